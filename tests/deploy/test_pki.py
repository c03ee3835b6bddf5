"""deploy/pki/make-certs.sh issues a CA and certificates that really work for TLS."""

from __future__ import annotations

import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "pki" / "make-certs.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)


def test_issues_ca_server_and_device_certificates(tmp_path):
    out = tmp_path / "pki"
    r = _run(str(out), "peep.local", "cam-1", "cam-2")
    assert r.returncode == 0, r.stderr
    for name in ("ca", "broker", "server", "devices/cam-1", "devices/cam-2"):
        assert stat.S_IMODE((out / f"{name}.key").stat().st_mode) == 0o600
    v = subprocess.run(
        ["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "server.crt"), str(out / "devices/cam-1.crt")],
        capture_output=True,
        text=True,
    )
    assert v.returncode == 0 and v.stdout.count(": OK") == 2
    subj = subprocess.run(
        ["openssl", "x509", "-in", str(out / "devices/cam-2.crt"), "-noout", "-subject"], capture_output=True, text=True
    )
    assert "CN = cam-2" in subj.stdout
    # Re-running keeps existing material and adds only new devices.
    before = (out / "devices/cam-1.crt").read_bytes()
    assert _run(str(out), "peep.local", "cam-1", "cam-3").returncode == 0
    assert (out / "devices/cam-1.crt").read_bytes() == before
    assert (out / "devices/cam-3.crt").is_file()


def test_rejects_bad_device_ids_and_usage(tmp_path):
    assert _run(str(tmp_path)).returncode == 2
    r = _run(str(tmp_path / "p"), "host", "cam/1")
    assert r.returncode == 2 and "cam/1" in r.stderr


def test_mutual_tls_handshake_with_issued_certificates(tmp_path):
    out = tmp_path / "pki"
    assert _run(str(out), "localhost", "cam-1").returncode == 0
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(out / "ca.crt"))
    server_ctx.load_cert_chain(str(out / "server.crt"), str(out / "server.key"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(out / "ca.crt"))
    client_ctx.load_cert_chain(str(out / "devices/cam-1.crt"), str(out / "devices/cam-1.key"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: dict[str, object] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            seen["peer"] = tls.getpeercert()
            tls.sendall(b"ok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_ctx.wrap_socket(raw, server_hostname="localhost") as c,
    ):
        assert c.recv(2) == b"ok"
    t.join(5)
    listener.close()
    subject = dict(x[0] for x in seen["peer"]["subject"])  # type: ignore[index]
    assert subject["commonName"] == "cam-1"
    # A certificate from another CA is refused.
    other = tmp_path / "other"
    assert _run(str(other), "localhost", "cam-9").returncode == 0
    bad_ctx = ssl.create_default_context(cafile=str(other / "ca.crt"))
    with _server_once(server_ctx) as port2, socket.create_connection(("127.0.0.1", port2)) as raw:
        with pytest.raises(ssl.SSLError):
            bad_ctx.wrap_socket(raw, server_hostname="localhost").recv(1)


class _server_once:
    """A TLS server accepting one connection (handshake errors are expected)."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        self.listener = socket.create_server(("127.0.0.1", 0))

    def __enter__(self) -> int:
        def serve() -> None:
            conn, _ = self.listener.accept()
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"x")
            except (ssl.SSLError, OSError):
                pass

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        return int(self.listener.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.thread.join(5)
        self.listener.close()
