"""The Live page's feed: recognitions from the server's event bus, kept in memory; unknown faces become alerts.

One thread subscribes to :attr:`Services.events <peep.server.services.Services.events>` (the same bus gRPC
``StreamEvents`` and the MQTT events topic are fed from, so on PostgreSQL it carries every replica's
recognitions) and appends each event to a bounded ring with a sequence number. Server-sent-event
streams poll the ring for numbers past the last one they sent, so a slow browser never slows
recognition. An identification that names nobody (``unknown``) is stored as an alert in the database,
where an operator acknowledges it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from peep.core import wire
from peep.v1 import template_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveEvent:
    """One recognition as the console shows it (ids only: the server has no image)."""

    seq: int
    event_id: str
    time: float
    site: str
    device_id: str
    track_id: str
    purpose: str
    subject: str
    unknown: bool
    accepted: bool | None
    probability: float
    model_version: str
    #: A door opened at another's request (``home_assistant``), not by a claim: it names no subject.
    requested_by: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class LiveFeed:
    """Recent recognitions (newest last) and the alert hook.

    Parameters
    ----------
    events : EventBus
    alerts : ConsoleStore or None
        Where unknown-face alerts are stored (None: not stored).
    size : int
        Events kept.
    """

    def __init__(self, events: Any, alerts: Any, *, size: int = 500) -> None:
        self._bus = events
        self._alerts = alerts
        self._ring: deque[LiveEvent] = deque(maxlen=size)
        self._seq = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sub: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> LiveFeed:
        self._sub = self._bus.subscribe("")
        self._thread = threading.Thread(target=self._run, name="peep-console-feed", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._sub is not None:
            self._sub.close()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.is_set() and not self._sub.closed:
            ev = self._sub.get(timeout=0.5)
            if ev is None:
                continue
            try:
                self.add(ev)
            except Exception:  # a bad event or a database hiccup must not end the feed
                log.exception("console feed: event not recorded")

    def add(self, ev: Any) -> LiveEvent:
        """Record a ``RecognitionEvent`` (the feed thread calls this; tests may too)."""
        verify = ev.purpose == template_pb2.PURPOSE_VERIFY
        t = ev.time.seconds + ev.time.nanos * 1e-9
        with self._lock:
            self._seq += 1
            item = LiveEvent(
                seq=self._seq,
                event_id=ev.event_id,
                time=t,
                site=ev.site,
                device_id=ev.device_id,
                track_id=ev.track_id,
                purpose=wire.purpose_name(ev.purpose) if ev.purpose else "unspecified",
                subject=ev.claimed_subject if verify else ev.subject,
                unknown=bool(ev.unknown) and not verify,
                accepted=bool(ev.accepted) if verify else None,
                probability=float(ev.probability),
                model_version=ev.model_version,
                requested_by=ev.requested_by if verify else "",
            )
            self._ring.append(item)
            self._changed.notify_all()
        if item.unknown and self._alerts is not None:
            self._alerts.add_alert(item.event_id, t, item.site, item.device_id, item.probability, item.model_version)
        return item

    def since(self, seq: int, *, site: str = "", device_id: str = "") -> list[LiveEvent]:
        """Events numbered after ``seq`` matching the filters, oldest first."""
        with self._lock:
            items = [e for e in self._ring if e.seq > seq]
        return [e for e in items if (not site or e.site == site) and (not device_id or e.device_id == device_id)]

    def recent(self, *, site: str = "", device_id: str = "", limit: int = 100) -> list[LiveEvent]:
        """The newest ``limit`` events matching the filters, newest first."""
        return list(reversed(self.since(0, site=site, device_id=device_id)))[:limit]

    @property
    def last_seq(self) -> int:
        return self._seq

    def wait(self, seq: int, timeout: float) -> bool:
        """Block until an event past ``seq`` exists or ``timeout`` passes (for threads; SSE polls)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._seq > seq, timeout)

    def sites_and_devices(self) -> tuple[list[str], list[str]]:
        with self._lock:
            return sorted({e.site for e in self._ring}), sorted({e.device_id for e in self._ring})
