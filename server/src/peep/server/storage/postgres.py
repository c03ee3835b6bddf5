"""PostgreSQL store (psycopg 3) for deployments with several server replicas.

Migrations run under a transaction-scoped advisory lock, so replicas starting
together apply each migration exactly once. Batched ingest is one
``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING`` per
batch: one round trip, and the returned (device id, message id) keys say
exactly which templates were new (the others are duplicates, including ones a
concurrent replica stored).
psycopg prepares statements that run repeatedly on a connection.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from peep.server.storage.dialect import POSTGRES
from peep.server.storage.interface import StoreError
from peep.server.storage.records import COLUMNS, LEDGER_COLUMNS, TEMPLATE_COLUMNS, LedgerEntry, TemplateRecord
from peep.server.storage.sql import Connection, SqlStore

_LOCK_ID = 0x5EE9_0001  # advisory lock key for migrations
_MODELS_LOCK_ID = 0x5EE9_0002  # transaction lock: one promotion or version deletion at a time
TRAINING_LOCK_ID = 0x5EE9_0003  # session lock: one training run at a time across the replicas
_EVENTS_LOCK_ID = 0x5EE9_0004  # transaction lock: decisions commit in the order of their ids
# Advisory locks are the whole database's: each is taken as (key, the schema's hash), so that deployments (or the
# test suite's workers) in other schemas of one database neither wait for nor refuse each other.
_SCHEMA_KEY = "hashtext(coalesce(current_schema(), current_setting('search_path')))"
_ARRAY_TYPES = {str: "text", float: "float8", int: "int4", bytes: "bytea"}  # element type of a column's array
_INSERT = (
    f"INSERT INTO templates ({', '.join(COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'%s::{_ARRAY_TYPES[c.value_type]}[]' for c in TEMPLATE_COLUMNS)}) "
    "ON CONFLICT (device_id, message_id) DO NOTHING RETURNING device_id, message_id"
)
_LEDGER_TYPES = (
    *("text", "text", "text", "float8", "text", "text", "text", "text", "float8", "float8", "float8"),
    *("text", "text"),  # transport, sent_by (migration 13)
    "float8",  # epsilon_label (migration 15)
)
assert len(_LEDGER_TYPES) == len(LEDGER_COLUMNS)
_INSERT_LEDGER = (
    f"INSERT INTO ingest_ledger ({', '.join(LEDGER_COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in _LEDGER_TYPES)}) "
    "ON CONFLICT DO NOTHING RETURNING device_id, message_id"
)


class PostgresStore(SqlStore):
    """:class:`~peep.server.storage.Store` on PostgreSQL.

    Parameters
    ----------
    dsn : str
        libpq conninfo or URI, without a password.
    password : str, optional
        From ``storage.password`` (env/credential reference).
    pool_size : int
        Connections kept open (callers beyond that wait).
    application_name : str, optional
        Shown for its connections in ``pg_stat_activity`` (unless ``dsn`` sets one).
    """

    dialect = POSTGRES.name
    _sql = POSTGRES
    _source = "storage.dsn"

    def __init__(
        self,
        dsn: str,
        *,
        password: str | None = None,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        application_name: str | None = None,
    ) -> None:
        self.dsn = dsn
        self._kwargs: dict[str, object] = {"autocommit": True, "connect_timeout": max(1, int(connect_timeout))}
        if application_name and "application_name" not in dsn:
            self._kwargs["application_name"] = application_name[:63]
        if password is not None:
            self._kwargs["password"] = password
        self._pool: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(pool_size)
        self._closed = False
        try:
            self._migrate()
        except BaseException:
            # A store that refuses to open (e.g. a newer schema) must not leak its pooled connection.
            self.close()
            raise

    # ------------------------------------------------------------ connections

    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self.dsn, **self._kwargs)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise StoreError(f"storage.dsn {self.dsn!r}: could not connect to PostgreSQL ({exc})") from exc

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection]:
        # Autocommit connections: each statement commits on its own.
        if self._closed:
            raise StoreError("store is closed")
        self._slots.acquire()
        try:
            try:
                conn = self._pool.get_nowait()
                if conn.closed or conn.broken:
                    conn = self._connect()
            except queue.Empty:
                conn = self._connect()
            try:
                yield conn
            except BaseException:
                if conn.broken:
                    conn.close()
                    raise
                self._pool.put(conn)
                raise
            self._pool.put(conn)
        finally:
            self._slots.release()

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection]:
        with self._session() as conn, conn.transaction():
            yield conn

    def _lock_schema(self, conn: Connection) -> None:
        conn.execute(f"SELECT pg_advisory_xact_lock(%s, {_SCHEMA_KEY})", (_LOCK_ID,))

    def _lock_models(self, conn: Connection) -> None:
        conn.execute(f"SELECT pg_advisory_xact_lock(%s, {_SCHEMA_KEY})", (_MODELS_LOCK_ID,))

    def _lock_events(self, conn: Connection) -> None:
        # An identity column hands out ids in the order transactions ask, not the order they commit: without
        # this, a reader of "id > the last I saw" could pass over an id whose transaction committed later.
        conn.execute(f"SELECT pg_advisory_xact_lock(%s, {_SCHEMA_KEY})", (_EVENTS_LOCK_ID,))

    def _notify(self, conn: Connection, channel: str, payload: str) -> None:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))

    def connect(self) -> psycopg.Connection:
        """A new autocommit connection outside the pool (a listener's, a lock holder's); the caller closes it."""
        return self._connect()

    @contextmanager
    def training_lock(self) -> Iterator[bool]:
        """Try to become the one replica training: yields False at once when another holds the lock.

        A session-level advisory lock on a connection of its own: it is released when the block
        ends, and by PostgreSQL when the process dies (a SIGKILLed trainer blocks no one).
        """
        conn = self._connect()
        try:
            row = conn.execute(f"SELECT pg_try_advisory_lock(%s, {_SCHEMA_KEY})", (TRAINING_LOCK_ID,)).fetchone()
            held = bool(row and row[0])
            try:
                yield held
            finally:
                if held and not conn.broken:
                    conn.execute(f"SELECT pg_advisory_unlock(%s, {_SCHEMA_KEY})", (TRAINING_LOCK_ID,))
        finally:
            conn.close()

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                break

    # ------------------------------------------------------------ templates

    def insert_templates(self, records: Sequence[TemplateRecord]) -> list[bool]:
        if not records:
            return []
        with self._transaction() as conn:
            inserted = self._insert_template_rows(conn, records)
        first: dict[tuple[str, str], int] = {}
        for i, r in enumerate(records):
            first.setdefault((r.device_id, r.message_id), i)
        keys = [(r.device_id, r.message_id) for r in records]
        return [first[k] == i and k in inserted for i, k in enumerate(keys)]

    def _insert_template_rows(self, conn: Any, records: Sequence[TemplateRecord]) -> set[tuple[str, str]]:
        # Message ids are unique per device: the key is (device_id, message_id). One statement: the
        # returned keys say exactly which were new (the others are duplicates, a concurrent replica's too).
        unique = list({(r.device_id, r.message_id): r for r in reversed(records)}.values())
        columns = list(zip(*(r.row() for r in unique), strict=True))
        return {(row[0], row[1]) for row in conn.execute(_INSERT, [list(c) for c in columns])}

    def _insert_ledger(self, conn: Any, entries: Sequence[LedgerEntry]) -> set[tuple[str, str]]:
        columns = list(zip(*(e.row() for e in entries), strict=True))
        return {(str(row[0]), str(row[1])) for row in conn.execute(_INSERT_LEDGER, [list(c) for c in columns])}

    def _executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql, rows)
