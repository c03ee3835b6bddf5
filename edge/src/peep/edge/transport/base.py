"""The forwarder contract: a thread moving templates from the spool to one receiver.

A forwarder reads its destination's queue in order, hands templates to its
receiver and removes each one only after the receiver acknowledged it.
``stop(drain_timeout)`` lets it keep delivering for up to
``drain_timeout`` seconds (until the queue is empty) before it exits.

A full disk does not end a forwarder: removing a delivered template is a
write, which SQLite refuses while the disk is full; the forwarder keeps what
it could not remove (sent again later, the receiver dedupes by message id)
and waits for space (:meth:`Forwarder.spool_write_failed`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from peep.edge.logs import log_event
from peep.edge.metrics import EdgeMetrics
from peep.edge.spool import Spool, is_disk_full

_log = logging.getLogger("peep.edge.transport")

#: Seconds a forwarder waits after the spool refused a write for a full disk before it tries again.
DISK_FULL_RETRY_S = 1.0


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
        self._disk_full = False
        spool.subscribe(self.wake.set)

    # -- lifecycle ----------------------------------------------------------------

    def stop(self, drain_timeout: float = 0.0, *, join: bool = True) -> bool:
        """Deliver for up to ``drain_timeout`` more seconds, then exit.

        Returns
        -------
        bool
            True if the queue was empty when the thread ended.
        """
        at = time.monotonic() + max(0.0, drain_timeout)
        # A second stop never moves the end later (a door starts its drain before it closes the lock).
        self._stop_at = at if self._stop_at is None else min(self._stop_at, at)
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

    def spool_write_failed(self, exc: sqlite3.OperationalError) -> None:
        """Handle the spool refusing a write (an ack, a dead letter): on a full disk, log once and wait.

        Raises
        ------
        sqlite3.OperationalError
            ``exc`` again when it is not a full disk (a real fault ends the forwarder loudly, as before).
        """
        if not is_disk_full(exc):
            raise exc
        if not self._disk_full:
            log_event(_log, logging.ERROR, "spool_write_failed_disk_full", transport=self.dest, error=str(exc),
                      retry_in_s=DISK_FULL_RETRY_S)  # fmt: skip
        self._disk_full = True
        self.sleep(DISK_FULL_RETRY_S)

    def spool_write_ok(self) -> None:
        """The spool took a write again: say so once after a full disk."""
        if self._disk_full:
            log_event(_log, logging.WARNING, "spool_write_resumed", transport=self.dest)
            self._disk_full = False

    def update_depth(self) -> None:
        self.metrics.spool_depth.labels(transport=self.dest).set(self.spool.depth(self.dest))
