"""``peep erase --config server.toml --subject ID [--no-retrain]``: erase a subject.

Exit code 1, with nothing changed, when nothing holds the subject (:class:`~peep.server.services.NoSuchSubject`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from peep.server.commands._config import add_config_option, load, say, services
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("erase", help="erase a subject's templates and soft traits, then retrain")
    add_config_option(p)
    p.add_argument("--subject", required=True, help="subject id to erase")
    p.add_argument(
        "--no-retrain", action="store_true", help="do not retrain (the current model stops naming the subject anyway)"
    )
    p.set_defaults(handler=erase)
    register_retire_key(sub)


def register_retire_key(sub: Any) -> None:
    p = sub.add_parser(
        "retire-key",
        help="after a site key rotation: delete every template released under the old key and every kept model "
        "trained under it (refused while the serving model uses it)",
    )
    add_config_option(p)
    p.add_argument("--key-id", required=True, help="the old key's public id (sk-...), or 'none' for unkeyed templates")
    p.set_defaults(handler=retire_key)


def retire_key(args: argparse.Namespace) -> int:
    import re

    from peep.server.services import KeyInUse

    key_id = "" if args.key_id == "none" else args.key_id
    if key_id and not re.fullmatch(r"sk-[0-9a-f]{16}", key_id):
        raise UsageError(f"--key-id: expected 'sk-' and 16 hex digits, or 'none', received {args.key_id[:64]!r}")
    s = services(load(args))
    try:
        r = s.retire_key(key_id)
    except KeyInUse as exc:
        print(f"peep retire-key: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        s.close()
    say(
        f"site key {key_id or '(none)'} retired: {r.templates_deleted} templates deleted"
        + (
            f"; purged model versions {', '.join(r.versions_purged)}"
            if r.versions_purged
            else "; no kept model used it"
        )
    )
    return 0


def erase(args: argparse.Namespace) -> int:
    from peep.core.exceptions import WireError
    from peep.core.wire import check_subject_id
    from peep.server.services import NoSuchSubject

    try:
        check_subject_id(args.subject, "--subject")
    except WireError as exc:
        raise UsageError(str(exc)) from None  # exit code 2
    s = services(load(args))
    try:
        hooks = _qbbs_hooks(s)
        r = s.erase_subject(args.subject, retrain=not args.no_retrain)
    except NoSuchSubject as exc:
        print(f"peep erase: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        s.close()
    say(
        f"subject {r.subject!r} erased: {r.templates_deleted} templates, {r.soft_traits_deleted} soft traits "
        f"({hooks} soft-trait store(s)), {r.decisions_deleted} kept decisions; "
        f"serving model {r.model_version or '(none)'}"
        + (f"; purged old versions {', '.join(r.versions_purged)}" if r.versions_purged else "")
    )
    return 0


def _qbbs_hooks(s: Any) -> int:
    """Let the QBBS module register its erasure hook (``peep.server.qbbs.server_plugin``)."""
    from peep.server.app import default_plugins

    for plugin in default_plugins():
        plugin(s)
    return int(s.n_erasure_hooks)
