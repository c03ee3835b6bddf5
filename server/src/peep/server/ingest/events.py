"""Recognition events: fan-out to gRPC ``StreamEvents`` subscribers and sinks (MQTT).

Publishing never blocks the recognition path: each subscriber has a bounded
queue and a slow subscriber loses its oldest events (counted in
``Subscription.dropped``) rather than slowing ingest.

Replicas on one PostgreSQL relay their events to each other
(:class:`ClusterRelay`, ``cluster.events``): a replica sends the events it
publishes, in publishing order, as ``NOTIFY peep_events`` (several per
notification), and offers the other replicas' events to its own subscribers,
with the same site and device filters. PostgreSQL delivers notifications in
commit order, so a subscriber on any replica sees each replica's events, and so
each device's, in the order they were published. Sinks (the MQTT events topic)
get only the replica's own events: the replica that made a recognition
publishes it there once.
"""

from __future__ import annotations

import base64
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


def put_dropping_oldest(q: queue.Queue[Any], item: Any) -> int:
    """Put ``item`` on the bounded ``q`` without blocking, dropping the oldest items to make room.

    What every queue on the recognition path does (subscribers, the cluster relay, the kept decisions):
    a slow consumer loses its oldest items rather than slowing ingest. Returns how many were dropped.
    """
    dropped = 0
    while True:
        try:
            q.put_nowait(item)
            return dropped
        except queue.Full:
            try:
                q.get_nowait()
                dropped += 1
            except queue.Empty:
                pass


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
        out.update(
            subject=ev.subject, unknown=ev.unknown, probability=ev.probability, releases_fused=ev.releases_fused or 1
        )
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
        self.dropped += put_dropping_oldest(self.queue, ev)

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
        self.relay: ClusterRelay | None = None

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
        return bool(self._subs or self._sinks or self.relay is not None)

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
        if self.relay is not None:
            self.relay.send(ev)

    def deliver_remote(self, ev: recognition_pb2.RecognitionEvent) -> None:
        """Offer another replica's event to this replica's subscribers (not to the sinks)."""
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            s.offer(ev)

    def close(self) -> None:
        """Wake every subscriber (shutdown)."""
        self.closed = True
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            s.close()


EVENTS_CHANNEL = "peep_events"
_PAYLOAD_MAX = 7000  # PostgreSQL refuses a NOTIFY payload of 8000 bytes or more


class ClusterRelay:
    """Relay events between replicas through PostgreSQL ``NOTIFY peep_events`` (see module docstring).

    Parameters
    ----------
    bus : EventBus
        Attached to it: its events are sent, the other replicas' delivered to its subscribers.
    connect : callable returning a psycopg connection (autocommit)
    queue_size : int
        Events waiting to be sent; beyond it the oldest are dropped (``dropped``), never ingest slowed.
    """

    def __init__(self, bus: EventBus, connect: Callable[[], Any], *, queue_size: int = 10_000) -> None:
        from peep.server.recognition.watch import ChangeWatcher

        self.origin = uuid.uuid4().hex[:16]
        self.bus = bus
        self._connect = connect
        self._out: queue.Queue[recognition_pb2.RecognitionEvent] = queue.Queue(queue_size)
        self._stop = threading.Event()
        self.sent = 0
        self.received = 0
        self.dropped = 0
        self.watcher = ChangeWatcher(connect, {EVENTS_CHANNEL: self._received}, interval=60.0, name="peep-events-in")
        self._sender = threading.Thread(target=self._send_loop, name="peep-events-out", daemon=True)
        bus.relay = self

    def start(self) -> ClusterRelay:
        self.watcher.start()
        self._sender.start()
        return self

    def send(self, ev: recognition_pb2.RecognitionEvent) -> None:
        self.dropped += put_dropping_oldest(self._out, ev)

    def _payloads(self, events: list[recognition_pb2.RecognitionEvent]) -> list[str]:
        out: list[str] = []
        lines: list[str] = []
        size = len(self.origin)
        for ev in events:
            line = base64.b64encode(ev.SerializeToString()).decode()
            if lines and size + len(line) + 1 > _PAYLOAD_MAX:
                out.append("\n".join([self.origin, *lines]))
                lines, size = [], len(self.origin)
            lines.append(line)
            size += len(line) + 1
        if lines:
            out.append("\n".join([self.origin, *lines]))
        return out

    def _send_loop(self) -> None:
        conn: Any = None
        while not self._stop.is_set() or not self._out.empty():
            try:
                first = self._out.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < 1000:
                try:
                    batch.append(self._out.get_nowait())
                except queue.Empty:
                    break
            for attempt in range(3):
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = self._connect()
                    with conn.transaction():  # one commit: the batch's notifications stay in order
                        for payload in self._payloads(batch):
                            conn.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, payload))
                    self.sent += len(batch)
                    break
                except Exception as exc:
                    conn = None
                    if attempt == 2 or self._stop.is_set():
                        self.dropped += len(batch)
                        log.warning("events not relayed to the other replicas", extra={"error": str(exc)})
                        break
                    self._stop.wait(0.5)
        if conn is not None:
            conn.close()

    def _received(self, payload: str) -> None:
        origin, _, rest = payload.partition("\n")
        if origin == self.origin or not rest:
            return  # this replica's own: its subscribers had them when they were published
        for line in rest.split("\n"):
            try:
                ev = recognition_pb2.RecognitionEvent.FromString(base64.b64decode(line))
            except Exception:
                log.warning("unreadable event from another replica dropped")
                continue
            self.received += 1
            self.bus.deliver_remote(ev)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._sender.is_alive():
            self._sender.join(timeout)
        self.watcher.stop(timeout)
