"""PostgreSQL store (psycopg 3) for deployments with several server replicas.

Migrations run under a transaction-scoped advisory lock, so replicas starting
together apply each migration exactly once. Batched ingest is one
``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING`` per
batch: one round trip, and the returned ids say exactly which templates were
new (the others are duplicates, including ones a concurrent replica stored).
psycopg prepares statements that run repeatedly on a connection.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import psycopg
from peep.server.storage import COLUMNS, EnrolmentSet, StoreError, TemplateRecord
from peep.server.storage.migrations import MIGRATIONS, SCHEMA_TABLE
from peep.server.storage.sqlite import _enrolment_set

_LOCK_ID = 0x5EE9_0001  # advisory lock key for migrations
_ARRAY_TYPES = (
    "text", "text", "text", "text", "text",
    "float8", "float8", "float8", "float8", "float8",
    "text", "text", "text", "float8", "float8", "int4", "bytea", "text",
)  # fmt: skip
_INSERT = (
    f"INSERT INTO templates ({', '.join(COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in _ARRAY_TYPES)}) "
    "ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
)


class PostgresStore:
    """:class:`~peep.server.storage.Store` on PostgreSQL.

    Parameters
    ----------
    dsn : str
        libpq conninfo or URI, without a password.
    password : str, optional
        From ``storage.password`` (env/credential reference).
    pool_size : int
        Connections kept open (callers beyond that wait).
    """

    dialect = "postgres"

    def __init__(
        self, dsn: str, *, password: str | None = None, pool_size: int = 4, connect_timeout: float = 10.0
    ) -> None:
        self.dsn = dsn
        self._kwargs: dict[str, object] = {"autocommit": True, "connect_timeout": max(1, int(connect_timeout))}
        if password is not None:
            self._kwargs["password"] = password
        self._pool: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(pool_size)
        self._closed = False
        self._migrate()

    # ------------------------------------------------------------ connections

    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self.dsn, **self._kwargs)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise StoreError(f"storage.dsn {self.dsn!r}: could not connect to PostgreSQL ({exc})") from exc

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
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

    # ------------------------------------------------------------ schema

    def _migrate(self) -> None:
        steps = MIGRATIONS[self.dialect]
        with self._conn() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA_TABLE}").fetchone()
            current = int(row[0]) if row else 0
            if current > len(steps):
                raise StoreError(
                    f"storage.dsn: schema version {current} is newer than this software's {len(steps)}; "
                    "upgrade peep-server"
                )
            for version in range(current + 1, len(steps) + 1):
                for stmt in steps[version - 1]:
                    conn.execute(stmt)
                conn.execute(
                    f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (%s, %s)", (version, time.time())
                )

    def schema_version(self) -> int:
        with self._conn() as conn:
            row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA_TABLE}").fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------ templates

    def insert_templates(self, records: Sequence[TemplateRecord]) -> list[bool]:
        if not records:
            return []
        first: dict[str, int] = {}
        for i, r in enumerate(records):
            first.setdefault(r.message_id, i)
        unique = [records[i] for i in first.values()]
        columns = list(zip(*(r.row() for r in unique), strict=True))
        with self._conn() as conn, conn.transaction():
            inserted = {row[0] for row in conn.execute(_INSERT, [list(c) for c in columns])}
        return [first[r.message_id] == i and r.message_id in inserted for i, r in enumerate(records)]

    def get_template(self, message_id: str) -> TemplateRecord | None:
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM templates WHERE message_id = %s", (message_id,)
            ).fetchone()
        if row is None:
            return None
        values = list(row)
        values[16] = bytes(values[16])
        return TemplateRecord(*values)

    def count_templates(
        self, *, subject: str | None = None, bundle_id: str | None = None, purpose: str | None = None
    ) -> int:
        where, params = [], []
        for col, val in (("subject", subject), ("bundle_id", bundle_id), ("purpose", purpose)):
            if val is not None:
                where.append(f"{col} = %s")
                params.append(val)
        q = "SELECT COUNT(*) FROM templates" + (" WHERE " + " AND ".join(where) if where else "")
        with self._conn() as conn:
            row = conn.execute(q, params).fetchone()
        return int(row[0]) if row else 0

    def enrolment_kinds(self, bundle_id: str) -> dict[str, int]:
        q = (
            "SELECT mechanism_kind, COUNT(*) FROM templates WHERE bundle_id = %s AND purpose = 'enroll' "
            "AND subject IS NOT NULL GROUP BY mechanism_kind"
        )
        with self._conn() as conn:
            return {k: int(n) for k, n in conn.execute(q, (bundle_id,))}

    def enrolment_set(self, bundle_id: str, kinds: Sequence[str]) -> EnrolmentSet:
        q = (
            "SELECT message_id, subject, mechanism_kind, n_components, vals FROM templates "
            "WHERE bundle_id = %s AND purpose = 'enroll' AND subject IS NOT NULL AND mechanism_kind = ANY(%s) "
            "ORDER BY message_id"
        )
        with self._conn() as conn:
            rows = conn.execute(q, (bundle_id, list(kinds))).fetchall()
        return _enrolment_set(rows)

    def relabel(self, message_ids: Sequence[str], subject: str) -> int:
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE templates SET subject = %s, purpose = 'enroll' WHERE message_id = ANY(%s)",
                (subject, list(message_ids)),
            )
            return int(cur.rowcount)

    def delete_subject(self, subject: str) -> int:
        with self._conn() as conn:
            return int(conn.execute("DELETE FROM templates WHERE subject = %s", (subject,)).rowcount)

    def delete_received_before(self, cutoff: float, *, include_enrolment: bool = False) -> int:
        q = "DELETE FROM templates WHERE received_at < %s" + ("" if include_enrolment else " AND purpose != 'enroll'")
        with self._conn() as conn:
            return int(conn.execute(q, (cutoff,)).rowcount)

    # ------------------------------------------------------------ bundles, erasures

    def put_bundle(self, bundle_id: str, payload: bytes, published_at: float) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO bundles (bundle_id, published_at, payload) VALUES (%s, %s, %s) "
                "ON CONFLICT (bundle_id) DO UPDATE SET published_at = excluded.published_at",
                (bundle_id, published_at, payload),
            )

    def get_bundle(self, bundle_id: str | None = None) -> bytes | None:
        with self._conn() as conn:
            if bundle_id is None:
                row = conn.execute("SELECT payload FROM bundles ORDER BY published_at DESC LIMIT 1").fetchone()
            else:
                row = conn.execute("SELECT payload FROM bundles WHERE bundle_id = %s", (bundle_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def record_erasure(self, subject: str, at: float) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO erasures (subject, erased_at) VALUES (%s, %s) "
                "ON CONFLICT (subject) DO UPDATE SET erased_at = excluded.erased_at",
                (subject, at),
            )

    def erasures(self) -> Mapping[str, float]:
        with self._conn() as conn:
            return {s: float(t) for s, t in conn.execute("SELECT subject, erased_at FROM erasures")}

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                break
