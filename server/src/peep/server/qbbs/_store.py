"""The soft-trait store: private to :mod:`peep.server.qbbs`.

Nothing outside this package may import this module or touch its tables
(``tests/qbbs/test_store_boundary.py`` scans the source tree and fails if any
does). The query module is the only reader: it asks for one trait's column
to compute the permissible SUM queries and never returns stored values.

Persistence is SQLite (stdlib ``sqlite3``) in WAL mode; the database file is
created with mode 0600 -- the code-level boundary does not stop someone with
file access, so deployments keep it owned by the service user.

:class:`PostgresSoftTraitStore` implements the same methods on PostgreSQL for
replicas sharing one database: the same two tables, in the server's database.

Neither creates its tables: the storage migrations do
(:mod:`peep.server.storage.migrations`, migration 16), applied by the server
when it opens its database and here to the SQLite file (its own numbering,
:data:`~peep.server.storage.migrations.SOFT_TRAIT_MIGRATIONS`), so a schema
change is one new migration. This module reads and writes them.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.server.qbbs.errors import QueryStructureChangedError
from peep.server.storage import StoreError
from peep.server.storage.dialect import SQLITE
from peep.server.storage.migrations import SOFT_TRAIT_MIGRATIONS, SOFT_TRAIT_SCHEMA_TABLE, migrate

#: Table names (the architecture test forbids them anywhere else in the tree but the migrations creating them).
TRAIT_TABLE = "qbbs_soft_traits"
META_TABLE = "qbbs_meta"


class SoftTraitStore:
    """SQLite table of (subject, trait, value); thread-safe.

    Parameters
    ----------
    path : str or Path, optional
        Database file (created with mode 0600); ``None`` keeps it in memory.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
                os.close(fd)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(self.path) if self.path is not None else ":memory:",
            check_same_thread=False,
            isolation_level=None,  # explicit transactions below
        )
        with self._lock:
            if self.path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
            # A file from before the migrations has the tables and no record: the first one records it.
            self._db.execute("BEGIN IMMEDIATE")
            try:
                source = f"qbbs.store_path {self.path}" if self.path is not None else "the in-memory soft-trait store"
                migrate(self._db, SOFT_TRAIT_MIGRATIONS, SQLITE, source=source, table=SOFT_TRAIT_SCHEMA_TABLE)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- query structure --------------------------------------------------------------

    def bind_structure(self, fingerprint: str, description: str) -> None:
        """Record the query structure on first use; refuse a different one once traits exist."""
        with self._lock:
            row = self._db.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'structure'").fetchone()
            n = self._db.execute(f"SELECT COUNT(*) FROM {TRAIT_TABLE}").fetchone()[0]
            if row is not None and row[0] != fingerprint and n > 0:
                desc = self._db.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'structure_text'").fetchone()
                raise QueryStructureChangedError(
                    f"query structure: expected the one fixed when subjects were first enrolled in "
                    f"{self.path or 'the store'} ({desc[0] if desc else row[0]}), received {description}; "
                    "the permissible queries cannot change after enrolment (erase all subjects or use a new store)"
                )
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    f"INSERT OR REPLACE INTO {META_TABLE} (key, value) VALUES ('structure', ?), ('structure_text', ?)",
                    (fingerprint, description),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # -- writes -----------------------------------------------------------------------

    def upsert(self, subject: str, values: Mapping[str, float]) -> None:
        """Insert or replace ``subject``'s values, atomically."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    f"INSERT OR REPLACE INTO {TRAIT_TABLE} (subject, trait, value, enrolled_at) VALUES (?, ?, ?, ?)",
                    [(subject, trait, float(v), now) for trait, v in values.items()],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def delete(self, subject: str) -> int:
        """Remove every value of ``subject``; returns how many were removed."""
        with self._lock:
            cur = self._db.execute(f"DELETE FROM {TRAIT_TABLE} WHERE subject = ?", (subject,))
            return int(cur.rowcount)

    # -- reads (only the query module calls these) -------------------------------------

    def column(self, trait: str) -> tuple[list[str], NDArray[np.float64]]:
        """All enrolled ``(subjects, values)`` of one trait, ordered by subject."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT subject, value FROM {TRAIT_TABLE} WHERE trait = ? ORDER BY subject", (trait,)
            ).fetchall()
        return [r[0] for r in rows], np.array([r[1] for r in rows], dtype=np.float64)

    def traits_of(self, subject: str) -> list[str]:
        """Names of the traits enrolled for ``subject`` (not their values)."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT trait FROM {TRAIT_TABLE} WHERE subject = ? ORDER BY trait", (subject,)
            ).fetchall()
        return [r[0] for r in rows]

    def n_subjects(self) -> int:
        with self._lock:
            return int(self._db.execute(f"SELECT COUNT(DISTINCT subject) FROM {TRAIT_TABLE}").fetchone()[0])


class PostgresSoftTraitStore:
    """The soft-trait table on PostgreSQL (same methods as :class:`SoftTraitStore`); thread-safe.

    Parameters
    ----------
    connect : callable returning a psycopg connection (autocommit)
        To the server's database, migrated (it has the tables); the store keeps one and reconnects when it
        breaks.

    Raises
    ------
    StoreError
        The database lacks the tables: it was not migrated by this version of the server.
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self.path = None
        self._connect = connect
        self._lock = threading.Lock()
        self._conn: Any = None
        with self._db() as conn:
            missing = [
                t
                for t in (TRAIT_TABLE, META_TABLE)
                if conn.execute("SELECT to_regclass(%s)", (t,)).fetchone()[0] is None
            ]
        if missing:
            self.close()
            raise StoreError(
                f"storage.dsn: expected the tables of storage migration 16 ({', '.join(missing)} missing); "
                "the server migrates its database when it opens it: open it with this version first"
            )

    @contextmanager
    def _db(self) -> Iterator[Any]:
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = self._connect()
            yield self._conn

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._db() as conn, conn.transaction():
            yield conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def bind_structure(self, fingerprint: str, description: str) -> None:
        with self._tx() as conn:
            conn.execute(f"LOCK TABLE {META_TABLE} IN EXCLUSIVE MODE")
            row = conn.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'structure'").fetchone()
            n = conn.execute(f"SELECT COUNT(*) FROM {TRAIT_TABLE}").fetchone()[0]
            if row is not None and row[0] != fingerprint and n > 0:
                desc = conn.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'structure_text'").fetchone()
                raise QueryStructureChangedError(
                    f"query structure: expected the one fixed when subjects were first enrolled in the database "
                    f"({desc[0] if desc else row[0]}), received {description}; the permissible queries cannot "
                    "change after enrolment (erase all subjects or use a new database)"
                )
            for key, value in (("structure", fingerprint), ("structure_text", description)):
                conn.execute(
                    f"INSERT INTO {META_TABLE} (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )

    def upsert(self, subject: str, values: Mapping[str, float]) -> None:
        now = time.time()
        with self._tx() as conn:
            for trait, v in values.items():
                conn.execute(
                    f"INSERT INTO {TRAIT_TABLE} (subject, trait, value, enrolled_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (subject, trait) DO UPDATE SET value = excluded.value, "
                    "enrolled_at = excluded.enrolled_at",
                    (subject, trait, float(v), now),
                )

    def delete(self, subject: str) -> int:
        with self._db() as conn:
            return int(conn.execute(f"DELETE FROM {TRAIT_TABLE} WHERE subject = %s", (subject,)).rowcount)

    def column(self, trait: str) -> tuple[list[str], NDArray[np.float64]]:
        with self._db() as conn:
            rows = conn.execute(
                f'SELECT subject, value FROM {TRAIT_TABLE} WHERE trait = %s ORDER BY subject COLLATE "C"', (trait,)
            ).fetchall()
        return [r[0] for r in rows], np.array([r[1] for r in rows], dtype=np.float64)

    def traits_of(self, subject: str) -> list[str]:
        with self._db() as conn:
            rows = conn.execute(
                f'SELECT trait FROM {TRAIT_TABLE} WHERE subject = %s ORDER BY trait COLLATE "C"', (subject,)
            ).fetchall()
        return [r[0] for r in rows]

    def n_subjects(self) -> int:
        with self._db() as conn:
            return int(conn.execute(f"SELECT COUNT(DISTINCT subject) FROM {TRAIT_TABLE}").fetchone()[0])
