"""Server-rendered SVG plots: no JavaScript, no image of anything but numbers.

Each function returns a complete ``<svg>`` element as a string in which every text is XML-escaped (labels
may be device ids or model versions), and which uses presentation attributes only (no ``style``), so it
renders under the console's Content-Security-Policy (``style-src 'self'``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape, quoteattr

WIDTH, HEIGHT = 640, 220
# The left margin holds the y label (rotated, at x = 12) and the tick values right-aligned at _L - 4: wide
# enough for "99.9k" without either running over the other.
_L, _R, _T, _B = 60, 12, 14, 40
#: Colour-blind-safe series colours (Okabe & Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def _frame(title: str, body: list[str], y_max: float, y_label: str) -> str:
    ph = HEIGHT - _T - _B
    ticks = []
    for k in range(5):
        v = y_max * k / 4
        y = _T + ph - ph * k / 4
        ticks.append(f'<line x1="{_L}" x2="{WIDTH - _R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        ticks.append(f'<text x="{_L - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{_fmt(v)}</text>')
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label={quoteattr(title)} '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" class="plot">'
        f"<title>{escape(title)}</title>"
        f'<text x="12" y="{_T + ph / 2:.0f}" font-size="10" transform="rotate(-90 12 {_T + ph / 2:.0f})" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    axes = f'<line x1="{_L}" x2="{_L}" y1="{_T}" y2="{_T + ph}" stroke="#333"/>'
    return head + "".join(ticks) + axes + "".join(body) + "</svg>"


def _fmt(v: float) -> str:
    """A tick value in at most 5 characters (``23.7k``, ``1.2M``, ``16``, ``0.25``)."""
    if v == 0:
        return "0"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            x = v / scale
            return f"{x:.0f}{suffix}" if abs(x) >= 100 else f"{x:.3g}{suffix}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    return f"{v:.2g}"


def _empty(title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label={quoteattr(title)} viewBox="0 0 {WIDTH} 40" '
        f'width="{WIDTH}" height="40" class="plot"><title>{escape(title)}</title>'
        f'<text x="8" y="24" font-size="12">no data yet</text></svg>'
    )


def bars(
    title: str, labels: Sequence[str], values: Sequence[float], *, y_label: str, y_max: float | None = None
) -> str:
    """A bar chart; ``labels`` under the bars (every k-th when there are many)."""
    if not values:
        return _empty(title)
    top = y_max if y_max is not None else max(max(values), 1e-12) * 1.1
    pw, ph = WIDTH - _L - _R, HEIGHT - _T - _B
    n = len(values)
    w = pw / n
    every = max(1, n // 12)
    body = []
    for i, (lab, v) in enumerate(zip(labels, values, strict=True)):
        h = ph * min(v, top) / top
        x = _L + i * w
        body.append(
            f'<rect x="{x + w * 0.1:.1f}" y="{_T + ph - h:.1f}" width="{w * 0.8:.1f}" height="{h:.1f}" '
            f'fill="{PALETTE[0]}"><title>{escape(f"{lab}: {_fmt(v)}")}</title></rect>'
        )
        if i % every == 0:
            body.append(
                f'<text x="{x + w / 2:.1f}" y="{HEIGHT - _B + 14}" font-size="10" text-anchor="middle">'
                f"{escape(lab)}</text>"
            )
    return _frame(title, body, top, y_label)


def lines(title: str, x_labels: Sequence[str], series: Mapping[str, Sequence[float]], *, y_label: str) -> str:
    """One line per series over the shared ``x_labels``, with a legend."""
    if not x_labels or not series:
        return _empty(title)
    top = max(max((max(v) for v in series.values() if len(v)), default=0.0), 1e-12) * 1.1
    pw, ph = WIDTH - _L - _R, HEIGHT - _T - _B
    n = len(x_labels)
    step = pw / max(n - 1, 1)
    body = []
    every = max(1, n // 12)
    for i, lab in enumerate(x_labels):
        if i % every == 0:
            body.append(
                f'<text x="{_L + (i * step if n > 1 else pw / 2):.1f}" y="{HEIGHT - _B + 14}" font-size="10" '
                f'text-anchor="middle">{escape(lab)}</text>'
            )
    for k, (name, vals) in enumerate(sorted(series.items())):
        colour = PALETTE[k % len(PALETTE)]
        xy = [(_L + (i * step if n > 1 else pw / 2), _T + ph - ph * v / top) for i, v in enumerate(vals)]
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        body.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        # A marker per point: a series of one point (a short run) is otherwise an invisible line.
        for (x, y), lab, v in zip(xy, x_labels, vals, strict=False):
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}">'
                f"<title>{escape(f'{name}, {lab}: {_fmt(v)}')}</title></circle>"
            )
        ly = HEIGHT - 12
        lx = _L + (k % 6) * 100
        body.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>')
        body.append(f'<text x="{lx + 14}" y="{ly + 1}" font-size="10">{escape(name[:14])}</text>')
    return _frame(title, body, top, y_label)
