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

from peep.server.config.base import (
    ConfigError,
    MechanismKind,
    SecretRef,
    TlsConfig,
    is_loopback_listen,
)
from peep.server.config.console import ConsoleConfig
from peep.server.config.data import (
    BundleConfig,
    DeviceModelsConfig,
    IngestConfig,
    RecognitionConfig,
    RetentionConfig,
    StorageConfig,
    TrainingConfig,
)
from peep.server.config.server import (
    AuthConfig,
    DeviceConfig,
    LoggingConfig,
    MetricsConfig,
    ResolvedSecrets,
    ServerConfig,
    load_config,
    parse_config,
    resolve_secrets,
    token_sha256,
)
from peep.server.config.transports import ClusterConfig, GrpcConfig, HomeAssistantConfig, MqttConfig, MqttTlsConfig

__all__ = [
    "AuthConfig", "BundleConfig", "ClusterConfig", "ConfigError", "ConsoleConfig", "DeviceConfig",
    "DeviceModelsConfig", "GrpcConfig", "HomeAssistantConfig",
    "IngestConfig", "LoggingConfig", "MechanismKind", "MetricsConfig", "MqttConfig", "MqttTlsConfig",
    "RecognitionConfig", "ResolvedSecrets", "RetentionConfig", "SecretRef", "ServerConfig", "StorageConfig",
    "TlsConfig", "TrainingConfig", "is_loopback_listen", "load_config", "parse_config", "resolve_secrets",
    "token_sha256",
]  # fmt: skip
