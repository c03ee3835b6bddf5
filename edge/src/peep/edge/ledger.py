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
``privacy.device_budget`` is set). The note of each spend is JSON with the
per-coordinate ε, purpose and message id.
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
    note    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS spends_key ON spends (key);
CREATE TABLE IF NOT EXISTS totals (
    key     TEXT PRIMARY KEY,
    epsilon REAL NOT NULL,
    delta   REAL NOT NULL,
    n       INTEGER NOT NULL
);
"""


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

    def append(self, spend: Spend) -> None:
        """Record ``spend`` durably (committed and fsynced) before returning."""
        if not isinstance(spend, Spend):
            raise TypeError(f"spend: expected a Spend, received {type(spend).__name__}")
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(
                    "INSERT INTO spends (key, epsilon, delta, time, note) VALUES (?, ?, ?, ?, ?)",
                    (spend.key, spend.epsilon, spend.delta, spend.time, spend.note),
                )
                cur.execute(
                    "INSERT INTO totals (key, epsilon, delta, n) VALUES (?, ?, ?, 1) "
                    "ON CONFLICT (key) DO UPDATE SET epsilon = epsilon + excluded.epsilon, "
                    "delta = delta + excluded.delta, n = n + 1",
                    (spend.key, spend.epsilon, spend.delta),
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def totals(self, key: str) -> tuple[float, float]:
        """``(Σε, Σδ)`` recorded for ``key``."""
        with self._lock:
            row = self._db.execute("SELECT epsilon, delta FROM totals WHERE key = ?", (key,)).fetchone()
        return (0.0, 0.0) if row is None else (float(row[0]), float(row[1]))

    def entries(self, key: str | None = None) -> Sequence[Spend]:
        """Spends in recording order, all or those of ``key``."""
        q = "SELECT key, epsilon, delta, time, note FROM spends"
        args: tuple[str, ...] = ()
        if key is not None:
            q += " WHERE key = ?"
            args = (key,)
        with self._lock:
            rows = self._db.execute(q + " ORDER BY id", args).fetchall()
        return [Spend(key=r[0], epsilon=r[1], delta=r[2], time=r[3], note=r[4]) for r in rows]

    def lifetime(self) -> tuple[float, float, int]:
        """Device lifetime spend over all release keys (``device:`` cap keys excluded).

        Returns
        -------
        (epsilon_vector, epsilon_coordinate, releases)
            Σ per-vector ε, Σ per-coordinate ε (from each spend's note) and
            the number of releases.
        """
        with self._lock:
            vec, n = self._db.execute(
                "SELECT COALESCE(SUM(epsilon), 0), COUNT(*) FROM spends WHERE key NOT LIKE 'device:%'"
            ).fetchone()
            notes = self._db.execute("SELECT note FROM spends WHERE key NOT LIKE 'device:%'").fetchall()
        coord = 0.0
        for (note,) in notes:
            try:
                coord += float(json.loads(note).get("epsilon_coordinate", 0.0))
            except (ValueError, AttributeError, TypeError):
                continue
        return float(vec), coord, int(n)

    def close(self) -> None:
        with self._lock:
            self._db.close()
