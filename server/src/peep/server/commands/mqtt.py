"""``peep mqtt retire --config server.toml``: end the broker sessions of a replica taken out of service.

A replica's persistent MQTT sessions (``mqtt.client_id``, ``<client_id>-1`` …)
stay members of the shared subscription after the replica stops: the broker
keeps queueing their share of the templates until ``mqtt.session_expiry_s``
and then deletes it. Run this with the replica stopped (another replica, or
the same configuration on any host that reaches the broker and the database):
what the sessions hold is stored and acknowledged, then each session is ended.
A running server does the same by itself for the sessions above its
``mqtt.connections`` (after that number was lowered). docs/OPERATIONS.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from peep.server.commands._config import add_config_option, load, say, services
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("mqtt", help="the MQTT broker sessions of this replica (docs/OPERATIONS.md)")
    actions = p.add_subparsers(dest="mqtt_action", metavar="ACTION", required=True)
    r = actions.add_parser(
        "retire", help="store what this replica's broker sessions hold, then end them (run with the replica stopped)"
    )
    add_config_option(r)
    r.add_argument(
        "--from-connection",
        type=int,
        default=0,
        metavar="I",
        help="retire the sessions of connections I, I+1, … only (default 0: all of them)",
    )
    r.set_defaults(handler=retire)


def retire(args: argparse.Namespace) -> int:
    if not 0 <= args.from_connection < 64:
        raise UsageError(f"--from-connection: expected 0 to 63, received {args.from_connection}")
    config = load(args)
    if not config.mqtt.enabled:
        raise UsageError("mqtt.enabled: expected true (this configuration has no broker sessions), received false")
    s = services(config)
    from peep.server.transport.mqtt import MqttBridge

    pw = s.secrets.mqtt_password.get_secret_value() if s.secrets.mqtt_password else None
    bridge = MqttBridge(config.mqtt, s, password=pw)
    try:
        # settle_s: a replica still running takes its session back within about a second (its
        # reconnect delay); that is noticed before the session is unsubscribed.
        done = bridge.retire_sessions(args.from_connection, settle_s=3.0)
    finally:
        bridge.stop(drain_timeout=5.0)
        s.close()
    for cid, n in done.items():
        say(f"mqtt retire: {cid}: {n} templates stored, session ended")
    if not done:
        say(f"mqtt retire: no session of {bridge.connection_client_id(args.from_connection)} on the broker")
    return 0
