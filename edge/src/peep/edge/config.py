"""The agent's one configuration file: TOML -> typed, validated model.

Load -> parse -> validate (Frigate's pattern): :func:`load_config` reads the
TOML, validates it into :class:`EdgeConfig` (pydantic v2, ``extra="forbid"``
everywhere, so a misspelt key is an error, not a silent default) and raises
:class:`~peep.edge.errors.ConfigError` listing every problem as
``key.path: expected ..., received ...``. Reading the file, resolving paths
and wording the problems is :mod:`peep.core.configfile`, shared with the server.

Privacy-relevant rules enforced here:

- The device's own file sets the mechanism kind, ε and δ. There is no seed
  field anywhere (``extra="forbid"`` rejects one), so the configuration can
  never select the seeded (simulation) sampler; nothing received over the
  network can change these values either.
- Secrets are not accepted in the file: ``mqtt.password`` / ``grpc.token``
  are rejected with a message naming ``*_env`` / ``*_credential``.
- Checks that need the bundle (``privacy.track_budget`` must allow at least
  one release, whose per-vector ε depends on the bundle's nc and bounds) run
  in :func:`peep.edge.policy.check_budget_allows_release` once the bundle is loaded.

Relative paths are resolved against the directory of the config file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from peep.core import configfile, topics
from peep.core.mechanisms import mechanism_class, mechanism_kind_literal
from peep.core.release import check_keyed_kind
from peep.core.topics import ID_PATTERN
from peep.core.wire import MIN_EPSILON
from peep.edge.errors import ConfigError
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
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


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    return configfile.resolve_path(value, configfile.context_base_dir(info.context))


ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]


def _check_id(value: str) -> str:
    if not ID_PATTERN.match(value):
        raise ValueError("expected 1-128 characters [A-Za-z0-9_.:@-] starting with a letter or digit")
    return value


Identifier = Annotated[str, AfterValidator(_check_id)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceConfig(_Section):
    """Who this device is and where it keeps its state."""

    id: Identifier = Field(description="device id; becomes an MQTT topic level and the template's device_id")
    site: Identifier = Field(description="site id; an MQTT topic level")
    state_dir: ConfigPath = Field(
        default=Path("/var/lib/peep-edge"),
        description="spool, privacy ledger and accepted bundle updates live here",
    )
    signing_key: ConfigPath | None = Field(
        default=None,
        description=(
            "the device's Ed25519 signing key (32 bytes, made on first start; default <state_dir>/device.key): "
            "every template is signed with it, `peep-edge device-key` prints the public half for the server"
        ),
    )


class BundleConfig(_Section):
    """The signed projection bundle and the deployer's pinned public key."""

    path: ConfigPath = Field(
        description="bundle directory (projector.onnx, metadata.json, manifest.json, signature.sig)"
    )
    public_key: ConfigPath = Field(description="Ed25519 public key (PEM) every bundle must verify against")
    accept_updates: bool = Field(
        default=True,
        description="take newer bundles from the retained <mqtt.topic_prefix>/bundle topic if they verify",
    )


