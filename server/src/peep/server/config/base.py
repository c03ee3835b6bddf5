"""What every part of the server's configuration shares: the error it raises, secret references, the
base model (``extra="forbid"``), path, listen-address and TLS-file checks, the mechanism kinds."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from peep.core import configfile
from peep.core.mechanisms import mechanism_kind_literal
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

if TYPE_CHECKING:
    MechanismKind = str
else:
    # Exactly the registry's kinds (peep.core.mechanisms), listed in errors and docs.
    MechanismKind = mechanism_kind_literal()


class ConfigError(ValueError):
    """The configuration is invalid; ``errors`` lists :class:`~peep.core.configfile.Problem`
    tuples (key path, message, value received), each printed as ``key: message, received value``."""

    def __init__(self, source: str, errors: Sequence[tuple[str, str, Any] | configfile.Problem]) -> None:
        self.source = source
        self.errors = [e if isinstance(e, configfile.Problem) else configfile.Problem(*e) for e in errors]
        super().__init__(f"{source}: invalid configuration\n  " + "\n  ".join(str(p) for p in self.errors))


# ------------------------------------------------------------------ secrets


class SecretRef(BaseModel):
    """Where a secret comes from: ``env:NAME``, ``credential:NAME`` or ``file:PATH``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: Literal["env", "credential", "file"]
    name: str

    def resolve(self, environ: Mapping[str, str] | None = None, *, header_value: bool = False) -> SecretStr:
        """The secret, checked by :func:`~peep.core.configfile.clean_secret` (``header_value``: a bearer token).

        Raises ValueError saying what is wrong and where it was read (never the secret).
        """
        env = os.environ if environ is None else environ
        if self.source == "env":
            if self.name not in env:
                raise ValueError(f"expected the environment variable {self.name} to hold the secret; it is not set")
            try:
                return SecretStr(configfile.clean_secret(env[self.name], header_value=header_value))
            except ValueError as exc:
                raise ValueError(f"{exc}, in ${self.name}") from None
        if self.source == "credential":
            cdir = env.get("CREDENTIALS_DIRECTORY")
            if not cdir:
                raise ValueError(
                    f"expected systemd credential {self.name!r}, but CREDENTIALS_DIRECTORY is not set "
                    "(use LoadCredential= in the unit, or env:NAME)"
                )
            path = Path(cdir) / self.name
        else:
            path = Path(self.name)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ValueError(f"expected a readable secret file {path} ({reason})") from None
        try:
            return SecretStr(configfile.clean_secret(text, header_value=header_value))
        except ValueError as exc:
            raise ValueError(f"{exc}, in the file {path}") from None

    def __str__(self) -> str:
        return f"{self.source}:{self.name}"


def parse_secret_ref(value: Any) -> Any:
    if isinstance(value, str):
        source, sep, name = value.partition(":")
        if not sep or source not in ("env", "credential", "file") or not name:
            raise ValueError(
                "expected a secret reference 'env:NAME', 'credential:NAME' or 'file:/path' (never the secret itself)"
            )
        return {"source": source, "name": name}
    return value


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def resolve_path(value: Path | None, info: ValidationInfo) -> Path | None:
    return None if value is None else configfile.resolve_path(value, configfile.context_base_dir(info.context))


def check_hex(v: str | None) -> str | None:
    if v is not None:
        v = v.lower()
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("expected 64 hex digits (sha256sum of the token)")
    return v


def check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535) or not host:
        raise ValueError("expected HOST:PORT with a port 0-65535 (0 = pick a free port)")
    h = host.strip("[]")
    try:
        ipaddress.ip_address(h)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", h):
            raise ValueError("expected HOST:PORT with a host name or IP address") from None
    return value


def is_loopback_listen(listen: str) -> bool:
    """Whether ``HOST:PORT`` binds a loopback address only (127.0.0.0/8, ``::1``, ``localhost``).

    >>> [is_loopback_listen(v) for v in ("127.0.0.1:0", "[::1]:50051", "localhost:1", "0.0.0.0:1", "[::]:1")]
    [True, True, True, False, False]
    """
    host = listen.rpartition(":")[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # any other name may resolve to a routable address
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


# ------------------------------------------------------------------ sections


class TlsConfig(ConfigModel):
    """gRPC TLS. With ``client_ca`` set the server requires mutual TLS: every
    client presents a certificate signed by that CA and its common name is
    the caller (a device id, or an admin listed in ``auth.admin_common_names``).
    gRPC cannot make client certificates optional, so mTLS is all or nothing."""

    cert: Path = Field(description="PEM server certificate chain")
    key: Path = Field(description="PEM private key of the server certificate")
    client_ca: Path | None = Field(default=None, description="PEM CA that signs client certificates (enables mTLS)")

    @field_validator("cert", "key", "client_ca", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(v, info)
