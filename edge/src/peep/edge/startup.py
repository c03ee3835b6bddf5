"""Start-up checks of the agent's files that are not the bundle: TLS material and the state directory.

:meth:`peep.edge.agent.Agent.prepare` runs them (so ``peep-edge run
--validate-config`` does), and the transports take their TLS material from
the same functions: :class:`~peep.edge.transport.mqtt.MqttLink` its SSL
context from :func:`mqtt_tls_context`, the gRPC channel its PEM bytes from
:func:`grpc_tls_material`. A file that validation accepts is therefore one
the transport loads; one it refuses is a :class:`~peep.edge.errors.ConfigError`
naming the key (``mqtt.ca_file: expected a readable PEM file, received ...``).

Only the standard library and :mod:`peep.core.tlsfiles` here: an MQTT-only
agent never imports gRPC.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from peep.core.tlsfiles import PemFile, TlsFileError, read_pem, tls_context
from peep.edge.config import GrpcConfig, MqttConfig
from peep.edge.errors import ConfigError

__all__ = ["check_state_dir", "grpc_tls_material", "mqtt_tls_context"]


def _files(section: str, cfg: MqttConfig | GrpcConfig) -> dict[str, PemFile | None]:
    return {
        name: (f"{section}.{name}_file", path) if (path := getattr(cfg, f"{name}_file")) is not None else None
        for name in ("ca", "cert", "key")
    }


def mqtt_tls_context(cfg: MqttConfig) -> ssl.SSLContext | None:
    """The broker connection's SSL context (None when ``mqtt.tls`` is false): CA (or the system's), client pair."""
    if not cfg.tls:
        return None
    f = _files("mqtt", cfg)
    try:
        return tls_context(server=False, ca=f["ca"], cert=f["cert"], key=f["key"])
    except TlsFileError as exc:
        raise ConfigError([(exc.key, exc.message)]) from None


def grpc_tls_material(cfg: GrpcConfig) -> tuple[bytes | None, bytes | None, bytes | None] | None:
    """``(root CA, private key, certificate chain)`` PEM bytes for the gRPC channel, checked (None without TLS)."""
    if not cfg.tls:
        return None
    f = _files("grpc", cfg)
    try:
        tls_context(server=False, ca=f["ca"], cert=f["cert"], key=f["key"])
        root, key, chain = (read_pem(x) if x is not None else None for x in (f["ca"], f["key"], f["cert"]))
    except TlsFileError as exc:
        raise ConfigError([(exc.key, exc.message)]) from None
    return root, key, chain


def check_state_dir(state_dir: Path) -> None:
    """``device.state_dir`` exists as a writable directory or can be created (nothing is written here)."""
    p = Path(state_dir)
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    why = None
    if not p.is_dir():
        why = f"{str(p)!r} is not a directory"
    elif not os.access(p, os.W_OK | os.X_OK):
        why = f"{str(p)!r} is not writable by this user"
    if why is not None:
        raise ConfigError(
            [("device.state_dir", f"expected a writable directory (or one that can be created), received "
              f"{str(state_dir)!r} ({why})")]
        )  # fmt: skip
