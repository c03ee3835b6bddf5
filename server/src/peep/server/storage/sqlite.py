"""SQLite store (the embedded default): WAL journal, one writer connection.

Writes are batched by the callers (ingest commits hundreds of templates per
transaction), so one connection serialised by a lock keeps up with several
thousand templates per second; WAL lets a ``peep train`` process read while
the server writes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from peep.server.storage.dialect import SQLITE
from peep.server.storage.interface import StoreError
from peep.server.storage.records import COLUMNS, LEDGER_COLUMNS, LedgerEntry, TemplateRecord
from peep.server.storage.sql import Connection, SqlStore

_INSERT = f"INSERT OR IGNORE INTO templates ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_INSERT_LEDGER = (
    f"INSERT INTO ingest_ledger ({', '.join(LEDGER_COLUMNS)}) VALUES ({', '.join('?' * len(LEDGER_COLUMNS))})"
)


class SqliteStore(SqlStore):
    """:class:`~peep.server.storage.Store` on a SQLite file.

    Parameters
    ----------
    path : path-like
        Database file (created with its directory); ``":memory:"`` for tests.
    """

    dialect = SQLITE.name
    _sql = SQLITE

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._source = f"storage.path {self.path}"
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a crash of this process loses nothing; a power
            # cut may lose the last transactions, never corrupts the database.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.Error as exc:
            raise StoreError(f"{self._source}: could not open the SQLite database ({exc})") from exc
        self._lock = threading.Lock()
        self._migrate()

    # ------------------------------------------------------------ connection

    @contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        # Autocommit (isolation_level=None): each statement commits on its own.
        with self._lock:
            yield self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

    def _lock_schema(self, conn: Connection) -> None:
        pass  # BEGIN IMMEDIATE has taken the database's write lock: other processes' migrations wait

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ------------------------------------------------------------ templates

    def insert_templates(self, records: Sequence[TemplateRecord]) -> list[bool]:
        if not records:
            return []
        with self._transaction() as c:
            inserted = self._insert_template_rows(c, records)
        # Message ids are unique per device: the key is (device_id, message_id); a key repeated in the
        # batch is new only the first time.
        first: dict[tuple[str, str], int] = {}
        for i, r in enumerate(records):
            first.setdefault((r.device_id, r.message_id), i)
        return [first[(r.device_id, r.message_id)] == i and (r.device_id, r.message_id) in inserted
                for i, r in enumerate(records)]  # fmt: skip

    def _existing(self, c: Connection, table: str, keys: list[tuple[str, str]]) -> set[tuple[str, str]]:
        existing: set[tuple[str, str]] = set()
        for chunk in SQLITE.chunks(keys):
            if not chunk:
                continue
            of_keys, params = SQLITE.any_pair_of(("device_id", "message_id"), chunk)
            q = f"SELECT device_id, message_id FROM {table} WHERE {of_keys}"
            existing.update((row[0], row[1]) for row in c.execute(q, params))
        return existing

    def _insert_template_rows(self, conn: Connection, records: Sequence[TemplateRecord]) -> set[tuple[str, str]]:
        # Within BEGIN IMMEDIATE (the database's write lock): nothing changes between the look-up and the insert.
        keys = list(dict.fromkeys((r.device_id, r.message_id) for r in records))
        existing = self._existing(conn, "templates", keys)
        inserted: set[tuple[str, str]] = set()
        rows = []
        for r in records:
            key = (r.device_id, r.message_id)
            if key not in existing and key not in inserted:
                inserted.add(key)
                rows.append(r.row())
        if rows:
            self._executemany(conn, _INSERT, rows)
        return inserted

    def _insert_ledger(self, conn: Connection, entries: Sequence[LedgerEntry]) -> set[tuple[str, str]]:
        existing = self._existing(conn, "ingest_ledger", [e.key for e in entries])
        new = [e for e in entries if e.key not in existing]
        if new:
            self._executemany(conn, _INSERT_LEDGER, [e.row() for e in new])
        return {e.key for e in new}

    def _executemany(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        conn.executemany(sql, rows)  # type: ignore[attr-defined]
