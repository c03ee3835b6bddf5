"""What ``peep serve`` checks before anything listens — and all that ``--validate-config`` checks.

One set of functions, called by both paths, so that a configuration that
validates is one that starts (and one that does not start says why, naming
the key, with exit code 2):

- :func:`pinned_key` reads ``bundle.public_key`` (an Ed25519 public key in
  PEM: a certificate or another kind of key is refused by name);
- :func:`configured_bundle` reads ``bundle.dir`` and loads it verified
  against that key (signature, every hash, the projector);
- :func:`grpc_tls_material` and :func:`mqtt_tls_context` read the TLS
  files and check them the way the transports use them
  (:func:`peep.core.tlsfiles.tls_context`: a certificate in the certificate
  file, an unencrypted key that belongs to it, CA certificates in the CA file);
- :func:`decision_signing_key` reads ``mqtt.decision_signing_key`` (the
  Ed25519 key that signs what doors deciding over MQTT act on);
- :func:`device_model_material` reads ``training.device_models.signing_key``
  and ``training.device_models.calibration`` (what signed device models are
  made with);
- :func:`check` runs all of them plus the secrets
  (:func:`~peep.server.config.resolve_secrets`) and the places the server
  writes (``storage.path``, ``training.model_dir``), and raises one
  :class:`~peep.server.config.ConfigError` listing every problem.

:class:`~peep.server.services.Services` takes its key from
:func:`pinned_key` and publishes :func:`configured_bundle`; the gRPC server
takes its credentials from :func:`grpc_tls_material`. What is not checked
here is what needs the network: the database, the broker, binding the ports.
Nor is the ``[qbbs]`` table: the QBBS module ships in peep-server, and
:class:`~peep.server.config.ServerConfig` validates the table with the
module's own model when the file is loaded.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from peep.core.bundle import ProjectionBundle, load_private_key, load_public_key, read_bundle_files
from peep.core.configfile import Problem
from peep.core.exceptions import BundleError
from peep.core.tlsfiles import TlsFileError, read_pem, tls_context
from peep.server.config import ConfigError, ResolvedSecrets, ServerConfig, resolve_secrets

if TYPE_CHECKING:
    from peep.server.bundles.calibrate import CalibrationSet

__all__ = [
    "check",
    "configured_bundle",
    "decision_signing_key",
    "device_model_material",
    "grpc_tls_material",
    "mqtt_tls_context",
    "pinned_key",
    "writable_dir",
]

SOURCE = "configuration"


def _error(key: str, message: str, source: str = SOURCE) -> ConfigError:
    return ConfigError(source, [Problem(key, message)])


def pinned_key(config: ServerConfig) -> Ed25519PublicKey:
    """The deployer's key from ``bundle.public_key`` (ConfigError naming the key otherwise)."""
    try:
        return load_public_key(config.bundle.public_key)
    except BundleError as exc:
        raise _error("bundle.public_key", str(exc)) from None


def configured_bundle(config: ServerConfig, key: Ed25519PublicKey) -> ProjectionBundle | None:
    """The bundle in ``bundle.dir`` loaded and verified against ``key`` (None when unset)."""
    d = config.bundle.dir
    if d is None:
        return None
    _check_bundle_dir(d)
    try:
        return ProjectionBundle.from_files(read_bundle_files(d), key)
    except (BundleError, OSError) as exc:
        raise _error(
            "bundle.dir", f"expected a bundle signed by the bundle.public_key key, received {str(d)!r}: {exc}"
        ) from None


def _check_bundle_dir(d: Path) -> None:
    if not Path(d).is_dir():
        raise _error(
            "bundle.dir", f"expected a signed bundle directory, received {str(d)!r} (missing or not a directory)"
        )


def grpc_tls_material(config: ServerConfig) -> tuple[bytes, bytes, bytes | None] | None:
    """``(key, certificate chain, client CA or None)`` PEM bytes for the gRPC listener, checked; None without TLS."""
    tls = config.grpc.tls
    if tls is None:
        return None
    cert, key = ("grpc.tls.cert", tls.cert), ("grpc.tls.key", tls.key)
    ca = ("grpc.tls.client_ca", tls.client_ca) if tls.client_ca is not None else None
    try:
        tls_context(server=True, cert=cert, key=key, ca=ca)
        return read_pem(key), read_pem(cert), read_pem(ca) if ca is not None else None
    except TlsFileError as exc:
        raise _error(exc.key, exc.message) from None


