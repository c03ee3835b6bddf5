"""``peep retention --config server.toml``: delete what is past its retention, and say what is kept.

With no option it applies the configured policy now (what the running server
does every ``retention.interval_s``): identify/verify templates that
``recognition.keep`` does not allow or that are older than
``recognition.keep_days``, decisions and alerts older than
``recognition.events_days``, ledger entries past the de-duplication window.
``--purge-recognition`` deletes every stored identify/verify template (an
existing deployment moving to decide-then-forget); ``--days N`` deletes
templates received more than N days ago. Each run prints what it deleted and
what is kept, per category.
"""

from __future__ import annotations

import argparse
from typing import Any

from peep.server.commands._config import add_config_option, load, say, services
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "retention",
        help="delete what is past its retention (or every identify/verify template), then report what is kept",
    )
    add_config_option(p)
    p.add_argument("--days", type=float, default=None, help="also delete templates received more than N days ago")
    p.add_argument("--include-enrolment", action="store_true", help="with --days: also delete old enrolment templates")
    p.add_argument(
        "--purge-recognition",
        action="store_true",
        help="delete every stored identify/verify template, whatever recognition.keep says (enrolment and "
        "background templates stay)",
    )
    p.set_defaults(handler=retention)


def retention(args: argparse.Namespace) -> int:
    if args.days is not None and not args.days > 0:
        raise UsageError(f"--days: expected a number > 0, received {args.days}")
    if args.include_enrolment and args.days is None:
        raise UsageError("--include-enrolment: expected --days N with it (the age of the templates to delete)")
    config = load(args)
    s = services(config)
    try:
        older = None
        deleted = {"recognised_templates": 0, "unknown_templates": 0}
        if args.purge_recognition:
            gone = s.purge_recognition()
            deleted = {"recognised_templates": gone["recognised"], "unknown_templates": gone["unknown"]}
        if args.days is not None:
            older = s.apply_retention(args.days, include_enrolment=True if args.include_enrolment else None)
        for k, n in s.enforce_retention().items():
            deleted[k] = deleted.get(k, 0) + n
        kept = s.store.kept_counts(config.training.background_prefix)
    finally:
        s.close()
    parts = []
    if older is not None:
        parts.append(f"{older} templates older than {args.days:g} days")
    parts.append(
        f"recognised templates {deleted['recognised_templates']}, unknown templates {deleted['unknown_templates']} "
        f"(recognition.keep = {config.recognition.keep})"
    )
    parts.append(
        f"decisions {deleted.get('decisions', 0)}, alerts {deleted.get('alerts', 0)}, ledger entries "
        f"{deleted.get('ledger', 0)}, track memory {deleted.get('track_memory', 0)}"
    )
    if deleted.get("templates"):
        parts.append(f"templates past retention.days {deleted['templates']}")
    say("retention: deleted " + "; ".join(parts))
    for line in kept_lines(kept, config):
        say(line)
    return 0


def kept_lines(kept: Any, config: Any) -> list[str]:
    """What is kept, per category, with how long (:func:`peep.server.services.kept_rows`)."""
    from peep.server.services import kept_rows

    rows = kept_rows(config, kept)
    width = max(len(r["what"]) for r in rows)
    return ["kept now:", *(f"  {r['what']:<{width}}  {r['n']:>9}  {r['kept_for']}" for r in rows)]
