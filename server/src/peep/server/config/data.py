"""What the server stores, trains on and keeps: storage, the pinned bundle, training, ingest, recognition, retention."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256
from peep.server.config.base import ConfigModel, MechanismKind, SecretRef, parse_secret_ref, resolve_path
from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

#: The recogniser presets ``training.preset`` may name. Names only: the presets themselves are
#: :data:`peep.server.recognition.fitting.PRESETS`, whose keys tests/server/test_presets.py keeps equal to
#: these, so that the configuration (the lowest layer) validates a name without importing recognition.
PRESET_NAMES: tuple[str, ...] = ("paper", "default", "reference", "lda", "logreg", "auto")
#: What a server trains unless ``training.preset`` says otherwise.
DEFAULT_PRESET = "default"


class StorageConfig(ConfigModel):
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
        return resolve_path(v, info)

    @field_validator("password", mode="before")
    @classmethod
    def check_secret(cls, v: Any) -> Any:
        return parse_secret_ref(v)

    @field_validator("dsn")
    @classmethod
    def check_dsn(cls, v: str) -> str:
        userinfo = v.split("://", 1)[1].split("@", 1)[0] if "://" in v and "@" in v else ""
        if "password=" in v.replace(" ", "").lower() or ":" in userinfo:
            raise ValueError(
                "expected a conninfo without a password; put the password in storage.password (env:/credential:)"
            )
        return v


class BundleConfig(ConfigModel):
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
        return resolve_path(v, info)


class DeviceModelsConfig(ConfigModel):
    """Signed device models, for devices that decide on their own clean projection (none without both files).

    Every promoted recogniser is also issued to them, re-issued on a schedule and at once on an erasure
    (docs/OPERATIONS.md, "Decisions on the device: issuing device models").
    """

    signing_key: Path | None = Field(
        default=None,
        description=(
            "Ed25519 private key (PEM, from 'peep keys generate'; mode 0600, the same file on every replica) that "
            "signs every device model; devices pin its public half (their recognition.model_public_key, by default "
            "the bundle's key). Unset: no device model is issued, and the server says so at start"
        ),
    )
    calibration: Path | None = Field(
        default=None,
        description=(
            "the calibration set every device model carries: clean, unkeyed projections of public faces no model "
            "is trained on, written by 'peep bundle calibrate' for the bundle in use. Unset: no device model is "
            "issued, and the server says so at start"
        ),
    )
    fpir: float = Field(
        default=0.01,
        gt=0.0,
        lt=0.5,
        description=(
            "the share of strangers a device's identification may name as someone (after the label mechanism), "
            "which it sets its own threshold for on the calibration set"
        ),
    )
    far: float = Field(
        default=0.001,
        gt=0.0,
        lt=0.5,
        description="the share of impostor claims a door deciding on the device may accept",
    )
    valid_s: float = Field(
        default=7 * 86_400.0,
        ge=600.0,
        le=365 * 86_400.0,
        description=(
            "seconds a device model may decide after it was issued (default 7 days): a device that cannot hear "
            "from the server for longer, or whose site key was retired, stops deciding"
        ),
    )
    reissue_s: float = Field(
        default=86_400.0,
        ge=60.0,
        le=30 * 86_400.0,
        description=(
            "seconds between two issues of the serving model (a new serial, a new expiry; default 1 day), so a "
            "device in touch never holds an expired one"
        ),
    )

    @field_validator("signing_key", "calibration", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(v, info)

    @model_validator(mode="after")
    def _reissued_before_expiry(self) -> DeviceModelsConfig:
        if self.reissue_s >= self.valid_s:
            raise ValueError(
                f"reissue_s: expected less than valid_s ({self.valid_s:g} s: a device would hold an expired model "
                f"until the next issue), received {self.reissue_s:g}"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether device models are issued (both a signing key and a calibration set are configured)."""
        return self.signing_key is not None and self.calibration is not None


class TrainingConfig(ConfigModel):
    preset: str = Field(
        default=DEFAULT_PRESET,
        description=f"recogniser preset: one of {', '.join(PRESET_NAMES)} (peep.server.recognition.presets.PRESETS)",
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

    device_models: DeviceModelsConfig = Field(
        default_factory=DeviceModelsConfig,
        description="signed device models for devices that decide on their own clean projection",
    )

    @field_validator("model_dir", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(v, info)

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str) -> str:
        if v not in PRESET_NAMES:
            raise ValueError(f"expected one of {', '.join(PRESET_NAMES)}")
        return v


class IngestConfig(ConfigModel):
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


class RetentionConfig(ConfigModel):
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


class RecognitionConfig(ConfigModel):
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
    claim_checks_per_s: float = Field(
        default=5.0,
        gt=0.0,
        le=10_000.0,
        description=(
            "a door's questions before it releases (is the claimed subject enrolled?) answered per second per "
            "device; more are refused RESOURCE_EXHAUSTED, so a hostile device cannot list the enrolled at wire speed"
        ),
    )
    claim_checks_burst: int = Field(
        default=20, ge=1, le=100_000, description="claim checks a device may ask at once before the rate applies"
    )

    @property
    def keep_days_s(self) -> float:
        return self.keep_days * 86_400.0

    @property
    def events_days_s(self) -> float:
        return self.events_days * 86_400.0
