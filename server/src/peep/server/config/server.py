"""The whole ``server.toml``: who may connect (devices, admin), metrics and logs, the model of the file, its
loading and its secrets."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from peep.core import configfile
from peep.core.topics import ID_PATTERN
from peep.server.config.base import (
    ConfigError,
    ConfigModel,
    SecretRef,
    check_hex,
    check_listen,
    is_loopback_listen,
    parse_secret_ref,
    resolve_path,
)
from peep.server.config.console import ConsoleConfig
from peep.server.config.data import (
    BundleConfig,
    IngestConfig,
    RecognitionConfig,
    RetentionConfig,
    StorageConfig,
    TrainingConfig,
)
from peep.server.config.transports import ClusterConfig, GrpcConfig, HomeAssistantConfig, MqttConfig
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


class DeviceConfig(ConfigModel):
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
    door: bool = Field(
        default=False,
        description=(
            "a door deciding on the device: GetDeviceModel gives it the model's class key, which turns a badge's "
            "subject into its column; cameras (false) get the model without it and cannot test a name"
        ),
    )
    signing_key: str | None = Field(
        default=None,
        description=(
            "the device's public signing key, 'ed25519:<base64>' as `peep-edge device-key` prints it: every "
            "template from the device must then carry its signature (a door deciding over MQTT needs one)"
        ),
    )

    @field_validator("signing_key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        if v is not None:
            from peep.core.signing import parse_public_key_text

            parse_public_key_text(v)
        return v

    @field_validator("token", mode="before")
    @classmethod
    def check_secret(cls, v: Any) -> Any:
        return parse_secret_ref(v)

    @field_validator("id", "site")
    @classmethod
    def _ids(cls, v: str | None) -> str | None:
        if v is not None and not ID_PATTERN.match(v):
            raise ValueError("expected 1-128 characters [A-Za-z0-9_.:@-] starting with a letter or digit")
        return v

    @field_validator("token_sha256")
    @classmethod
    def check_hex(cls, v: str | None) -> str | None:
        return check_hex(v)


class AuthConfig(ConfigModel):
    admin_token: SecretRef | None = Field(default=None, description="admin bearer token, by reference")
    admin_token_sha256: str | None = Field(default=None, description="hex SHA-256 of the admin bearer token")
    admin_common_names: list[str] = Field(default_factory=list, description="client-certificate CNs with admin rights")
    devices: list[DeviceConfig] = Field(default_factory=list)
    require_device_signatures: bool = Field(
        default=False,
        description=(
            "refuse every MQTT template that does not carry its device's signature (each device then needs "
            "signing_key); off, a device without a registered key is taken on its topic alone, except a "
            "door's VERIFY, which always needs it"
        ),
    )
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
        return parse_secret_ref(v)

    @field_validator("admin_token_sha256")
    @classmethod
    def check_hex(cls, v: str | None) -> str | None:
        return check_hex(v)

    @model_validator(mode="after")
    def _unique_devices(self) -> AuthConfig:
        seen: set[str] = set()
        for d in self.devices:
            if d.id in seen:
                raise ValueError(f"devices: device id {d.id!r} is listed twice")
            seen.add(d.id)
        return self


class MetricsConfig(ConfigModel):
    enabled: bool = True
    listen: str = Field(default="127.0.0.1:9464", description="HOST:PORT of the Prometheus /metrics endpoint")

    @field_validator("listen")
    @classmethod
    def check_listen(cls, v: str) -> str:
        return check_listen(v)


class LoggingConfig(ConfigModel):
    format: Literal["json", "text"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


class ServerConfig(ConfigModel):
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
    home_assistant: HomeAssistantConfig = Field(default_factory=HomeAssistantConfig)
    console: ConsoleConfig | None = Field(
        default=None, description="the operator console (HTTPS web page); absent = off"
    )
    qbbs: dict[str, Any] | None = Field(
        default=None, description="the soft-biometric query module's section (validated by peep.server.config.qbbs)"
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
                data[key] = str(resolve_path(Path(data[key]), info))
        from peep.server.config.qbbs import load_qbbs_config

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
                "home_assistant",
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


class ResolvedSecrets(ConfigModel):
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