class PrivacyConfig(_Section):
    """Mechanism and release policy. Only this file sets them (never the bundle or the server)."""

    mechanism: MechanismKind = Field(default="peep", description="the local-DP mechanism kind (see docs/PRIVACY.md)")
    # Below MIN_EPSILON the server refuses the templates (and soft traits) at ingest: refuse it here.
    epsilon: float = Field(
        ge=MIN_EPSILON,
        le=1e6,
        description="the mechanism's ε (per coordinate for the per-coordinate kinds peep/peep-raw)",
    )
    delta: float = Field(default=0.0, ge=0.0, lt=1.0, description="δ, only for kinds that take one (gaussian-l2)")
    track_budget: float = Field(gt=0.0, description="per-vector ε a single track may spend in total")
    releases_per_window: int = Field(default=1, ge=1, le=1000, description="k: releases per track per window")
    window_seconds: float = Field(default=60.0, gt=0.0, le=86400.0)
    min_track_frames: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="frames a face must be tracked before it may be released",
    )
    device_budget: float | None = Field(
        default=None,
        gt=0.0,
        description="optional lifetime per-vector ε cap of the device (persistent ledger)",
    )
    enroll_budget: float | None = Field(
        default=None,
        gt=0.0,
        description="optional per-vector ε cap per enrolled subject; none = --count decides",
    )

    site_key: ConfigPath | None = Field(
        default=None,
        description=(
            "the site's template key file (peep-edge site-key generate; mode 0600): templates are rotated by a "
            "secret the server never holds before the noise, so another site's or a thief's copy links to "
            "nothing; only for mechanisms on the unit sphere or an L2 ball (privunit, privunit-g, gaussian-l2), "
            "whose ε and δ it leaves unchanged"
        ),
    )

    @model_validator(mode="after")
    def _keyed_mechanism(self) -> PrivacyConfig:
        if self.site_key is not None:
            try:
                check_keyed_kind(self.mechanism)
            except ValueError as exc:
                raise ValueError(f"privacy.site_key: {exc}") from None
        return self

    @model_validator(mode="after")
    def _epsilon_and_delta_fit_the_mechanism(self) -> PrivacyConfig:
        cls = mechanism_class(self.mechanism)
        if self.epsilon > cls.max_epsilon:
            raise ValueError(
                f"privacy.epsilon: expected <= {cls.max_epsilon:g} for mechanism {self.mechanism!r}, "
                f"received {self.epsilon:g}"
            )
        takes_delta = cls.takes_delta
        if takes_delta and self.delta <= 0.0:
            raise ValueError(
                f"privacy.delta: expected 0 < delta < 1 for mechanism {self.mechanism!r}, received {self.delta}"
            )
        if not takes_delta and self.delta != 0.0:
            raise ValueError(
                f"privacy.delta: expected 0 for the pure-ε mechanism {self.mechanism!r}, received {self.delta}"
            )
        return self


class SoftConfig(_Section):
    """On-device age and gender under local DP (needs ``peep-edge[soft]``)."""

    enabled: bool = False
    age_epsilon: float = Field(
        default=1.0, ge=MIN_EPSILON, le=100.0, description="ε of the bounded Laplace age release"
    )
    gender_epsilon: float = Field(
        default=1.0, ge=MIN_EPSILON, le=100.0, description="ε of randomized response on gender"
    )
    age_max: float = Field(default=100.0, gt=0.0, le=150.0, description="ages are clipped to [0, age_max]")


