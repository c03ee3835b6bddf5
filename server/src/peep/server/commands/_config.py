"""Shared option and config loading for the server commands."""

from __future__ import annotations

import argparse
import sys

from peep.server.config import ConfigError, ServerConfig, load_config
from peep.server.errors import UsageError


def add_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="server.toml", help="server configuration file")


def load(args: argparse.Namespace) -> ServerConfig:
    """Load the config or raise UsageError listing every problem (exit 2)."""
    try:
        return load_config(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def services(config: ServerConfig, *, host_qbbs: bool = False):  # type: ignore[no-untyped-def]
    """Services for a one-shot command (secrets resolved; errors are exit 2); ``host_qbbs``: see Services."""
    from peep.server.config import resolve_secrets
    from peep.server.services import Services

    try:
        secrets = resolve_secrets(config)
        return Services(config, secrets=secrets, host_qbbs=host_qbbs)
    except ConfigError as exc:  # a secret, the pinned key (peep.server.startup.pinned_key), [qbbs]'s files
        raise UsageError(str(exc)) from None


def say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)
