"""Recognition events: fan-out to gRPC ``StreamEvents`` subscribers and sinks (MQTT).

Publishing never blocks the recognition path: each subscriber has a bounded
queue and a slow subscriber loses its oldest events (counted in
``Subscription.dropped``) rather than slowing ingest.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from peep.core import wire
from peep.v1 import recognition_pb2, template_pb2

log = logging.getLogger(__name__)

Event = recognition_pb2.RecognitionEvent


def new_event(**fields: Any) -> recognition_pb2.RecognitionEvent:
    """A RecognitionEvent with a fresh id and the current time."""
    ev = recognition_pb2.RecognitionEvent(event_id=uuid.uuid4().hex, **fields)
    ev.time.GetCurrentTime()
    return ev


def event_to_json(ev: recognition_pb2.RecognitionEvent) -> dict[str, Any]:
    """The JSON published on ``<mqtt.topic_prefix>/<site>/<device>/events`` (:mod:`peep.core.topics`)."""
    out: dict[str, Any] = {
        "event_id": ev.event_id,
        "time": Timestamp.ToJsonString(ev.time),
        "site": ev.site,
        "device_id": ev.device_id,
        "message_id": ev.message_id,
        "track_id": ev.track_id,
        "purpose": wire.purpose_name(ev.purpose) if ev.purpose else "unspecified",
        "model_version": ev.model_version,
    }
    if ev.purpose == template_pb2.PURPOSE_VERIFY:
        out.update(claimed_subject=ev.claimed_subject, accepted=ev.accepted, probability=ev.probability)
    else:
        out.update(subject=ev.subject, unknown=ev.unknown, probability=ev.probability)
    return out


def event_json_bytes(ev: recognition_pb2.RecognitionEvent) -> bytes:
    return json.dumps(event_to_json(ev), separators=(",", ":")).encode()


class Subscription:
    """One StreamEvents client: iterate with :meth:`get`.

    Receives the events of ``site`` (every site when empty) and, when ``device_id``
    is set, only those of that device's templates.
    """

    def __init__(self, bus: EventBus, site: str, maxsize: int, device_id: str = "") -> None:
        self._bus = bus
        self.site = site
        self.device_id = device_id
        self.queue: queue.Queue[recognition_pb2.RecognitionEvent | None] = queue.Queue(maxsize)
        self.dropped = 0
        self.closed = False

    def offer(self, ev: recognition_pb2.RecognitionEvent) -> None:
        if (self.site and ev.site != self.site) or (self.device_id and ev.device_id != self.device_id):
            return
        while True:
            try:
                self.queue.put_nowait(ev)
                return
            except queue.Full:
                try:
                    self.queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def get(self, timeout: float) -> recognition_pb2.RecognitionEvent | None:
        """Next event, or None on timeout / when closed."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed = True
        self._bus._remove(self)
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass


class EventBus:
    def __init__(self, *, queue_size: int = 1000) -> None:
        self._subs: list[Subscription] = []
        self._sinks: list[Callable[[recognition_pb2.RecognitionEvent], None]] = []
        self._lock = threading.Lock()
        self._queue_size = queue_size
        self.closed = False

    def add_sink(self, fn: Callable[[recognition_pb2.RecognitionEvent], None]) -> None:
        self._sinks.append(fn)

    def subscribe(self, site: str = "", *, device_id: str = "") -> Subscription:
        """Events of ``site`` ("" = all sites), only ``device_id``'s when given (the caller decides who sees what)."""
        sub = Subscription(self, site, self._queue_size, device_id)
        with self._lock:
            self._subs.append(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    @property
    def n_subscribers(self) -> int:
        return len(self._subs)

    @property
    def active(self) -> bool:
        """Whether anyone would receive an event (skip building events otherwise)."""
        return bool(self._subs or self._sinks)

    def publish(self, ev: recognition_pb2.RecognitionEvent) -> None:
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            s.offer(ev)
        for fn in self._sinks:
            try:
                fn(ev)
            except Exception:
                log.exception("event sink failed")

    def close(self) -> None:
        """Wake every subscriber (shutdown)."""
        self.closed = True
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            s.close()