class CaptureConfig(_Section):
    """Where frames come from."""

    source: int | str = Field(description="camera index, video file, rtsp://|http(s):// URL, or a folder of images")
    max_fps: float = Field(default=15.0, ge=0.0, le=240.0, description="frame-rate cap; 0 = as fast as possible")
    loop: bool = Field(
        default=False,
        description="a video file only: play it again from the start at its end, times going on (soak runs)",
    )
    width: int | None = Field(default=None, ge=16, le=8192, description="requested camera width")
    height: int | None = Field(default=None, ge=16, le=8192, description="requested camera height")
    rtsp_transport: Literal["tcp", "udp"] = Field(
        default="tcp",
        description=(
            "rtsp:// streams: RTP inside the RTSP connection (tcp: nothing lost, one port through firewalls, NAT "
            "and restreamers) or in UDP datagrams (udp: a little less latency on a clean wired LAN; a lost "
            "packet smears the frame until the next key frame)"
        ),
    )
    reconnect_min_s: float = Field(default=1.0, gt=0.0, le=600.0)
    reconnect_max_s: float = Field(
        default=5.0,
        gt=0.0,
        le=3600.0,
        description=(
            "the longest wait between attempts to re-open a camera or stream (the wait doubles from "
            "reconnect_min_s up to this); after it returns, frames may wait this long plus the open (about 2 s "
            "for RTSP) before they flow"
        ),
    )
    reconnect_attempts: int = Field(
        default=0,
        ge=0,
        description="give up (exit 1, systemd restarts) after this many failed re-opens; 0 = never",
    )

    @field_validator("source")
    @classmethod
    def _source_not_empty(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError("expected a camera index >= 0")
        if isinstance(v, str) and not v.strip():
            raise ValueError("expected a camera index, video file, URL or image folder, received an empty string")
        return v

    @model_validator(mode="after")
    def _loop_needs_a_file(self) -> CaptureConfig:
        # A camera or a stream has no end to loop from; a folder against a file is told when it is opened.
        src = str(self.source).strip()
        if self.loop and (isinstance(self.source, int) or src.isdigit() or "://" in src or src.startswith("/dev/")):
            raise ValueError(f"capture.loop: expected a video file as capture.source, received {src[:64]!r}")
        return self


class DetectorConfig(_Section):
    """Face detection: YuNet where its file is found (``auto``, the default), else Haar; or one named."""

    kind: Literal["auto", "haar", "yunet", "hog"] = Field(
        default="auto",
        description=(
            "auto: YuNet from model_path, or from the folder peep-edge models fetch writes to, and Haar (with a "
            "warning) when neither holds the file; haar, hog (dlib) or yunet: that detector"
        ),
    )
    detect_width: int | None = Field(
        default=320,
        ge=32,
        le=4096,
        description="downscale frames to this width before Haar or HOG detection",
    )
    upsample: int = Field(
        default=1,
        ge=0,
        le=3,
        description="HOG only: times the frame is doubled first (each halves the smallest face, 80 px at 0)",
    )
    scale_factor: float = Field(default=1.2, gt=1.0, le=2.0)
    min_neighbors: int = Field(default=5, ge=0, le=50)
    min_size: int = Field(default=64, ge=8, le=2048, description="smallest face, pixels of the full frame")
    model_path: ConfigPath | None = Field(
        default=None, description="YuNet ONNX file (kind 'yunet', or 'auto'; peep-edge models fetch yunet writes one)"
    )
    score_threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    refine: bool = Field(
        default=True,
        description="before a release, re-detect at full size with the bundle's detector settings",
    )
    threads: int = Field(default=1, ge=1, le=64, description="OpenCV threads")

    @model_validator(mode="after")
    def _model_matches_kind(self) -> DetectorConfig:
        if self.kind == "yunet" and self.model_path is None:
            raise ValueError("detector.model_path: expected a YuNet ONNX file for kind 'yunet', received none")
        if self.kind not in ("yunet", "auto") and self.model_path is not None:
            raise ValueError(
                f"detector.kind: expected 'yunet' or 'auto' when detector.model_path is set, received {self.kind!r}"
            )
        # a written-out config carries every field at its default: only a changed upsample is a mistake
        if self.kind != "hog" and self.upsample != 1:
            raise ValueError(f"detector.upsample: expected only with detector.kind 'hog', received kind {self.kind!r}")
        return self


class DescriptorConfig(_Section):
    """Where a descriptor bundle's network (dlib's ResNet) runs."""

    backend: Literal["onnxruntime", "dlib"] = Field(
        default="onnxruntime",
        description=(
            "onnxruntime: dlib's network as an ONNX graph built from the same file and checked against dlib "
            "before use (several times faster); dlib: dlib's own network (the reference)"
        ),
    )
    threads: int = Field(default=1, ge=1, le=64, description="onnxruntime threads per batch of faces")
    cache_dir: ConfigPath | None = Field(
        default=None,
        description=(
            "where the ONNX graph is kept, keyed by the network file's SHA-256 (default: descriptor/ in "
            "$PEEP_CACHE_DIR, systemd's $CACHE_DIRECTORY, or ~/.cache/peep); built there at first use"
        ),
    )


class TrackerConfig(_Section):
    iou_threshold: float = Field(default=0.3, gt=0.0, lt=1.0)
    max_distance: float = Field(
        default=0.6, ge=0.0, le=5.0, description="centroid fallback: max distance in box widths"
    )
    max_age_s: float = Field(default=1.0, gt=0.0, le=60.0, description="drop a track unseen for this long")
    max_size_ratio: float = Field(
        default=1.5,
        gt=1.0,
        le=4.0,
        description="a face continues a track only if the two boxes' heights are within this ratio (a near face "
        "does not take over a far one's track)",
    )
    appearance: bool = Field(
        default=True,
        description="with a descriptor bundle, compare faces' descriptors where positions leave the tracker unsure "
        "(people crossing, a face hidden and seen again); the descriptors stay in the device's memory",
    )
    max_appearance: float = Field(
        default=0.6,
        gt=0.0,
        le=2.0,
        description="a face whose descriptor lies further than this from a track's never continues it",
    )
    reid_s: float = Field(
        default=3.0,
        ge=0.0,
        le=60.0,
        description="a face may resume a track ended less than this long ago if its descriptor is within "
        "reid_appearance (0: never)",
    )
    reid_appearance: float = Field(default=0.45, gt=0.0, le=2.0, description="see reid_s")
    refresh_s: float = Field(
        default=0.5, gt=0.0, le=60.0, description="a track's descriptor is renewed from its face this often"
    )
    hold_s: float = Field(
        default=0.3, ge=0.0, le=60.0,
        description="a face refused by the only track it could continue (half covered, turning) is held out of "
        "every track, nothing released, for up to this long before it starts its own (0: never; <= max_age_s)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _within_limits(self) -> TrackerConfig:
        if self.hold_s > self.max_age_s:
            raise ValueError(f"tracker.hold_s: expected <= max_age_s ({self.max_age_s}), received {self.hold_s}")
        if self.reid_appearance > self.max_appearance:
            raise ValueError(
                f"tracker.reid_appearance: expected <= tracker.max_appearance ({self.max_appearance}), "
                f"received {self.reid_appearance}"
            )
        return self


class SpoolConfig(_Section):
    """Templates waiting for their receiver's ack; delivered ones are deleted from the file, WAL included."""

    path: ConfigPath | None = Field(default=None, description="SQLite file; default <state_dir>/spool.sqlite3")
    max_messages: int = Field(default=50_000, ge=10, le=10_000_000, description="per transport")
    synchronous: Literal["normal", "full"] = Field(
        default="full", description="'full' fsyncs every insert (survives power loss)"
    )
    drain_timeout_s: float = Field(default=10.0, ge=0.0, le=600.0, description="on stop, wait this long for acks")
    dead_letter_days: float = Field(
        default=7.0,
        gt=0.0,
        le=365.0,
        description=(
            "templates a receiver refused for good (dead letters, payload included) are deleted this many days "
            "after the refusal; list or purge them sooner with peep-edge deadletter"
        ),
    )
    dead_letter_max: int = Field(
        default=1000, ge=1, le=100_000, description="at most this many dead letters are kept (the newest)"
    )


def _reject_secrets(data: Any, section: str, names: tuple[str, ...]) -> Any:
    if isinstance(data, dict):
        for name in names:
            if name in data:
                raise ValueError(
                    f"{section}.{name}: secrets are not accepted in the config file; set "
                    f"{section}.{name}_credential (systemd LoadCredential) or {section}.{name}_env"
                )
    return data


class MqttConfig(_Section):
    enabled: bool = True
    host: str = Field(default="localhost", min_length=1)
    port: int = Field(default=8883, ge=1, le=65535)
    tls: bool = True
    ca_file: ConfigPath | None = Field(default=None, description="CA bundle; system CAs when unset")
    cert_file: ConfigPath | None = Field(default=None, description="client certificate (mutual TLS)")
    key_file: ConfigPath | None = None
    client_id: str | None = Field(default=None, description="default peep-edge-<site>-<device>")
    topic_prefix: Annotated[str, AfterValidator(topics.check_root)] = Field(
        default=topics.DEFAULT_ROOT,
        description=(
            "topic root; the device publishes to <prefix>/<site>/<device>/templates and reads <prefix>/bundle. "
            "Must equal the server's mqtt.topic_prefix (and the broker ACL), or no template reaches the server"
        ),
    )
    username: str | None = Field(default=None, description="default: the device id when a password is configured")
    password_env: str | None = None
    password_credential: str | None = None
    keepalive_s: int = Field(default=30, ge=5, le=3600)
    reconnect_min_s: int = Field(default=1, ge=1, le=600)
    reconnect_max_s: int = Field(
        default=5,
        ge=1,
        le=3600,
        description=(
            "the longest wait between attempts to reach the broker again (the wait doubles from reconnect_min_s "
            "up to this); after the broker returns, templates may wait this long in the spool before they flow"
        ),
    )
    max_inflight: int = Field(default=20, ge=1, le=1000)
    connect_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    report_interval_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86_400.0,
        description=(
            "seconds between the device's retained report (releases, suppressed releases, per-vector ε budgets; "
            "no face, track or subject) on <root>/<site>/<device>/report; 0 = none"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        return _reject_secrets(data, "mqtt", ("password",))

    @model_validator(mode="after")
    def _cert_pair(self) -> MqttConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("mqtt.cert_file/mqtt.key_file: expected both (client certificate) or neither")
        if not self.tls and (self.ca_file or self.cert_file):
            raise ValueError("mqtt.tls: expected true when ca_file/cert_file are set, received false")
        return self


class GrpcConfig(_Section):
    enabled: bool = False
    target: str = Field(default="localhost:50051", min_length=1, description="host:port of the server")
    tls: bool = True
    ca_file: ConfigPath | None = None
    cert_file: ConfigPath | None = None
    key_file: ConfigPath | None = None
    server_name: str | None = Field(default=None, description="TLS name to expect when it differs from the host")
    token_env: str | None = None
    token_credential: str | None = None
    deadline_s: float = Field(default=10.0, gt=0.0, le=600.0, description="deadline of every call")
    batch_size: int = Field(default=64, ge=1, le=10_000)
    retry_min_s: float = Field(default=0.5, gt=0.0, le=600.0)
    retry_max_s: float = Field(default=60.0, gt=0.0, le=3600.0)
    reconnect_max_s: float = Field(
        default=5.0,
        gt=0.0,
        le=3600.0,
        description=(
            "the longest wait between the channel's attempts to reach the server again (the wait grows from 1 s "
            "up to this); after the server or the network returns, templates may wait this long in the spool"
        ),
    )
    report_interval_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86_400.0,
        description=(
            "without [mqtt]: seconds between the device's report sent with ReportDevice (releases, suppressed "
            "releases, per-vector ε budgets; no face, track or subject), and one at shutdown; 0 = none "
            "(with [mqtt] enabled the report is the retained MQTT message instead)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        return _reject_secrets(data, "grpc", ("token",))

    @model_validator(mode="after")
    def _cert_pair(self) -> GrpcConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("grpc.cert_file/grpc.key_file: expected both (client certificate) or neither")
        if not self.tls and (self.ca_file or self.cert_file):
            raise ValueError("grpc.tls: expected true when ca_file/cert_file are set, received false")
        return self


class MetricsConfig(_Section):
    port: int = Field(default=9108, ge=0, le=65535, description="Prometheus endpoint; 0 = off")
    bind: str = "127.0.0.1"


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class DoorConfig(_Section):
    """A door this device opens on a verified claim (fail-secure: see peep.edge.door)."""

    enabled: bool = False
    decision: Literal["grpc", "mqtt", "device"] = Field(
        default="grpc",
        description=(
            "who decides a claim: the server, answering the device's gRPC Verify call or by its signed message on "
            "the device's MQTT events topic naming the claim's nonce; or 'device': this device, with the site's "
            "signed device model on its clean projection (no template released, no round trip; works while the "
            "server is away; locked without a valid model)"
        ),
    )
    fuse_soft_traits: bool = Field(
        default=False,
        description=(
            "decide on the face fused with the template's soft traits (the server's QBBS VerifyFused; needs "
            "soft.enabled and decision = 'grpc'); the trait queries are charged to the claimed subject"
        ),
    )
    lock: Literal["gpio", "mqtt-relay", "command"] = Field(
        default="gpio", description="what drives the strike or relay: a GPIO pin, an MQTT relay, or commands"
    )
    gpio_pin: int = Field(default=17, ge=0, le=63, description="BCM pin of the relay (lock = 'gpio')")
    gpio_active_high: bool = Field(
        default=False, description="whether the relay closes on a high output (most relay boards are active low)"
    )
    relay_convention: Literal["tasmota", "shelly", "custom"] = Field(
        default="tasmota", description="lock = 'mqtt-relay': the relay's topic convention"
    )
    relay_name: str = Field(
        default="door-relay", pattern=ID_PATTERN.pattern, description="the relay's topic name (Tasmota) or id (Shelly)"
    )
    relay_topic: str | None = Field(
        default=None, max_length=256, description="relay_convention = 'custom': the command topic (Home Assistant)"
    )
    relay_payload_on: str = Field(default="ON", max_length=64)
    relay_payload_off: str = Field(default="OFF", max_length=64)
    open_command: list[str] = Field(default_factory=list, max_length=64, description="lock = 'command': argv to open")
    close_command: list[str] = Field(default_factory=list, max_length=64, description="lock = 'command': argv to lock")
    open_s: float = Field(default=3.0, gt=0.0, le=60.0, description="seconds the lock stays open after an accept")
    decision_timeout_s: float = Field(
        default=5.0, gt=0.0, le=60.0, description="seconds from a claim to its deadline; no decision by then: locked"
    )
    lockout_failures: int = Field(
        default=5,
        ge=1,
        le=1000,
        description=(
            "claims the server refused (it verified the face and said no) that lock a subject out; an outage "
            "(unreachable, timeout) or no face never counts"
        ),
    )
    lockout_window_s: float = Field(default=300.0, gt=0.0, le=86400.0, description="the lock-out's window")
    max_claims_per_minute: int = Field(
        default=10,
        ge=1,
        le=600,
        description=(
            "claims taken in any 60 s; more are refused at once (throttled) before anything is asked or released, "
            "so a flood of badge reads is dropped, not queued"
        ),
    )
    epsilon_per_hour: float = Field(
        default=1600.0,
        gt=0.0,
        le=1e7,
        description=(
            "per-vector ε the door may release in any hour (all its VERIFY templates, soft traits included; "
            "kept in the ledger, so a restart does not reset it); a claim that would pass it is refused "
            "(door_budget). The default is 100 claims an hour at ε 16"
        ),
    )
    subject_epsilon_per_hour: float = Field(
        default=96.0,
        gt=0.0,
        le=1e7,
        description=(
            "per-vector ε the door may release in any hour for claims of one subject (six claims at ε 16); a "
            "claim that would pass it is refused (subject_budget). Counted in memory: a restart forgets it"
        ),
    )
    decision_public_key: ConfigPath | None = Field(
        default=None,
        description=(
            "decision = 'mqtt': the public half (PEM) of the server's mqtt.decision_signing_key. The door acts "
            "only on decisions and claim checks signed by it, so a client that can write the events topic still "
            "cannot forge one"
        ),
    )
    insecure_broker: bool = Field(
        default=False,
        description=(
            "decision = 'mqtt' on a broker connection without TLS or without credentials: refused unless this is "
            "true (then warned at every start and shown on the console). Decisions stay signed either way"
        ),
    )
    report_lock: bool = Field(
        default=False,
        description=(
            "state the lock on <root>/<site>/<door>/lock over [mqtt], retained: locked, unlocked, or jammed when "
            "driving it failed (Home Assistant's lock entity, docs/HOME_ASSISTANT.md); the door also states its "
            "own status and last will there. Off: the door needs no broker unless its decision or lock does"
        ),
    )
    home_assistant_open: bool = Field(
        default=False,
        description=(
            "open when Home Assistant's lock says UNLOCK (or OPEN) on <root>/<site>/<door>/lock_command, for open_s "
            "like an accepted claim; refused while any subject is locked out here, while a claim waits, or past "
            "max_claims_per_minute, and each opening is sent as an access record naming who asked. Needs "
            "report_lock and a broker ACL line letting one Home Assistant account write that topic "
            "(docs/HOME_ASSISTANT.md). Off: the door never reads the topic"
        ),
    )

    @model_validator(mode="after")
    def _lock_is_complete(self) -> DoorConfig:
        if self.home_assistant_open and not self.report_lock:
            raise ValueError(
                "door.home_assistant_open: expected door.report_lock = true beside it (the lock's state and the "
                "door's availability are what Home Assistant's lock shows), received report_lock = false"
            )
        if self.lock == "command" and not (self.open_command and self.close_command):
            raise ValueError("door.open_command/close_command: expected both argument lists for lock = 'command'")
        if self.lock == "mqtt-relay" and self.relay_convention == "custom" and not self.relay_topic:
            raise ValueError("door.relay_topic: expected the command topic for relay_convention = 'custom'")
        if self.relay_topic is not None and any(c in self.relay_topic for c in "+#\x00"):
            raise ValueError(
                f"door.relay_topic: expected a topic without wildcards, received {self.relay_topic[:64]!r}"
            )
        return self


class RecognitionConfig(_Section):
    """Where a camera's identifications are decided (docs/DECISIONS.md)."""

    decide: Literal["server", "device"] = Field(default="server", description=(
        "'server': release a perturbed template per track window and let the server decide; 'device': decide "
        "here with the site's signed device model on the clean projection and release only the label, "
        "randomised at epsilon_label (without a valid model the camera releases nothing)"))  # fmt: skip
    epsilon_label: float = Field(default=8.0, gt=0.0, le=40.0, description=(
        "ε of one decision's label (k-ary randomized response over the model's subjects plus unknown); "
        "per appearance, per coordinate and per vector alike"))  # fmt: skip
    fuse_frames: int = Field(default=3, ge=1, le=30, description=(
        "frames of a track whose clean projections are averaged before deciding (no ε: nothing leaves)"))  # fmt: skip
    choose_from: int | None = Field(default=None, ge=1, le=60, description=(
        "frames of a track looked at before deciding, at least fuse_frames: the fuse_frames with the largest faces "
        "among them are averaged (a later first decision for a sharper one; default fuse_frames)"))  # fmt: skip
    min_face_score: float | None = Field(default=None, ge=0.0, le=1.0, description=(
        "fuse and decide only on faces the detector scored at least this (YuNet's score falls as a face is "
        "covered: the track waits for fuse_frames such faces); none: every face"))  # fmt: skip
    model_public_key: ConfigPath | None = Field(default=None, description=(
        "Ed25519 public key (PEM) every device model must verify against (default: bundle.public_key)"))  # fmt: skip
    model_check_s: float = Field(default=300.0, ge=1.0, le=86400.0, description=(
        "seconds between two asks for a newer device model over gRPC (MQTT also hears it at once)"))  # fmt: skip

    @property
    def frames_looked_at(self) -> int:
        """Frames of a track a camera looks at before its first decision (``choose_from``, else ``fuse_frames``)."""
        return self.choose_from or self.fuse_frames

    @model_validator(mode="after")
    def _choice_holds_the_fused(self) -> RecognitionConfig:
        if self.choose_from is not None and self.choose_from < self.fuse_frames:
            raise ValueError(f"recognition.choose_from: expected >= fuse_frames ({self.fuse_frames}), "
                             f"received {self.choose_from}")  # fmt: skip
        return self


class EdgeConfig(_Section):
    """The whole agent configuration (one TOML file)."""

    device: DeviceConfig
    bundle: BundleConfig
    privacy: PrivacyConfig
    capture: CaptureConfig
    soft: SoftConfig = SoftConfig()
    detector: DetectorConfig = DetectorConfig()
    descriptor: DescriptorConfig = DescriptorConfig()
    tracker: TrackerConfig = TrackerConfig()
    spool: SpoolConfig = SpoolConfig()
    mqtt: MqttConfig = MqttConfig()
    grpc: GrpcConfig = GrpcConfig()
    metrics: MetricsConfig = MetricsConfig()
    log: LogConfig = LogConfig()
    door: DoorConfig = DoorConfig()
    recognition: RecognitionConfig = RecognitionConfig()

    @property
    def decides_on_device(self) -> bool:
        """Whether this device needs a device model: a camera deciding itself, or a door deciding itself."""
        return self.recognition.decide == "device" or (self.door.enabled and self.door.decision == "device")

    @model_validator(mode="after")
    def _checks(self) -> EdgeConfig:
        if not (self.mqtt.enabled or self.grpc.enabled):
            raise ValueError("mqtt.enabled/grpc.enabled: expected at least one transport enabled, received none")
        if self.capture.reconnect_max_s < self.capture.reconnect_min_s:
            raise ValueError(
                "capture.reconnect_max_s: expected >= capture.reconnect_min_s "
                f"({self.capture.reconnect_min_s}), "
                f"received {self.capture.reconnect_max_s}"
            )
        if self.door.enabled and self.door.decision == "grpc" and not self.grpc.enabled:
            raise ValueError("door.decision: expected grpc.enabled for decision = 'grpc', received grpc disabled")
        if self.door.enabled and self.door.decision == "mqtt" and not self.mqtt.enabled:
            raise ValueError("door.decision: expected mqtt.enabled for decision = 'mqtt', received mqtt disabled")
        if self.door.enabled and self.door.decision == "mqtt":
            if self.door.decision_public_key is None:
                raise ValueError(
                    "door.decision_public_key: expected the server's decision key (the public half of its "
                    "mqtt.decision_signing_key) for decision = 'mqtt', received none"
                )
            weak = self.broker_weaknesses()
            if weak and not self.door.insecure_broker:
                raise ValueError(
                    f"door.decision: expected a broker connection with TLS and credentials for decision = 'mqtt', "
                    f"received {' and '.join(weak)}; a client on such a broker can read every claim and write "
                    "decisions (set door.insecure_broker = true to run anyway: decisions are still signed)"
                )
        fusable = self.soft.enabled and self.door.decision == "grpc"
        if self.door.enabled and self.door.fuse_soft_traits and not fusable:
            raise ValueError(
                "door.fuse_soft_traits: expected soft.enabled and door.decision = 'grpc' (the fused decision is the "
                "server's VerifyFused answer on the template's own soft traits)"
            )
        if self.door.enabled and self.door.lock == "mqtt-relay" and not self.mqtt.enabled:
            raise ValueError("door.lock: expected mqtt.enabled for lock = 'mqtt-relay', received mqtt disabled")
        if self.privacy.enroll_budget is not None and not math.isfinite(self.privacy.enroll_budget):
            raise ValueError("privacy.enroll_budget: expected a finite number")
        return self

    @property
    def spool_path(self) -> Path:
        return self.spool.path or self.device.state_dir / "spool.sqlite3"

    @property
    def ledger_path(self) -> Path:
        return self.device.state_dir / "ledger.sqlite3"

    @property
    def device_key_path(self) -> Path:
        """The device's signing key (peep.edge.device_key)."""
        return self.device.signing_key or self.device.state_dir / "device.key"

    @property
    def door_memory_path(self) -> Path:
        """The door's throttle, lock-outs and per-subject spends (peep.edge.door_memory), beside the ledger."""
        return self.device.state_dir / "door.sqlite3"

    @property
    def mqtt_client_id(self) -> str:
        return self.mqtt.client_id or f"peep-edge-{self.device.site}-{self.device.id}"

    def broker_weaknesses(self) -> list[str]:
        """What the broker connection lacks (``"no TLS"``, ``"no credentials"``); empty when it has both.

        Credentials are a password (``mqtt.password_env``/``password_credential``) or a client certificate.
        """
        m = self.mqtt
        weak = [] if m.tls else ["no TLS"]
        if not (m.password_env or m.password_credential or (m.tls and m.cert_file)):
            weak.append("no credentials")
        return weak


def parse_config(data: dict[str, Any], *, base_dir: Path | None = None) -> EdgeConfig:
    """Validate an already parsed TOML mapping (raises :class:`ConfigError`)."""
    try:
        return EdgeConfig.model_validate(data, context={configfile.BASE_DIR: base_dir})
    except ValidationError as exc:
        problems = configfile.problems_from_errors(
            exc.errors(include_url=False),
            unknown_key="unknown key (check the spelling; seeds and secrets are never accepted)",
        )
        raise ConfigError([(p.key, p.detail) for p in problems]) from None


def load_config(path: str | Path) -> EdgeConfig:
    """Read, parse and validate a TOML configuration file."""
    try:
        data, base_dir = configfile.read_toml(path)
    except configfile.ConfigFileError as exc:
        raise ConfigError(f"--config: {exc.reason}, received {str(exc.path)!r}") from None
    return parse_config(data, base_dir=base_dir)
