"""Progress of long steps on stderr: the one display every ``peep`` command uses.

On a terminal the line is redrawn in place (carriage return), at most every
``tty_interval`` seconds. Anywhere else (``peep audit ... > log 2>&1``, a
pipe, the journal) carriage-return updates would pile up as hundreds of
lines, so plain lines are written instead: at the start, at each 10 % step
(but at most one per ``line_interval`` seconds) and at the end — a dozen
lines per step at most. A step long enough that 10 % of it is a long wait
(the demo's first description of the public faces) can ask for a
``heartbeat``: a line whenever that many seconds passed since the last one.
``PEEP_PROGRESS=0`` silences it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO


class Progress:
    """A ``(done, total)`` progress display; call it, or use :meth:`update` / :meth:`advance`.

    Parameters
    ----------
    label : str
        What is being done, printed first on each line.
    total : int, optional
        Number of steps, if known before the first update.
    stream : text stream, optional
        Where to write (default: ``sys.stderr`` at construction).
    enabled : bool
        ``False`` writes nothing (``--no-progress``).
    interactive : bool, optional
        Redraw in place; default: whether ``stream`` is a terminal.
    tty_interval, line_interval : float
        Least seconds between two redraws (terminal) or two milestone lines (otherwise).
    heartbeat : float, optional
        Off a terminal, also write a line when this many seconds passed since
        the last one (None: only the milestones). Updates must come at least
        this often for it to hold.
    clock : callable
        Monotonic time in seconds (injected in tests).
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        interactive: bool | None = None,
        tty_interval: float = 0.2,
        line_interval: float = 5.0,
        heartbeat: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and os.environ.get("PEEP_PROGRESS") != "0"
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self.tty_interval = tty_interval
        self.line_interval = line_interval
        self.heartbeat = heartbeat
        self._clock = clock
        self._start = 0.0
        self._last = 0.0  # time of the last write
        self._started = False
        self._finished = False
        self._shown: tuple[int, int | None] | None = None  # (done, total) last written
        self._open_line = False  # a redrawn line without its newline yet
        self._decile = -1

    def __call__(self, done: int, total: int | None = None) -> None:
        self.update(done, total)

    def advance(self, n: int = 1) -> None:
        """``n`` more steps done."""
        self.update(self.done + n)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` steps of ``total`` (or of the total already known) are done."""
        if total is not None:
            self.total = total
        self.done = done
        if not self.enabled:
            return
        now = self._clock()
        end = self.total is not None and done >= self.total
        if self._finished:
            if end:
                return
            self._finished = self._started = False  # called again below the total: a new run
        if not self._started:
            self._started, self._start = True, now
            self._decile = self._decile_of(done)
            self._write(now, end)
            return
        if self.interactive:
            if end or now - self._last >= self.tty_interval:
                self._write(now, end)
            return
        decile = self._decile_of(done)
        milestone = decile > self._decile and now - self._last >= self.line_interval
        beat = self.heartbeat is not None and now - self._last >= self.heartbeat
        if end or milestone or beat:
            self._decile = max(decile, self._decile)
            self._write(now, end)

    def close(self) -> None:
        """Show the last state if it was not shown, and end the line."""
        if not self.enabled or not self._started or self._finished:
            return
        if self._shown != (self.done, self.total):
            self._write(self._clock(), True)
        elif self._open_line:
            self.stream.write("\n")
            self.stream.flush()
        self._open_line = False
        self._finished = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _decile_of(self, done: int) -> int:
        return 10 * done // self.total if self.total else 0

    def _text(self, now: float) -> str:
        elapsed = now - self._start
        if not self.total:
            return f"{self.label}: {self.done} ({elapsed:.0f}s)"
        frac = self.done / self.total
        if self.done >= self.total:
            tail = f"in {elapsed:.0f}s"
        else:
            tail = f"eta {elapsed / self.done * (self.total - self.done):.0f}s" if self.done else "eta ?"
        return f"{self.label}: {self.done}/{self.total} ({frac:.0%}) {tail}"

    def _write(self, now: float, end: bool) -> None:
        text = self._text(now)
        if self.interactive:
            # \x1b[K clears what a longer previous line left on the right.
            self.stream.write(f"\r{text}\x1b[K" + ("\n" if end else ""))
            self._open_line = not end
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._last = now
        self._shown = (self.done, self.total)
        if end:
            self._finished = True


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_printer(label: str, *, stream: TextIO | None = None) -> Callable[[int, int], None]:
    """A ``(done, total)`` callback showing the progress of ``label`` on stderr (see :class:`Progress`)."""
    return Progress(label, stream=stream)
