"""Progress reporting for long steps (stderr, only when it is a terminal or forced)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable


def progress_printer(label: str, *, min_interval: float = 1.0) -> Callable[[int, int], None]:
    """A ``(done, total)`` callback printing ``label: done/total (pct) eta`` to stderr.

    Prints at most every ``min_interval`` seconds, plus the final line; quiet
    when stderr is not a terminal unless ``PEEP_PROGRESS=1``.
    """
    enabled = sys.stderr.isatty() or os.environ.get("PEEP_PROGRESS") == "1"
    start = time.monotonic()
    last = [0.0]

    def report(done: int, total: int) -> None:
        if not enabled:
            return
        now = time.monotonic()
        if done < total and now - last[0] < min_interval:
            return
        last[0] = now
        elapsed = now - start
        eta = elapsed / done * (total - done) if done else 0.0
        end = "\n" if done >= total else "\r"
        print(
            f"{label}: {done}/{total} ({done / max(total, 1):.0%}) eta {eta:.0f}s   ",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return report
