"""Behind a reverse proxy: X-Forwarded-For is believed only from `console.trusted_proxies`, so the per-address
login throttle and the audit log see the client — and a client cannot name its own address otherwise."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from peep.server.config import parse_config
from peep_testing.console import login_token
from peep_testing.server import base_config, make_pki, start_server, tls_section


def _console(tmp: Any, trusted: list[str]) -> Iterator[tuple[Any, httpx.Client]]:
    from peep.lab.bench.server import synthetic_bundle
    from peep.server.console import accounts
    from peep.server.console.store import ConsoleStore

    (tmp / "pki").mkdir()
    pki = make_pki(tmp / "pki")
    _bundle, pub = synthetic_bundle(tmp)
    console = {"listen": "127.0.0.1:0", "login_attempts": 3}
    if trusted:
        console["trusted_proxies"] = trusted
    srv = start_server(base_config(tmp, pub, tmp / "bundle", grpc={"tls": tls_section(pki)}, console=console), pki, tmp)
    try:
        ConsoleStore(srv.services.store).add_account("root", "admin", accounts.hash_password("pw-123456789"),
                                                     must_change=False)  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
        with httpx.Client(base_url=str(srv.app.console.url), verify=ctx, timeout=30) as c:
            yield srv, c
    finally:
        srv.app.stop(0)


def _fail(c: httpx.Client, name: str, forwarded: str) -> int:
    token = login_token(c)
    form = {"name": name, "password": "wrong", "csrf": token}
    return c.post("/login", data=form, headers={"X-Forwarded-For": forwarded}).status_code


@pytest.fixture
def behind_proxy(tmp_path):
    yield from _console(tmp_path, ["127.0.0.1/32"])


@pytest.fixture
def direct(tmp_path):
    yield from _console(tmp_path, [])


def test_a_trusted_proxy_names_the_client_for_the_throttle_and_the_audit(behind_proxy):
    srv, c = behind_proxy
    from peep.server.console.store import ConsoleStore

    # three accounts' failures from one client address: its fourth attempt is refused, whatever the name
    assert [_fail(c, f"user{i}", "203.0.113.9") for i in range(3)] == [401, 401, 401]
    assert _fail(c, "user9", "203.0.113.9") == 429
    # another client behind the same proxy is not held back by it
    assert _fail(c, "user10", "198.51.100.7") == 401
    addresses = {e.address for e in ConsoleStore(srv.services.store).audit_log(limit=20)}
    assert {"203.0.113.9", "198.51.100.7"} <= addresses and "127.0.0.1" not in addresses


def test_without_trusted_proxies_a_client_cannot_choose_its_address(direct):
    srv, c = direct
    from peep.server.console.store import ConsoleStore

    # each attempt claims a new address; the console counts the real one and refuses the fourth
    assert [_fail(c, f"user{i}", f"203.0.113.{i}") for i in range(3)] == [401, 401, 401]
    assert _fail(c, "user9", "203.0.113.99") == 429
    assert {e.address for e in ConsoleStore(srv.services.store).audit_log(limit=20)} == {"127.0.0.1"}


@pytest.mark.parametrize("bad", ["*", "proxy.example", "10.0.0.0/33", "x" * 500])
def test_trusted_proxies_must_be_addresses_or_networks(tmp_path, bad):
    cfg = {"console": {"trusted_proxies": ["10.0.0.1", bad]}}
    with pytest.raises(Exception, match=r"trusted_proxies\[1\]: expected an IP address or CIDR network") as e:
        parse_config(cfg, source="server.toml")
    assert len(str(e.value)) < 600
