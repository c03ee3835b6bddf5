"""How many distinct enrolled people each camera recognised in the last minutes: the count Home Assistant's
``sensor.<camera>_recognised_recently`` shows, and nothing of who.

Data minimisation: the counter holds, per camera, each subject recognised there within the window and the time of
that subject's latest recognition, in this process's memory only. An entry is dropped as soon as it leaves the
window (on every update and every read), nothing is written to disk or the database, and only the number leaves the
process. A restart forgets it all: the count starts again from the decisions made after it.

With several replicas, each counts only the decisions it made itself (the devices' templates are split between the
replicas), so each count is a part of the site's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["RecentlyRecognised"]


class RecentlyRecognised:
    """Distinct subjects per camera within a sliding window, kept in memory only (see the module docstring).

    Parameters
    ----------
    window_s : float
        How far back a recognition counts, in seconds (``home_assistant.recent_minutes`` × 60).
    clock : callable returning float, default time.monotonic
        Seconds on a clock that never steps back (tests inject their own).
    max_per_camera : int, default 100_000
        A bound on what one camera's entry may hold (more subjects than any site enrols): beyond it the
        oldest entry is dropped, so a flood of decisions cannot grow the memory without end.

    Examples
    --------
    >>> now = [0.0]
    >>> r = RecentlyRecognised(60.0, clock=lambda: now[0])
    >>> r.add("cam-1", "alice"); r.add("cam-1", "alice"); r.add("cam-1", "bob")
    >>> r.count("cam-1")
    2
    >>> now[0] = 61.0
    >>> r.count("cam-1")
    0
    """

    def __init__(
        self, window_s: float, *, clock: Callable[[], float] = time.monotonic, max_per_camera: int = 100_000
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s: expected a positive number of seconds, received {window_s!r}")
        self.window_s = float(window_s)
        self._clock = clock
        self._max = max_per_camera
        # camera -> {subject: time of its latest recognition}, in insertion order of those times (oldest first).
        self._seen: dict[Hashable, dict[str, float]] = {}
        self._lock = threading.Lock()

    def add(self, camera: Hashable, subject: str) -> None:
        """Note that ``subject`` was recognised at ``camera`` now."""
        now = self._clock()
        with self._lock:
            seen = self._seen.setdefault(camera, {})
            seen.pop(subject, None)  # re-inserted last: the dict stays ordered by time
            seen[subject] = now
            while len(seen) > self._max:
                del seen[next(iter(seen))]
            self._prune(camera, now)

    def count(self, camera: Hashable) -> int:
        """The number of distinct subjects recognised at ``camera`` within the window."""
        with self._lock:
            self._prune(camera, self._clock())
            return len(self._seen.get(camera, ()))

    def forget(self, keep: set[Hashable]) -> None:
        """Drop every camera not in ``keep`` (no longer shown to Home Assistant)."""
        with self._lock:
            for camera in [c for c in self._seen if c not in keep]:
                del self._seen[camera]

    def _prune(self, camera: Hashable, now: float) -> None:
        seen = self._seen.get(camera)
        if seen is None:
            return
        horizon = now - self.window_s
        while seen:
            subject, at = next(iter(seen.items()))
            if at > horizon:
                break
            del seen[subject]
        if not seen:
            del self._seen[camera]
