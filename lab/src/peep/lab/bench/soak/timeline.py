"""What the soak saw, as time series: resources per process, fault windows and latencies per minute.

A :class:`Timeline` is filled from several threads at once (the resource sampler, the load's
devices, the nemesis) for an hour or more, so it is locked and bounded:

samples
    ``add(measure, series, t_s, value)``, e.g. ``add("rss_mb", "replica-a", 61.0, 212.5)``. Each
    (measure, series) keeps at most ``cap`` samples. When one reaches ``cap``, every other sample of
    its *older half* is dropped (the first sample always stays, the newer half is untouched), so
    recent minutes keep full resolution, older ones thin out geometrically (a sample that has
    survived ``k`` compactions stands for ``2**k`` of the originals), the first and last samples
    always remain, and the count stays between ``3/4 cap`` and ``cap`` once full. Thinning (rather than
    averaging pairs) keeps values that were really observed; a least-squares slope is still
    unbiased over unevenly spaced samples.
lives
    A sample of the measure :data:`LIFE` is not a series: its value names the life of the
    series' process (:func:`~peep.lab.bench.soak.sampler.process_source` gives the process's
    start time), and a new value marks a restart. Slopes and growth are taken within each life,
    each after its own warm-up: a replica SIGKILLed and started again begins with a small heap
    again, and its climb back is start-up, not a leak.
steps
    ``step(series, start_s, end_s, why)``: a window in which a process is known to take a one-time step
    (a replica's first training run imports the fitting libraries). Slopes and growth skip the window
    and its settling (:data:`STEP_SETTLE_S`) and fit each side with its own intercept, as across a
    restart: a step is not a rate, and a process that keeps growing afterwards still shows it.
faults
    ``fault(kind, start_s, end_s, recovered_s)``: when the fault was injected, when it was
    lifted, and when the system was seen healthy again (``None``: never), all on the timeline's
    clock.
latencies
    ``latency(kind, t_s, ms)`` goes into a histogram of minute ``t_s // 60`` with logarithmic
    buckets 1 % wide (from 0.01 ms to 10⁷ ms; outside values are clamped and counted), so memory
    grows with the minutes and the spread of latencies, never with the rate, and percentiles are
    within 0.5 % of the exact ones.

Times are seconds on one clock from the start of the run: :meth:`Timeline.now` reads
``time.monotonic`` (the clock-step faults move the wall clock, not this one).
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

import numpy as np

#: Seconds after the start of the run (and after each restart) that no slope or growth looks at.
WARMUP_S = 300.0
#: Seconds after a known step's end that slopes and growth still skip.
STEP_SETTLE_S = 30.0
#: The measure whose samples name a process's life instead of forming a series.
LIFE = "life"
#: The latency kinds the soak measures (others are accepted: the report and targets take any).
LATENCY_KINDS = ("ingest_to_decision", "claim_to_lock")

_FORMAT = 1
_MIN_MS = 0.01
_MAX_MS = 1e7
_GAMMA = 1.01
_LOG_GAMMA = math.log(_GAMMA)
_TOP_BUCKET = math.ceil(math.log(_MAX_MS / _MIN_MS) / _LOG_GAMMA)
_MAX_FAULTS = 100_000
_MAX_LIVES = 10_000


@dataclass(frozen=True)
class FaultWindow:
    """One injected fault: ``kind`` from ``start_s`` to ``end_s``, healthy again at ``recovered_s``."""

    kind: str
    start_s: float
    end_s: float
    recovered_s: float | None

    @property
    def recovery_s(self) -> float | None:
        """Seconds from the fault's end to health again (0 if healthy before it ended; None: never)."""
        return None if self.recovered_s is None else max(0.0, self.recovered_s - self.end_s)

    @property
    def until_s(self) -> float:
        """The end of the disturbance: recovery if it came, else the end of the fault."""
        return self.end_s if self.recovered_s is None else max(self.end_s, self.recovered_s)


@dataclass(frozen=True)
class StepWindow:
    """A known one-time step of ``series``'s process from ``start_s`` to ``end_s``, and ``why``."""

    series: str
    start_s: float
    end_s: float
    why: str


class MinutePercentiles(TypedDict):
    """Latency of one minute: ``minute`` is ``t_s // 60``."""

    minute: int
    n: int
    p50_ms: float
    p99_ms: float
    max_ms: float


class _Series:
    __slots__ = ("dropped", "t", "v")

    def __init__(self) -> None:
        self.t: list[float] = []
        self.v: list[float] = []
        self.dropped = 0


