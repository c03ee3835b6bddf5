"""Sampling the soak's processes and folders into a :class:`~peep.lab.bench.soak.timeline.Timeline`.

A *source* is any callable returning ``{series: {measure: value}}``, or None when there is nothing
to read this time (the process is down: a replica between its SIGKILL and its restart). Three
kinds are made here: :func:`process_source` (a process's memory, descriptors, threads and CPU, read
from ``/proc``, no dependency), :func:`directory_bytes_source` (a spool folder's size) and
:func:`callable_source` (any number or numbers per series: database size per table, the broker's
queue).

:class:`ResourceSampler` calls each source on its own daemon thread. A source that raises is
counted and called again next time; one that blocks (a size query while PostgreSQL is stopped)
delays only itself, so the replicas' memory is still sampled through exactly the faults where it
matters most.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from peep.lab.bench.soak.timeline import LIFE, Timeline

log = logging.getLogger(__name__)

#: What a source returns: values per measure, per series.
Reading = Mapping[str, Mapping[str, float]]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Source:
    """A named source: ``read()`` returns a :data:`Reading` or None (nothing to read now)."""

    name: str
    read: Callable[[], Reading | None]

    def __call__(self) -> Reading | None:
        return self.read()


def _proc_stat(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) and start time (seconds after boot) from ``/proc/<pid>/stat``."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: the fields after it start at the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime, start = int(fields[11]), int(fields[12]), int(fields[19])
    return (utime + stime) / _CLK_TCK, start / _CLK_TCK


def read_process(pid: int) -> dict[str, float]:
    """``rss_mb``, ``fds``, ``threads``, ``cpu_s`` and :data:`LIFE` (start time) of process ``pid``.

    Raises
    ------
    FileNotFoundError, ProcessLookupError
        The process is gone.
    """
    rss_kb = threads = None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    if rss_kb is None or threads is None:
        # A zombie has no memory lines: it is gone as far as the soak is concerned.
        raise ProcessLookupError(f"process {pid} has no VmRSS or Threads (a zombie?)")
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    cpu_s, start_s = _proc_stat(pid)
    return {"rss_mb": rss_kb / 1024.0, "fds": float(fds), "threads": float(threads), "cpu_s": cpu_s, LIFE: start_s}


def process_source(name: str, pid_getter: Callable[[], int | None]) -> Source:
    """A source for the process ``pid_getter()`` names now, as series ``name``.

    Reads ``rss_mb`` (VmRSS), ``fds`` (entries of ``/proc/<pid>/fd``), ``threads``, ``cpu_s``
    (user + system seconds since the process started) and ``cpu_pct`` (of one core, since the
    previous reading of the same life), and gives the process's start time as :data:`LIFE`, so a
    restart starts a new life on the timeline. None while there is no pid or the process is gone.
    Reading another user's ``/proc/<pid>/fd`` needs privilege; that raises (a counted failure).
    """
    last: dict[str, float] = {}

    def read() -> Reading | None:
        pid = pid_getter()
        if pid is None:
            return None
        try:
            values = read_process(pid)
        except (FileNotFoundError, ProcessLookupError):
            return None
        now = time.monotonic()
        if last.get("life") == values[LIFE] and now > last["at"]:
            values["cpu_pct"] = 100.0 * (values["cpu_s"] - last["cpu_s"]) / (now - last["at"])
        last.update(life=values[LIFE], cpu_s=values["cpu_s"], at=now)
        return {name: values}

    return Source(f"process:{name}", read)


def directory_bytes_source(
    name: str,
    path: str | os.PathLike[str],
    *,
    bytes_measure: str = "spool_bytes",
    files_measure: str | None = "spool_files",
) -> Source:
    """A source for the size of the files under ``path`` (recursively), as series ``name``.

    Files that vanish while the folder is walked (a spool being drained) are skipped; None while
    the folder does not exist. Symbolic links are not followed.
    """
    root = Path(path)

    def read() -> Reading | None:
        if not root.is_dir():
            return None
        total = files = 0
        stack = [root]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                        files += 1
                except FileNotFoundError:
                    continue
        values = {bytes_measure: float(total)}
        if files_measure is not None:
            values[files_measure] = float(files)
        return {name: values}

    return Source(f"directory:{name}", read)


def callable_source(
    fn: Callable[[], float | Mapping[str, float] | None], *, measure: str, series: str | None = None
) -> Source:
    """A source of one ``measure`` from ``fn``.

    With ``series``, ``fn()`` returns one number (``callable_source(queue_depth, measure="broker_queue",
    series="mosquitto")``); without, it returns ``{series: number}`` (``callable_source(table_sizes,
    measure="db_mb")`` for the size of each table). None from ``fn`` means nothing to read now.
    """

    def read() -> Reading | None:
        got = fn()
        if got is None:
            return None
        if series is not None:
            if isinstance(got, Mapping):
                raise TypeError(f"source {measure}/{series} must return a number, got a mapping")
            return {series: {measure: got}}
        if not isinstance(got, Mapping):
            raise TypeError(f"source {measure} without a series must return {{series: number}}, got {got!r}")
        return {s: {measure: v} for s, v in got.items()}

    return Source(f"callable:{measure}" + (f":{series}" if series else ""), read)


class ResourceSampler:
    """Call each source every ``every_s`` seconds and record what it returns on ``timeline``.

    Parameters
    ----------
    timeline : Timeline
        Where readings go, at :meth:`Timeline.now` when each source returned.
    every_s : float
        The period; a source slower than that skips the slots it missed instead of bunching.
    sources : sequence of callables
        Each returns a :data:`Reading` or None; named by its ``name`` attribute (as a
        :class:`Source` has), else its ``__name__``, else its position.

    Notes
    -----
    ``failures`` counts the calls that raised or returned a value the timeline refused,
    ``absent`` those that returned None, ``readings`` those recorded, per source name.
    """

    def __init__(self, timeline: Timeline, every_s: float, sources: Sequence[Callable[[], Reading | None]]) -> None:
        if not isinstance(every_s, int | float) or not math.isfinite(every_s) or every_s <= 0:
            raise ValueError(f"every_s must be a positive number of seconds, got {every_s!r}")
        self.timeline = timeline
        self.every_s = float(every_s)
        self._sources: list[tuple[str, Callable[[], Reading | None]]] = []
        for i, src in enumerate(sources):
            name = getattr(src, "name", None) or getattr(src, "__name__", None) or f"source-{i}"
            self._sources.append((f"{name}#{i}" if any(n == name for n, _ in self._sources) else name, src))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._counts_lock = threading.Lock()
        self._failures = {n: 0 for n, _ in self._sources}
        self._absent = {n: 0 for n, _ in self._sources}
        self._readings = {n: 0 for n, _ in self._sources}
        self.last_error: dict[str, str] = {}

    def _count(self, table: dict[str, int], name: str) -> None:
        with self._counts_lock:
            table[name] += 1

    @property
    def failures(self) -> dict[str, int]:
        """Calls per source that raised or gave values the timeline refused."""
        with self._counts_lock:
            return dict(self._failures)

    @property
    def absent(self) -> dict[str, int]:
        """Calls per source that returned None (nothing to read then)."""
        with self._counts_lock:
            return dict(self._absent)

    @property
    def readings(self) -> dict[str, int]:
        """Calls per source whose values were recorded."""
        with self._counts_lock:
            return dict(self._readings)

    def sample_now(self) -> None:
        """Call every source once on the calling thread (a last reading before the report, say).

        A source that blocks blocks the caller; the sampler's own threads are unaffected.
        """
        for name, source in self._sources:
            self._sample(name, source)

    def _sample(self, name: str, source: Callable[[], Reading | None]) -> bool:
        """Call one source and record its reading; False if it failed (counted, never raised)."""
        try:
            reading = source()
            if reading is None:
                self._count(self._absent, name)
                return True
            t = self.timeline.now()
            for series, values in reading.items():
                for measure, value in values.items():
                    self.timeline.add(measure, series, t, value)
        except Exception as e:  # a broken source must never end the sampling of the others
            with self._counts_lock:
                self._failures[name] += 1
                first = self._failures[name] == 1
                self.last_error[name] = f"{type(e).__name__}: {e}"
            # The first failure of a source is worth a warning; a process that stays down repeats it.
            log.log(logging.WARNING if first else logging.DEBUG, "soak sampler: source %s failed: %s", name, e)
            return False
        self._count(self._readings, name)
        return True

    def _run(self, name: str, source: Callable[[], Reading | None]) -> None:
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            self._sample(name, source)
            # The next slot after now: a slow call skips slots rather than catching up in a burst.
            k = max(k + 1, math.floor((time.monotonic() - start) / self.every_s) + 1)
            if self._stop.wait(max(0.0, start + k * self.every_s - time.monotonic())):
                break

    def start(self) -> ResourceSampler:
        """Start one daemon thread per source; returns self."""
        if self._threads:
            raise RuntimeError("the sampler was already started")
        for name, src in self._sources:
            th = threading.Thread(target=self._run, args=(name, src), name=f"soak-sampler:{name}", daemon=True)
            self._threads.append(th)
            th.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop sampling, waiting at most ``timeout_s`` in all; False if a source is still stuck in a call.

        A stuck thread is a daemon and is left behind: it cannot hold the process up at exit.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        return not any(th.is_alive() for th in self._threads)

    def __enter__(self) -> ResourceSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
