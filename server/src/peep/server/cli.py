"""The ``peep`` command line (backend).

Each sub-command lives in :mod:`peep.server.commands` as a module with
``register(subparsers)``; the handler returns an exit code. Exit codes:
0 success, 2 usage or configuration error (the message names the option or
field), 1 any other failure (the message says what and where).

Other distributions add commands through the entry point group
:data:`ENTRY_POINT_GROUP` (``peep-lab`` adds the audit, the benchmarks, the
demo, ...): peep-server names none of them. A name with a dot
(``qbbs.evaluate``) is an action of the command before it. A command that is
installed but does not load is a broken install, and ``peep`` says so instead
of leaving the command out; a command that is not installed says where the
lab's commands come from.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from peep.server.errors import UsageError

#: Sub-commands in help order; each is the module ``peep.server.commands.<name>``, whose ``register`` returns
#: its own sub-parsers when it has actions (``qbbs``).
COMMANDS = ("keys", "bundle", "serve", "mqtt", "events", "train", "erase", "subjects", "retention", "qbbs", "console")
#: Where installed distributions declare the commands they add (``name = "module:register"``).
ENTRY_POINT_GROUP = "peep.commands"
#: What to install for the commands that come with the lab.
LAB_INSTALL = "pip install ./lab (from a checkout of PEEP) or pip install peep-lab"


class CommandLoadError(RuntimeError):
    """A command's module failed to import: the install that provides it is incomplete or broken."""

    def __init__(self, command: str, module: str, cause: BaseException, distribution: str = "peep-server") -> None:
        super().__init__(
            f"the command `peep {command}` could not be loaded ({module}: {type(cause).__name__}: {cause}); "
            f"this {distribution} install is incomplete or broken: reinstall it"
        )


def command_module(command: str) -> str:
    """The module that implements the serving ``command`` (``"retention"`` → ``peep.server.commands.retention``)."""
    return "peep.server.commands." + command.replace(" ", "_")


def added_commands() -> list[EntryPoint]:
    """The commands other installed distributions add (:data:`ENTRY_POINT_GROUP`), in name order."""
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", "") or "the distribution that declares it")


def build_parser() -> argparse.ArgumentParser:
    """The ``peep`` parser: every command of :data:`COMMANDS`, then every :func:`added_commands` one.

    Raises
    ------
    CommandLoadError
        When a command's module does not import or an added command names an action of a command that does
        not exist.
    """
    parser = argparse.ArgumentParser(
        prog="peep", description="PEEP backend: bundles, server, training, QBBS (with peep-lab: the audit, "
        "benchmarks, the demo)"
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    actions: dict[str, Any] = {"": parser.add_subparsers(dest="command", metavar="COMMAND", required=True)}
    for command in COMMANDS:
        module_name = command_module(command)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise CommandLoadError(command, module_name, exc) from exc
        command_actions = module.register(actions[""])
        if command_actions is not None:
            actions[command] = command_actions
    for ep in added_commands():
        parent, _, _ = ep.name.rpartition(".")
        command = ep.name.replace(".", " ")
        if parent.replace(".", " ") not in actions:
            raise CommandLoadError(
                command, ep.value, LookupError(f"no command `peep {parent}` to add it to"), _distribution(ep)
            )
        try:
            register = ep.load()
        except Exception as exc:
            raise CommandLoadError(command, ep.value, exc, _distribution(ep)) from exc
        command_actions = register(actions[parent.replace(".", " ")])
        if command_actions is not None:
            actions[command] = command_actions
    return parser


def _first_word(argv: Sequence[str]) -> str | None:
    """The command ``argv`` asks for (its first argument that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def _not_installed(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """What to say when ``argv`` names no installed command and nothing adds commands (a serving install)."""
    word = _first_word(argv)
    if word is None or added_commands():
        return None
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if word in sub.choices:
        return None
    return (
        f"peep: `{word}` is not a command of peep-server ({', '.join(sub.choices)}); the lab's commands (the "
        f"audit, anonymisation, benchmarks, the demo, ...) come with peep-lab: {LAB_INSTALL}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except CommandLoadError as exc:
        print(f"peep: error: {exc}", file=sys.stderr)
        return 1
    words = sys.argv[1:] if argv is None else list(argv)
    missing = _not_installed(parser, words)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    args = parser.parse_args(words)
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
