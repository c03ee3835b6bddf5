"""The ``peep`` command line (backend).

Each sub-command lives in :mod:`peep.server.commands` as a module with
``register(subparsers)``; the handler returns an exit code. Exit codes:
0 success, 2 usage or configuration error (the message names the option or
field), 1 any other failure (the message says what and where).

A serving install lacks the lab's dependencies (:mod:`peep.server.extras`):
its lab commands are listed as needing the lab install and, when run, say
which install that is (exit 2). Any other command that does not load is a
broken install, and ``peep`` says so instead of leaving the command out.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

from peep.server.errors import UsageError
from peep.server.extras import is_lab_module, lab_install, missing_lab_dependencies

#: Sub-commands in help order; each is the module ``peep.server.commands.<words joined by _>``. A command
#: of two words is an action of the first word's command, whose ``register`` returns its sub-parsers.
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
    "qbbs evaluate",
    "anonymize",
    "bench",
    "demo",
    "sgap",
    "console",
)


class CommandLoadError(RuntimeError):
    """A command's module failed to import for a reason other than a serving install's missing lab."""

    def __init__(self, command: str, module: str, cause: BaseException) -> None:
        super().__init__(
            f"the command `peep {command}` could not be loaded ({module}: {type(cause).__name__}: {cause}); "
            "this peep-server install is incomplete or broken: reinstall it"
        )


def command_module(command: str) -> str:
    """The module that implements ``command`` (``"qbbs evaluate"`` → ``peep.server.commands.qbbs_evaluate``)."""
    return "peep.server.commands." + command.replace(" ", "_")


def _needs_lab(command: str, missing: Sequence[str], args: argparse.Namespace) -> int:
    print(
        f"peep {command}: needs the lab install: {lab_install(command)} (not installed: {', '.join(missing)})",
        file=sys.stderr,
    )
    return 2


def _add_lab_placeholder(sub: Any, command: str, missing: Sequence[str]) -> None:
    """A lab command in a serving install: listed, and taking any arguments only to say what to install."""
    p = sub.add_parser(command.split()[-1], help=f"needs the lab install ({lab_install(command)})", add_help=False)
    p.set_defaults(handler=functools.partial(_needs_lab, command, missing), any_arguments=True)


def build_parser() -> argparse.ArgumentParser:
    """The ``peep`` parser with every command of :data:`COMMANDS`.

    Raises
    ------
    CommandLoadError
        When a command's module does not import, unless it is a lab command and the lab's dependencies are
        not installed (then it is listed as needing the lab install).
    """
    parser = argparse.ArgumentParser(
        prog="peep", description="PEEP backend: bundles, server, training, audit, QBBS, benchmarks"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    actions = {"": parser.add_subparsers(dest="command", metavar="COMMAND", required=True)}
    missing: dict[bool, list[str]] = {}  # looked up once per kind (the demo's, the rest of the lab's)
    for command in COMMANDS:
        sub = actions[command.rpartition(" ")[0]]
        module_name = command_module(command)
        if is_lab_module(module_name):
            demo = command == "demo"
            if demo not in missing:
                missing[demo] = missing_lab_dependencies("demo" if demo else None)
            missing_lab = missing[demo]
            if missing_lab:
                _add_lab_placeholder(sub, command, missing_lab)
                continue
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise CommandLoadError(command, module_name, exc) from exc
        command_actions = module.register(sub)
        if command_actions is not None:
            actions[command] = command_actions
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except CommandLoadError as exc:
        print(f"peep: error: {exc}", file=sys.stderr)
        return 1
    # Known arguments first, so that a lab command's placeholder can take whatever its real parser would.
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
