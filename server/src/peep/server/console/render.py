"""How the console's pages print things: times, transports, numbers, and the template environment that
prints every value through :func:`~peep.server.console.text.shown`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from peep.server.console.text import shown

HERE = Path(__file__).resolve().parent


def time_text(t: float | None) -> str:
    if t is None or not math.isfinite(t) or t <= 0:
        return "–"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _time_cell(t: float | None) -> Markup:
    """A time as a ``<time>`` element (kept on one line by the style sheet; the text is digits only)."""
    text = time_text(t)
    if text == "–":
        return Markup("–")
    iso = datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # type: ignore[arg-type]
    return Markup(f'<time datetime="{iso}">{text}</time>')


#: How a release or a report arrived, as the Devices page names it ("": a ledger row from before it was recorded).
TRANSPORT_NAMES = {"grpc": "gRPC", "mqtt": "MQTT", "": "not recorded"}


def transports_by_use(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """``[(name, releases)]`` of a device's own releases per transport, the most used first.

    >>> transports_by_use({"mqtt": 39, "": 2, "grpc": 5})
    [('MQTT', 39), ('gRPC', 5), ('not recorded', 2)]
    """
    named = [(TRANSPORT_NAMES.get(t, t), int(n)) for t, n in counts.items() if n]
    return sorted(named, key=lambda tn: (-tn[1], tn[0]))


def _clock(t: float | None) -> str:
    if t is None or not math.isfinite(t) or t <= 0:
        return "–"
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def format_number(v: float | None) -> str:
    """A number as an operator reads it: thousands separated, at most 4 significant digits after the point.

    >>> format_number(23660.0), format_number(16.0), format_number(0.1234567), format_number(1234.5678)
    ('23,660', '16', '0.1235', '1,234.6')
    """
    if v is None:
        return "–"
    x = float(v)
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    digits = max(1, 4 - (math.floor(math.log10(abs(x))) + 1))
    return f"{x:,.{digits}f}".rstrip("0").rstrip(".")


def _finalize(value: Any) -> Any:
    # Every printed value goes through shown() (bidi and controls made visible), then the autoescaper.
    if value is None:
        return ""
    if isinstance(value, Markup):
        return value
    if isinstance(value, str):
        return shown(value)
    return value


def template_environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        finalize=_finalize,
        auto_reload=False,
    )
    env.filters["time"] = _time_cell
    env.filters["clock"] = _clock
    env.filters["eps"] = format_number
    env.filters["pct"] = lambda v: "–" if v is None else f"{100 * float(v):.1f} %"
    return env
