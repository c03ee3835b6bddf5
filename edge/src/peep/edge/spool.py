"""Durable store-and-forward spool (SQLite, WAL) between capture and transports.

Every released template is written here first, once per enabled transport
(``mqtt``, ``grpc``), and leaves only when that transport's receiver has
acknowledged it (broker PUBACK at QoS 1, server ``IngestAck`` ``ACCEPTED`` or
``DUPLICATE``). Readers get rows in insertion order, so delivery is in order;
receivers dedupe by ``message_id``, so a resend after a lost ack (or after a
crash between the receiver's ack and the delete here) is harmless.

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
to the ``dead`` table so nothing is lost silently and an operator can inspect
them (``peep-edge deadletter``).

What the device keeps (data minimisation)
-----------------------------------------
- A delivered (or dropped) template leaves the files, not only the table:
  the connection runs with ``secure_delete`` (SQLite zeroes a deleted row's
  bytes and freed pages, whatever the build's default), and the WAL, which
  still holds the pages as they were before the delete, is checkpointed and
  truncated to zero bytes when an ack empties the outbox (at most once per
  ``checkpoint_interval_s``), at the next :meth:`Spool.housekeep` after any
  deletion (the agent calls it every second), on open (frames a crash left
  behind) and on close.
- Dead letters (payload included) are kept at most ``dead_letter_days``
  (and only the newest ``dead_letter_max``): older ones are deleted on every
  new dead letter, on open and by :meth:`Spool.housekeep`.

A full disk
-----------
On a full disk SQLite refuses every write (``SQLITE_FULL``: "database or
disk is full") and rolls the transaction back; reads go on, and writes work
again as soon as space returns, on the same connection. A release is charged
to the ledger before it is queued here, so the pipeline asks
:func:`disk_room` before charging (``MIN_FREE_BYTES`` free on the state
folders' filesystems) and stops releasing while there is less: nothing is
charged that could not be queued. :func:`is_disk_full` tells that error from
others.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peep.core.wire import MAX_TEMPLATE_BYTES
from peep.edge.errors import SpoolFullError
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.spool")

#: Free bytes the state folders' filesystems must have before a release is charged: a release writes a few
#: pages to the ledger's and the spool's WAL (and a checkpoint may grow a database file); a megabyte leaves
#: room for that many times over, and for the forwarders' deletes.
MIN_FREE_BYTES = 1 << 20

DEAD_LETTER_DAYS = 7.0
DEAD_LETTER_MAX = 1000
_DAY_S = 86_400.0

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
CREATE INDEX IF NOT EXISTS dead_failed ON dead (failed);
"""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite (or the OS) saying the disk is full, rather than any other failure."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            # SQLITE_FULL; an fsync or write refused with ENOSPC may come back as an I/O error instead.
            return code == sqlite3.SQLITE_FULL or ((code & 0xFF) == sqlite3.SQLITE_IOERR and "full" in str(exc))
        return "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_room(paths: Iterable[str | os.PathLike[str]], min_free_bytes: int = MIN_FREE_BYTES) -> bool:
    """Whether the filesystem of each file in ``paths`` (its folder) has ``min_free_bytes`` free.

    Free means what an unprivileged process may still use (``f_bavail``): a device's state must not
    depend on the blocks a filesystem keeps for root. A folder that cannot be read counts as having no room.
    """
    for p in paths:
        try:
            st = os.statvfs(Path(p).parent)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < min_free_bytes:
            return False
    return True


