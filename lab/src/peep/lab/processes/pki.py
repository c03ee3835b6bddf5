"""A throw-away certificate authority for demos, benchmarks and tests.

Production sites use ``deploy/pki/make-certs.sh`` (openssl) and keep the CA
key offline; this module makes the same kind of material in-process so
``peep demo`` and ``peep bench`` can run TLS on a machine without openssl, and
so every test builds its certificates the one way (:class:`LocalCA`).

Certificates are ECDSA P-256 / SHA-256 and carry what strict verifiers
(OpenSSL 3, Python's ``VERIFY_X509_STRICT``, BoringSSL in gRPC) ask for: a
critical CA basic constraint and key usage on the CA, subject and authority
key identifiers, an extended key usage on every leaf, and subject alternative
names on server certificates.

Examples
--------
>>> ca = LocalCA("example CA")
>>> server = ca.issue_server(("localhost",))
>>> device = ca.issue_client("cam-1")
>>> server.cert_pem.startswith(b"-----BEGIN CERTIFICATE-----") and device.key_pem.startswith(b"-----BEGIN PRIVATE KEY")
True
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class IssuedFiles:
    """Paths of a CA certificate and one server certificate with its key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class Credentials:
    """A PEM certificate and its private key (PEM, PKCS#8, unencrypted)."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write the certificate (0644) and the key (0600); return both paths."""
        cert, key = Path(cert_path), Path(key_path)
        _write(cert, self.cert_pem, 0o644)
        _write(key, self.key_pem, 0o600)
        return cert, key


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # O_CREAT's mode does not apply to an existing file


#: A CA signs certificates and CRLs (and nothing else).
_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
)  # fmt: skip


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class LocalCA:
    """A throw-away certificate authority that issues server and client certificates.

    Parameters
    ----------
    common_name : str, default "PEEP local CA"
    days : float, default 7
        Validity of the CA and of everything it issues (from five minutes ago,
        to tolerate clock skew between processes).
    """

    def __init__(self, common_name: str = "PEEP local CA", *, days: float = 7.0) -> None:
        if not common_name:
            raise ValueError(f"common_name: expected a non-empty name, received {common_name!r}")
        if not days > 0:
            raise ValueError(f"days: expected a validity > 0 days, received {days!r}")
        self.common_name = common_name
        self.days = days
        self._key = ec.generate_private_key(ec.SECP256R1())
        self.cert = (
            self._builder(_name(common_name), self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_KEY_USAGE, critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate (what clients and servers trust)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The CA's private key (tests that sign more themselves, e.g. a broker's own tooling)."""
        return _pem_key(self._key)

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(_name(self.common_name))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=self.days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        )

    def _issue(self, common_name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]) -> Credentials:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            self._builder(_name(common_name), key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(self._key, hashes.SHA256())
        return Credentials(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    def issue_server(
        self, hostnames: Sequence[str] = ("localhost",), *, ip_addresses: Sequence[str] = ("127.0.0.1",)
    ) -> Credentials:
        """A TLS server certificate for ``hostnames`` and ``ip_addresses`` (common name: the first host name)."""
        if not hostnames:
            raise ValueError("hostnames: expected at least one host name, received none")
        sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        return self._issue(hostnames[0], ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, common_name: str) -> Credentials:
        """A TLS client certificate; its common name is the identity (a device id, an admin name)."""
        if not common_name:
            raise ValueError(f"common_name: expected a non-empty name, received {common_name!r}")
        return self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def write_ca(self, path: str | os.PathLike[str]) -> Path:
        """Write the CA certificate (0644); return its path."""
        p = Path(path)
        _write(p, self.cert_pem, 0o644)
        return p


def make_local_pki(out_dir: str | os.PathLike[str], *, hostnames: tuple[str, ...] = ("localhost",)) -> IssuedFiles:
    """Create ``ca.pem``, ``server.pem`` and ``server.key`` (0600) under ``out_dir``.

    The server certificate is valid for ``hostnames`` and 127.0.0.1 for 7 days.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ca = LocalCA()
    ca.write_ca(out / "ca.pem")
    cert, key = ca.issue_server(hostnames).write(out / "server.pem", out / "server.key")
    return IssuedFiles(out / "ca.pem", cert, key)
