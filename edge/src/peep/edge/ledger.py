"""Persistent privacy ledger (SQLite) for :class:`peep.core.accounting.PrivacyAccountant`.

Implements the core's :class:`~peep.core.accounting.SpendLedger` protocol.
Every spend is committed with ``synchronous=FULL`` before the template is
queued, so a restart (or power loss) never forgets ε already spent. Totals
are kept per key in the same transaction, so :meth:`totals` is one indexed
lookup however long the device has run (a JSONL ledger would be replayed
into memory at every start).

Keys used by the agent: ``track:<run>-<n>`` (per-track budgets; run ids are
unique per process start, so a restart never reuses a track key),
``subject:<id>`` (enrolment), ``device:<id>`` (only when
``privacy.device_budget`` is set). Each spend records its per-vector ε (what
budgets add up), its per-coordinate ε, purpose and message id in typed
columns; ledgers written before those columns existed kept them as JSON in the
note and are migrated in place when opened.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from peep.core.accounting import Spend

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spends (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    key     TEXT NOT NULL,
    epsilon REAL NOT NULL,
    delta   REAL NOT NULL,
    time    REAL NOT NULL,
    note    TEXT NOT NULL,
    epsilon_coordinate REAL NOT NULL DEFAULT 0,
    purpose TEXT NOT NULL DEFAULT '',
    message_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS spends_key ON spends (key);
CREATE TABLE IF NOT EXISTS totals (
    key     TEXT PRIMARY KEY,
    epsilon REAL NOT NULL,
    delta   REAL NOT NULL,
    n       INTEGER NOT NULL
);
"""


def _rollback(cur: sqlite3.Cursor) -> None:
    """Roll back the open transaction, if SQLite has not already done so.

    SQLite rolls a transaction back by itself on some errors (``SQLITE_FULL``: the disk is full); a
    ``ROLLBACK`` then fails with "no transaction is active", which would hide the error that matters.
    """
    if cur.connection.in_transaction:
        cur.execute("ROLLBACK")


# Typed columns added after the first release of the ledger, with their SQL types.
_TYPED_COLUMNS = {
    "epsilon_coordinate": "REAL NOT NULL DEFAULT 0",
    "purpose": "TEXT NOT NULL DEFAULT ''",
    "message_id": "TEXT NOT NULL DEFAULT ''",
}


class SqliteLedger:
    """Thread-safe, durable :class:`~peep.core.accounting.SpendLedger`.

    Parameters
    ----------
    path : str or Path
        Database file (created with its directory).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(_SCHEMA)
        self._migrate_typed_columns()

    def _migrate_typed_columns(self) -> None:
        """Give a ledger from before the typed columns its per-coordinate ε, purpose and message id.

        Those lived as JSON in each spend's note; they are copied into the
        columns once, in one transaction, so the lifetime per-coordinate total
        a restarted device reports does not change.
        """
        have = {row[1] for row in self._db.execute("PRAGMA table_info(spends)")}
        missing = [c for c in _TYPED_COLUMNS if c not in have]
        if not missing:
            return
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            for column in missing:
                cur.execute(f"ALTER TABLE spends ADD COLUMN {column} {_TYPED_COLUMNS[column]}")
            for row_id, note in cur.execute("SELECT id, note FROM spends").fetchall():
                try:
                    meta = json.loads(note)
                    values = (
                        float(meta.get("epsilon_coordinate", 0.0)),
                        str(meta.get("purpose", "")),
                        str(meta.get("message_id", "")),
                        row_id,
                    )
                except (ValueError, AttributeError, TypeError):
                    continue  # a free-text note: nothing typed to recover
                cur.execute(
                    "UPDATE spends SET epsilon_coordinate = ?, purpose = ?, message_id = ?, note = '' WHERE id = ?",
                    values,
                )
            cur.execute("COMMIT")
        except BaseException:
            _rollback(cur)
            raise

    def append(self, spend: Spend) -> None:
        """Record ``spend`` durably (committed and fsynced) before returning."""
        if not isinstance(spend, Spend):
            raise TypeError(f"spend: expected a Spend, received {type(spend).__name__}")
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(
                    "INSERT INTO spends (key, epsilon, delta, time, note, epsilon_coordinate, purpose, message_id) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        spend.key,
                        spend.epsilon,
                        spend.delta,
                        spend.time,
                        spend.note,
                        spend.epsilon_coordinate,
                        spend.purpose,
                        spend.message_id,
                    ),
                )
                cur.execute(
                    "INSERT INTO totals (key, epsilon, delta, n) VALUES (?, ?, ?, 1) "
                    "ON CONFLICT (key) DO UPDATE SET epsilon = epsilon + excluded.epsilon, "
                    "delta = delta + excluded.delta, n = n + 1",
                    (spend.key, spend.epsilon, spend.delta),
                )
                cur.execute("COMMIT")
            except BaseException:
                _rollback(cur)
                raise

    def totals(self, key: str) -> tuple[float, float]:
        """``(Σε, Σδ)`` recorded for ``key``."""
        with self._lock:
            row = self._db.execute("SELECT epsilon, delta FROM totals WHERE key = ?", (key,)).fetchone()
        return (0.0, 0.0) if row is None else (float(row[0]), float(row[1]))

    def entries(self, key: str | None = None) -> Sequence[Spend]:
        """Spends in recording order, all or those of ``key``."""
        q = "SELECT key, epsilon, delta, time, note, epsilon_coordinate, purpose, message_id FROM spends"
        args: tuple[str, ...] = ()
        if key is not None:
            q += " WHERE key = ?"
            args = (key,)
        with self._lock:
            rows = self._db.execute(q + " ORDER BY id", args).fetchall()
        return [
            Spend(
                key=r[0],
                epsilon=r[1],
                delta=r[2],
                time=r[3],
                note=r[4],
                epsilon_coordinate=r[5],
                purpose=r[6],
                message_id=r[7],
            )
            for r in rows
        ]

    def recent(self, prefix: str, since: float) -> list[tuple[float, float]]:
        """``(time, per-vector ε)`` of the spends of keys starting with ``prefix`` recorded at ``since`` or later.

        What a door's hourly budget is seeded from at start, without reading the whole ledger.
        """
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._lock:
            rows = self._db.execute(
                "SELECT time, epsilon FROM spends WHERE key LIKE ? ESCAPE '\\' AND time >= ? ORDER BY id",
                (pattern, since),
            ).fetchall()
        return [(float(t), float(e)) for t, e in rows]

    def lifetime(self) -> tuple[float, float, int]:
        """Device lifetime spend over all release keys (``device:`` cap keys excluded).

        Returns
        -------
        (epsilon_vector, epsilon_coordinate, releases)
            Σ per-vector ε, Σ per-coordinate ε and the number of releases.
        """
        with self._lock:
            vec, coord, n = self._db.execute(
                "SELECT COALESCE(SUM(epsilon), 0), COALESCE(SUM(epsilon_coordinate), 0), COUNT(*) "
                "FROM spends WHERE key NOT LIKE 'device:%'"
            ).fetchone()
        return float(vec), float(coord), int(n)

    def close(self) -> None:
        with self._lock:
            self._db.close()
