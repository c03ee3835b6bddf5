"""``peep serve --config server.toml [--validate-config]``: run the recognition server."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from peep.core.configfile import Problem
from peep.server.commands._config import add_config_option, load
from peep.server.config import ConfigError, resolve_secrets


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the recognition server (gRPC, MQTT ingest, metrics)")
    add_config_option(p)
    p.add_argument(
        "--validate-config", action="store_true", help="check the configuration and secrets, print every problem, exit"
    )
    p.add_argument("--no-mqtt", action="store_true", help="do not connect to the MQTT broker (overrides mqtt.enabled)")
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    if args.validate_config:
        return validate(args.config)
    config = load(args)
    from peep.core.logs import setup_logging
    from peep.server.app import ServerApp, default_plugins
    from peep.server.commands._config import services as make_services

    setup_logging(level=config.logging.level, fmt=config.logging.format)
    services = make_services(config)
    app = ServerApp(config, services=services, plugins=default_plugins(), enable_mqtt=False if args.no_mqtt else None)
    return app.run()


def validate(path: str) -> int:
    from peep.server.config import load_config

    try:
        config = load_config(path)
        resolve_secrets(config)
    except ConfigError as exc:
        print(f"{exc.source}: invalid configuration", file=sys.stderr)
        for problem in exc.errors:
            print(f"  {problem}", file=sys.stderr)
        return 2
    problems = []
    for label, p in (("bundle.public_key", config.bundle.public_key), ("bundle.dir", config.bundle.dir)):
        if p is not None and not p.exists():
            problems.append(f"  {Problem(label, 'expected an existing path', str(p))}")
    if config.grpc.tls is not None:
        for label, p in (
            ("grpc.tls.cert", config.grpc.tls.cert),
            ("grpc.tls.key", config.grpc.tls.key),
            ("grpc.tls.client_ca", config.grpc.tls.client_ca),
        ):
            if p is not None and not p.is_file():
                problems.append(f"  {Problem(label, 'expected a readable file', str(p))}")
    if config.qbbs is not None:
        try:
            from peep.server.qbbs.config import load_config as load_qbbs_config
        except ModuleNotFoundError:
            problems.append("  qbbs: the section is set but the QBBS module is not installed")
        else:
            try:
                load_qbbs_config(path)
            except ValueError as exc:
                problems.append(f"  qbbs: {exc}")
    if problems:
        print(f"{path}: invalid configuration", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return 2
    print(
        f"{path}: configuration OK (storage {config.storage.backend}, gRPC {config.grpc.listen}, "
        f"TLS {'on' if config.grpc.tls else 'OFF'}, MQTT {'on' if config.mqtt.enabled else 'off'}, "
        f"{len(config.auth.devices)} devices)"
    )
    return 0
