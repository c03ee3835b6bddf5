"""Recognition events: the log of decisions streamed to ``StreamEvents`` subscribers, and the sinks (MQTT).

Every decision is committed to the database (``recognition_events``) before
anyone hears of it, and its row id is the event's ``seq``: increasing in commit
order (:meth:`peep.server.storage.sql.SqlStore._lock_events`), shared by every
replica on one PostgreSQL database. Subscribers are fed by one reader per
process (:class:`EventBus`) that reads the rows above the last id it
delivered, whenever this process commits decisions, when another replica
says it did (``NOTIFY peep_events``, :class:`~peep.server.recognition.watch.ChangeWatcher`),
and every ``check_interval`` seconds. A replica whose database connections
were cut reads on from its last id once they are back: nothing committed
meanwhile is passed over, and each event reaches a subscriber once, in
``seq`` order. A subscriber may start from a ``seq`` (``after_seq``): the
kept events above it first, read from the database, then on.

Publishing never blocks the recognition path: a subscriber's queue is
bounded, and one that falls behind by more than it holds re-reads from its
last ``seq`` rather than losing events (``Subscription.reread``) or slowing
ingest. Sinks (the MQTT events topic) get this process's own decisions at
once, before they are committed when the Identify and Verify calls decide
(their rows are written in batches, off the calls' path).
"""

from __future__ import annotations

import collections
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

__all__ = ["OLDEST_SEQ_KEY", "EventBus", "SeqAhead", "event_json_bytes", "event_to_json"]

log = logging.getLogger(__name__)

Event = recognition_pb2.RecognitionEvent

#: Initial metadata of a resumed ``StreamEvents`` (``after_seq`` > 0): the oldest seq the server still keeps
#: ("0": none kept). A client whose last seq is older than it by more than one may have missed deleted events.
OLDEST_SEQ_KEY = "peep-oldest-seq"


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
        "decided_on": ev.decided_on or "server",
    }
    if ev.decided_on == "device":
        out.update(epsilon_label=ev.epsilon_label, model_serial=ev.model_serial)
    if ev.purpose == template_pb2.PURPOSE_VERIFY:
        out.update(claimed_subject=ev.claimed_subject, accepted=ev.accepted, probability=ev.probability)
        if ev.template_sha256:
            out["template_sha256"] = ev.template_sha256
        if ev.requested_by:
            out["requested_by"] = ev.requested_by
    else:
        out.update(
            subject=ev.subject, unknown=ev.unknown, probability=ev.probability, releases_fused=ev.releases_fused or 1
        )
    return out


def event_json_bytes(ev: recognition_pb2.RecognitionEvent) -> bytes:
    return json.dumps(event_to_json(ev), separators=(",", ":")).encode()


class Subscription:
    """One ``StreamEvents`` client (or the console's feed): iterate with :meth:`get`.

    Receives the events of ``site`` (every site when empty) and, when
    ``device_id`` is set, only those of that device's templates, each once and
    in ``seq`` order, starting after ``after`` (see the module docstring).
    """

    def __init__(self, bus: EventBus, site: str, maxsize: int, device_id: str = "", *, after: int, catch_up: bool):
        self._bus = bus
        self.site = site
        self.device_id = device_id
        #: The seq of the last event handed out (or the point it starts after).
        self.after = after
        self.queue: queue.Queue[recognition_pb2.RecognitionEvent | None] = queue.Queue(maxsize)
        self._backlog: collections.deque[recognition_pb2.RecognitionEvent] = collections.deque()
        self._page = max(1, min(maxsize, 500))
        #: Events dropped from the full queue (each then read again from the database).
        self.dropped = 0
        self._dropped_read = -1 if catch_up else 0  # != dropped: read from the database before the queue
        #: Times this subscriber caught up from the database (a resume, or having fallen behind).
        self.reread = 0
        self._catching = False
        self.closed = False

    def offer(self, ev: recognition_pb2.RecognitionEvent) -> None:
        if (self.site and ev.site != self.site) or (self.device_id and ev.device_id != self.device_id):
            return
        self.dropped += put_dropping_oldest(self.queue, ev)

    def _catch_up(self) -> bool:
        """Read the kept events after :attr:`after` into the backlog; False when the database failed."""
        mark = self.dropped
        try:
            self._backlog.extend(self._bus.read(self.after, site=self.site, device_id=self.device_id, limit=self._page))
        except Exception as exc:
            log.warning("events not read from the database; retrying", extra={"error": str(exc)[:200]})
            return False
        if not self._backlog:
            self._dropped_read = mark  # caught up: what the queue holds from here follows on
            self._catching = False
        return True

    def get(self, timeout: float) -> recognition_pb2.RecognitionEvent | None:
        """The next event, or None on timeout / when closed."""
        while not self.closed:
            if self._backlog:
                ev = self._backlog.popleft()
                if ev.seq > self.after:
                    self.after = ev.seq
                    return ev
                continue
            if self._dropped_read != self.dropped:
                if not self._catching:
                    self._catching = True
                    self.reread += 1
                if self._catch_up():
                    continue
                self._bus.wait_stopping(min(timeout, 1.0))
                return None
            try:
                ev = self.queue.get(timeout=timeout)
            except queue.Empty:
                return None
            if ev is None:
                return None
            if ev.seq > self.after:
                self.after = ev.seq
                return ev
        return None

    def close(self) -> None:
        self.closed = True
        self._bus._remove(self)
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass


Reader = Callable[..., list[tuple[int, Any]]]


