"""``peep serve --config server.toml [--validate-config]``: run the recognition server.

Start-up and ``--validate-config`` run the same checks
(:func:`peep.server.startup.check`: secrets, the pinned key and the
configured bundle verified against it, TLS files, the directories the server
writes), so a configuration that validates is one that starts; either way a
problem exits 2 naming its key.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from peep.server.commands._config import add_config_option, load
from peep.server.config import ConfigError
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the recognition server (gRPC, MQTT ingest, metrics)")
    add_config_option(p)
    p.add_argument(
        "--validate-config",
        action="store_true",
        help="run every start-up check (secrets, bundle, keys, TLS files), print every problem, exit",
    )
    p.add_argument("--no-mqtt", action="store_true", help="do not connect to the MQTT broker (overrides mqtt.enabled)")
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    if args.validate_config:
        return validate(args.config, mqtt=False if args.no_mqtt else None)
    config = load(args)
    from peep.core.logs import setup_logging
    from peep.server import startup
    from peep.server.app import ServerApp
    from peep.server.services import Services

    try:
        secrets = startup.check(config, source=str(args.config), mqtt=False if args.no_mqtt else None)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    setup_logging(level=config.logging.level, fmt=config.logging.format)
    try:
        services = Services(config, secrets=secrets, host_qbbs=True)  # what [qbbs] declares is hosted
    except ConfigError as exc:  # [qbbs] without the files it needs
        raise UsageError(str(exc)) from None
    app = ServerApp(config, services=services, enable_mqtt=False if args.no_mqtt else None)
    return app.run()


def validate(path: str, *, mqtt: bool | None = None) -> int:
    from peep.server import startup
    from peep.server.config import load_config

    try:
        config = load_config(path)
        startup.check(config, source=path, mqtt=mqtt)
    except ConfigError as exc:
        print(f"{exc.source}: invalid configuration", file=sys.stderr)
        for problem in exc.errors:
            print(f"  {problem}", file=sys.stderr)
        return 2
    print(
        f"{path}: configuration OK (storage {config.storage.backend}, gRPC {config.grpc.listen}, "
        f"TLS {'on' if config.grpc.tls else 'OFF'}, MQTT {'on' if config.mqtt.enabled else 'off'}, "
        f"{len(config.auth.devices)} devices)"
    )
    return 0
