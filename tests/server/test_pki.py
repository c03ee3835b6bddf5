"""peep.lab.processes.pki: the one in-process CA of the demo, the benchmark and the tests issues certificates
that a strict TLS stack accepts, in both directions, and nothing from another CA."""

from __future__ import annotations

import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from peep.lab.processes.pki import LocalCA, make_local_pki


def _handshake(tmp_path, ca: LocalCA, client_ca: LocalCA) -> tuple[object, object]:
    """Mutual TLS over a socket pair; returns the client CN the server saw, or the error."""
    server_files = ca.issue_server(("localhost",)).write(tmp_path / "s.pem", tmp_path / "s.key")
    client_files = client_ca.issue_client("cam-1").write(tmp_path / "c.pem", tmp_path / "c.key")
    ca_file = ca.write_ca(tmp_path / "ca.pem")
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(*server_files)
    srv.load_verify_locations(ca_file)
    srv.verify_mode = ssl.CERT_REQUIRED
    srv.verify_flags |= ssl.VERIFY_X509_STRICT
    cli = ssl.create_default_context(cafile=ca_file)
    cli.verify_flags |= ssl.VERIFY_X509_STRICT
    cli.load_cert_chain(*client_files)
    a, b = socket.socketpair()
    seen: dict[str, object] = {}

    def serve() -> None:
        try:
            with srv.wrap_socket(a, server_side=True) as s:
                seen["cn"] = dict(x[0] for x in s.getpeercert()["subject"])["commonName"]
        except (ssl.SSLError, OSError) as exc:
            seen["error"] = exc

    t = threading.Thread(target=serve)
    t.start()
    try:
        with cli.wrap_socket(b, server_hostname="localhost"):
            pass
    except (ssl.SSLError, OSError) as exc:
        seen.setdefault("error", exc)
    t.join(10)
    return seen.get("cn"), seen.get("error")


def test_server_and_client_certificates_pass_a_strict_mutual_tls_handshake(tmp_path):
    ca = LocalCA("test CA", days=1)
    cn, error = _handshake(tmp_path, ca, ca)
    assert error is None and cn == "cam-1"


def test_a_client_certificate_from_another_ca_is_refused(tmp_path):
    cn, error = _handshake(tmp_path, LocalCA("test CA", days=1), LocalCA("rogue CA", days=1))
    assert cn is None and isinstance(error, ssl.SSLError | OSError)


def test_certificates_name_their_use(tmp_path):
    ca = LocalCA("test CA")
    server = x509.load_pem_x509_certificate(ca.issue_server(("peep.local", "localhost")).cert_pem)
    client = x509.load_pem_x509_certificate(ca.issue_client("peep-admin").cert_pem)
    assert server.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "peep.local"
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["peep.local", "localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.issuer == ca.cert.subject


def test_make_local_pki_writes_the_ca_and_a_private_server_key(tmp_path):
    files = make_local_pki(tmp_path / "tls")
    assert files.ca_cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert stat.S_IMODE(files.server_key.stat().st_mode) == 0o600


@pytest.mark.parametrize(("kwargs", "match"), [({"common_name": ""}, "common_name"), ({"days": 0}, "days")])
def test_bad_parameters_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=rf"^{match}: expected"):
        LocalCA(**kwargs)
