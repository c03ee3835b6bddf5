"""In-memory receiver (benchmarks and tests): acknowledges everything it is handed."""

from __future__ import annotations

import time

from peep.edge.metrics import EdgeMetrics
from peep.edge.spool import Spool
from peep.edge.transport.base import Forwarder


class MemoryForwarder(Forwarder):
    """Moves templates of destination ``dest`` from the spool into :attr:`received`.

    Attributes
    ----------
    received : list of bytes
        Payloads in delivery order.
    publish_seconds : list of float
        Time per hand-off + ack round (the bench's ``publish`` stage).
    """

    def __init__(
        self,
        spool: Spool,
        *,
        dest: str = "memory",
        metrics: EdgeMetrics | None = None,
        batch: int = 64,
    ) -> None:
        self.dest = dest
        super().__init__(spool, metrics=metrics)
        self.batch = batch
        self.received: list[bytes] = []
        self.publish_seconds: list[float] = []

    def run(self) -> None:
        while True:
            items = [] if self._spool_closed() else self.spool.peek(self.dest, self.batch)
            if not items:
                if self.should_exit(idle=True):
                    return
                self.sleep(0.05)
                continue
            t0 = time.perf_counter()
            self.received.extend(it.payload for it in items)
            self.spool.ack(self.dest, [it.message_id for it in items])
            dt = time.perf_counter() - t0
            self.publish_seconds.extend([dt / len(items)] * len(items))
            now = time.time()
            for it in items:
                self.metrics.publish_latency.labels(transport=self.dest).observe(max(0.0, now - it.created))
            self.metrics.published.labels(transport=self.dest).inc(len(items))
            if self.should_exit(idle=False):
                return
