"""TLS material named in a configuration: read, parsed and matched the way the transports will use it.

Both processes check their PEM files with this one function, at start-up and
in ``--validate-config`` (so a file that validation accepts is one the
transport can load): :func:`tls_context` builds the :class:`ssl.SSLContext`
from the CA, certificate and key files, and raises :class:`TlsFileError`
naming the config key of the file at fault and what was wrong with it:
missing or unreadable, no certificate in it, not an unencrypted private key,
or a key that does not belong to the certificate. paho takes the context as
it is; gRPC takes the PEM bytes (:func:`read_pem`) once they passed.

Standard library only (``ssl``: the OpenSSL the MQTT client uses too).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

__all__ = ["PemFile", "TlsFileError", "read_pem", "tls_context"]

#: ``(config key, path)`` of one PEM file, e.g. ``("mqtt.ca_file", Path("/etc/peep/ca.pem"))``.
PemFile = tuple[str, str | os.PathLike[str]]


class TlsFileError(ValueError):
    """A TLS file named by ``key`` is missing, unreadable or not what the key expects.

    Attributes
    ----------
    key : str
        The config key (``grpc.tls.cert``).
    message : str
        What was expected and what was found (``expected ..., received '/path' (...)``).
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


def read_pem(file: PemFile) -> bytes:
    """The bytes of a PEM file, or :class:`TlsFileError` naming its key."""
    key, path = file
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        reason = "a directory" if p.is_dir() else exc.strerror or type(exc).__name__
        raise TlsFileError(key, f"expected a readable PEM file, received {str(p)!r} ({reason})") from None
    if not data.strip():
        raise TlsFileError(key, f"expected a PEM file, received {str(p)!r} (empty)")
    return data


def _no_password() -> bytes:
    # Never let OpenSSL prompt on a terminal for an encrypted key (systemd has none): refuse it.
    raise ValueError("the private key is encrypted")


def tls_context(
    *,
    server: bool,
    ca: PemFile | None = None,
    cert: PemFile | None = None,
    key: PemFile | None = None,
    system_ca: bool = True,
) -> ssl.SSLContext:
    """An SSL context from PEM files, each checked (see the module docstring).

    Parameters
    ----------
    server : bool
        A server context (``PROTOCOL_TLS_SERVER``; ``ca`` then verifies client
        certificates, which become required) or a client one
        (``PROTOCOL_TLS_CLIENT``: certificate and host name verified).
    ca, cert, key : (config key, path), optional
        CA certificate(s), certificate chain and its private key.
        ``cert`` and ``key`` go together.
    system_ca : bool
        A client without ``ca`` trusts the system's CAs.

    Raises
    ------
    TlsFileError
        Naming the key of the first file at fault.
    """
    if (cert is None) != (key is None):
        have, missing = (cert, "key") if cert is not None else (key, "certificate")
        assert have is not None
        raise TlsFileError(have[0], f"expected a {missing} file to go with it, received none")
    for f in (ca, cert, key):
        if f is not None:
            read_pem(f)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=os.fspath(ca[1]))
        except ssl.SSLError as exc:
            raise TlsFileError(
                ca[0], f"expected PEM CA certificate(s), received {str(ca[1])!r} ({exc.reason or exc})"
            ) from None
        if server:
            ctx.verify_mode = ssl.CERT_REQUIRED
    elif not server and system_ca:
        ctx.load_default_certs()
    if cert is not None and key is not None:
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            probe.load_verify_locations(cafile=os.fspath(cert[1]))
        except ssl.SSLError:
            raise TlsFileError(
                cert[0], f"expected a PEM certificate (chain), received {str(cert[1])!r} (no certificate in it)"
            ) from None
        try:
            ctx.load_cert_chain(os.fspath(cert[1]), os.fspath(key[1]), password=_no_password)
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                detail = "the key of another certificate"
                expected = f"the private key of the certificate {str(cert[1])!r}"
            else:
                detail, expected = exc.reason or "no private key in it", "an unencrypted PEM private key"
            raise TlsFileError(key[0], f"expected {expected}, received {str(key[1])!r} ({detail})") from None
        except ValueError:
            raise TlsFileError(
                key[0], f"expected an unencrypted PEM private key, received {str(key[1])!r} (encrypted)"
            ) from None
    return ctx
