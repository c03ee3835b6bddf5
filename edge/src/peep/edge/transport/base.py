"""The forwarder contract: a thread moving templates from the spool to one receiver.

A forwarder reads its destination's queue in order, hands templates to its
receiver and removes each one only after the receiver acknowledged it.
``stop(drain_timeout)`` lets it keep delivering for up to
``drain_timeout`` seconds (until the queue is empty) before it exits.
"""

from __future__ import annotations

import threading
import time

from peep.edge.metrics import EdgeMetrics
from peep.edge.spool import Spool


class Forwarder(threading.Thread):
    """Base class: wake-up event, stop/drain handling, metric helpers."""

    dest: str = ""

    def __init__(self, spool: Spool, *, metrics: EdgeMetrics | None = None) -> None:
        super().__init__(name=f"peep-forward-{self.dest}", daemon=True)
        self.spool = spool
        self.metrics = metrics or EdgeMetrics()
        self.wake = threading.Event()
        self._stop_at: float | None = None
        self._halt = threading.Event()
        spool.subscribe(self.wake.set)

    # -- lifecycle ----------------------------------------------------------------

    def stop(self, drain_timeout: float = 0.0, *, join: bool = True) -> bool:
        """Deliver for up to ``drain_timeout`` more seconds, then exit.

        Returns
        -------
        bool
            True if the queue was empty when the thread ended.
        """
        self._stop_at = time.monotonic() + max(0.0, drain_timeout)
        self.wake.set()
        if join and self.is_alive():
            self.join(drain_timeout + 10.0)
        return self.spool.depth(self.dest) == 0 if not self._spool_closed() else False

    def halt(self) -> None:
        """Exit as soon as possible (no drain)."""
        self._halt.set()
        self._stop_at = time.monotonic()
        self.wake.set()

    def _spool_closed(self) -> bool:
        return bool(getattr(self.spool, "_closed", False))

    @property
    def stopping(self) -> bool:
        return self._stop_at is not None

    def should_exit(self, *, idle: bool) -> bool:
        """Exit when halted, or when stopping and either drained (``idle``) or out of time."""
        if self._halt.is_set():
            return True
        if self._stop_at is None:
            return False
        return idle or time.monotonic() >= self._stop_at

    def sleep(self, seconds: float) -> None:
        """Wait for a wake-up (new template, ack, stop) or ``seconds``."""
        if self._stop_at is not None:
            seconds = min(seconds, max(0.0, self._stop_at - time.monotonic()))
        self.wake.wait(seconds)
        self.wake.clear()

    def update_depth(self) -> None:
        self.metrics.spool_depth.labels(transport=self.dest).set(self.spool.depth(self.dest))
