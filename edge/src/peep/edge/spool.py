"""Durable store-and-forward spool (SQLite, WAL) between capture and transports.

Every released template is written here first, once per enabled transport
(``mqtt``, ``grpc``), and leaves only when that transport's receiver has
acknowledged it (broker PUBACK at QoS 1, server ``IngestAck``). Readers get
rows in insertion order, so delivery is in order; receivers dedupe by
``message_id``, so a resend after a lost ack is harmless.

Drop policy (bounded size)
--------------------------
Each transport's queue holds at most ``max_messages`` rows. When a new
template arrives at a full queue:

1. the **oldest identify/verify** template of that queue is dropped (the
   newest faces are the most useful for live recognition);
2. if the queue holds only enrolment templates, a new identify/verify
   template is dropped instead;
3. enrolment templates are **never** dropped: a new one arriving at a queue
   full of enrolment templates raises :class:`SpoolFullError` and nothing is
   written (the operator's ``peep-edge enroll`` fails loudly).

Every drop increments ``peep_edge_spool_dropped_total{transport,purpose}``
and is logged.

Receivers can reject a template for good (gRPC ``REJECTED``); such rows move
to the ``dead`` table (newest :data:`DEAD_LETTER_KEEP` kept) so nothing is
lost silently and an operator can inspect them.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peep.core.wire import MAX_TEMPLATE_BYTES
from peep.edge.errors import SpoolFullError
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.spool")

DEAD_LETTER_KEEP = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    dest       TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    purpose    TEXT    NOT NULL,
    created    REAL    NOT NULL,
    payload    BLOB    NOT NULL,
    UNIQUE (dest, message_id)
);
CREATE INDEX IF NOT EXISTS outbox_dest_seq ON outbox (dest, seq);
CREATE INDEX IF NOT EXISTS outbox_dest_purpose_seq ON outbox (dest, purpose, seq);
CREATE TABLE IF NOT EXISTS dead (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    dest       TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    purpose    TEXT    NOT NULL,
    created    REAL    NOT NULL,
    failed     REAL    NOT NULL,
    reason     TEXT    NOT NULL,
    payload    BLOB    NOT NULL
);
"""


@dataclass(frozen=True)
class SpoolItem:
    """One queued template for one transport."""

    seq: int
    dest: str
    message_id: str
    purpose: str
    created: float
    payload: bytes


