"""The soak's self-contained HTML report: one chart per measure and per latency, the faults, the counts.

:func:`write_report` writes ``soak.html`` (every chart embedded as a PNG data URI, so the file is
the whole report) and the same charts as ``plots/<name>.png``. On every chart the time axis is
minutes into the run, each fault window is shaded in its kind's colour and labelled with the kind
(the fault itself darker, the time until the system was healthy again lighter), and a restart of
a process is a dashed line in its series' colour.

The summary keys it shows, each optional: ``targets`` (the verdicts of
:func:`~peep.lab.bench.soak.targets.judge`), ``faults`` (``[{kind, at_s, recovered_s}]``, as the
nemesis reported them), ``devices`` (``{device: {sent, decided_once, dead_lettered, lost,
duplicated}}``); the whole summary follows as JSON.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peep.lab.bench.soak.timeline import LATENCY_KINDS, FaultWindow, Timeline

#: Title and unit of the measures the soak's sources give; any other measure is charted under its own name.
MEASURES: dict[str, tuple[str, str]] = {
    "rss_mb": ("Resident memory per process", "MB"),
    "fds": ("Open file descriptors per process", "descriptors"),
    "threads": ("Threads per process", "threads"),
    "cpu_pct": ("CPU per process", "% of one core"),
    "cpu_s": ("CPU time per process, since it started", "s"),
    "db_mb": ("Database size per table", "MB"),
    "spool_bytes": ("Spool depth", "bytes"),
    "spool_files": ("Spool depth in files", "files"),
    "broker_queue": ("Broker queue depth", "messages"),
}
LATENCY_TITLES = {
    "ingest_to_decision": "Latency from the server's receipt of a template to its decision, per minute",
    "release_to_decision": "Latency from a camera's release to its decision (reported, not a target), per minute",
    "claim_to_lock": "Latency from a door claim to the lock drive, per minute",
    "console_page": "Console page loads (Live, Devices), per minute",
    "claim_to_verdict": "Latency from a door claim to the door's answer (opened or rejected), per minute",
}
DEVICE_COUNTS = ("sent", "decided_once", "dead_lettered", "lost", "duplicated")

_PALETTE = ("#e76f51", "#2a9d8f", "#6d597a", "#f4a261", "#264653", "#b5838d", "#588157", "#8d99ae", "#bc6c25")
_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}"
    "th{background:#f4f4f4}img{max-width:100%}td.num{text-align:right}"
    ".ok{color:#2a7d2a;font-weight:bold}.fail{color:#b00020;font-weight:bold}"
)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "chart"


def _shade_faults(ax: Any, faults: Sequence[FaultWindow], colours: Mapping[str, str]) -> None:
    """Shade each fault window on ``ax`` (x in minutes) and label it with its kind."""
    from matplotlib.transforms import blended_transform_factory

    top = blended_transform_factory(ax.transData, ax.transAxes)
    for f in faults:
        c = colours[f.kind]
        # A zero-length fault (a clock step, a SIGKILL) would be an invisible span: a line marks it too.
        ax.axvline(f.start_s / 60, color=c, lw=0.8, alpha=0.7)
        ax.axvspan(f.start_s / 60, f.end_s / 60, color=c, alpha=0.25, lw=0)
        if f.until_s > f.end_s:
            ax.axvspan(f.end_s / 60, f.until_s / 60, color=c, alpha=0.1, lw=0)
        ax.text(
            f.start_s / 60, 0.98, f" {f.kind}", transform=top, rotation=90, va="top", ha="right", fontsize=6, color=c
        )


def _png(fig: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _figure() -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.5, 3.6))
    return fig, fig.add_subplot()


def _legend(ax: Any, n: int) -> None:
    if n:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if n <= 16 else 2, frameon=False)


def _measure_chart(
    timeline: Timeline, measure: str, faults: Sequence[FaultWindow], colours: Mapping[str, str]
) -> bytes:
    title, unit = MEASURES.get(measure, (measure, ""))
    fig, ax = _figure()
    series = timeline.series(measure)
    for i, s in enumerate(series):
        t, v = timeline.samples(measure, s)
        (line,) = ax.plot(t / 60, v, lw=1, label=s, color=f"C{i % 10}")
        for start, _ in timeline.lives(s)[1:]:
            ax.axvline(start / 60, color=line.get_color(), ls="--", lw=0.8)
        for w in timeline.steps(s):  # a known step: its slope is fitted on each side, without this window
            ax.axvline(w.start_s / 60, color=line.get_color(), ls=":", lw=0.8)
    _shade_faults(ax, faults, colours)
    ax.set_title(title)
    ax.set_xlabel("minutes into the run")
    ax.set_ylabel(f"{measure} ({unit})" if unit else measure)
    _legend(ax, len(series))
    return _png(fig)


def _latency_chart(timeline: Timeline, kind: str, faults: Sequence[FaultWindow], colours: Mapping[str, str]) -> bytes:
    rows = timeline.percentiles_per_minute(kind)
    fig, ax = _figure()
    if rows:
        x = [r["minute"] + 0.5 for r in rows]
        ax.plot(x, [r["p50_ms"] for r in rows], marker=".", lw=1, label="p50", color="#264653")
        ax.plot(x, [r["p99_ms"] for r in rows], marker=".", lw=1, label="p99", color="#e76f51")
        low = min(r["p50_ms"] for r in rows)
        if low > 0 and max(r["p99_ms"] for r in rows) / low > 50:
            ax.set_yscale("log")
    _shade_faults(ax, faults, colours)
    clamped = timeline.clamped(kind)
    title = LATENCY_TITLES.get(kind, f"Latency {kind}, per minute")
    ax.set_title(title + (f" ({clamped} out of range, clamped)" if clamped else ""))
    ax.set_xlabel("minutes into the run")
    ax.set_ylabel("ms")
    _legend(ax, 2 if rows else 0)
    return _png(fig)


def _cell(v: Any) -> str:
    if v is None:
        return "<td>—</td>"
    if isinstance(v, float):
        return f"<td class='num'>{v:,.1f}</td>"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"<td class='num'>{v:,}</td>"
    return f"<td>{html.escape(str(v))}</td>"


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], table_id: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "\n".join("<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in rows)
    return f"<table id='{table_id}'><tr>{th}</tr>\n{body}</table>"


def _targets_html(targets: Any) -> str:
    if not isinstance(targets, Sequence) or not targets:
        return "<p>No targets in the summary.</p>"
    rows = []
    for v in targets:
        mark = "<td class='ok'>pass</td>" if v.get("ok") else "<td class='fail'>FAIL</td>"
        value = v.get("value")
        shown = "—" if value is None else f"{value:.3g}"
        rows.append(
            f"<tr>{mark}<td>{html.escape(str(v.get('target')))}</td><td class='num'>{shown}</td>"
            f"<td class='num'>{v.get('limit', '')}</td><td>{html.escape(str(v.get('detail', '')))}</td></tr>"
        )
    failed = sum(not v.get("ok") for v in targets)
    head = "<tr><th></th><th>target</th><th>value</th><th>limit</th><th>detail</th></tr>"
    verdict = f"<p class='{'fail' if failed else 'ok'}'>{failed} of {len(targets)} targets failed.</p>"
    return verdict + f"<table id='targets'>{head}\n" + "\n".join(rows) + "</table>"


def _reported_html(summary: Mapping[str, Any]) -> str:
    """The measures worked out as targets are but reported beside them (the runner says why), marked as such."""
    reported = summary.get("reported")
    latency = reported.get("latency") if isinstance(reported, Mapping) else None
    if not isinstance(latency, Sequence) or not latency:
        return ""
    rows = []
    for v in latency:
        value = v.get("value")
        shown = "—" if value is None else f"{value:.3g}"
        within = "within" if v.get("ok") else "beyond"
        rows.append(
            f"<tr><td>{within}</td><td>{html.escape(str(v.get('target')))}</td><td class='num'>{shown}</td>"
            f"<td class='num'>{v.get('limit', '')}</td><td>{html.escape(str(v.get('detail', '')))}</td></tr>"
        )
    head = "<tr><th></th><th>measure</th><th>value</th><th>a target's limit</th><th>detail</th></tr>"
    return (
        f"<p>Reported beside the targets, not judged:</p><table id='reported'>{head}\n" + "\n".join(rows) + "</table>"
    )


def _faults_html(summary: Mapping[str, Any], windows: Sequence[FaultWindow]) -> str:
    reported = summary.get("faults") or []
    rows = [(f.get("kind"), f.get("at_s"), f.get("recovered_s")) for f in reported if isinstance(f, Mapping)]
    out = _table(("kind", "at_s", "recovered_s"), rows, "faults") if rows else "<p>The summary reports no faults.</p>"
    if windows:
        out += "<p>Fault windows on the timeline (seconds into the run):</p>" + _table(
            ("kind", "start_s", "end_s", "recovered_s", "recovery after its end, s"),
            [(f.kind, f.start_s, f.end_s, f.recovered_s, f.recovery_s) for f in windows],
            "fault-windows",
        )
    return out


def _devices_html(summary: Mapping[str, Any]) -> str:
    devices = summary.get("devices")
    if not isinstance(devices, Mapping) or not devices:
        return "<p>The summary has no per-device counts.</p>"
    rows: list[list[Any]] = []
    totals = [0] * len(DEVICE_COUNTS)
    for d in sorted(devices):
        c = devices[d] if isinstance(devices[d], Mapping) else {}
        rows.append([d, *(c.get(k) for k in DEVICE_COUNTS)])
        totals = [t + int(c.get(k) or 0) for t, k in zip(totals, DEVICE_COUNTS, strict=True)]
    rows.append(["all devices", *totals])
    return _table(("device", *DEVICE_COUNTS), rows, "devices")


def write_report(summary: Mapping[str, Any], timeline: Timeline, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``out_dir/soak.html`` and ``out_dir/plots/*.png``; returns the HTML's path.

    Parameters
    ----------
    summary : mapping
        The checker's summary (see the module's docstring for the keys shown); JSON-serialisable.
    timeline : Timeline
        The run's record: every measure and every latency kind gets one chart.
    out_dir : path
        Created if missing; existing charts of the same names are replaced.
    """
    out = Path(out_dir)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    faults = timeline.faults()
    kinds = sorted({f.kind for f in faults})
    colours = {k: _PALETTE[i % len(_PALETTE)] for i, k in enumerate(kinds)}
    known = [m for m in MEASURES if m in timeline.measures()]
    measures = known + [m for m in timeline.measures() if m not in MEASURES]
    latency = [k for k in LATENCY_KINDS if k in timeline.latency_kinds()]
    latency += [k for k in timeline.latency_kinds() if k not in LATENCY_KINDS]

    charts: list[tuple[str, str, str, bytes]] = []  # (what, name, title, png)
    for m in measures:
        charts.append(("measure", m, MEASURES.get(m, (m, ""))[0], _measure_chart(timeline, m, faults, colours)))
    for k in latency:
        charts.append(("latency", k, LATENCY_TITLES.get(k, k), _latency_chart(timeline, k, faults, colours)))

    figures = []
    for what, name, title, png in charts:
        file = f"{'latency_' if what == 'latency' else ''}{_slug(name)}.png"
        (plots / file).write_bytes(png)
        figures.append(
            f"<h3>{html.escape(title)}</h3><img class='chart' data-{what}='{html.escape(name, quote=True)}' "
            f"alt='{html.escape(title, quote=True)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        )
    legend = ", ".join(f"<span style='color:{colours[k]}'>■</span> {html.escape(k)}" for k in kinds)
    summary_json = html.escape(json.dumps(summary, indent=2, default=str))
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>PEEP soak report</title>
<style>{_CSS}</style>
</head><body>
<h1>PEEP soak report</h1>
<p>The whole system on one machine under steady load, with faults injected on a seeded schedule.
Time axes are minutes into the run; shaded bands are fault windows (darker: the fault; lighter: until
the system was healthy again){"; fault kinds: " + legend if kinds else ""}. Dashed lines are restarts; dotted
lines are known steps (the mid-run training), where slopes are fitted on each side as across a restart.</p>
<h2>Targets</h2>
{_targets_html(summary.get("targets"))}
{_reported_html(summary)}
<h2>Faults</h2>
{_faults_html(summary, faults)}
<h2>Messages per device</h2>
{_devices_html(summary)}
<h2>Charts</h2>
{chr(10).join(figures) if figures else "<p>The timeline holds no samples.</p>"}
<h2>Summary (JSON)</h2><pre>{summary_json}</pre>
</body></html>
"""
    path = out / "soak.html"
    path.write_text(doc, encoding="utf-8")
    return path
