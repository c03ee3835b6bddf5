"""The pieces every audit page is made of: figures (matplotlib on Agg), number formats, HTML tables and
embedded images, and an atomic write. The audit's, the open-set's, the bystander's and the anonymiser's reports
use them."""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def series(entries: Sequence[dict[str, Any]], *path: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Means and stds along ``path`` (std from each entry's ``std`` tree)."""
    means, stds = [], []
    for e in entries:
        m: Any = e
        s: Any = e.get("std", {})
        for p in path:
            m = m.get(p) if isinstance(m, dict) else None
            s = s.get(p) if isinstance(s, dict) else None
        means.append(np.nan if m is None else float(m))
        stds.append(0.0 if s is None or isinstance(s, dict) else float(s))
    return np.array(means), np.array(stds)


def eps_axis(ax: Any, audit: dict[str, Any]) -> None:
    """Log x-axis of the ε parameter, with per-vector ε on top when proportional."""
    res = audit["results"]
    eps = np.array([r["epsilon"] for r in res])
    vec = np.array([r["epsilon_vector"] for r in res])
    ax.set_xscale("log")
    per = audit["mechanism"]["epsilon_parameter"]
    ax.set_xlabel(f"ε ({per})")
    ratio = vec / eps
    if per == "per coordinate" and np.allclose(ratio, ratio[0], rtol=1e-6):
        r = float(ratio[0])
        top = ax.secondary_xaxis("top", functions=(lambda x: x * r, lambda x: x / r))
        top.set_xlabel("ε per vector (what protects the person)")


def save_figure(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def num(v: Any, nd: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (int, np.integer)):
        return str(v)
    return f"{float(v):.{nd}f}"


def fmt_g(v: Any) -> str:
    return "–" if v is None else f"{float(v):.4g}"


def plus_minus(entry: dict[str, Any], *path: str, nd: int = 3) -> str:
    m: Any = entry
    s: Any = entry.get("std", {})
    for p in path:
        m = m.get(p) if isinstance(m, dict) else None
        s = s.get(p) if isinstance(s, dict) else None
    if m is None:
        return "–"
    return f"{num(m, nd)} ± {num(s, nd)}" if isinstance(s, (int, float)) else num(m, nd)


def html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def embedded_image(out: Path, name: str) -> str:
    data = base64.b64encode((out / name).read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"></figure>'


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
