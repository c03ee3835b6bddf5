"""``peep erase --config server.toml --subject ID [--no-retrain]``: erase a subject.

Exit code 1, with nothing changed, when nothing holds the subject (:class:`~peep.server.services.NoSuchSubject`).
Each erasure and each refusal (an invalid id, a subject nothing holds) is written to the console's audit log as
done by ``cli`` from ``local``, with the outcomes the console's own erasure records.
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
        "trained under it, and withdraw its device models (refused while the serving model uses it)",
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
        + (
            f"; {r.device_models_withdrawn} device models withdrawn (never served again; devices' copies expire)"
            if r.device_models_withdrawn
            else ""
        )
    )
    return 0


def erase(args: argparse.Namespace) -> int:
    from peep.core.exceptions import WireError
    from peep.core.wire import check_subject_id
    from peep.server.services import NoSuchSubject

    config = load(args)
    try:
        check_subject_id(args.subject, "--subject")
    except WireError as exc:
        # The store is opened for the record alone: Services would load models for an id that names nothing.
        _audit_alone(config, args.subject[:128], "refused: invalid subject")
        raise UsageError(str(exc)) from None  # exit code 2
    s = services(config, host_qbbs=True)  # the soft traits QBBS holds are erased with the rest
    try:
        hooks = s.n_erasure_hooks
        r = s.erase_subject(args.subject, retrain=not args.no_retrain)
    except NoSuchSubject as exc:
        _audit(s.store, exc.subject, "refused: no such subject")
        print(f"peep erase: {exc}", file=sys.stderr, flush=True)
        return 1
    else:
        _audit(
            s.store, r.subject,
            f"templates {r.templates_deleted}, soft traits {r.soft_traits_deleted}, "
            f"model {r.model_version or '-'}, purged {','.join(r.versions_purged) or '-'}",
        )  # fmt: skip
    finally:
        s.close()
    say(
        f"subject {r.subject!r} erased: {r.templates_deleted} templates, {r.soft_traits_deleted} soft traits "
        f"({hooks} soft-trait store(s)), {r.decisions_deleted} kept decisions; "
        f"serving model {r.model_version or '(none)'}"
        + (f"; purged old versions {', '.join(r.versions_purged)}" if r.versions_purged else "")
    )
    return 0


def _audit(store: Any, target: str, outcome: str) -> None:
    """Record the erasure or refusal in the console's audit log (who erased what is an admin's question whichever
    way it was asked); a log that cannot be written is said, not fatal: the erasure's outcome stands."""
    from peep.server.console.store import ConsoleStore

    try:
        ConsoleStore(store).audit("cli", "erase", target, outcome, "local")
    except Exception as exc:  # whatever the backend's driver raises
        _unrecorded(exc)


def _audit_alone(config: Any, target: str, outcome: str) -> None:
    from peep.server.config import resolve_secrets
    from peep.server.storage import open_store

    try:
        secrets = resolve_secrets(config)
        pw = secrets.db_password.get_secret_value() if secrets.db_password else None
        store = open_store(config.storage, password=pw)
    except Exception as exc:  # a secret, or whatever the backend's driver raises
        _unrecorded(exc)
        return
    try:
        _audit(store, target, outcome)
    finally:
        store.close()


def _unrecorded(exc: Exception) -> None:
    print(
        f"peep erase: could not write the console's audit log ({type(exc).__name__}: {str(exc)[:200]})", file=sys.stderr
    )
