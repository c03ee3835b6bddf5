"""Helpers shared by the server tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import hashlib
import socket
import sys
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from peep.core import wire
from peep.core.configfile import to_toml as to_toml  # one TOML writer for tests, the bench and the demo
from peep.core.release import TemplateReleaser
from peep.lab.processes.pki import LocalCA

ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
DEVICE_TOKENS = {"cam-1": "tok-cam1-" + uuid.uuid4().hex, "cam-2": "tok-cam2-" + uuid.uuid4().hex}
DOOR_TOKEN = "tok-door1-" + uuid.uuid4().hex  # door-1: a door deciding on the device (gets the class key)
SITE = "lobby"
MQTT_PREFIX = f"peeptest-{uuid.uuid4().hex[:10]}/v1"
#: The `peep` console script of this environment (`python -m peep.server.cli` would not map UsageError to exit 2).
PEEP = str(Path(sys.executable).with_name("peep"))


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --------------------------------------------------------------------------- TLS material


@dataclass
class Pki:
    dir: Path
    ca_pem: bytes
    server_cert: Path
    server_key: Path
    client_ca: Path
    clients: dict[str, tuple[bytes, bytes]]  # CN -> (key PEM, cert PEM)
    rogue: tuple[bytes, bytes]  # signed by another CA


# --------------------------------------------------------------------------- configs


def make_pki(d: Path) -> Pki:
    """A CA, a server certificate for localhost/127.0.0.1, client certificates and a rogue one (the lab's PKI)."""
    ca = LocalCA("peep-test-ca", days=2)
    ca.write_ca(d / "ca.pem")
    ca.issue_server(("localhost",)).write(d / "server.pem", d / "server.key")
    clients = {}
    for cn in ("cam-1", "cam-2", "peep-admin", "cam-unregistered"):
        c = ca.issue_client(cn)
        clients[cn] = (c.key_pem, c.cert_pem)
    rogue_cert = LocalCA("rogue-ca", days=2).issue_client("cam-1")  # the right CN from the wrong CA
    rogue = (rogue_cert.key_pem, rogue_cert.cert_pem)
    return Pki(d, ca.cert_pem, d / "server.pem", d / "server.key", d / "ca.pem", clients, rogue)


def base_config(tmp: Path, pub_path: Path, bundle_dir: Path | None, **sections: dict[str, Any]) -> dict[str, Any]:
    """A server.toml as a dict (sections override the defaults shallowly per section)."""
    cfg: dict[str, Any] = {
        "grpc": {"listen": "127.0.0.1:0", "grace_s": 2.0},
        "storage": {"backend": "sqlite", "path": str(tmp / "peep.db")},
        "bundle": {"public_key": str(pub_path)},
        "auth": {
            "admin_token_sha256": sha(ADMIN_TOKEN),
            "admin_common_names": ["peep-admin"],
            "devices": [
                # cam-1 is the enrolment desk the fixtures enrol through; cam-2 an ordinary camera.
                {"id": "cam-1", "site": SITE, "token_sha256": sha(DEVICE_TOKENS["cam-1"]), "enrolment_desk": True},
                {"id": "cam-2", "site": SITE, "token_sha256": sha(DEVICE_TOKENS["cam-2"])},
                {"id": "door-1", "site": SITE, "token_sha256": sha(DOOR_TOKEN), "door": True},
            ],
        },
        "mqtt": {
            "enabled": False,
            "topic_prefix": MQTT_PREFIX,
            "client_id": f"peep-test-{uuid.uuid4().hex[:8]}",
            # The shared broker: no persistent session outlives a test (tests of durability
            # start their own broker, peep_testing.broker).
            "session_expiry_s": 0,
            "username": None,
        },
        "training": {"model_dir": str(tmp / "models")},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "warning"},
    }
    if bundle_dir is not None:
        cfg["bundle"]["dir"] = str(bundle_dir)
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def tls_section(pki: Pki, *, mtls: bool = False) -> dict[str, Any]:
    sec: dict[str, Any] = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
    if mtls:
        sec["client_ca"] = str(pki.client_ca)
    return sec


def tls_channel(port: int, pki: Pki, *, client: str | None = None, rogue: bool = False) -> grpc.Channel:
    key = cert = None
    if rogue:
        key, cert = pki.rogue
    elif client is not None:
        key, cert = pki.clients[client]
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_pem, private_key=key, certificate_chain=cert)
    return grpc.secure_channel(f"localhost:{port}", creds)


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


DEVICE = auth(DEVICE_TOKENS["cam-1"])
ADMIN = auth(ADMIN_TOKEN)


# --------------------------------------------------------------------------- templates


@dataclass
class Templates:
    """LFW faces released through the core pipeline, split 70/30 per person."""

    releaser: TemplateReleaser
    bundle_id: str
    X: np.ndarray
    subjects: np.ndarray
    train: np.ndarray
    test: np.ndarray
    background: np.ndarray  # background templates used as enrolment background (half the people)
    strangers: np.ndarray  # never-enrolled people's templates (the other half)
    background_people: np.ndarray | None = None  # the person behind each background row

    def message(self, i: int | None = None, *, values: Any = None, purpose: str = "identify", subject: str = "",
                device_id: str = "cam-1", site: str = SITE, **kw: Any) -> Any:  # fmt: skip
        v = self.X[i] if values is None else values
        kw.setdefault("key_id", self.releaser.key_id)
        return wire.make_template(
            v, device_id=device_id, site=site, bundle_id=self.bundle_id, mechanism=self.releaser.description,
            purpose=purpose, subject=subject, **kw,
        )  # fmt: skip

    def enrolment_messages(self) -> list[Any]:
        msgs = [self.message(int(i), purpose="enroll", subject=str(self.subjects[i])) for i in self.train]
        # One subject per background person, so validation holds out whole people (the prefix's meaning).
        people = self.background_people if self.background_people is not None else np.arange(len(self.background))
        for row, person in zip(self.background, people, strict=True):
            msgs.append(self.message(values=row, purpose="enroll", subject=f"background:{person}"))
        return msgs


