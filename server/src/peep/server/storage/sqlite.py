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

from peep.server.storage import COLUMNS, StoreError, TemplateRecord
from peep.server.storage.base import Connection, SqlStore
from peep.server.storage.dialect import SQLITE

_INSERT = f"INSERT OR IGNORE INTO templates ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


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
            # Message ids are unique per device: the key is (device_id, message_id).
            existing: set[tuple[str, str]] = set()
            for chunk in SQLITE.chunks(list(dict.fromkeys((r.device_id, r.message_id) for r in records))):
                of_keys, params = SQLITE.any_pair_of(("device_id", "message_id"), chunk)
                q = f"SELECT device_id, message_id FROM templates WHERE {of_keys}"
                existing.update((row[0], row[1]) for row in c.execute(q, params))
            result: list[bool] = []
            rows = []
            for r in records:
                key = (r.device_id, r.message_id)
                if key in existing:
                    result.append(False)
                else:
                    existing.add(key)
                    rows.append(r.row())
                    result.append(True)
            if rows:
                c.executemany(_INSERT, rows)
        return result
