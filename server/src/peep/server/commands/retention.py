"""``peep retention --config server.toml --days N``: delete old templates."""

from __future__ import annotations

import argparse
from typing import Any

from peep.server.commands._config import add_config_option, load, say, services
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("retention", help="delete templates received more than N days ago")
    add_config_option(p)
    p.add_argument("--days", type=float, required=True, help="age limit in days")
    p.add_argument(
        "--include-enrolment", action="store_true", help="also delete old enrolment templates (training data)"
    )
    p.set_defaults(handler=retention)


def retention(args: argparse.Namespace) -> int:
    if not args.days > 0:
        raise UsageError(f"--days: expected a number > 0, received {args.days}")
    s = services(load(args))
    try:
        n = s.apply_retention(args.days, include_enrolment=True if args.include_enrolment else None)
    finally:
        s.close()
    say(f"retention: deleted {n} templates received more than {args.days:g} days ago")
    return 0