class _Minute:
    __slots__ = ("buckets", "max_ms", "n")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.n = 0
        self.max_ms = -math.inf


def _bucket(ms: float) -> int:
    if ms <= _MIN_MS:
        return 0
    return min(_TOP_BUCKET, 1 + math.floor(math.log(ms / _MIN_MS) / _LOG_GAMMA))


def _bucket_value(b: int) -> float:
    """The geometric middle of bucket ``b`` (bucket 0 holds everything up to the minimum)."""
    return _MIN_MS if b == 0 else _MIN_MS * _GAMMA ** (b - 0.5)


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{name} must be finite, got {f!r}")
    return f


def _name(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty str, got {value!r}")
    return value


class Timeline:
    """A thread-safe, bounded record of the soak's time series, faults and latencies.

    Parameters
    ----------
    cap : int, default 20_000
        Most samples kept per (measure, series); see the module's docstring for how older
        samples are thinned.
    clock : callable, default ``time.monotonic``
        Seconds; :meth:`now` is this clock minus its reading when the timeline was made.

    Examples
    --------
    >>> tl = Timeline(cap=100)
    >>> for minute in range(60):
    ...     tl.add("rss_mb", "replica-a", 60.0 * minute, 200.0 + minute / 6)
    >>> round(tl.slope_per_hour("rss_mb", "replica-a", after_s=0), 6)
    10.0
    >>> tl.latency("claim_to_lock", 30.0, 80.0)
    >>> [(m["minute"], m["n"]) for m in tl.percentiles_per_minute("claim_to_lock")]
    [(0, 1)]
    """

    def __init__(self, *, cap: int = 20_000, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 8:
            raise ValueError(f"cap must be an int of at least 8, got {cap!r}")
        self.cap = cap
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._samples: dict[str, dict[str, _Series]] = {}
        self._lives: dict[str, list[tuple[float, float]]] = {}
        self._faults: list[FaultWindow] = []
        self._steps: list[StepWindow] = []
        self._latency: dict[str, dict[int, _Minute]] = {}
        self._clamped: dict[str, int] = {}

    # -- recording ---------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the timeline was made, on its clock."""
        return self._clock() - self._t0

    def add(self, measure: str, series: str, t_s: float, value: float) -> None:
        """Record ``value`` of ``measure`` for ``series`` at ``t_s`` (a :data:`LIFE` sample marks a life).

        Raises
        ------
        TypeError, ValueError
            A name that is not a non-empty string, or a time or value that is not a finite number.
        """
        measure, series = _name("measure", measure), _name("series", series)
        t, v = _finite("t_s", t_s), _finite("value", value)
        with self._lock:
            if measure == LIFE:
                lives = self._lives.setdefault(series, [])
                if (not lives or lives[-1][1] != v) and len(lives) < _MAX_LIVES:
                    lives.append((t, v))
                return
            s = self._samples.setdefault(measure, {}).setdefault(series, _Series())
            s.t.append(t)
            s.v.append(v)
            if len(s.t) >= self.cap:
                # Odd indices of the older half: index 0 (the first sample) stays.
                half = len(s.t) // 2
                before = len(s.t)
                del s.t[1:half:2]
                del s.v[1:half:2]
                s.dropped += before - len(s.t)

    def fault(self, kind: str, start_s: float, end_s: float, recovered_s: float | None = None) -> None:
        """Record a fault window (times on the timeline's clock; ``recovered_s`` None: never healthy again).

        Raises
        ------
        ValueError
            ``end_s`` before ``start_s``, or a time that is not finite.
        """
        kind = _name("kind", kind)
        start, end = _finite("start_s", start_s), _finite("end_s", end_s)
        rec = None if recovered_s is None else _finite("recovered_s", recovered_s)
        if end < start:
            raise ValueError(f"end_s must not be before start_s ({start}), got {end}")
        with self._lock:
            if len(self._faults) < _MAX_FAULTS:
                self._faults.append(FaultWindow(kind, start, end, rec))

    def step(self, series: str, start_s: float, end_s: float, why: str) -> None:
        """Record a window in which ``series``'s process is known to take a one-time step (see the module).

        Raises
        ------
        TypeError, ValueError
            An empty name or reason, a time that is not finite, or ``end_s`` before ``start_s``.
        """
        series, why = _name("series", series), _name("why", why)
        start, end = _finite("start_s", start_s), _finite("end_s", end_s)
        if end < start:
            raise ValueError(f"end_s must not be before start_s ({start}), got {end}")
        with self._lock:
            if len(self._steps) < _MAX_FAULTS:
                self._steps.append(StepWindow(series, start, end, why[:200]))

    def latency(self, kind: str, t_s: float, ms: float) -> None:
        """Count one latency of ``kind`` (e.g. ``"ingest_to_decision"``) observed at ``t_s``.

        A value outside 0.01 ms … 10⁷ ms (a negative one after a wall-clock step, say) is
        clamped into the histogram's range and counted in :meth:`clamped`.
        """
        kind = _name("kind", kind)
        t, v = _finite("t_s", t_s), _finite("ms", ms)
        with self._lock:
            minute = self._latency.setdefault(kind, {}).setdefault(math.floor(t / 60.0), _Minute())
            if v < 0 or v > _MAX_MS:
                self._clamped[kind] = self._clamped.get(kind, 0) + 1
            b = _bucket(v)
            minute.buckets[b] = minute.buckets.get(b, 0) + 1
            minute.n += 1
            minute.max_ms = max(minute.max_ms, v)

    # -- reading -----------------------------------------------------------------------------

    def measures(self) -> list[str]:
        """The measures with samples, sorted."""
        with self._lock:
            return sorted(self._samples)

    def series(self, measure: str) -> list[str]:
        """The series of ``measure``, sorted."""
        with self._lock:
            return sorted(self._samples.get(measure, {}))

    def samples(self, measure: str, series: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Times and values of one series, in time order (empty arrays if there is none)."""
        with self._lock:
            s = self._samples.get(measure, {}).get(series)
            t = np.array(s.t if s else [], dtype=float)
            v = np.array(s.v if s else [], dtype=float)
        order = np.argsort(t, kind="stable")
        return t[order], v[order]

    def dropped(self, measure: str, series: str) -> int:
        """How many samples of the series thinning has dropped."""
        with self._lock:
            s = self._samples.get(measure, {}).get(series)
            return s.dropped if s else 0

    def lives(self, series: str) -> list[tuple[float, float]]:
        """``(t_s, life)`` for each life of the series' process: when it was first seen, and its value."""
        with self._lock:
            return sorted(self._lives.get(series, []))

    def faults(self) -> list[FaultWindow]:
        """The fault windows, in order of start."""
        with self._lock:
            return sorted(self._faults, key=lambda f: (f.start_s, f.end_s))

    def steps(self, series: str | None = None) -> list[StepWindow]:
        """The known steps (of ``series`` only, if given), in order of start."""
        with self._lock:
            out = [w for w in self._steps if series is None or w.series == series]
        return sorted(out, key=lambda w: (w.start_s, w.end_s))

    def latency_kinds(self) -> list[str]:
        """The latency kinds with samples, sorted."""
        with self._lock:
            return sorted(self._latency)

    def clamped(self, kind: str) -> int:
        """Latencies of ``kind`` that fell outside the histogram's range."""
        with self._lock:
            return self._clamped.get(kind, 0)

    def percentiles_per_minute(self, kind: str) -> list[MinutePercentiles]:
        """p50 and p99 (nearest rank, within 0.5 %) and the exact maximum of each minute with samples."""
        with self._lock:
            minutes = {m: (dict(h.buckets), h.n, h.max_ms) for m, h in self._latency.get(kind, {}).items()}
        out: list[MinutePercentiles] = []
        for m in sorted(minutes):
            buckets, n, top = minutes[m]
            ranked = sorted(buckets.items())

            def at(q: float, ranked: list[tuple[int, int]] = ranked, n: int = n, top: float = top) -> float:
                rank, seen = max(1, math.ceil(q * n)), 0
                for b, c in ranked:
                    seen += c
                    if seen >= rank:
                        return min(_bucket_value(b), top) if top > 0 else _bucket_value(b)
                return top  # unreachable: the counts add up to n

            out.append({"minute": m, "n": n, "p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": top})
        return out

    def _steady(
        self, measure: str, series: str, after_s: float, life_warmup_s: float | None
    ) -> list[np.ndarray[Any, Any]]:
        """The series' samples cut into lives and at known steps, each part without its warm-up or the step's
        window: a list of ``(2, n)`` arrays."""
        t, v = self.samples(measure, series)
        steps = self.steps(series)
        outside = np.ones(t.shape, dtype=bool)
        for w in steps:
            outside &= (t < w.start_s) | (t >= w.end_s + STEP_SETTLE_S)
        warm = after_s if life_warmup_s is None else life_warmup_s
        starts = [s for s, _ in self.lives(series)]
        # Samples before the first life marker (if any) belong to the first life; each life's
        # warm-up counts from when it was first seen, so a process started late still gets one.
        edges = [-math.inf, *starts[1:], math.inf]
        anchors = starts or [-math.inf]
        parts = []
        for (lo, hi), born in zip(itertools.pairwise(edges), anchors, strict=True):
            life = outside & (t >= lo) & (t < hi) & (t >= after_s) & (t >= born + warm)
            cuts = [lo, *sorted(w.start_s for w in steps if lo < w.start_s < hi), hi]
            for a, b in itertools.pairwise(cuts):
                keep = life & (t >= a) & (t < b)
                if keep.any():
                    parts.append(np.vstack([t[keep], v[keep]]))
        return parts

    def slope_per_hour(
        self, measure: str, series: str, after_s: float = WARMUP_S, *, life_warmup_s: float | None = None
    ) -> float | None:
        """Least-squares slope of the series in units per hour, from ``after_s`` on.

        Within each life of the series' process (see :data:`LIFE`), after its own warm-up
        (``life_warmup_s`` from when the life was first seen, default ``after_s``); the lives share
        one slope and each has its own intercept, so a restart's drop is not read as shrinking, nor
        its climb back as a leak. Known steps (:meth:`step`) cut a life the same way, without their window.
        None when fewer than two samples at different times remain.
        """
        num = den = 0.0
        for part in self._steady(measure, series, after_s, life_warmup_s):
            dt = part[0] - part[0].mean()
            num += float(dt @ (part[1] - part[1].mean()))
            den += float(dt @ dt)
        return None if den == 0.0 else 3600.0 * num / den

    def growth(
        self, measure: str, series: str, after_s: float = WARMUP_S, *, life_warmup_s: float | None = None
    ) -> float | None:
        """Last minus first sample from ``after_s`` on, added up over the process's lives (None: no samples)."""
        parts = self._steady(measure, series, after_s, life_warmup_s)
        return None if not parts else float(sum(p[1][-1] - p[1][0] for p in parts))

    # -- JSON --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything recorded, as plain JSON types (see :meth:`from_dict`)."""
        with self._lock:
            return {
                "format": _FORMAT,
                "cap": self.cap,
                "samples": {
                    m: {s: {"t": list(x.t), "v": list(x.v), "dropped": x.dropped} for s, x in per.items()}
                    for m, per in self._samples.items()
                },
                "lives": {s: [list(x) for x in lives] for s, lives in self._lives.items()},
                "faults": [asdict(f) for f in self._faults],
                "steps": [asdict(w) for w in self._steps],
                "latency": {
                    k: {
                        str(m): {"n": h.n, "max_ms": h.max_ms, "buckets": {str(b): c for b, c in h.buckets.items()}}
                        for m, h in per.items()
                    }
                    for k, per in self._latency.items()
                },
                "clamped": dict(self._clamped),
            }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, clock: Callable[[], float] = time.monotonic) -> Timeline:
        """The timeline :meth:`to_dict` described.

        Raises
        ------
        ValueError
            A format this code does not read.
        """
        if data.get("format") != _FORMAT:
            raise ValueError(f"timeline format must be {_FORMAT}, got {data.get('format')!r}")
        tl = cls(cap=int(data["cap"]), clock=clock)
        for m, per in data["samples"].items():
            for s, x in per.items():
                series = tl._samples.setdefault(m, {}).setdefault(s, _Series())
                series.t, series.v = [float(a) for a in x["t"]], [float(a) for a in x["v"]]
                series.dropped = int(x["dropped"])
        tl._lives = {s: [(float(t), float(v)) for t, v in lives] for s, lives in data["lives"].items()}
        tl._faults = [FaultWindow(**f) for f in data["faults"]]
        # A timeline written before steps were recorded has none.
        tl._steps = [StepWindow(**w) for w in data.get("steps", [])]
        for k, per in data["latency"].items():
            for m, h in per.items():
                minute = tl._latency.setdefault(k, {}).setdefault(int(m), _Minute())
                minute.n, minute.max_ms = int(h["n"]), float(h["max_ms"])
                minute.buckets = {int(b): int(c) for b, c in h["buckets"].items()}
        tl._clamped = {k: int(n) for k, n in data["clamped"].items()}
        return tl

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, *, clock: Callable[[], float] = time.monotonic) -> Timeline:
        """The timeline :meth:`to_json` wrote."""
        return cls.from_dict(json.loads(text), clock=clock)
