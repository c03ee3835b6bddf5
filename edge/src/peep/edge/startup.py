"""Start-up checks of the agent's files that are not the bundle: TLS material, the state directory, a door's.

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
from typing import Any

from peep.core.tlsfiles import PemFile, TlsFileError, read_pem, tls_context
from peep.edge.config import DoorConfig, GrpcConfig, MqttConfig
from peep.edge.errors import ConfigError

__all__ = ["check_door", "check_state_dir", "grpc_tls_material", "mqtt_tls_context"]


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


def check_door(door: DoorConfig, *, release_epsilon_vector: float) -> Any:
    """A door's budgets against one release, and its decision key: the server's public key (or None over gRPC).

    A budget below one release's per-vector ε (the template and its soft traits) would refuse every claim;
    a decision key that cannot be read would leave an MQTT door acting on nothing.
    """
    for name, value in (("door.epsilon_per_hour", door.epsilon_per_hour),
                        ("door.subject_epsilon_per_hour", door.subject_epsilon_per_hour)):  # fmt: skip
        # A door deciding on the device releases nothing of the face: its budgets never come into play.
        if door.decision != "device" and release_epsilon_vector > value:
            raise ConfigError([(name, f"expected at least one release's per-vector ε ({release_epsilon_vector:g}: "
                                      f"the template and its soft traits), received {value:g}")])  # fmt: skip
    if door.decision != "mqtt" or door.decision_public_key is None:
        return None
    from peep.core.bundle import load_public_key
    from peep.core.exceptions import BundleError

    try:
        return load_public_key(door.decision_public_key)
    except BundleError as exc:
        raise ConfigError([("door.decision_public_key", str(exc))]) from None


def check_decision_mode(cfg: Any) -> Any:
    """The deployer's public key device models must verify against (``recognition.model_public_key``, else the
    bundle's), for a camera or a door that decides on the device; :class:`ConfigError` naming the key."""
    from peep.core.bundle import load_public_key
    from peep.core.exceptions import BundleError

    name = "recognition.model_public_key" if cfg.recognition.model_public_key is not None else "bundle.public_key"
    path = cfg.recognition.model_public_key or cfg.bundle.public_key
    try:
        return load_public_key(path)
    except BundleError as exc:
        raise ConfigError([(name, str(exc))]) from None
