"""The soak's targets: what a run must show to pass, each with its value and its limit.

:func:`judge` reads the checker's ``summary`` and the run's
:class:`~peep.lab.bench.soak.timeline.Timeline`. The summary keys it reads:

``devices``
    ``{device: {"sent", "decided_once", "dead_lettered", "lost", "duplicated"}}``, counts of
    (device, message id) pairs over the whole run.
``wrong_lock_drives``
    How many times the door's lock was driven other than as the decision said.

The targets, one verdict per row (``target`` names it and the thing judged, e.g.
``rss_mb_per_hour[replica-a]``):

``lost``, ``duplicated``, ``wrong_lock_drives``
    0 each. A count the summary lacks fails: silence is not a zero.
``rss_mb_per_hour[<process>]``
    The least-squares slope of resident memory after warm-up, within each life of the process
    (:meth:`Timeline.slope_per_hour`), at most 5 MB per hour. A known step (the training run) is left out
    and each side of it fitted on its own, as across a restart; the detail names it.
``fds_growth[<process>]``, ``threads_growth[<process>]``
    Last minus first after warm-up, added over the lives (:meth:`Timeline.growth`), at most 4.
``recovery[<kind>@<start>s]``
    Every fault healthy again at most 15 s after it ended. No fault at all fails too, unless
    ``faults_expected=False``: a fault soak whose nemesis recorded nothing tested nothing.
``p99_per_minute[<latency kind>]``
    No judged minute's p99 above 3 × the baseline: the first judged minute. A minute is judged
    when it starts after warm-up, has at least ``min_minute_n`` latencies, and overlaps no fault
    window from its start to ``settle_s`` after its recovery (a spool drained after a broker outage
    delivers templates whose latency counts the outage).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from peep.lab.bench.soak.timeline import LATENCY_KINDS, STEP_SETTLE_S, WARMUP_S, FaultWindow, Timeline


class Verdict(TypedDict):
    """One target: whether it held, the value measured (None: nothing to measure) and its limit."""

    target: str
    ok: bool
    value: float | None
    limit: float
    detail: str


def _verdict(target: str, value: float | None, limit: float, detail: str, unit: str = "") -> Verdict:
    """A verdict whose detail starts with the value and the limit in ``unit``."""
    u = f" {unit}" if unit else ""
    head = "not measured" if value is None else f"{value:.3g}{u}"
    return {
        "target": target,
        "ok": value is not None and value <= limit,
        "value": value,
        "limit": limit,
        "detail": f"{head} (limit {limit:g}{u}): {detail}",
    }


def _counts(summary: Mapping[str, Any]) -> list[Verdict]:
    devices = summary.get("devices")
    out: list[Verdict] = []
    for key in ("lost", "duplicated"):
        if not isinstance(devices, Mapping) or not devices:
            out.append(_verdict(key, None, 0, "the summary has no per-device counts"))
            continue
        missing = sorted(d for d, c in devices.items() if not isinstance(c, Mapping) or key not in c)
        if missing:
            out.append(_verdict(key, None, 0, f"no {key!r} count for {', '.join(missing)}"))
            continue
        total = sum(int(c[key]) for c in devices.values())
        bad = [f"{d}: {int(c[key])}" for d, c in sorted(devices.items()) if int(c[key])]
        sent = sum(int(c.get("sent", 0)) for c in devices.values())
        out.append(_verdict(key, total, 0, f"{total} of {sent} sent" + (f" ({'; '.join(bad)})" if bad else "")))
    wrong = summary.get("wrong_lock_drives")
    if wrong is None:
        out.append(_verdict("wrong_lock_drives", None, 0, "the summary has no wrong_lock_drives count"))
    else:
        out.append(_verdict("wrong_lock_drives", int(wrong), 0, f"{int(wrong)} lock drives against the decision"))
    return out + _histories(summary)


def _histories(summary: Mapping[str, Any]) -> list[Verdict]:
    """The other histories' checks, each judged where the summary has it (a soak without a desk has none)."""
    out: list[Verdict] = []
    ev = summary.get("events")
    if isinstance(ev, Mapping):
        bad = sum(int(ev.get(k, 0)) for k in ("missing", "repeats", "out_of_order", "unexpected"))
        out.append(_verdict("events", bad, 0, f"of {ev.get('expected')} committed after the subscriber started: "
                            + ", ".join(f"{k} {ev.get(k, 0)}" for k in ("missing", "repeats", "out_of_order",
                                                                        "unexpected"))))  # fmt: skip
    if "strangers_kept" in summary:
        kept = summary["strangers_kept"]
        where = "the cameras' releases found in a table besides the ingest ledger and the decisions"
        out.append(_verdict("strangers_kept", None if kept is None else int(kept), 0, where))
    eps = summary.get("epsilon")
    if isinstance(eps, Mapping):
        mism = eps.get("mismatches", {})
        out.append(_verdict("epsilon_shown", len(mism), 0, f"devices whose ε on the console differs from their "
                            f"own ledger's: {dict(mism) if mism else 'none'}"))  # fmt: skip
    desk = summary.get("desk")
    if isinstance(desk, Mapping):
        n = len(desk.get("mismatched", [])) + len(desk.get("failed", []))
        out.append(_verdict("enrolments", n, 0, f"of {desk.get('enrolments')} enrolments at the desk, failed or "
                            "stored other than released"))  # fmt: skip
    return out


