"""The server's connections: the gRPC listener, the MQTT broker, the replicas of a cluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from peep.core import topics
from peep.server.config.base import ConfigModel, SecretRef, TlsConfig, check_listen, parse_secret_ref, resolve_path
from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


class GrpcConfig(ConfigModel):
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
        return check_listen(v)

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


class MqttTlsConfig(ConfigModel):
    ca: Path
    cert: Path | None = None
    key: Path | None = None

    @field_validator("ca", "cert", "key", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(v, info)


_CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,99}$")


def _check_client_id(v: str) -> str:
    if not _CLIENT_ID.match(v):
        raise ValueError("expected an MQTT client id: 1-100 of [A-Za-z0-9_.:@-], starting with a letter or digit")
    return v


def _check_mount_point(v: str) -> str:
    if v and (not v.endswith("/") or v.startswith("/") or "//" in v or any(c in v for c in "+#$")):
        raise ValueError("expected empty or topic levels ending with '/', e.g. \"devices/\" (no wildcards, no '$')")
    return v


class MqttConfig(ConfigModel):
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
    reconnect_max_s: int = Field(
        default=5,
        ge=1,
        le=300,
        description=(
            "the longest wait between attempts to reach the broker again (the wait doubles from 1 s up to this); "
            "after the broker returns the server may wait this long before templates flow again"
        ),
    )
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
        return parse_secret_ref(v)

    @field_validator("decision_signing_key", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(v, info)


def _check_device_id(v: str) -> str:
    if not topics.ID_PATTERN.match(v):
        raise ValueError("expected a device id: 1-128 of [A-Za-z0-9_.:@-], starting with a letter or digit")
    return v


class HomeAssistantConfig(ConfigModel):
    """Home Assistant's MQTT discovery: the site's doors and cameras as entities, published by the server."""

    enabled: bool = Field(
        default=False,
        description=(
            "publish Home Assistant discovery for every registered device at its site (a door's lock and access "
            "events, a camera's recognition events, each one's availability) and its events; never a probability or a "
            "template, and no name but of a subject who opted in (peep subjects home-assistant; docs/HOME_ASSISTANT.md)"
        ),
    )
    discovery_prefix: Annotated[str, AfterValidator(topics.check_root)] = Field(
        default="homeassistant", description="Home Assistant's discovery prefix (its MQTT integration's setting)"
    )
    doors: list[Annotated[str, AfterValidator(_check_device_id)]] = Field(
        default_factory=list,
        description=(
            "device ids shown as doors besides those registered with auth.devices[].door = true (a door the server "
            "decides for needs no device model key, so it need not be registered as one)"
        ),
        max_length=10_000,
    )
    recent_minutes: int = Field(
        default=15,
        ge=1,
        le=1440,
        description=(
            "the window of each camera's sensor of the distinct enrolled people it recognised recently: a count "
            "only, never who, kept in the server's memory only and each person dropped as they leave the window; "
            "with several replicas each counts only the decisions it made"
        ),
    )


_REPLICA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _check_replica_id(v: str) -> str:
    if not _REPLICA_ID.match(v):
        raise ValueError("expected a replica id: 1-63 of [A-Za-z0-9_.-], starting with a letter or digit")
    return v


class ClusterConfig(ConfigModel):
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