@contextmanager
def _immediate(cur: sqlite3.Cursor) -> Iterator[sqlite3.Cursor]:
    """One write transaction on ``cur`` (BEGIN IMMEDIATE takes the database's write lock), rolled back if it raises."""
    cur.execute("BEGIN IMMEDIATE")
    try:
        yield cur
        cur.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back already (SQLITE_FULL does): a second ROLLBACK would fail with
        # "no transaction is active" and hide the error that matters (the disk is full).
        if cur.connection.in_transaction:
            cur.execute("ROLLBACK")
        raise


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
    dead_letter_days : float
        Refused templates are deleted this many days after they failed (> 0, <= 365).
    dead_letter_max : int
        At most this many refused templates are kept, the newest (>= 1).
    checkpoint_interval_s : float
        An ack that empties the outbox checkpoints and truncates the WAL at once
        unless the last checkpoint is more recent than this; the next
        :meth:`housekeep` does it then. A checkpoint costs two fsyncs and holds
        the spool meanwhile, so a burst of deliveries pays for one per interval,
        not one per template.
    on_drop : callable(dest, purpose, message_id), optional
        Called for each dropped template (metrics).
    clock : callable returning float
        Wall-clock seconds (Unix time): ``created`` and ``failed`` stamps and
        the age of dead letters.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        destinations: Sequence[str],
        max_messages: int = 50_000,
        synchronous: str = "full",
        dead_letter_days: float = DEAD_LETTER_DAYS,
        dead_letter_max: int = DEAD_LETTER_MAX,
        checkpoint_interval_s: float = 1.0,
        on_drop: Callable[[str, str, str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not destinations:
            raise ValueError("destinations: expected at least one transport, received none")
        if synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous: expected 'full' or 'normal', received {synchronous!r}")
        if max_messages < 1:
            raise ValueError(f"max_messages: expected >= 1, received {max_messages}")
        if not 0.0 < dead_letter_days <= 365.0:
            raise ValueError(f"dead_letter_days: expected 0 < days <= 365, received {dead_letter_days}")
        if dead_letter_max < 1:
            raise ValueError(f"dead_letter_max: expected >= 1, received {dead_letter_max}")
        if not 0.0 <= checkpoint_interval_s <= 3600.0:
            raise ValueError(f"checkpoint_interval_s: expected 0 <= seconds <= 3600, received {checkpoint_interval_s}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.destinations = tuple(destinations)
        self.max_messages = int(max_messages)
        self.dead_letter_days = float(dead_letter_days)
        self.dead_letter_max = int(dead_letter_max)
        self.checkpoint_interval_s = float(checkpoint_interval_s)
        self._on_drop = on_drop
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("PRAGMA busy_timeout=30000")
        # Per connection, and what "deleted" means for a face template here: without it a deleted
        # row's bytes stay in the page (and freed pages keep theirs) until something overwrites them.
        if self._db.execute("PRAGMA secure_delete=ON").fetchone()[0] != 1:
            self._db.close()
            raise RuntimeError(f"spool {self.path}: this SQLite build refuses PRAGMA secure_delete")
        self._db.executescript(_SCHEMA)
        self._closed = False
        # A delete whose old page images may still sit in the WAL: the next checkpoint must truncate it.
        self._wal_dirty = False
        self._last_checkpoint = -math.inf  # time.monotonic()
        self._listeners: list[Callable[[], None]] = []
        with self._lock:
            # Whatever a previous run left: dead letters past their bound, and WAL frames from
            # before a crash (holding templates it had already deleted).
            self._expire_dead_locked(self._clock(), count=True)
            self._checkpoint_locked()

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
            with _immediate(cur):
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
            if dropped:
                self._wal_dirty = True
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
        """Remove acknowledged templates of ``dest``; returns how many were removed.

        Unknown ids are ignored (an ack for a row already gone, e.g. a
        ``DUPLICATE`` after a resend). When the outbox is empty afterwards the
        WAL is checkpointed and truncated, so the delivered templates' bytes are
        gone from the files too; otherwise that waits for :meth:`housekeep`.
        """
        ids = list(message_ids)
        if not ids:
            return 0
        with self._lock:
            self._check_open()
            cur = self._db.cursor()
            with _immediate(cur):
                cur.executemany("DELETE FROM outbox WHERE dest = ? AND message_id = ?", [(dest, m) for m in ids])
                n = cur.rowcount
                empty = cur.execute("SELECT 1 FROM outbox LIMIT 1").fetchone() is None
            if n > 0:
                self._wal_dirty = True
                if empty:
                    self._checkpoint_due_locked()
            self._changed.notify_all()
        return int(n)

    def dead_letter(self, dest: str, message_id: str, reason: str) -> bool:
        """Move a template the receiver rejected for good to the ``dead`` table.

        Dead letters past ``dead_letter_days`` or beyond the newest
        ``dead_letter_max`` are deleted in the same transaction.
        """
        with self._lock:
            self._check_open()
            cur = self._db.cursor()
            with _immediate(cur):
                row = cur.execute(
                    "SELECT seq, purpose, created, payload FROM outbox WHERE dest = ? AND message_id = ?",
                    (dest, message_id),
                ).fetchone()
                expired = 0
                if row is not None:
                    now = self._clock()
                    cur.execute(
                        "INSERT INTO dead (dest, message_id, purpose, created, failed, reason, "
                        "payload) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (dest, message_id, row[1], row[2], now, reason[:1000], row[3]),
                    )
                    cur.execute("DELETE FROM outbox WHERE seq = ?", (row[0],))
                    expired = self._delete_expired(cur, now)
            if row is not None:
                # The outbox row (and any expired dead letter) was deleted: its old page images are in the WAL.
                self._wal_dirty = True
                if cur.execute("SELECT 1 FROM outbox LIMIT 1").fetchone() is None:
                    self._checkpoint_due_locked()
            self._changed.notify_all()
        if expired:
            log_event(_log, logging.INFO, "dead_letters_expired", count=expired, days=self.dead_letter_days)
        return row is not None

    def _delete_expired(self, cur: sqlite3.Cursor, now: float) -> int:
        """Delete dead letters past the age or count bound (inside the caller's transaction)."""
        keep_s = self.dead_letter_days * _DAY_S
        # A stamp further in the future than the bound means the clock was set back since: its age is
        # unknown, so it must not outlive the bound by waiting for the clock to catch up.
        cur.execute("DELETE FROM dead WHERE failed < ? OR failed > ?", (now - keep_s, now + keep_s))
        n = cur.rowcount
        cur.execute(
            "DELETE FROM dead WHERE seq <= (SELECT seq FROM dead ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (self.dead_letter_max,),
        )
        return int(n + cur.rowcount)

    def _expire_dead_locked(self, now: float, *, count: bool = False) -> int:
        cur = self._db.cursor()
        # Reading first keeps the common case (nothing to expire) free of a write transaction; MIN and
        # MAX each come from the index (not both in one query: SQLite would scan). The count only grows
        # by dead_letter(), which applies its bound, so only opening (perhaps with a lower bound
        # configured) needs to count.
        lo = cur.execute("SELECT MIN(failed) FROM dead").fetchone()[0]
        hi = cur.execute("SELECT MAX(failed) FROM dead").fetchone()[0]
        keep_s = self.dead_letter_days * _DAY_S
        if lo is None:
            return 0
        over = count and cur.execute("SELECT COUNT(*) FROM dead").fetchone()[0] > self.dead_letter_max
        if lo >= now - keep_s and hi <= now + keep_s and not over:
            return 0
        with _immediate(cur):
            n = self._delete_expired(cur, now)
        if n:
            self._wal_dirty = True
            log_event(_log, logging.INFO, "dead_letters_expired", count=n, days=self.dead_letter_days)
        return n

    def expire_dead(self, now: float | None = None) -> int:
        """Delete dead letters older than ``dead_letter_days`` (or beyond ``dead_letter_max``).

        Parameters
        ----------
        now : float, optional
            Unix time to measure ages from (the spool's clock by default).

        Returns
        -------
        int
            Dead letters deleted (their bytes leave the WAL at the next checkpoint,
            which :meth:`housekeep` makes at once).
        """
        with self._lock:
            self._check_open()
            return self._expire_dead_locked(self._clock() if now is None else now)

    def purge_dead(self, *, older_than_days: float | None = None, now: float | None = None) -> int:
        """Delete dead letters (all, or those failed more than ``older_than_days`` ago); returns how many.

        The WAL is checkpointed and truncated afterwards, so the payloads are gone from the files too.
        """
        if older_than_days is not None and not older_than_days >= 0.0:
            raise ValueError(f"older_than_days: expected a number >= 0, received {older_than_days}")
        with self._lock:
            self._check_open()
            cur = self._db.cursor()
            with _immediate(cur):
                if older_than_days is None:
                    cur.execute("DELETE FROM dead")
                else:
                    t = (self._clock() if now is None else now) - older_than_days * _DAY_S
                    cur.execute("DELETE FROM dead WHERE failed < ?", (t,))
                n = int(cur.rowcount)
            if n:
                self._wal_dirty = True
                self._checkpoint_locked()
        return n

    def housekeep(self, now: float | None = None) -> int:
        """Expire dead letters, and checkpoint the WAL if a deletion since the last one left page images in it.

        Cheap when there is nothing to do (one indexed read); the agent calls it
        every second, which bounds how long a deleted template's bytes can stay
        in the WAL when the ack that emptied the outbox came too soon after the
        last checkpoint, or while the outbox never runs empty (a backlog draining).

        Returns
        -------
        int
            Dead letters expired.
        """
        with self._lock:
            self._check_open()
            n = self._expire_dead_locked(self._clock() if now is None else now)
            if self._wal_dirty:
                self._checkpoint_locked()
            return n

    def checkpoint(self) -> bool:
        """Copy the WAL into the database file and truncate it to zero bytes; False if a reader prevented it."""
        with self._lock:
            self._check_open()
            return self._checkpoint_locked()

    def _checkpoint_due_locked(self) -> None:
        if time.monotonic() - self._last_checkpoint >= self.checkpoint_interval_s:
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> bool:
        self._last_checkpoint = time.monotonic()
        try:
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.OperationalError as exc:
            # Another process holds the database (e.g. peep-edge deadletter): the next checkpoint retries.
            log_event(_log, logging.WARNING, "spool_checkpoint_failed", path=str(self.path), error=str(exc))
            self._wal_dirty = True
            return False
        # busy: another connection was reading; the frames stay until the next checkpoint.
        self._wal_dirty = bool(busy)
        return not busy

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
        """Rejected templates (newest last), without their payload.

        Returns
        -------
        list of dict
            Keys ``seq`` (increasing, never reused), ``dest``, ``message_id``,
            ``purpose``, ``reason`` and ``failed`` (Unix time).
        """
        keys = ("seq", "dest", "message_id", "purpose", "reason", "failed")
        with self._lock:
            self._check_open()
            q = f"SELECT {', '.join(keys)} FROM dead"
            args: tuple[Any, ...] = ()
            if dest is not None:
                q += " WHERE dest = ?"
                args = (dest,)
            rows = self._db.execute(q + " ORDER BY seq", args).fetchall()
        return [dict(zip(keys, r, strict=True)) for r in rows]

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
        """Checkpoint the WAL into the database file, truncate it, and close."""
        with self._lock:
            if self._closed:
                return
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError as exc:
                if not is_disk_full(exc):
                    raise
                # The WAL keeps what the database file could not take; the next open checkpoints it.
                log_event(_log, logging.WARNING, "spool_close_checkpoint_failed", path=str(self.path), error=str(exc))
            finally:
                self._db.close()
                self._closed = True
            self._changed.notify_all()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