def _warmup_text(timeline: Timeline, series: str, warmup_s: float, life_warmup_s: float | None) -> str:
    restarts = max(0, len(timeline.lives(series)) - 1)
    text = f"after the first {warmup_s:g} s"
    if restarts:
        text += f" and {warmup_s if life_warmup_s is None else life_warmup_s:g} s after each of {restarts} restarts"
    for w in timeline.steps(series):
        text += f"; {w.start_s:.0f}-{w.end_s + STEP_SETTLE_S:.0f} s left out and each side fitted on its own ({w.why})"
    return text


def _resources(
    timeline: Timeline, warmup_s: float, life_warmup_s: float | None, rss_mb_per_hour: float, flat_bound: float
) -> list[Verdict]:
    out: list[Verdict] = []
    processes = timeline.series("rss_mb")
    if not processes:
        out.append(_verdict("rss_mb_per_hour", None, rss_mb_per_hour, "no process memory was sampled"))
    for s in processes:
        slope = timeline.slope_per_hour("rss_mb", s, warmup_s, life_warmup_s=life_warmup_s)
        when = _warmup_text(timeline, s, warmup_s, life_warmup_s)
        detail = "too few samples to fit a slope " + when if slope is None else f"least-squares slope {when}"
        out.append(_verdict(f"rss_mb_per_hour[{s}]", slope, rss_mb_per_hour, detail, "MB per hour"))
    for measure in ("fds", "threads"):
        for s in timeline.series(measure):
            g = timeline.growth(measure, s, warmup_s, life_warmup_s=life_warmup_s)
            when = _warmup_text(timeline, s, warmup_s, life_warmup_s)
            detail = "no samples " + when if g is None else f"last minus first {when}"
            out.append(_verdict(f"{measure}_growth[{s}]", g, flat_bound, detail, measure))
    return out


def _recoveries(faults: Sequence[FaultWindow], recovery_s: float, faults_expected: bool) -> list[Verdict]:
    if not faults:
        if faults_expected:
            return [_verdict("recovery", None, recovery_s, "no fault was recorded: the nemesis did not run or report")]
        return []
    out = []
    for f in faults:
        name = f"recovery[{f.kind}@{f.start_s:.0f}s]"
        if f.recovered_s is None:
            out.append(_verdict(name, None, recovery_s, f"ended at {f.end_s:.1f} s, never healthy again"))
        else:
            detail = f"ended at {f.end_s:.1f} s, healthy at {f.recovered_s:.1f} s"
            out.append(_verdict(name, f.recovery_s, recovery_s, detail, "s"))
    return out


def _disturbed(minute: int, faults: Iterable[FaultWindow], settle_s: float) -> bool:
    lo, hi = 60.0 * minute, 60.0 * minute + 60.0
    return any(lo < f.until_s + settle_s and hi > f.start_s for f in faults)


