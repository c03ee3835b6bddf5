"""What a door remembers across restarts: the claims of the last minute, each subject's failed claims and spends.

A door's limits on one person — the claim throttle, the lock-out after repeated refusals, the ε per hour
spent on one subject's claims — are worth nothing if a restart forgets them: three restarts of a door that
kept them in memory released one face 18 times in 45 s (ε 288 against a stated 96 an hour). They are kept
here, in ``<state_dir>/door.sqlite3``, committed before the claim goes on (``synchronous=FULL``, as the
privacy ledger), and read back at start.

No name is written. A subject is stored as ``HMAC-SHA256(door key, subject)``; the door key is 32 random
bytes in ``<state_dir>/door.key`` (mode 0600), made on first use. Someone who copies the state file alone
(a backup, a support bundle) cannot tell who claimed; someone who holds the whole disk holds the key too, and
may test a candidate name against it, offline — no more than the device's model already lets them test
(docs/DOORS.md). Rows leave the file once no limit can use them any more (the longest window).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from peep.edge.device_key import SecretFileError, read_or_make_secret
from peep.edge.errors import EdgeError

#: The kinds of row: a claim taken (the throttle), a refusal that counts towards a lock-out, a release's ε.
KINDS = ("claim", "failure", "release")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS door_events (
    kind    TEXT NOT NULL,
    subject TEXT NOT NULL,
    time    REAL NOT NULL,
    epsilon REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS door_events_by_kind ON door_events (kind, time);
"""


class DoorMemoryError(EdgeError):
    """The door's state file or key cannot be used (named in the message): the door does not start."""


def _read_or_make_key(path: Path) -> bytes:
    try:
        return read_or_make_secret(path, "door", why_kept="its subjects' lock-outs would be forgotten")
    except SecretFileError as exc:
        raise DoorMemoryError(str(exc)) from None


class DoorMemory:
    """The door's claims, failures and per-subject spends, kept on disk under keyed subject ids.

    Parameters
    ----------
    path : path
        The SQLite file (``<state_dir>/door.sqlite3``); its folder must exist.
    key_path : path, optional
        The door key; default ``door.key`` beside ``path``.
    keep_s : float
        Rows older than this are deleted: the longest window a limit looks back over (the hourly budget).
    clock : callable
        Wall-clock seconds: the windows outlast a restart, so they cannot be on a monotonic clock.

    Raises
    ------
    DoorMemoryError
        The key file exists with the wrong size, or the database cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str], *, key_path: str | os.PathLike[str] | None = None,
                 keep_s: float = 3600.0, clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        if not (keep_s > 0 and keep_s < float("inf")):
            raise ValueError(f"keep_s: expected positive finite seconds, received {keep_s}")
        self.path = Path(path)
        self.key_path = Path(key_path) if key_path is not None else self.path.with_name("door.key")
        self.keep_s, self.clock = float(keep_s), clock
        self._key = _read_or_make_key(self.key_path)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise DoorMemoryError(f"{self.path}: cannot open the door's state: {exc}") from exc
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()

    def subject_key(self, subject: str) -> str:
        """The id a subject is remembered by: 32 hex digits of HMAC-SHA256 under the door key."""
        return hmac.new(self._key, subject.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def record(self, kind: str, subject_key: str = "", epsilon: float = 0.0) -> float:
        """Remember one ``kind`` event now (committed when this returns); returns its wall-clock time."""
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, received {kind!r}")
        now = self.clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM door_events WHERE time < ?", (now - self.keep_s,))
                self._db.execute("INSERT INTO door_events (kind, subject, time, epsilon) VALUES (?, ?, ?, ?)",
                                 (kind, subject_key, now, float(epsilon)))  # fmt: skip
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return now

    def forget(self, kind: str, subject_key: str) -> None:
        """Drop every ``kind`` row of one subject (a lock-out's count after an accepted claim)."""
        with self._lock:
            self._db.execute("DELETE FROM door_events WHERE kind = ? AND subject = ?", (kind, subject_key))

    def recent(self, kind: str, within_s: float) -> list[tuple[str, float, float]]:
        """``(subject key, age in seconds, ε)`` of the ``kind`` rows of the last ``within_s``, oldest first."""
        now = self.clock()
        with self._lock:
            rows = self._db.execute(
                "SELECT subject, time, epsilon FROM door_events WHERE kind = ? AND time >= ? ORDER BY time",
                (kind, now - within_s),
            ).fetchall()
        return [(str(s), max(now - float(t), 0.0), float(e)) for s, t, e in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