class Spool:
    """SQLite outbox shared by the capture thread and the transport threads.

    Parameters
    ----------
    path : str or Path
        Database file (created with its directory).
    destinations : sequence of str
        Transports that each receive every template (``["mqtt"]``, ...).
    max_messages : int
        Bound per transport (see the module's drop policy).
    synchronous : {"full", "normal"}
        SQLite ``synchronous`` in WAL mode: ``full`` fsyncs every commit, so an
        acknowledged insert survives power loss; ``normal`` may lose the last
        commits on power loss (never on a process crash).
    on_drop : callable(dest, purpose, message_id), optional
        Called for each dropped template (metrics).
    clock : callable returning float
    """

    def __init__(
        self,
        path: str | Path,
        *,
        destinations: Sequence[str],
        max_messages: int = 50_000,
        synchronous: str = "full",
        on_drop: Callable[[str, str, str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not destinations:
            raise ValueError("destinations: expected at least one transport, received none")
        if synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous: expected 'full' or 'normal', received {synchronous!r}")
        if max_messages < 1:
            raise ValueError(f"max_messages: expected >= 1, received {max_messages}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.destinations = tuple(destinations)
        self.max_messages = int(max_messages)
        self._on_drop = on_drop
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(_SCHEMA)
        self._closed = False
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (without arguments, from the writer's thread) after every insert."""
        self._listeners.append(callback)

    # -- writing ------------------------------------------------------------------

    def put(self, *, message_id: str, purpose: str, payload: bytes) -> list[tuple[str, str, str]]:
        """Queue one encoded template for every destination, applying the drop policy.

        Returns
        -------
        list of (dest, purpose, message_id)
            What was dropped to make room (possibly this template, for some
            destination).

        Raises
        ------
        SpoolFullError
            An enrolment template met a queue full of enrolment templates;
            nothing was written.
        """
        if len(payload) > MAX_TEMPLATE_BYTES:
            raise ValueError(f"payload: expected at most {MAX_TEMPLATE_BYTES} bytes, received {len(payload)}")
        now = self._clock()
        dropped: list[tuple[str, str, str]] = []
        with self._lock:
            self._check_open()
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                for dest in self.destinations:
                    depth = cur.execute("SELECT COUNT(*) FROM outbox WHERE dest = ?", (dest,)).fetchone()[0]
                    insert = True
                    while depth >= self.max_messages:
                        row = cur.execute(
                            "SELECT seq, message_id, purpose FROM outbox WHERE dest = ? AND "
                            "purpose != 'enroll' "
                            "ORDER BY seq LIMIT 1",
                            (dest,),
                        ).fetchone()
                        if row is not None:
                            cur.execute("DELETE FROM outbox WHERE seq = ?", (row[0],))
                            dropped.append((dest, row[2], row[1]))
                            depth -= 1
                        elif purpose != "enroll":
                            dropped.append((dest, purpose, message_id))
                            insert = False
                            break
                        else:
                            raise SpoolFullError(
                                f"spool {self.path}: the {dest} queue holds {depth} enrolment "
                                "templates "
                                f"(spool.max_messages = {self.max_messages}) and enrolment "
                                "templates are never "
                                "dropped; deliver them (is the transport connected?) or raise "
                                "spool.max_messages"
                            )
                    if insert:
                        cur.execute(
                            "INSERT OR IGNORE INTO outbox (dest, message_id, purpose, created, "
                            "payload) "
                            "VALUES (?, ?, ?, ?, ?)",
                            (dest, message_id, purpose, now, sqlite3.Binary(payload)),
                        )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            self._changed.notify_all()
        for callback in self._listeners:
            callback()
        for dest, p, mid in dropped:
            log_event(
                _log,
                logging.WARNING,
                "spool_drop",
                transport=dest,
                purpose=p,
                message_id=mid,
                max_messages=self.max_messages,
            )
            if self._on_drop is not None:
                self._on_drop(dest, p, mid)
        return dropped

    def ack(self, dest: str, message_ids: Iterable[str]) -> int:
        """Remove acknowledged templates of ``dest``; returns how many were removed."""
        ids = list(message_ids)
        if not ids:
            return 0
        with self._lock:
            self._check_open()
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.executemany("DELETE FROM outbox WHERE dest = ? AND message_id = ?", [(dest, m) for m in ids])
                n = cur.rowcount
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            self._changed.notify_all()
        return int(n)

    def dead_letter(self, dest: str, message_id: str, reason: str) -> bool:
        """Move a template the receiver rejected for good to the ``dead`` table."""
        with self._lock:
            self._check_open()
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                row = cur.execute(
                    "SELECT seq, purpose, created, payload FROM outbox WHERE dest = ? AND message_id = ?",
                    (dest, message_id),
                ).fetchone()
                if row is not None:
                    cur.execute(
                        "INSERT INTO dead (dest, message_id, purpose, created, failed, reason, "
                        "payload) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (dest, message_id, row[1], row[2], self._clock(), reason[:1000], row[3]),
                    )
                    cur.execute("DELETE FROM outbox WHERE seq = ?", (row[0],))
                    cur.execute(
                        "DELETE FROM dead WHERE seq <= (SELECT MAX(seq) FROM dead) - ?",
                        (DEAD_LETTER_KEEP,),
                    )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            self._changed.notify_all()
        return row is not None

    # -- reading ------------------------------------------------------------------

    def peek(self, dest: str, limit: int, *, after_seq: int = 0) -> list[SpoolItem]:
        """Up to ``limit`` oldest templates of ``dest`` with ``seq > after_seq``, in order."""
        with self._lock:
            self._check_open()
            rows = self._db.execute(
                "SELECT seq, dest, message_id, purpose, created, payload FROM outbox "
                "WHERE dest = ? AND seq > ? ORDER BY seq LIMIT ?",
                (dest, after_seq, limit),
            ).fetchall()
        return [SpoolItem(r[0], r[1], r[2], r[3], r[4], bytes(r[5])) for r in rows]

    def depth(self, dest: str | None = None) -> int:
        """Templates waiting for ``dest`` (all transports when ``None``)."""
        with self._lock:
            self._check_open()
            if dest is None:
                return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
            return int(self._db.execute("SELECT COUNT(*) FROM outbox WHERE dest = ?", (dest,)).fetchone()[0])

    def dead(self, dest: str | None = None) -> list[dict[str, Any]]:
        """Rejected templates (newest last)."""
        with self._lock:
            self._check_open()
            q = "SELECT dest, message_id, purpose, reason, failed FROM dead"
            args: tuple[Any, ...] = ()
            if dest is not None:
                q += " WHERE dest = ?"
                args = (dest,)
            rows = self._db.execute(q + " ORDER BY seq", args).fetchall()
        return [dict(zip(("dest", "message_id", "purpose", "reason", "failed"), r, strict=True)) for r in rows]

    def wait(self, timeout: float) -> None:
        """Block until the spool changes or ``timeout`` seconds pass."""
        with self._changed:
            self._changed.wait(timeout)

    def notify(self) -> None:
        """Wake threads blocked in :meth:`wait` (used on stop)."""
        with self._changed:
            self._changed.notify_all()

    # -- lifecycle ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"spool {self.path} is closed")

    def close(self) -> None:
        """Checkpoint the WAL into the database file and close."""
        with self._lock:
            if self._closed:
                return
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()
                self._closed = True
            self._changed.notify_all()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