# --------------------------------------------------------------------------- services


def rpc_error(call: Any, *args: Any, **kw: Any) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call that must fail."""
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kw)
    return e.value.code(), e.value.details()


def free_port() -> int:
    """A port to listen on, outside the range outgoing connections draw from (see the cluster's)."""
    from peep.lab.processes.ports import free_port as chosen

    return chosen()


def mqtt_available() -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", 1883), timeout=1.0):
            return None
    except OSError as exc:
        return f"Mosquitto not reachable on 127.0.0.1:1883 ({exc})"


PG_BASE = "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3"


# --------------------------------------------------------------------------- running servers


@dataclass
class RunningServer:
    app: Any
    port: int
    pki: Pki
    tmp: Path
    tls: bool = True
    mtls: bool = False

    @property
    def services(self) -> Any:
        return self.app.services

    def channel(self, **kw: Any) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return tls_channel(self.port, self.pki, **kw)

    def stub(self, **kw: Any) -> Any:
        from peep.v1 import recognition_pb2_grpc

        return recognition_pb2_grpc.RecognitionServiceStub(self.channel(**kw))


def start_server(
    cfg: dict[str, Any], pki: Pki, tmp: Path, *, mqtt_wait: float | None = None, **kw: Any
) -> RunningServer:
    from peep.server.app import ServerApp
    from peep.server.config import parse_config

    config = parse_config(cfg)
    app = ServerApp(config, **kw)
    app.start(mqtt_wait=mqtt_wait)
    tls = config.grpc.tls is not None
    return RunningServer(app, app.port, pki, tmp, tls=tls, mtls=tls and config.grpc.tls.client_ca is not None)  # type: ignore[union-attr]


# PostgreSQL for the tests of every package that stores (imported by tests/server's and tests/console's conftest).
@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Any]:
    """A connection to the `test` database; skipped only when PostgreSQL is unreachable."""
    import psycopg

    try:
        conn = psycopg.connect(PG_BASE, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable on 127.0.0.1:5432 ({exc})")
    yield conn
    conn.close()


@pytest.fixture
def pg_dsn(pg_admin: Any) -> Iterator[str]:
    """DSN of a fresh private schema (dropped afterwards)."""
    schema = f"peep_test_{uuid.uuid4().hex[:10]}"
    pg_admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{PG_BASE} options='-c search_path={schema}'"
    finally:
        pg_admin.execute(f"DROP SCHEMA {schema} CASCADE")


class EventCollector:
    """The first ``n`` recognition events of ``site`` from a running server's StreamEvents, read on a thread.

    ``with EventCollector(server, n) as events:`` returns once the server has the subscriber; send what
    raises the events, then ``events.wait()`` returns them (or fails the test after ``timeout`` s).
    ``message_ids``: collect only the events of those releases. Replicas stream each other's decisions, and
    another replica's Identify decisions are committed up to a second after the call (this collector flushes
    only its own server's), so without it a late event of an earlier step can take one of the ``n`` places.
    """

    def __init__(self, server: RunningServer, n: int, *, site: str = SITE, timeout: float = 10.0,
                 message_ids: Collection[str] | None = None) -> None:  # fmt: skip
        import threading

        self.server, self.n, self.timeout = server, n, timeout
        self.message_ids = None if message_ids is None else frozenset(message_ids)
        self.got: list[Any] = []
        self._done = threading.Event()
        from peep.v1 import recognition_pb2

        # An earlier test's Identify/Verify decision is committed (and so streamed) up to a second after its
        # call: commit it now, so that it is before this subscriber's start.
        server.services.ingestor.decisions.flush()
        self._before = server.services.events.n_subscribers
        self._call = server.stub().StreamEvents(
            recognition_pb2.StreamEventsRequest(site=site), metadata=DEVICE, timeout=20
        )
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        try:
            for ev in self._call:
                if self.message_ids is not None and ev.message_id not in self.message_ids:
                    continue
                self.got.append(ev)
                if len(self.got) >= self.n:
                    break
        finally:
            self._done.set()

    def __enter__(self) -> EventCollector:
        import time

        self._thread.start()
        deadline = time.monotonic() + 5
        while self.server.services.events.n_subscribers <= self._before and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def wait(self) -> list[Any]:
        assert self._done.wait(self.timeout), self.got
        return self.got

    def __exit__(self, *exc: object) -> None:
        self._call.cancel()


def write_edge_config(path: Path, *, port: int, pki: Pki, bundle_dir: Path, pub_path: Path, device_id: str,
                      privacy: dict[str, Any], grpc: dict[str, Any] | None = None,
                      **sections: dict[str, Any]) -> Path:  # fmt: skip
    """An edge.toml for a device talking gRPC/TLS to a test server on ``port`` (MQTT off)."""
    cfg: dict[str, Any] = {
        "device": {"id": device_id, "site": SITE, "state_dir": str(path.parent / f"{path.stem}-state")},
        "bundle": {"path": str(bundle_dir), "public_key": str(pub_path)},
        "privacy": privacy,
        "capture": {"source": "0"},
        "mqtt": {"enabled": False},
        "grpc": {"enabled": True, "target": f"localhost:{port}", "ca_file": str(pki.dir / "ca.pem"), **(grpc or {})},
        **sections,
    }
    path.write_text(to_toml(cfg))
    return path