def _latencies(
    timeline: Timeline,
    kinds: Iterable[str],
    warmup_s: float,
    p99_factor: float,
    min_n: int,
    settle_s: float,
    min_per_minute: Mapping[str, int],
    reported_only: Iterable[str] = (),
) -> list[Verdict]:
    faults = timeline.faults()
    out: list[Verdict] = []
    required = set(kinds)
    for kind in sorted((required | set(timeline.latency_kinds())) - set(reported_only)):
        name = f"p99_per_minute[{kind}]"
        rows = timeline.percentiles_per_minute(kind)
        if not rows:
            out.append(_verdict(name, None, p99_factor, "no latencies recorded"))
            continue
        min_minute_n = min_per_minute.get(kind, min_n)
        early = sum(60.0 * r["minute"] < warmup_s for r in rows)
        sparse = sum(60.0 * r["minute"] >= warmup_s and r["n"] < min_minute_n for r in rows)
        faulted = [r for r in rows if 60.0 * r["minute"] >= warmup_s and _disturbed(r["minute"], faults, settle_s)]
        judged = [
            r
            for r in rows
            if 60.0 * r["minute"] >= warmup_s
            and r["n"] >= min_minute_n
            and not _disturbed(r["minute"], faults, settle_s)
        ]
        skipped = f"{early} in warm-up, {len(faulted)} in or after faults, {sparse} under {min_minute_n} latencies"
        if not judged:
            if kind in required:  # a kind recorded besides them is judged where it can be, listed otherwise
                out.append(_verdict(name, None, p99_factor, f"no quiet minute to judge ({skipped})"))
            continue
        base = judged[0]
        if base["p99_ms"] <= 0:
            out.append(_verdict(name, None, p99_factor, f"baseline minute {base['minute']} has a p99 of 0 ms"))
            continue
        worst = max(judged, key=lambda r: r["p99_ms"])
        ratio = worst["p99_ms"] / base["p99_ms"]
        detail = (
            f"worst minute {worst['minute']} p99 {worst['p99_ms']:.1f} ms vs baseline minute {base['minute']} "
            f"p99 {base['p99_ms']:.1f} ms; {len(judged)} minutes judged ({skipped})"
        )
        out.append(_verdict(name, ratio, p99_factor, detail, "× baseline"))
    return out


def judge(
    summary: Mapping[str, Any],
    timeline: Timeline,
    *,
    warmup_s: float = WARMUP_S,
    life_warmup_s: float | None = None,
    rss_mb_per_hour: float = 5.0,
    flat_bound: float = 4.0,
    recovery_s: float = 15.0,
    p99_factor: float = 3.0,
    min_minute_n: int = 20,
    settle_s: float = 60.0,
    latency_kinds: Iterable[str] = LATENCY_KINDS,
    faults_expected: bool = True,
    min_per_minute: Mapping[str, int] | None = None,
    reported_only: Iterable[str] = (),
) -> list[Verdict]:
    """Every target of the module's docstring, in that order.

    Parameters
    ----------
    summary : mapping
        The checker's summary (``devices``, ``wrong_lock_drives``).
    timeline : Timeline
        What the run recorded.
    warmup_s : float, default 300
        Seconds from the start that the resource and latency targets ignore.
    life_warmup_s : float, optional
        Seconds after each restart of a process that its resource targets ignore (default ``warmup_s``).
    rss_mb_per_hour, flat_bound, recovery_s, p99_factor : float
        The limits: MB per hour; growth of descriptors and threads; seconds; ratio to the baseline.
    min_minute_n : int, default 20
        Fewest latencies for a minute's p99 to be judged (a p99 of five is their maximum).
    settle_s : float, default 60
        Seconds after each fault's recovery whose minutes the latency target does not judge.
    latency_kinds : iterable of str
        Kinds that must be judged; a kind recorded besides them is judged only where it has a quiet minute.
    min_per_minute : mapping, optional
        ``min_minute_n`` per kind, where a kind comes fewer times a minute (a door's claims).
    reported_only : iterable of str
        Latency kinds recorded for the report and left out of the targets (:func:`latency_ratios` gives
        their ratios, worked out as a target's).
    faults_expected : bool, default True
        Whether a run without a fault fails the recovery target.

    Returns
    -------
    list of Verdict
        ``{target, ok, value, limit, detail}``; ``value`` None means nothing could be measured, and fails.
    """
    for name, v in (
        ("warmup_s", warmup_s),
        ("rss_mb_per_hour", rss_mb_per_hour),
        ("flat_bound", flat_bound),
        ("recovery_s", recovery_s),
        ("p99_factor", p99_factor),
        ("settle_s", settle_s),
    ):
        if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    return [
        *_counts(summary),
        *_resources(timeline, warmup_s, life_warmup_s, rss_mb_per_hour, flat_bound),
        *_recoveries(timeline.faults(), recovery_s, faults_expected),
        *_latencies(
            timeline, latency_kinds, warmup_s, p99_factor, min_minute_n, settle_s, min_per_minute or {}, reported_only
        ),
    ]


def latency_ratios(
    timeline: Timeline,
    kinds: Iterable[str],
    *,
    warmup_s: float = WARMUP_S,
    p99_factor: float = 3.0,
    min_minute_n: int = 20,
    settle_s: float = 60.0,
) -> list[Verdict]:
    """The p99 target's verdict for ``kinds``, for a measure that is reported beside the targets, not judged.

    The same minutes, baseline and ratio as :func:`judge`'s ``p99_per_minute`` (a kind never recorded gives
    ``value`` None).
    """
    return _latencies(timeline, kinds, warmup_s, p99_factor, min_minute_n, settle_s, {},
                      set(timeline.latency_kinds()) - set(kinds))  # fmt: skip
