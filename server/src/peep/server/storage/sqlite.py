"""SQLite store (the embedded default): WAL journal, one writer connection.

Writes are batched by the callers (ingest commits hundreds of templates per
transaction), so one connection serialised by a lock keeps up with several
thousand templates per second; WAL lets a ``peep train`` process read while
the server writes.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from peep.server.storage import COLUMNS, EnrolmentSet, StoreError, TemplateRecord, stack_blobs
from peep.server.storage.migrations import MIGRATIONS, SCHEMA_TABLE

_INSERT = f"INSERT OR IGNORE INTO templates ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_CHUNK = 500  # bound parameters per IN (...) query (SQLite allows 32,766)


class SqliteStore:
    """:class:`~peep.server.storage.Store` on a SQLite file.

    Parameters
    ----------
    path : path-like
        Database file (created with its directory); ``":memory:"`` for tests.
    """

    dialect = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
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
            raise StoreError(f"storage.path {self.path}: could not open the SQLite database ({exc})") from exc
        self._lock = threading.Lock()
        self._migrate()

    # ------------------------------------------------------------ schema

    def _migrate(self) -> None:
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute(
                    f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
                )
                current = c.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA_TABLE}").fetchone()[0]
                steps = MIGRATIONS[self.dialect]
                if current > len(steps):
                    raise StoreError(
                        f"storage.path {self.path}: schema version {current} is newer than this software's "
                        f"{len(steps)}; upgrade peep-server"
                    )
                for version in range(current + 1, len(steps) + 1):
                    for stmt in steps[version - 1]:
                        c.execute(stmt)
                    c.execute(f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (?, ?)", (version, time.time()))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA_TABLE}").fetchone()[0])

    # ------------------------------------------------------------ templates

    def insert_templates(self, records: Sequence[TemplateRecord]) -> list[bool]:
        if not records:
            return []
        ids = [r.message_id for r in records]
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                existing: set[str] = set()
                unique = list(dict.fromkeys(ids))
                for i in range(0, len(unique), _CHUNK):
                    chunk = unique[i : i + _CHUNK]
                    q = f"SELECT message_id FROM templates WHERE message_id IN ({','.join('?' * len(chunk))})"
                    existing.update(row[0] for row in c.execute(q, chunk))
                result: list[bool] = []
                rows = []
                for r in records:
                    if r.message_id in existing:
                        result.append(False)
                    else:
                        existing.add(r.message_id)
                        rows.append(r.row())
                        result.append(True)
                if rows:
                    c.executemany(_INSERT, rows)
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return result

    def get_template(self, message_id: str) -> TemplateRecord | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM templates WHERE message_id = ?", (message_id,)
            ).fetchone()
        return None if row is None else TemplateRecord(*row)

    def count_templates(
        self, *, subject: str | None = None, bundle_id: str | None = None, purpose: str | None = None
    ) -> int:
        where, params = [], []
        for col, val in (("subject", subject), ("bundle_id", bundle_id), ("purpose", purpose)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        q = "SELECT COUNT(*) FROM templates" + (" WHERE " + " AND ".join(where) if where else "")
        with self._lock:
            return int(self._conn.execute(q, params).fetchone()[0])

    def enrolment_kinds(self, bundle_id: str) -> dict[str, int]:
        q = (
            "SELECT mechanism_kind, COUNT(*) FROM templates WHERE bundle_id = ? AND purpose = 'enroll' "
            "AND subject IS NOT NULL GROUP BY mechanism_kind"
        )
        with self._lock:
            return {k: int(n) for k, n in self._conn.execute(q, (bundle_id,))}

    def enrolment_set(self, bundle_id: str, kinds: Sequence[str]) -> EnrolmentSet:
        kinds = list(kinds)
        q = (
            "SELECT message_id, subject, mechanism_kind, n_components, vals FROM templates "
            f"WHERE bundle_id = ? AND purpose = 'enroll' AND subject IS NOT NULL "
            f"AND mechanism_kind IN ({','.join('?' * len(kinds))}) "
            "ORDER BY message_id"
        )
        with self._lock:
            rows = self._conn.execute(q, [bundle_id, *kinds]).fetchall()
        return _enrolment_set(rows)

    def relabel(self, message_ids: Sequence[str], subject: str) -> int:
        n = 0
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                for i in range(0, len(message_ids), _CHUNK):
                    chunk = list(message_ids[i : i + _CHUNK])
                    cur = c.execute(
                        "UPDATE templates SET subject = ?, purpose = 'enroll' "
                        f"WHERE message_id IN ({','.join('?' * len(chunk))})",
                        [subject, *chunk],
                    )
                    n += cur.rowcount
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return n

    def delete_subject(self, subject: str) -> int:
        with self._lock:
            return int(self._conn.execute("DELETE FROM templates WHERE subject = ?", (subject,)).rowcount)

    def delete_received_before(self, cutoff: float, *, include_enrolment: bool = False) -> int:
        q = "DELETE FROM templates WHERE received_at < ?" + ("" if include_enrolment else " AND purpose != 'enroll'")
        with self._lock:
            return int(self._conn.execute(q, (cutoff,)).rowcount)

    # ------------------------------------------------------------ bundles, erasures

    def put_bundle(self, bundle_id: str, payload: bytes, published_at: float) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO bundles (bundle_id, published_at, payload) VALUES (?, ?, ?) "
                "ON CONFLICT (bundle_id) DO UPDATE SET published_at = excluded.published_at",
                (bundle_id, published_at, payload),
            )

    def get_bundle(self, bundle_id: str | None = None) -> bytes | None:
        with self._lock:
            if bundle_id is None:
                row = self._conn.execute("SELECT payload FROM bundles ORDER BY published_at DESC LIMIT 1").fetchone()
            else:
                row = self._conn.execute("SELECT payload FROM bundles WHERE bundle_id = ?", (bundle_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def record_erasure(self, subject: str, at: float) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO erasures (subject, erased_at) VALUES (?, ?) "
                "ON CONFLICT (subject) DO UPDATE SET erased_at = excluded.erased_at",
                (subject, at),
            )

    def erasures(self) -> Mapping[str, float]:
        with self._lock:
            return {s: float(t) for s, t in self._conn.execute("SELECT subject, erased_at FROM erasures")}

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _enrolment_set(rows: Sequence[Sequence[Any]]) -> EnrolmentSet:
    if not rows:
        return EnrolmentSet(
            values=np.zeros((0, 0), dtype=np.float32),
            subjects=np.array([], dtype=object),
            kinds=np.array([], dtype=object),
            message_ids=[],
        )
    widths = {int(r[3]) for r in rows}
    if len(widths) != 1:
        raise StoreError(f"templates: enrolment templates of one bundle have several dimensions {sorted(widths)}")
    values = stack_blobs([bytes(r[4]) for r in rows], widths.pop())
    return EnrolmentSet(
        values=values,
        subjects=np.array([r[1] for r in rows], dtype=object),
        kinds=np.array([r[2] for r in rows], dtype=object),
        message_ids=[str(r[0]) for r in rows],
    )
