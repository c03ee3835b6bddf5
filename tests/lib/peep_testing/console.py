"""Fixtures for the operator console: a real TLS server (synthetic bundle, trained model) with the console on.

No LFW: the faces are synthetic prototypes plus small noise, released through the core pipeline with the
secure sampler, enrolled over gRPC and trained by the Train RPC, so the console reads what a real server holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from peep_testing.server import (
    ADMIN,
    Pki,
    RunningServer,
    base_config,
    make_pki,
    start_server,
    tls_section,
)

#: A subject id that is markup: it must show as text, never run.
SCRIPT_SUBJECT = "<script>alert(1)<img src=x onerror=alert(2)>"
SUBJECTS = ("alice", "bob", "carol", "dave", SCRIPT_SUBJECT)
PASSWORDS = {"root": "admin-password-123", "olga": "operator-password-1", "desk": "enrol-password-123"}
ROLES = {"root": "admin", "olga": "operator", "desk": "enrol"}


@dataclass
class Faces:
    """Synthetic faces: one prototype per subject (and per background or stranger identity)."""

    bundle: Any
    releaser: Any
    protos: np.ndarray
    rng: np.random.Generator

    def faces(self, k: int, n: int) -> np.ndarray:
        noise = 0.05 * self.rng.standard_normal((n, self.bundle.n_features)).astype(np.float32)
        return np.clip(self.protos[k] + noise, 0.0, 1.0)

    def message(self, k: int, *, purpose: str = "identify", subject: str = "", device: str = "cam-1", **kw: Any) -> Any:
        from peep.core import wire

        v = self.releaser.release(self.faces(k, 1))[0]
        return wire.make_template(
            v, device_id=device, site="lobby", bundle_id=self.bundle.bundle_id, mechanism=self.releaser.description,
            purpose=purpose, subject=subject, **kw,
        )  # fmt: skip

    def stranger(self, **kw: Any) -> Any:
        return self.message(len(self.protos) - 1, **kw)


@dataclass
class Console:
    server: RunningServer
    faces: Faces
    pki: Pki

    @property
    def url(self) -> str:
        return str(self.server.app.console.url)

    @property
    def ca(self) -> str:
        return str(self.pki.dir / "ca.pem")

    def client(self) -> Any:
        import ssl

        import httpx

        ctx = ssl.create_default_context(cafile=self.ca)
        return httpx.Client(base_url=self.url, verify=ctx, follow_redirects=False, timeout=30)

    @contextmanager
    def login(self, name: str) -> Iterator[Any]:
        """An httpx client logged in as ``name`` (and its CSRF token as ``client.csrf``)."""
        with self.client() as c:
            token = login_token(c)
            r = c.post("/login", data={"name": name, "password": PASSWORDS[name], "csrf": token})
            assert r.status_code == 303, r.text
            c.csrf = csrf_of("/", c)
            yield c


def login_token(client: Any) -> str:
    r = client.get("/login")
    assert r.status_code == 200
    return _hidden(r.text, "csrf")


def _hidden(html: str, name: str) -> str:
    import re

    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert m, f"no hidden {name} field"
    return m.group(1)


def csrf_of(path: str, client: Any) -> str:
    r = client.get(path, follow_redirects=True)
    return _hidden(r.text, "csrf")


@pytest.fixture(scope="session")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    from peep.core.release import TemplateReleaser
    from peep.lab.bench.server import synthetic_bundle
    from peep.server.console import accounts
    from peep.server.console.store import ConsoleStore
    from peep.v1 import recognition_pb2

    tmp = tmp_path_factory.mktemp("console")
    pki = make_pki(tmp_path_factory.mktemp("console-pki"))
    bundle, pub = synthetic_bundle(tmp)
    releaser = TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0)
    rng = np.random.default_rng(0)
    faces = Faces(bundle, releaser, rng.random((len(SUBJECTS) + 4, bundle.n_features), dtype=np.float32), rng)
    cfg = base_config(tmp, pub, tmp / "bundle", grpc={"tls": tls_section(pki)}, console={"listen": "127.0.0.1:0"})
    srv = start_server(cfg, pki, tmp)
    try:
        msgs = [faces.message(k, purpose="enroll", subject=s) for k, s in enumerate(SUBJECTS) for _ in range(12)]
        for j in range(3):  # background identities calibrate the unknown threshold
            k = len(SUBJECTS) + j
            msgs += [faces.message(k, purpose="enroll", subject=f"background:{j}") for _ in range(12)]
        stub = srv.stub()
        assert stub.IngestStream(iter(msgs), metadata=ADMIN, timeout=60).rejected == 0
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
        store = ConsoleStore(srv.services.store)
        for name, pw in PASSWORDS.items():
            store.add_account(name, ROLES[name], accounts.hash_password(pw), must_change=False)
        yield Console(srv, faces, pki)
    finally:
        srv.app.stop(0)


@contextmanager
def keeping(console: Any, keep: str) -> Iterator[None]:
    """The console's server with another recognition.keep for one test (its config and its ingest)."""
    services = console.server.services
    rc, ingestor = services.config.recognition, services.ingestor
    old = rc.keep
    object.__setattr__(rc, "keep", keep)
    ingestor.keep = keep
    try:
        yield
    finally:
        object.__setattr__(rc, "keep", old)
        ingestor.keep = old
