"""A throw-away certificate authority for demos and local trials.

Production sites use ``deploy/pki/make-certs.sh`` (openssl) and keep the CA
key offline; this module makes the same kind of material in-process so
``peep demo`` can run gRPC over TLS on a machine without openssl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
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


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_local_pki(out_dir: str | os.PathLike[str], *, hostnames: tuple[str, ...] = ("localhost",)) -> IssuedFiles:
    """Create ``ca.pem``, ``server.pem`` and ``server.key`` (0600) under ``out_dir``.

    The server certificate is valid for ``hostnames`` and 127.0.0.1 for 7 days.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("PEEP local CA"))
        .issuer_name(_name("PEEP local CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hostnames[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = IssuedFiles(out / "ca.pem", out / "server.pem", out / "server.key")
    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.server_cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(
        files.server_key,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    return files