def mqtt_tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The broker connection's SSL context from ``mqtt.tls``, checked; None without TLS."""
    tls = config.mqtt.tls
    if tls is None:
        return None
    cert = ("mqtt.tls.cert", tls.cert) if tls.cert is not None else None
    key = ("mqtt.tls.key", tls.key) if tls.key is not None else None
    try:
        return tls_context(server=False, ca=("mqtt.tls.ca", tls.ca), cert=cert, key=key)
    except TlsFileError as exc:
        raise _error(exc.key, exc.message) from None


def decision_signing_key(config: ServerConfig) -> Ed25519PrivateKey | None:
    """The key that signs what doors deciding over MQTT act on (``mqtt.decision_signing_key``); None when unset."""
    path = config.mqtt.decision_signing_key
    if path is None:
        return None
    try:
        return load_private_key(path)
    except BundleError as exc:
        raise _error("mqtt.decision_signing_key", str(exc).replace("signing key ", "", 1)) from None


def device_model_material(config: ServerConfig) -> tuple[Ed25519PrivateKey, CalibrationSet] | None:
    """The device models' signing key and calibration set (``training.device_models``); None when either is unset.

    Raises
    ------
    ConfigError
        Naming ``training.device_models.signing_key`` or ``.calibration`` (both when both are wrong).
    """
    from peep.server.bundles.calibrate import CalibrationError, load_calibration

    dm = config.training.device_models
    if dm.signing_key is None or dm.calibration is None:
        return None
    problems: list[Problem] = []
    key = calibration = None
    try:
        key = load_private_key(dm.signing_key)
    except BundleError as exc:
        problems.append(Problem("training.device_models.signing_key", str(exc).replace("signing key ", "", 1)))
    try:
        calibration = load_calibration(dm.calibration)
    except CalibrationError as exc:
        problems.append(Problem("training.device_models.calibration", str(exc)))
    if problems or key is None or calibration is None:
        raise ConfigError(SOURCE, problems)
    return key, calibration


def _bundle_step(config: ServerConfig) -> Callable[[], object]:
    def step() -> None:
        try:
            key = pinned_key(config)
        except ConfigError as exc:
            # Without the key nothing verifies; a missing bundle.dir is still worth saying at the same time.
            if config.bundle.dir is not None:
                try:
                    _check_bundle_dir(config.bundle.dir)
                except ConfigError as missing:
                    exc.errors.extend(missing.errors)
            raise
        configured_bundle(config, key)

    return step


def writable_dir(path: Path) -> str | None:
    """Why the server could not create or write the directory ``path`` (None when it can)."""
    p = Path(path)
    while not p.exists():
        if p.parent == p:
            return f"no existing parent of {str(path)!r}"
        p = p.parent
    if not p.is_dir():
        return f"{str(p)!r} is not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{str(p)!r} is not writable by this user"
    return None


def check(
    config: ServerConfig,
    *,
    source: str = SOURCE,
    environ: Mapping[str, str] | None = None,
    mqtt: bool | None = None,
) -> ResolvedSecrets:
    """Every start-up check (module docstring); returns the resolved secrets.

    Parameters
    ----------
    source : str
        Where the configuration came from (the file), for the error.
    mqtt : bool, optional
        Whether the server will connect to the broker (default ``mqtt.enabled``).

    Raises
    ------
    ConfigError
        Listing every problem, each naming its key.
    """
    problems: list[Problem] = []
    secrets = ResolvedSecrets()
    try:
        secrets = resolve_secrets(config, environ)
    except ConfigError as exc:
        problems.extend(exc.errors)
    steps: list[Callable[[], object]] = [
        _bundle_step(config),
        lambda: grpc_tls_material(config),
        lambda: device_model_material(config),
    ]
    if config.mqtt.enabled if mqtt is None else mqtt:
        steps.append(lambda: mqtt_tls_context(config))
        steps.append(lambda: decision_signing_key(config))
    for step in steps:
        try:
            step()
        except ConfigError as exc:
            problems.extend(exc.errors)
    # On PostgreSQL the model registry is in the database, shared by the replicas: model_dir is not used.
    writes = [("training.model_dir", config.training.model_dir)] if config.storage.backend == "sqlite" else []
    if config.storage.backend == "sqlite":
        # SQLite in WAL mode writes next to the database file too.
        writes.append(("storage.path", config.storage.path.parent))
        if config.storage.path.is_dir():
            problems.append(
                Problem(
                    "storage.path", f"expected a database file, received the directory {str(config.storage.path)!r}"
                )
            )
    for key, path in writes:
        why = writable_dir(path)
        if why is not None:
            problems.append(Problem(key, f"expected a directory the server can create and write in, {why}"))
    if problems:
        raise ConfigError(source, problems)
    return secrets
