"""The server's configuration: one TOML file -> one typed pydantic model.

Load -> parse -> validate (Frigate's pattern): :func:`load_config` reads the
TOML, resolves relative paths against the file's directory, validates every
field (``extra="forbid"``: a typo is an error, not a silently ignored key) and
resolves secrets. Every error is reported as ``key.path: expected ...,
received ...`` by :class:`ConfigError`, which ``peep serve --validate-config``
prints one per line. Reading the file, resolving paths and wording the
problems is :mod:`peep.core.configfile`, shared with the edge agent.

Secrets never sit in the file. A secret field holds a *reference*:

``"env:NAME"``
    the environment variable ``NAME``;
``"credential:NAME"``
    the file ``$CREDENTIALS_DIRECTORY/NAME`` (systemd ``LoadCredential=``);
``"file:/path"``
    a file.

A secret read from any of them loses one trailing newline (what ``echo`` and
most secret stores add) and is refused, naming its key, if it still holds a
control character, or for a bearer token anything an HTTP/2 header cannot
carry (:func:`peep.core.configfile.clean_secret`).

Example (``deploy/server/server.toml`` has the full, commented version)::

    [server]
    listen = "0.0.0.0:50051"

    [storage]
    backend = "sqlite"
    path = "/var/lib/peep/peep.db"

    [bundle]
    public_key = "/etc/peep/site.pub"

    [auth]
    admin_token = "credential:admin-token"
    [[auth.devices]]
    id = "cam-lobby-1"
    site = "lobby"
    token_sha256 = "9f86d081884c7d65..."
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from peep.core import configfile, topics
from peep.core.mechanisms import mechanism_kind_literal
from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256
from peep.core.topics import ID_PATTERN
from peep.server.recognition.fitting import DEFAULT_PRESET, PRESETS
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
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


def _parse_secret_ref(value: Any) -> Any:
    if isinstance(value, str):
        source, sep, name = value.partition(":")
        if not sep or source not in ("env", "credential", "file") or not name:
            raise ValueError(
                "expected a secret reference 'env:NAME', 'credential:NAME' or 'file:/path' (never the secret itself)"
            )
        return {"source": source, "name": name}
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _resolve_path(value: Path | None, info: ValidationInfo) -> Path | None:
    return None if value is None else configfile.resolve_path(value, configfile.context_base_dir(info.context))


def _check_hex(v: str | None) -> str | None:
    if v is not None:
        v = v.lower()
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("expected 64 hex digits (sha256sum of the token)")
    return v


def _check_listen(value: str) -> str:
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


class TlsConfig(_Model):
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
        return _resolve_path(v, info)


class GrpcConfig(_Model):
    listen: str = Field(default="127.0.0.1:50051", description="HOST:PORT of the gRPC listener")
    max_workers: int = Field(
        default=16,
        ge=1,
        le=512,
        description=(
            "unary calls (Identify, Verify, Ingest, health checks, ...) handled at once, once their request arrived; "
            "streaming calls run on threads of their own (max_streams + 4) and can never occupy these"
        ),
    )
    grace_s: float = Field(
        default=10.0,
        ge=0.0,
        le=300.0,
        description="graceful-shutdown drain time (systemd TimeoutStopSec must be longer)",
    )
    max_stream_messages: int = Field(
        default=50_000, ge=1, le=1_000_000, description="templates per IngestStream call (acks travel in one summary)"
    )
    stream_batch: int = Field(default=512, ge=1, le=10_000, description="streamed templates committed per transaction")
    request_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=300.0,
        description=(
            "seconds a call's request message may take to arrive after its headers (a unary call, or the one "
            "request of StreamEvents and health Watch); later, the call ends with DEADLINE_EXCEEDED. A peer "
            "sending nothing, or one byte a second, holds a reader thread this long and never a worker"
        ),
    )
    max_concurrent_streams: int = Field(
        default=128,
        ge=1,
        le=10_000,
        description=(
            "RPCs running, queued for a thread or awaiting their request message, unary and streaming together, "
            "before gRPC refuses more with RESOURCE_EXHAUSTED (must exceed max_streams); also the reader threads "
            "that await unary requests"
        ),
    )
    max_streams: int = Field(
        default=32,
        ge=1,
        le=1_000,
        description=(
            "streaming calls open at once on the server (IngestStream, StreamEvents, reflection, health Watch), "
            "each on a thread of the stream pool; more are refused with RESOURCE_EXHAUSTED naming this key. "
            "Several callers together must be needed to fill it: keep it well above max_streams_per_identity"
        ),
    )
    max_streams_per_identity: int = Field(
        default=4,
        ge=1,
        le=1_000,
        description=(
            "streaming calls open at once per caller (a device, an admin credential); callers without "
            "credentials count as one caller together. At most max_streams"
        ),
    )
    stream_idle_timeout_s: float = Field(
        default=120.0,
        ge=1.0,
        le=86_400.0,
        description=(
            "a stream with no message either way for this long is ended with DEADLINE_EXCEEDED (an IngestStream "
            "keeps going while templates flow; a StreamEvents subscriber with no event re-subscribes)"
        ),
    )
    keepalive_time_s: float = Field(
        default=60.0,
        ge=1.0,
        le=7_200.0,
        description=(
            "the server pings a connection with calls in flight after this long without traffic "
            "(grpc.keepalive_time_ms); a peer that does not answer within keepalive_timeout_s is dropped and its "
            "streams end"
        ),
    )
    keepalive_timeout_s: float = Field(
        default=20.0, ge=1.0, le=600.0, description="how long the server waits for the answer to its ping"
    )
    min_client_ping_interval_s: float = Field(
        default=10.0,
        ge=1.0,
        le=3_600.0,
        description=(
            "a client pinging more often than this without sending data is disconnected after 2 strikes "
            "(GOAWAY too_many_pings; grpc.http2.min_ping_interval_without_data_ms). The edge pings every 30 s"
        ),
    )
    max_connection_idle_s: float = Field(
        default=300.0,
        ge=1.0,
        le=86_400.0,
        description="close a connection without calls for this long (grpc.max_connection_idle_ms; clients reconnect)",
    )
    max_connection_age_s: float = Field(
        default=3_600.0,
        ge=10.0,
        le=604_800.0,
        description=(
            "close every connection after this long (GOAWAY; grpc.max_connection_age_ms; clients reconnect): "
            "bounds what a stalled peer can hold, e.g. a call whose request never arrives"
        ),
    )
    max_connection_age_grace_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86_400.0,
        description="calls in flight on a connection past max_connection_age_s get this long to finish",
    )
    max_message_mb: int = Field(
        default=32,
        ge=1,
        le=1_024,
        description=(
            "largest request accepted, in MiB (grpc.max_receive_message_length; larger ones get RESOURCE_EXHAUSTED "
            "before any handler runs). PublishBundle carries a whole bundle: projector.onnx is about "
            "n_components x pixels x 4 bytes (1.5 MB with the defaults)"
        ),
    )
    reflection: Literal["off", "authenticated", "open"] = Field(
        default="off",
        description=(
            "gRPC server reflection (grpcurl, Postman): it lists every method and message. off; authenticated "
            "(any device or admin credential; true means this); open (no credentials: development only)"
        ),
    )
    device_events: Literal["site", "device", "none"] = Field(
        default="site",
        description=(
            "what StreamEvents shows a device: site (the recognitions of its registered site; a device without "
            "one sees its own), device (only its own templates' recognitions), none (devices may not subscribe). "
            "An admin sees every site"
        ),
    )
    tls: TlsConfig | None = None

    @field_validator("listen")
    @classmethod
    def check_listen(cls, v: str) -> str:
        return _check_listen(v)

    @field_validator("reflection", mode="before")
    @classmethod
    def _reflection_bool(cls, v: Any) -> Any:
        # true/false from configurations written before the three modes; true is the safe reading
        if isinstance(v, bool):
            return "authenticated" if v else "off"
        return v

    @model_validator(mode="after")
    def _stream_budgets(self) -> GrpcConfig:
        if self.max_streams_per_identity > self.max_streams:
            raise ValueError(
                f"max_streams_per_identity: expected at most max_streams ({self.max_streams}), "
                f"received {self.max_streams_per_identity}"
            )
        if self.max_concurrent_streams <= self.max_streams:
            raise ValueError(
                f"max_concurrent_streams: expected more than max_streams ({self.max_streams}) so that streams "
                f"cannot take every RPC slot, received {self.max_concurrent_streams}"
            )
        return self


class StorageConfig(_Model):
    backend: Literal["sqlite", "postgres"] = "sqlite"
    path: Path = Field(default=Path("peep.db"), description="SQLite database file (WAL mode)")
    dsn: str = Field(
        default="host=127.0.0.1 port=5432 dbname=peep user=peep-server", description="PostgreSQL conninfo (no password)"
    )
    password: SecretRef | None = Field(default=None, description="PostgreSQL password reference")
    pool_size: int = Field(default=4, ge=1, le=64)

    @field_validator("path", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve_path(v, info)

    @field_validator("password", mode="before")
    @classmethod
    def check_secret(cls, v: Any) -> Any:
        return _parse_secret_ref(v)

    @field_validator("dsn")
    @classmethod
    def check_dsn(cls, v: str) -> str:
        userinfo = v.split("://", 1)[1].split("@", 1)[0] if "://" in v and "@" in v else ""
        if "password=" in v.replace(" ", "").lower() or ":" in userinfo:
            raise ValueError(
                "expected a conninfo without a password; put the password in storage.password (env:/credential:)"
            )
        return v


class BundleConfig(_Model):
    public_key: Path = Field(description="the deployer's Ed25519 public key (PEM); every bundle must verify against it")
    dir: Path | None = Field(default=None, description="a signed bundle directory published at start-up")
    plausibility_sigmas: float = Field(
        default=40.0,
        ge=5.0,
        le=1000.0,
        description="values may exceed the mechanism's domain by this many noise standard deviations",
    )
    trusted_descriptor_models: list[str] = Field(
        default_factory=lambda: sorted(DLIB_RESNET_MODEL_SHA256.values()),
        max_length=64,
        description="SHA-256 (hex) of the descriptor model files a descriptor bundle (dlib-resnet) may name; "
        "default: face_recognition_models 0.3.0's ResNet and 5-point landmark models",
    )

    @field_validator("trusted_descriptor_models", mode="after")
    @classmethod
    def check_model_hashes(cls, v: list[str]) -> list[str]:
        for h in v:
            if not re.fullmatch(r"[0-9a-f]{64}", h):
                raise ValueError(f"expected SHA-256 hex digests (64 lower-case hex characters), received {h[:80]!r}")
        return v

    @field_validator("public_key", "dir", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve_path(v, info)


class DeviceConfig(_Model):
    id: str = Field(description="device id (the template's device_id, MQTT client/topic level, certificate CN)")
    site: str | None = Field(default=None, description="when set, the device may only send templates for this site")
    token_sha256: str | None = Field(default=None, description="hex SHA-256 of the device's bearer token")
    token: SecretRef | None = Field(default=None, description="the bearer token itself, by reference")
    enabled: bool = True
    enrolment_desk: bool = Field(
        default=False,
        description=(
            "an enrolment desk: may send ENROLL templates (enrol subjects by name) over gRPC and MQTT, except "
            "for background subjects (admin only); ordinary cameras (false) may only identify and verify"
        ),
    )

    @field_validator("token", mode="before")
    @classmethod
    def check_secret(cls, v: Any) -> Any:
        return _parse_secret_ref(v)

    @field_validator("id", "site")
    @classmethod
    def _ids(cls, v: str | None) -> str | None:
        if v is not None and not ID_PATTERN.match(v):
            raise ValueError("expected 1-128 characters [A-Za-z0-9_.:@-] starting with a letter or digit")
        return v

    @field_validator("token_sha256")
    @classmethod
    def check_hex(cls, v: str | None) -> str | None:
        return _check_hex(v)


class AuthConfig(_Model):
    admin_token: SecretRef | None = Field(default=None, description="admin bearer token, by reference")
    admin_token_sha256: str | None = Field(default=None, description="hex SHA-256 of the admin bearer token")
    admin_common_names: list[str] = Field(default_factory=list, description="client-certificate CNs with admin rights")
    devices: list[DeviceConfig] = Field(default_factory=list)
    allow_insecure: bool = Field(
        default=False,
        description=(
            "permit a gRPC listener without TLS, for development on one machine: grpc.listen must then be a "
            "loopback address (127.0.0.0/8, ::1, localhost)"
        ),
    )

    @field_validator("admin_token", mode="before")
    @classmethod
    def check_secret(cls, v: Any) -> Any:
        return _parse_secret_ref(v)

    @field_validator("admin_token_sha256")
    @classmethod
    def check_hex(cls, v: str | None) -> str | None:
        return _check_hex(v)

    @model_validator(mode="after")
    def _unique_devices(self) -> AuthConfig:
        seen: set[str] = set()
        for d in self.devices:
            if d.id in seen:
                raise ValueError(f"devices: device id {d.id!r} is listed twice")
            seen.add(d.id)
        return self


class MqttTlsConfig(_Model):
    ca: Path
    cert: Path | None = None
    key: Path | None = None

    @field_validator("ca", "cert", "key", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve_path(v, info)


_CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,99}$")


def _check_client_id(v: str) -> str:
    if not _CLIENT_ID.match(v):
        raise ValueError("expected an MQTT client id: 1-100 of [A-Za-z0-9_.:@-], starting with a letter or digit")
    return v


def _check_mount_point(v: str) -> str:
    if v and (not v.endswith("/") or v.startswith("/") or "//" in v or any(c in v for c in "+#$")):
        raise ValueError("expected empty or topic levels ending with '/', e.g. \"devices/\" (no wildcards, no '$')")
    return v


class MqttConfig(_Model):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=1883, ge=1, le=65535)
    client_id: Annotated[str, AfterValidator(_check_client_id)] | None = Field(
        default=None,
        description=(
            "this replica's MQTT client id, stable across restarts: the broker keeps the replica's persistent "
            "session (its share of the queued templates) under it. Every replica needs its own; connection i > 0 "
            "uses <client_id>-<i>. Default peep-server-<cluster.replica_id>, or peep-server-<host name> without "
            "one (set one of them where host names are not stable, e.g. containers)"
        ),
    )
    session_expiry_s: int = Field(
        default=604_800,
        ge=0,
        le=4_294_967_295,
        description=(
            "MQTT v5 session expiry: how long the broker keeps this replica's session, its subscription and the "
            "templates queued for it while the server is stopped or crash-looping (default 7 days; 0 = no "
            "persistent session: templates published while the server is down are lost; 4294967295 = never "
            "expires). docs/OPERATIONS.md"
        ),
    )
    device_mount_point: Annotated[str, AfterValidator(_check_mount_point)] = Field(
        default="",
        description=(
            "the broker's mount_point on the devices' listener (deploy/mosquitto/mosquitto.conf: \"devices/\"): "
            "device topics reach the server as <device_mount_point><topic_prefix>/<site>/<device>/…, and a device "
            "cannot join the server's shared subscription. Empty when devices and the server use one listener"
        ),
    )
    clear_retained: bool = Field(
        default=True,
        description=(
            "clear retained messages devices should not leave (the broker cannot refuse the retain flag): "
            "retained templates once stored, and retained statuses other than online/offline from a registered "
            "device at its registered site"
        ),
    )
    username: str | None = Field(default="peep-server", description="the server's broker user (deploy/mosquitto ACL)")
    password: SecretRef | None = None
    share_group: Annotated[str, AfterValidator(topics.check_share_group)] = Field(
        default="peep-server", description="MQTT v5 shared-subscription group (replicas split the load)"
    )
    topic_prefix: Annotated[str, AfterValidator(topics.check_root)] = Field(
        default=topics.DEFAULT_ROOT,
        description=(
            "topic root; devices publish to <prefix>/<site>/<device>/templates, the bundle is retained on "
            "<prefix>/bundle, refused templates go to <prefix>/deadletter. Must equal every device's "
            "mqtt.topic_prefix (and the broker ACL)"
        ),
    )
    qos: int = Field(default=1, ge=0, le=1)
    keepalive_s: int = Field(default=30, ge=5, le=3600)
    receive_maximum: int = Field(default=1000, ge=1, le=65535, description="QoS 1 messages in flight from the broker")
    connections: int = Field(
        default=4,
        ge=1,
        le=64,
        description="consumer connections in the shared-subscription group (each gets the broker's in-flight window)",
    )
    batch: int = Field(default=512, ge=1, le=10_000, description="templates committed per transaction")
    queue_size: int = Field(
        default=50_000, ge=100, le=10_000_000, description="decoded templates waiting for the writer"
    )
    require_registered_device: bool = Field(
        default=True,
        description="reject templates from devices missing from auth.devices (when that list is non-empty)",
    )
    tls: MqttTlsConfig | None = None
    decision_signing_key: Path | None = Field(
        default=None,
        description=(
            "Ed25519 private key (PEM, from 'peep keys generate'; mode 0600, the same file on every replica) that "
            "signs what doors deciding over MQTT act on: each VERIFY decision and each claim check on a device's "
            "events topic. Doors pin its public half (door.decision_public_key) and refuse anything unsigned, so a "
            "broker without the shipped ACL is not the last line. Unset: nothing is signed and such doors stay locked"
        ),
    )

    @field_validator("password", mode="before")
    @classmethod
    def check_secret(cls, v: Any) -> Any:
        return _parse_secret_ref(v)

    @field_validator("decision_signing_key", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve_path(v, info)


class TrainingConfig(_Model):
    preset: str = Field(
        default=DEFAULT_PRESET,
        description=f"recogniser preset: one of {', '.join(PRESETS)} (peep.server.recognition.fitting.PRESETS)",
    )
    model_dir: Path = Field(
        default=Path("models"),
        description="versioned model registry (SQLite only: on PostgreSQL the versions are in the database)",
    )
    mechanism_kind: MechanismKind | None = Field(
        default=None, description="train on this kind only (default: the most common domain)"
    )
    site_key_id: str | None = Field(
        default=None,
        pattern=r"^sk-[0-9a-f]{16}$",
        description=(
            "train on enrolment templates released under this site key (its public id, 'sk-' and 16 hex digits; "
            "never the key itself, which stays on the devices); needed only while templates of two keys are "
            "stored (a key rotation), since a model never mixes keys"
        ),
    )
    validation_fraction: float = Field(default=0.2, gt=0.0, lt=0.5)
    target_far: float = Field(
        default=0.01,
        gt=0.0,
        lt=0.5,
        description=(
            "false-accept rate both thresholds are set for: verify (validation impostor scores) and, with "
            "background templates, identify (share of held-out background people named as someone) unless "
            "identify_far is set"
        ),
    )
    identify_far: float | None = Field(
        default=None,
        gt=0.0,
        lt=0.5,
        description=(
            "false-positive identification rate of the open-set decision (share of strangers named as someone), "
            "if it should differ from target_far: a camera naming people from noisy templates may accept more "
            "strangers than a verification gate (none = target_far)"
        ),
    )
    unknown_reject_rate: float = Field(
        default=0.05,
        ge=0.0,
        lt=0.5,
        description=(
            "without background templates only: share of enrolled validation templates allowed to be called unknown"
        ),
    )
    background_prefix: str = Field(
        default="background:",
        description=(
            "subjects with this prefix are never identities: they form the 'unknown' class and calibrate the "
            "unknown threshold (the rest of the id names the person; validation holds out whole people)"
        ),
    )
    min_templates_per_subject: int = Field(default=2, ge=2, le=10_000)
    random_state: int = Field(default=0, ge=0, description="seed of the training split and weights (not privacy noise)")
    keep_versions: int = Field(default=5, ge=1, le=1000)
    threads: int = Field(default=1, ge=1, le=64, description="onnxruntime threads for serving")
    blas_threads: int = Field(
        default=1, ge=1, le=64, description="BLAS threads while training (more only on an idle many-core box)"
    )
    track_fusion_s: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        description=(
            "identify a track's release together with the same track's previous release, if it came within this "
            "many seconds (product rule, its own calibrated unknown threshold; post-processing, no further ε); "
            "0 = decide on each release alone. Per replica: releases of one track taken by two replicas are not fused"
        ),
    )

    @field_validator("model_dir", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve_path(v, info)

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str) -> str:
        if v not in PRESETS:
            raise ValueError(f"expected one of {', '.join(PRESETS)}")
        return v


class IngestConfig(_Model):
    """What every ingested template must satisfy besides the wire rules (peep.server.ingest.validation)."""

    max_clock_skew_s: float = Field(
        default=300.0,
        ge=0.0,
        le=86_400.0,
        description="a template's capture_time may be at most this far ahead of the server clock",
    )
    max_age_s: float = Field(
        default=30 * 86_400.0,
        ge=60.0,
        le=10 * 365 * 86_400.0,
        description=(
            "a template's capture_time may be at most this far behind the server clock (default 30 days): how "
            "long a device's spool may hold templates through an outage before they are refused. It also bounds "
            "the de-duplication ledger: a message id is remembered max_age_s + max_clock_skew_s after receipt"
        ),
    )

    @property
    def ledger_window_s(self) -> float:
        """How long a received message id must be remembered to answer any redelivery DUPLICATE.

        A template captured at ``c`` and first received at ``r`` has ``c <= r + max_clock_skew_s``;
        a redelivery at ``t`` is accepted only while ``t - c <= max_age_s``, so any redelivery that
        is not refused as too old arrives before ``r + max_age_s + max_clock_skew_s``.
        """
        return self.max_age_s + self.max_clock_skew_s


class RetentionConfig(_Model):
    days: float | None = Field(
        default=None,
        gt=0,
        description=(
            "also delete templates received more than N days ago (kept identify/verify templates have their own "
            "bound, recognition.keep_days; with include_enrolment, enrolment templates too); none: no such limit"
        ),
    )
    include_enrolment: bool = Field(
        default=False, description="also expire enrolment templates (they are training data)"
    )
    interval_s: float = Field(
        default=3600.0,
        ge=1.0,
        le=86_400.0,
        description=(
            "how often the running server deletes what is past its retention (kept templates, decisions, alerts, "
            "the de-duplication ledger); track fusion's memory is swept separately, within its own window"
        ),
    )


class RecognitionConfig(_Model):
    """What the server keeps of the templates it decides (data minimisation). docs/OPERATIONS.md

    An identify or verify template is decided in memory and, by default, never written to durable storage:
    only the decision (the recognition event) and a ledger entry of ids and times that de-duplicates
    redelivered templates are kept. Enrolment templates (consented) and the administrator's background
    population are kept until erased.
    """

    keep: Literal["none", "recognised", "all"] = Field(
        default="none",
        description=(
            "identify/verify templates written to the database after their decision: none (default: decided, then "
            "forgotten), recognised (only those of people recognised as an enrolled subject, e.g. for drift "
            "monitoring; kept keep_days), all (strangers' too, kept keep_days: a linkable record of people who never "
            "enrolled; logged as a warning at start and shown on the console's Privacy page)"
        ),
    )
    keep_days: float = Field(
        default=30.0,
        gt=0.0,
        le=3650.0,
        description="kept identify/verify templates (keep = recognised or all) are deleted this long after receipt",
    )
    events_days: float = Field(
        default=30.0,
        gt=0.0,
        le=3650.0,
        description=(
            "decisions (the recognition events kept in the database) and the console's unknown-face alerts are "
            "deleted this many days after they were made"
        ),
    )

    @property
    def keep_days_s(self) -> float:
        return self.keep_days * 86_400.0

    @property
    def events_days_s(self) -> float:
        return self.events_days * 86_400.0


class MetricsConfig(_Model):
    enabled: bool = True
    listen: str = Field(default="127.0.0.1:9464", description="HOST:PORT of the Prometheus /metrics endpoint")

    @field_validator("listen")
    @classmethod
    def check_listen(cls, v: str) -> str:
        return _check_listen(v)


class LoggingConfig(_Model):
    format: Literal["json", "text"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


_REPLICA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _check_replica_id(v: str) -> str:
    if not _REPLICA_ID.match(v):
        raise ValueError("expected a replica id: 1-63 of [A-Za-z0-9_.-], starting with a letter or digit")
    return v


class ClusterConfig(_Model):
    """Several replicas on one PostgreSQL (``storage.backend = "postgres"``; ignored on SQLite). docs/OPERATIONS.md"""

    replica_id: Annotated[str, AfterValidator(_check_replica_id)] | None = Field(
        default=None,
        description=(
            "this replica's stable name, the only key in which the server.toml of two replicas differ "
            "(deploy/cluster): it names the replica's persistent MQTT sessions (mqtt.client_id defaults to "
            "peep-server-<replica_id>) and its log lines. Keep it across restarts and upgrades; a new replica gets "
            "a new one. Unset: the host name"
        ),
    )

    check_interval_s: float = Field(
        default=2.0,
        ge=0.1,
        le=60.0,
        description=(
            "the fallback check for changes other replicas made (a promoted model, an erasure), in case a "
            "PostgreSQL NOTIFY was missed while the replica's listening connection was down"
        ),
    )
    registration_timeout_s: float = Field(
        default=30.0,
        ge=3.0,
        le=3600.0,
        description=(
            "a replica registers its replica_id in the database and renews it every third of this: a second "
            "process starting with an id whose registration is fresher refuses to start (naming the holder's host "
            "and start time); a registration without a heartbeat for this long, or of a process gone from this "
            "host, is taken over"
        ),
    )
    events: bool = Field(
        default=True,
        description=(
            "recognition events of every replica reach the StreamEvents subscribers of every replica (each "
            "replica reads the database's log of decisions, woken by PostgreSQL NOTIFY peep_events); false: a "
            "subscriber sees only the decisions its own replica made"
        ),
    )


class ConsoleConfig(_Model):
    """The operator console (``peep.server.console``): a web page served by ``peep serve`` over HTTPS with the
    gRPC listener's certificate (``grpc.tls``). Off unless the section is present. Accounts, sessions, alerts and
    the console's audit log are in the server's database; ``peep console add-user`` creates accounts. docs/OPERATIONS.md
    """

    listen: str = Field(
        default="127.0.0.1:8443",
        description="HOST:PORT of the console's HTTPS listener (0 = pick a free port); a reverse proxy may front it",
    )
    session_lifetime_s: float = Field(
        default=8 * 3600.0,
        ge=300.0,
        le=7 * 86_400.0,
        description="a login lasts at most this long (a shift), whatever the activity",
    )
    session_idle_s: float = Field(
        default=1800.0, ge=60.0, le=86_400.0, description="a session unused for this long ends (at most the lifetime)"
    )
    login_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        description=(
            "failed logins allowed per account name and per client address within login_window_s; more are "
            "refused (HTTP 429) until the window has passed, even with the right password"
        ),
    )
    login_window_s: float = Field(default=900.0, ge=10.0, le=86_400.0, description="the window of login_attempts")
    recent_events: int = Field(
        default=500, ge=10, le=100_000, description="recognitions the Live page keeps in memory (newest first)"
    )
    audit_dir: Path | None = Field(
        default=None,
        description="a `peep audit --out` directory whose audit.json the Privacy page summarises (none: not shown)",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "addresses or CIDR networks of the reverse proxies in front of the console whose X-Forwarded-For and "
            "X-Forwarded-Proto it believes, so the per-address login throttle and the audit log see the client "
            "rather than the proxy; empty: the headers are ignored"
        ),
    )
    header_timeout_s: float = Field(
        default=10.0,
        ge=1.0,
        le=300.0,
        description=(
            "a connection must deliver a whole request (head and form) within this many seconds of its TLS "
            "handshake or of its previous response, else it is closed; a request once received (a Live event "
            "stream) is not cut"
        ),
    )
    tls_handshake_timeout_s: float = Field(
        default=5.0,
        ge=1.0,
        le=60.0,
        description=(
            "a connection must complete its TLS handshake within this many seconds of being accepted, else it is "
            "closed; until then it counts toward max_connections and max_connections_per_address like any other"
        ),
    )
    max_connections: int = Field(
        default=512,
        ge=16,
        le=100_000,
        description=(
            "open connections in all; one more closes the connection that has waited longest for its request, "
            "or is refused when every connection is busy with one"
        ),
    )
    max_connections_per_address: int = Field(
        default=64,
        ge=2,
        le=100_000,
        description=(
            "open connections per client address (a reverse proxy's own address: everyone behind it shares it); "
            "one more closes that address's connection that has waited longest for its request, or is refused"
        ),
    )

    @field_validator("listen")
    @classmethod
    def check_listen(cls, v: str) -> str:
        return _check_listen(v)

    @field_validator("trusted_proxies")
    @classmethod
    def check_trusted_proxies(cls, v: list[str]) -> list[str]:
        for i, item in enumerate(v):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                # "*" would let any client name its own address and walk around the per-address throttle.
                raise ValueError(
                    f"trusted_proxies[{i}]: expected an IP address or CIDR network such as 10.0.0.5 or 10.0.0.0/24, "
                    f"received {item[:64]!r}"
                ) from None
        return v

    @field_validator("audit_dir", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve_path(v, info)

    @model_validator(mode="after")
    def _connection_budgets(self) -> ConsoleConfig:
        if self.max_connections_per_address > self.max_connections:
            raise ValueError(
                f"max_connections_per_address: expected at most max_connections ({self.max_connections}), "
                f"received {self.max_connections_per_address}"
            )
        return self


class ServerConfig(_Model):
    """The whole ``server.toml``."""

    grpc: GrpcConfig = Field(default_factory=GrpcConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    bundle: BundleConfig
    auth: AuthConfig = Field(default_factory=AuthConfig)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    recognition: RecognitionConfig = Field(default_factory=RecognitionConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    console: ConsoleConfig | None = Field(
        default=None, description="the operator console (HTTPS web page); absent = off"
    )
    qbbs: dict[str, Any] | None = Field(
        default=None, description="the soft-biometric query module's section (validated by peep.server.qbbs.config)"
    )

    @field_validator("qbbs", mode="after")
    @classmethod
    def check_qbbs(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        # Validated here so a bad [qbbs] fails `peep serve`/`peep erase` at load (exit 2) with its key
        # path; store/ledger paths resolve against server.toml's directory like every other path.
        if v is None:
            return None
        data = dict(v)
        for key in ("store_path", "ledger_path"):
            if isinstance(data.get(key), str) and data[key]:
                data[key] = str(_resolve_path(Path(data[key]), info))
        from peep.server.qbbs.config import load_config as load_qbbs_config

        load_qbbs_config(None, **data)
        return data

    @model_validator(mode="before")
    @classmethod
    def fill_sections(cls, data: Any) -> Any:
        # Missing sections are validated as {} so that their relative paths
        # are resolved against the config file like explicit ones.
        if isinstance(data, dict):
            data = dict(data)
            for name in (
                "grpc",
                "storage",
                "auth",
                "mqtt",
                "training",
                "ingest",
                "retention",
                "recognition",
                "metrics",
                "logging",
                "cluster",
            ):
                data.setdefault(name, {})
        return data

    @model_validator(mode="after")
    def _replica_names_mqtt_session(self) -> ServerConfig:
        # The replica id names the persistent MQTT sessions unless mqtt.client_id says otherwise.
        if self.cluster.replica_id is not None and self.mqtt.client_id is None:
            mqtt = self.mqtt.model_copy(update={"client_id": f"peep-server-{self.cluster.replica_id}"})
            object.__setattr__(self, "mqtt", mqtt)
        return self

    @model_validator(mode="after")
    def _tls_or_explicitly_insecure(self) -> ServerConfig:
        if self.grpc.tls is None and not self.auth.allow_insecure:
            raise ValueError(
                "grpc.tls is missing: set grpc.tls.cert/key, or auth.allow_insecure = true for loopback development"
            )
        if self.grpc.tls is None and not is_loopback_listen(self.grpc.listen):
            # Tokens and templates would cross the network in clear: insecure is for one machine only.
            raise ValueError(
                "grpc.listen/auth.allow_insecure: expected a loopback address (127.0.0.0/8, ::1 or localhost) "
                "for a listener without TLS (auth.allow_insecure = true), or grpc.tls.cert/key, "
                f"received grpc.listen = {self.grpc.listen!r}"
            )
        if self.console is not None and self.grpc.tls is None:
            # Passwords and session cookies (Secure) need HTTPS: the console never serves plain HTTP.
            raise ValueError(
                "console/grpc.tls: expected grpc.tls.cert/key (the console serves HTTPS only, with the server's "
                "certificate), received a [console] section and no grpc.tls"
            )
        if self.grpc.reflection == "open" and not is_loopback_listen(self.grpc.listen):
            # Open reflection lists every method to anyone who connects: development on one machine only.
            raise ValueError(
                'grpc.reflection/grpc.listen: expected "off" or "authenticated" on a listener that is not '
                f'loopback ("open" is for development on 127.0.0.1), received grpc.listen = {self.grpc.listen!r}'
            )
        return self


def parse_config(data: Mapping[str, Any], *, source: str = "<config>", base_dir: Path | None = None) -> ServerConfig:
    """Validate a parsed TOML mapping; raise :class:`ConfigError` listing every problem."""
    try:
        return ServerConfig.model_validate(dict(data), context={configfile.BASE_DIR: base_dir})
    except ValidationError as exc:
        raise ConfigError(source, configfile.problems_from_errors(exc.errors(include_url=False))) from None


def load_config(path: str | os.PathLike[str]) -> ServerConfig:
    """Read, parse and validate ``server.toml`` (relative paths are relative to its directory)."""
    try:
        data, base_dir = configfile.read_toml(path)
    except configfile.ConfigFileError as exc:
        raise ConfigError(str(exc.path), [configfile.Problem("(file)", exc.reason, str(exc.path))]) from None
    return parse_config(data, source=str(path), base_dir=base_dir)


def token_sha256(token: str) -> str:
    """Hex SHA-256 of a bearer token (what ``auth.devices[].token_sha256`` holds)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class ResolvedSecrets(_Model):
    """Secrets read at start-up (so a missing one fails before anything listens)."""

    admin_token_sha256: str | None = None
    device_token_sha256: dict[str, str] = Field(default_factory=dict)
    mqtt_password: SecretStr | None = None
    db_password: SecretStr | None = None


