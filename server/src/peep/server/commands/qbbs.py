"""``peep qbbs ...``: the soft-biometric query module's admin commands.

``enrol``, ``query``, ``odometer`` and ``erase`` act on the store and
ledger named by a QBBS configuration (a TOML file, or the ``[qbbs]`` table of
``server.toml``); running them needs file access to the store, i.e. the
service account -- that is the admin credential on the command line (the
gRPC service checks a bearer token instead).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from peep.server.errors import UsageError


def _trait_value(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE such as age=42, received {text!r}")
    try:
        return name.strip(), float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number after '=', received {text!r}") from exc


def register(sub: Any) -> Any:
    """Add ``peep qbbs`` and its admin actions; returns the actions, which the lab's ``evaluate`` joins."""
    p = sub.add_parser("qbbs", help="soft-biometric query module: evaluation and admin commands")
    q = p.add_subparsers(dest="qbbs_command", metavar="ACTION", required=True)

    def admin(name: str, help_text: str) -> argparse.ArgumentParser:
        a: argparse.ArgumentParser = q.add_parser(name, help=help_text)
        a.add_argument("--config", required=True, help="QBBS configuration TOML (or server.toml with a [qbbs] table)")
        return a

    a = admin("enrol", help_text="store a subject's soft traits")
    a.add_argument("--subject", required=True)
    a.add_argument(
        "--trait",
        type=_trait_value,
        action="append",
        required=True,
        metavar="NAME=VALUE",
        help="repeat per trait, e.g. --trait age=42 --trait height=180",
    )
    a.set_defaults(handler=enrol)
    a = admin("query", help_text="one permissible query (spends the subject's ε)")
    a.add_argument("--subject", required=True)
    a.add_argument("--trait", required=True)
    a.set_defaults(handler=query)
    a = admin("odometer", help_text="cumulative ε of a subject (or every subject) and the spend audit log")
    a.add_argument("--subject", default=None)
    a.add_argument("--log", action="store_true", help="print the audit log (JSON lines)")
    a.set_defaults(handler=odometer)
    a = admin("erase", help_text="delete a subject's soft traits (the spend ledger is kept)")
    a.add_argument("--subject", required=True)
    a.set_defaults(handler=erase)
    return q


def _config(path: str | None, **overrides: Any) -> Any:
    from peep.server.config.qbbs import load_qbbs_config

    try:
        return load_qbbs_config(path, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        raise UsageError(f"--config: {exc}") from exc


def _module(args: argparse.Namespace) -> Any:
    from peep.server.qbbs import QbbsModule, QueryStructureChangedError

    cfg = _config(args.config)
    if cfg.store_path is None or cfg.ledger_path is None:
        raise UsageError(
            f"--config {args.config}: expected store_path and ledger_path (an in-memory store would be lost)"
        )
    try:
        return QbbsModule(cfg)
    except QueryStructureChangedError as exc:
        raise UsageError(f"--config {args.config}: {exc}") from exc


def enrol(args: argparse.Namespace) -> int:
    from peep.server.qbbs import QbbsError

    traits: dict[str, float] = {}
    for name, value in args.trait:
        if name in traits:
            raise UsageError(f"--trait: expected each trait once, received {name!r} twice")
        traits[name] = value
    with _module(args) as module:
        try:
            n = module.enrol(args.subject, traits)
        except QbbsError as exc:
            raise UsageError(f"--trait: {exc}") from exc
    print(f"enrolled {n} soft trait(s) for {args.subject!r}")
    return 0


def query(args: argparse.Namespace) -> int:
    from peep.core.exceptions import BudgetError
    from peep.server.qbbs import QbbsError

    with _module(args) as module:
        try:
            r = module.query(args.subject, args.trait, requester="cli")
        except BudgetError as exc:
            print(f"peep qbbs query: refused: {exc}", file=sys.stderr)
            return 1
        except QbbsError as exc:
            raise UsageError(str(exc)) from exc
        cap = module.config.epsilon_cap
    print(
        f"{r.subject} {r.trait}: Y' = {r.value:.6g} (noise sd {r.noise_std:.4g}, Δf {r.sensitivity:g}, "
        f"{r.responses} SUM responses); ε spent {r.epsilon_spent:g}, total {r.epsilon_total:g} of {cap:g}"
    )
    return 0


def odometer(args: argparse.Namespace) -> int:
    from peep.server.qbbs import QbbsError

    with _module(args) as module:
        try:
            entries = module.audit_log(args.subject)
            subjects = [args.subject] if args.subject else list(dict.fromkeys(e["subject"] for e in entries))
            readings = [module.odometer(s) for s in subjects]
        except QbbsError as exc:
            raise UsageError(str(exc)) from exc
    for r in readings:
        print(
            f"{r.subject}: ε {r.epsilon_spent:g} of {r.epsilon_cap:g} ({r.releases} releases, "
            f"{r.epsilon_remaining:g} left)"
        )
    if not readings:
        print("no spends recorded")
    if args.log:
        for e in entries:
            print(json.dumps(e))
    return 0


def erase(args: argparse.Namespace) -> int:
    with _module(args) as module:
        n = module.erase(args.subject)
    if n == 0:
        # A mistyped id must not read as done: say nothing was there (the spend ledger is untouched either way).
        print(f"peep qbbs erase: no soft traits of {args.subject[:64]!r} are stored; nothing erased", file=sys.stderr)
        return 1
    print(f"erased {n} soft trait(s) of {args.subject!r}")
    return 0