class SeqAhead(Exception):
    """A subscriber asked to start after a seq the log never reached (another database's, or made up).

    Ids never run backwards, so starting from it would pass over events: the client must start afresh.
    """

    def __init__(self, after_seq: int, last: int) -> None:
        super().__init__(f"after_seq: expected at most {last} (the last event's seq), received {after_seq}")
        self.after_seq = after_seq
        self.last = last


class EventBus:
    """The process's reader of the log of decisions, its subscribers and its sinks (see the module docstring).

    Parameters
    ----------
    read : callable
        ``read(since_id=, limit=, site=, device_id=, origin=)`` -> ``[(id, DecisionRecord)]`` oldest first
        (:meth:`peep.server.storage.Store.decisions`).
    last_id : callable
        The largest id in the log (:meth:`peep.server.storage.Store.last_decision_id`).
    first_id : callable, optional
        The smallest id still kept (:meth:`peep.server.storage.Store.first_decision_id`).
    origin : str or None
        Stream only the decisions of this replica (``cluster.events = false``); None: every replica's.
    queue_size : int
        Events a subscriber's queue holds before it re-reads from the database.
    check_interval : float
        Seconds between reads when nothing said a decision was committed (a missed notification).
    """

    def __init__(
        self,
        read: Reader,
        last_id: Callable[[], int],
        first_id: Callable[[], int] | None = None,
        *,
        origin: str | None = None,
        queue_size: int = 1000,
        check_interval: float = 2.0,
    ) -> None:
        if not check_interval > 0:
            raise ValueError(f"check_interval: expected seconds > 0, received {check_interval!r}")
        self._read = read
        self._last_id = last_id
        self._first_id = first_id
        self.origin = origin or None
        self._subs: list[Subscription] = []
        self._sinks: list[Callable[[recognition_pb2.RecognitionEvent], None]] = []
        self._lock = threading.Lock()
        self._queue_size = queue_size
        self.check_interval = float(check_interval)
        #: The seq of the last event read from the log (None: not reading, nobody subscribed).
        self.cursor: int | None = None
        self.read_events = 0
        self.read_failures = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.closed = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ sinks

    def add_sink(self, fn: Callable[[recognition_pb2.RecognitionEvent], None]) -> None:
        self._sinks.append(fn)

    def publish(self, ev: recognition_pb2.RecognitionEvent) -> None:
        """Hand this process's decision to the sinks (subscribers read it from the log once committed)."""
        for fn in self._sinks:
            try:
                fn(ev)
            except Exception:
                log.exception("event sink failed")

    # ------------------------------------------------------------ the log

    def committed(self) -> None:
        """Decisions were committed (here, or another replica said so): read the log."""
        self._wake.set()

    def read(self, after: int, *, site: str = "", device_id: str = "", limit: int = 500) -> list[Event]:
        """The kept events after seq ``after`` (of ``site`` / ``device_id`` when given), oldest first."""
        rows = self._read(since_id=after, limit=limit, site=site, device_id=device_id, origin=self.origin)
        return [rec.to_event(seq) for seq, rec in rows]

    def last_seq(self) -> int:
        """The largest seq in the log (a subscriber may not resume after a later one)."""
        return int(self._last_id())

    def first_seq(self) -> int:
        """The smallest seq still kept (older ones deleted by retention or an erasure); 0: none kept or unknown."""
        return int(self._first_id()) if self._first_id is not None else 0

    def start(self) -> EventBus:
        self._thread = threading.Thread(target=self._run, name="peep-events", daemon=True)
        self._thread.start()
        return self

    def wait_stopping(self, timeout: float) -> bool:
        return self._stop.wait(timeout)

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            self._wake.wait(self.check_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                if not self._subs:
                    self.cursor = None  # nobody listening: no reads; the next subscriber starts from the end
                    continue
                since = self.cursor
            if since is None:
                continue
            try:
                events = self.read(since, limit=1000)
            except Exception as exc:  # the database: keep the cursor, read on from it once it answers
                self.read_failures += 1
                log.warning("events not read from the database; retrying", extra={"error": str(exc)[:200]})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                self._wake.set()
                continue
            backoff = 0.2
            if not events:
                continue
            if len(events) == 1000:
                self._wake.set()  # more to read
            with self._lock:
                if self.cursor != since:  # the subscribers left and came back meanwhile: they start later
                    continue
                self.cursor = events[-1].seq
                subs = list(self._subs)
            self.read_events += len(events)
            for ev in events:
                for s in subs:
                    s.offer(ev)

    # ------------------------------------------------------------ subscribers

    def subscribe(self, site: str = "", *, device_id: str = "", after_seq: int = 0) -> Subscription:
        """Events of ``site`` ("" = all sites), only ``device_id``'s when given (the caller decides who sees what).

        ``after_seq`` 0: the events committed from now on; N: the kept events whose seq is above N first.
        Raises :class:`SeqAhead` when N is above the last seq in the log.
        """
        last = self.last_seq()  # "now": what is committed, whether or not the reader has read it yet
        if after_seq > last:
            raise SeqAhead(after_seq, last)
        with self._lock:
            if self.cursor is None:
                self.cursor = last  # the reader is idle while there is nobody: it reads on from here
            start = max(self.cursor, last)
            resume = 0 < after_seq < start
            sub = Subscription(
                self, site, self._queue_size, device_id, after=after_seq if after_seq else start, catch_up=resume
            )
            self._subs.append(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    @property
    def n_subscribers(self) -> int:
        return len(self._subs)

    def close(self) -> None:
        """Wake every subscriber and stop reading (shutdown)."""
        self.closed = True
        self._stop.set()
        self._wake.set()
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            s.close()
        if self._thread is not None:
            self._thread.join(5.0)