def resolve_secrets(config: ServerConfig, environ: Mapping[str, str] | None = None) -> ResolvedSecrets:
    """Resolve every secret reference; raise :class:`ConfigError` naming the key of each missing one."""
    errors: list[tuple[str, str, Any]] = []

    def get(ref: SecretRef | None, path: str, *, token: bool = False) -> SecretStr | None:
        if ref is None:
            return None
        try:
            # A token is compared with what clients send in the authorization header.
            return ref.resolve(environ, header_value=token)
        except ValueError as exc:
            errors.append((path, str(exc), str(ref)))
            return None

    admin = get(config.auth.admin_token, "auth.admin_token", token=True)
    admin_hash = token_sha256(admin.get_secret_value()) if admin is not None else config.auth.admin_token_sha256
    devices: dict[str, str] = {}
    for i, d in enumerate(config.auth.devices):
        tok = get(d.token, f"auth.devices[{i}].token", token=True)
        if tok is not None:
            devices[d.id] = token_sha256(tok.get_secret_value())
        elif d.token_sha256 is not None:
            devices[d.id] = d.token_sha256
    mqtt = get(config.mqtt.password, "mqtt.password")
    db = get(config.storage.password, "storage.password")
    if errors:
        raise ConfigError("secrets", errors)
    return ResolvedSecrets(
        admin_token_sha256=admin_hash, device_token_sha256=devices, mqtt_password=mqtt, db_password=db
    )
