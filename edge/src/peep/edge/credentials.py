"""Secrets (MQTT password, gRPC bearer token) from systemd credentials or the environment.

Secrets never live in the TOML file: the config names where to find them.
``*_credential`` names a file in ``$CREDENTIALS_DIRECTORY`` (systemd's
``LoadCredential=``), ``*_env`` names an environment variable. A credential
that is configured but cannot be found is a :class:`ConfigError` naming the
field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from peep.edge.errors import ConfigError


def resolve_secret(
    *,
    credential: str | None,
    env: str | None,
    field: str,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The secret, or ``None`` when neither source is configured.

    Parameters
    ----------
    credential : str or None
        File name inside ``$CREDENTIALS_DIRECTORY``; tried first.
    env : str or None
        Environment variable name; tried when no credential is configured or
        systemd did not provide one.
    field : str
        Config path prefix for messages (``mqtt.password``).
    """
    environ = os.environ if environ is None else environ
    if credential:
        cred_dir = environ.get("CREDENTIALS_DIRECTORY")
        if cred_dir:
            path = Path(cred_dir) / credential
            if path.is_file():
                return path.read_text(encoding="utf-8").rstrip("\r\n")
        if not env or env not in environ:
            raise ConfigError(
                f"{field}_credential: expected a systemd credential {credential!r} in "
                f"$CREDENTIALS_DIRECTORY ({cred_dir or 'not set'}), received none"
                + (f" (and ${env} is not set)" if env else "")
            )
    if env:
        value = environ.get(env)
        if value is None:
            raise ConfigError(f"{field}_env: expected the environment variable {env} to hold the secret, it is not set")
        if not value:
            raise ConfigError(f"{field}_env: expected a non-empty secret in ${env}, received an empty string")
        return value
    return None
