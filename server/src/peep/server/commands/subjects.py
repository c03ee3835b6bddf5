"""``peep subjects home-assistant --config server.toml``: who is shown in Home Assistant, by their own consent.

``--subject S --opt-in --name N`` records that an enrolled subject agreed to be shown in Home Assistant under the
display name ``N`` (or changes the name); ``--subject S --opt-out`` withdraws it; ``--list`` lists who opted in. Off
by default: nobody is shown who was not opted in. A serving server publishes the change within its publisher's
refresh (10 s; docs/HOME_ASSISTANT.md): the person's "last seen" sensor appears, or is emptied. Each change and
each refusal is written to the console's audit log as done by ``cli`` from ``local``; the display name itself is not
(the audit log outlives an erasure, and the name is the person's, kept only while they agree).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from peep.server.commands._config import add_config_option, load, say
from peep.server.errors import UsageError

#: The console's audit log's action for a change of who is shown in Home Assistant (the console's too).
AUDIT_ACTION = "home-assistant"


def register(sub: Any) -> None:
    p = sub.add_parser("subjects", help="per-subject settings: who is shown in Home Assistant (home-assistant)")
    cmds = p.add_subparsers(dest="subjects_command", metavar="ACTION", required=True)
    ha = cmds.add_parser(
        "home-assistant",
        help="opt an enrolled subject in to Home Assistant under a display name they agreed to, opt them out, or "
        "list who opted in (off by default)",
    )
    add_config_option(ha)
    ha.add_argument("--subject", help="the enrolled subject's id (with --opt-in or --opt-out)")
    what = ha.add_mutually_exclusive_group(required=True)
    what.add_argument("--opt-in", action="store_true", help="show the subject (a 'last seen' sensor; needs --name)")
    what.add_argument("--opt-out", action="store_true", help="stop showing the subject; their entity is emptied")
    what.add_argument("--list", action="store_true", help="list the subjects who opted in")
    ha.add_argument("--name", help="the display name the subject agreed to be shown under (1-64 characters)")
    ha.set_defaults(handler=home_assistant)


def home_assistant(args: argparse.Namespace) -> int:
    from peep.core.exceptions import WireError
    from peep.core.wire import check_subject_id
    from peep.server.storage import check_display_name

    config = load(args)
    if args.list:
        if args.subject is not None or args.name is not None:
            raise UsageError("--list: lists everyone; expected no --subject or --name with it")
        store = _open(config)
        try:
            people = store.home_assistant_people()
        finally:
            store.close()
        for p in sorted(people.values(), key=lambda p: p.subject):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(p.opted_in_at))
            say(f"{p.subject}\t{p.display_name}\topted in {when} UTC")
        if not people:
            say("nobody opted in to be shown in Home Assistant")
        return 0
    if args.subject is None:
        raise UsageError("--subject: expected the subject's id with --opt-in or --opt-out")
    try:
        subject = check_subject_id(args.subject, "--subject")
    except WireError as exc:
        raise UsageError(str(exc)) from None
    if args.opt_out and args.name is not None:
        raise UsageError("--name: expected none with --opt-out")
    if args.opt_in:
        if args.name is None:
            raise UsageError("--name: expected the display name the subject agreed to be shown under, with --opt-in")
        try:
            name = check_display_name(args.name, "--name")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    store = _open(config)
    try:
        if args.opt_out:
            was = store.clear_home_assistant_person(subject)
            _audit(store, subject, "opted out" if was else "opted out: was not opted in")
            say(f"subject {subject!r} " + ("is no longer shown in Home Assistant" if was else "was not opted in"))
            return 0
        prefix = config.training.background_prefix
        if subject.startswith(prefix) or not store.count_templates(subject=subject, purpose="enroll"):
            _audit(store, subject, "refused: not an enrolled subject")
            print(f"peep subjects home-assistant: --subject: {subject!r} is not an enrolled subject", file=sys.stderr)
            return 1
        new = store.set_home_assistant_person(subject, name, time.time())
        _audit(store, subject, "opted in" if new else "display name changed")
    finally:
        store.close()
    on = config.home_assistant.enabled
    say(
        f"subject {subject!r} " + ("opted in to" if new else "renamed in") + f" Home Assistant as {name!r}"
        + ("" if on else " (home_assistant.enabled is false: nothing is published until it is turned on)")
    )  # fmt: skip
    return 0


def _open(config: Any) -> Any:
    from peep.server.config import ConfigError, resolve_secrets
    from peep.server.storage import open_store

    try:
        secrets = resolve_secrets(config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    pw = secrets.db_password.get_secret_value() if secrets.db_password else None
    return open_store(config.storage, password=pw)


def _audit(store: Any, subject: str, outcome: str) -> None:
    from peep.server.console.store import ConsoleStore

    ConsoleStore(store).audit("cli", AUDIT_ACTION, subject, outcome, "local")
