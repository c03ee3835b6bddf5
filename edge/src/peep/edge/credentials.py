"""Secrets (MQTT password, gRPC bearer token) from systemd credentials or the environment.

Secrets never live in the TOML file: the config names where to find them.
``*_credential`` names a file in ``$CREDENTIALS_DIRECTORY`` (systemd's
``LoadCredential=``), ``*_env`` names an environment variable. A credential
that is configured but cannot be found is a :class:`ConfigError` naming the
field.

What is read is checked once, here (:func:`peep.core.configfile.clean_secret`):
one trailing newline is removed (``echo token > file`` and most secret stores
add one), and a secret still holding a control character, or a token holding
anything an HTTP/2 header cannot carry, is a :class:`ConfigError` naming the
field — rather than a gRPC ``INTERNAL "Invalid metadata"`` on every send.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from peep.core.configfile import clean_secret
from peep.edge.errors import ConfigError


def resolve_secret(
    *,
    credential: str | None,
    env: str | None,
    field: str,
    environ: Mapping[str, str] | None = None,
    header_value: bool | None = None,
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
    header_value : bool, optional
        The secret travels in an HTTP/2 header (only printable ASCII); by
        default true for a ``*.token`` field.
    """
    environ = os.environ if environ is None else environ
    header = field.endswith(".token") if header_value is None else header_value

    def checked(value: str, key: str, where: str) -> str:
        try:
            return clean_secret(value, header_value=header)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}, in {where}") from None

    if credential:
        cred_dir = environ.get("CREDENTIALS_DIRECTORY")
        if cred_dir:
            path = Path(cred_dir) / credential
            if path.is_file():
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise ConfigError(
                        f"{field}_credential: expected a readable UTF-8 credential file, received {str(path)!r} "
                        f"({getattr(exc, 'strerror', None) or type(exc).__name__})"
                    ) from None
                return checked(text, f"{field}_credential", f"the credential file {path}")
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
        return checked(value, f"{field}_env", f"${env}")
    return None
