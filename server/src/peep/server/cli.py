"""The ``peep`` command line (backend).

Each sub-command lives in :mod:`peep.server.commands` as a module with
``register(subparsers)``; the handler returns an exit code. Exit codes:
0 success, 2 usage or configuration error (the message names the option or
field), 1 any other failure (the message says what and where).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from peep.server.errors import UsageError

#: Sub-command modules under peep.server.commands, in help order.
COMMANDS = (
    "keys",
    "bundle",
    "serve",
    "mqtt",
    "events",
    "train",
    "erase",
    "retention",
    "audit",
    "qbbs",
    "anonymize",
    "bench",
    "demo",
    "sgap",
    "console",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="peep", description="PEEP backend: bundles, server, training, audit, QBBS, benchmarks"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"peep.server.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"peep.server.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        rc: int = args.handler(args)
        return rc
    except UsageError as exc:
        print(f"peep {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"peep {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: say what failed, exit 1
        logging.getLogger("peep").debug("failure", exc_info=True)
        print(f"peep {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
