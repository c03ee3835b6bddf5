"""The face cache: per-image results keyed by the image file's content, shared by every command.

Finding a face, cropping it and computing its descriptor cost ~0.03 s and
~0.15 s an image; the demo, the audit, ``peep bundle build`` and the tests
all ask for the same public faces. Each result is stored under the SHA-256
of the image file's *bytes* plus everything else that changes it (the
detector and its settings, the geometry, the network's file hashes, the
code's version of the computation), never its path: the same images in
another folder (a second clone, the test suite's data home, a moved or
copied dataset) hit the same entries.

One SQLite file (:data:`CACHE_FILE`) in the cache folder (``PEEP_CACHE_DIR``,
else ``<data home>/peep_cache``, else ``~/.cache/peep``):

* concurrent writers are safe: SQLite's write-ahead log serialises them,
  and a writer waits for another (``timeout``) instead of failing;
* every value is stored with a digest of its key and bytes, so an entry
  altered on disk is detected, ignored and recomputed;
* a file SQLite cannot read as a database is moved aside and a new one
  started; any other failure (disk full, a lock held past the timeout)
  turns the cache off for the run with a warning: results are recomputed,
  a command never fails for its cache.

Re-reading thousands of files to hash them would cost more than looking
results up, so the content hash of each file is memoised by its
``(device, inode, size, mtime, ctime)``: unchanged files are not read
again. The key stays the content: a changed file has a new mtime and ctime
(ctime cannot be set back by a process), so its bytes are hashed anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

__all__ = ["CACHE_FILE", "FaceCache", "file_sha256"]

#: The cache's file name inside the cache folder.
CACHE_FILE = "faces.sqlite3"
#: The lock a process holds while it computes faces for the cache (:meth:`FaceCache.computing`).
COMPUTE_LOCK_FILE = "faces.compute.lock"
#: Longest wait for another process's computing before computing anyway (a holder that died frees it at once).
COMPUTE_LOCK_WAIT_S = 3600.0
# The compute locks this process holds (by lock file), and how deeply: see FaceCache.computing.
_HELD: dict[str, int] = {}
_HELD_GUARD = threading.Lock()
# SQLite's default limit on the parameters of one statement is 999 before 3.32.
_BATCH = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    digest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS contents (
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (dev, ino)
);
"""


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """SHA-256 (hex) of a file's bytes, or None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


def _entry_digest(key: str, value: bytes) -> str:
    # The key is in the digest: a value moved under another key is as wrong as a damaged one.
    h = hashlib.sha256(key.encode())
    h.update(b"\0")
    h.update(value)
    return h.hexdigest()[:32]


def _batches(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), _BATCH):
        yield items[i : i + _BATCH]


class FaceCache:
    """Values (bytes) under content-derived keys, in ``folder/faces.sqlite3``.

    Parameters
    ----------
    folder : path
        The cache folder (created if missing).
    timeout : float, default=60
        Seconds a writer waits for another process's write to finish.

    Attributes
    ----------
    path : Path
        The database file.
    enabled : bool
        False once a failure turned the cache off: lookups miss, writes are dropped.
    n_rejected : int
        Entries found altered (digest mismatch) and ignored so far.
    """

    def __init__(self, folder: str | os.PathLike[str], *, timeout: float = 60.0) -> None:
        self.path = Path(folder) / CACHE_FILE
        self.n_rejected = 0
        self._timeout = timeout
        self._db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("face cache off: cannot create %s (%s); faces are computed anew", self.path.parent, exc)
            return
        self._db = self._connect(first=True)

    @property
    def enabled(self) -> bool:
        return self._db is not None

    # ------------------------------------------------------------------ opening and failures

    def _connect(self, *, first: bool) -> sqlite3.Connection | None:
        try:
            # Autocommit: each write below opens its own transaction (BEGIN IMMEDIATE).
            db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        except sqlite3.Error as exc:
            log.warning("face cache off: cannot open %s (%s); faces are computed anew", self.path, exc)
            return None
        try:
            self._prepare(db)
        except sqlite3.Error as exc:
            db.close()
            if first and self._is_damaged(exc) and self._move_aside(exc):
                return self._connect(first=False)
            log.warning("face cache off: %s is unusable (%s); faces are computed anew", self.path, exc)
            return None
        return db

    def _prepare(self, db: sqlite3.Connection) -> None:
        """WAL mode and the schema, waiting up to ``timeout`` while another process holds the file.

        Two processes opening a new cache at once both switch it to WAL and create its tables; SQLite answers
        one of them "database is locked" at once (its busy handler is not asked where waiting could
        deadlock), which turned that process's cache off for its whole run. So a lock is waited out here.
        """
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                # The write-ahead log lets readers go on while another process writes.
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                db.execute("SELECT COUNT(*) FROM entries WHERE rowid = 1").fetchone()
                return
            except sqlite3.OperationalError as exc:
                locked = "locked" in str(exc) or str(getattr(exc, "sqlite_errorname", "")).startswith("SQLITE_BUSY")
                if not locked or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    @staticmethod
    def _is_damaged(exc: sqlite3.Error) -> bool:
        # Only "file is not a database" and "database disk image is malformed" condemn the file; a lock,
        # a read-only or full disk say nothing about it.
        name = str(getattr(exc, "sqlite_errorname", ""))
        return name == "SQLITE_NOTADB" or name.startswith("SQLITE_CORRUPT")

    def _move_aside(self, exc: sqlite3.Error) -> bool:
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            pass  # another process moved it first; it starts a new one as we do
        except OSError as err:
            log.warning("face cache: %s is damaged (%s) and could not be moved aside (%s)", self.path, exc, err)
            return False
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        log.warning("face cache: %s was damaged (%s); moved to %s, starting a new cache", self.path, exc, aside.name)
        return True

    def _failed(self, what: str, exc: sqlite3.Error) -> None:
        self.close()
        if self._is_damaged(exc) and self._move_aside(exc):
            self._db = self._connect(first=False)  # what this call wanted is recomputed; later ones are cached
            return
        log.warning("face cache off for this run: %s %s failed (%s); faces are computed anew", what, self.path, exc)

    # ------------------------------------------------------------------ entries

    def get(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The intact values of those ``keys`` that are stored; altered entries are left out (and counted)."""
        found: dict[str, bytes] = {}
        if self._db is None or not keys:
            return found
        rejected = 0
        try:
            for batch in _batches(list(dict.fromkeys(keys))):
                rows = self._db.execute(
                    f"SELECT key, value, digest FROM entries WHERE key IN ({','.join('?' * len(batch))})", batch
                ).fetchall()
                for key, value, digest in rows:
                    value = bytes(value) if isinstance(value, (bytes, memoryview)) else b""
                    if digest == _entry_digest(key, value):
                        found[key] = value
                    else:
                        rejected += 1
        except sqlite3.Error as exc:
            self._failed("reading", exc)
            return {}
        if rejected:
            self.n_rejected += rejected
            log.warning("face cache: %d altered entries in %s ignored (recomputed)", rejected, self.path)
        return found

    def put(self, items: Mapping[str, bytes]) -> None:
        """Store ``items`` (replacing entries under the same keys) in one transaction."""
        if self._db is None or not items:
            return
        rows = [(k, v, _entry_digest(k, v)) for k, v in items.items()]
        self._write("INSERT OR REPLACE INTO entries (key, value, digest) VALUES (?, ?, ?)", rows)

    def _write(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        assert self._db is not None
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(sql, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._failed("writing", exc)

    # ------------------------------------------------------------------ content hashes

    def content_hashes(self, files: Sequence[str | os.PathLike[str]]) -> list[str | None]:
        """SHA-256 of each file's bytes (None: unreadable), read only for files new or changed since last hashed."""
        out: list[str | None] = [None] * len(files)
        stats: list[os.stat_result | None] = []
        for f in files:
            try:
                stats.append(os.stat(f))
            except OSError:
                stats.append(None)
        memo: dict[tuple[int, int], tuple[int, int, int, str]] = {}
        if self._db is not None:
            try:
                for st in stats:
                    if st is None:
                        continue
                    row = self._db.execute(
                        "SELECT size, mtime_ns, ctime_ns, sha256 FROM contents WHERE dev = ? AND ino = ?",
                        (st.st_dev, st.st_ino),
                    ).fetchone()
                    if row is not None:
                        memo[(st.st_dev, st.st_ino)] = row
            except sqlite3.Error as exc:
                self._failed("reading", exc)
                memo = {}
        new: list[tuple[object, ...]] = []
        for i, (f, st) in enumerate(zip(files, stats, strict=True)):
            if st is None:
                continue
            known = memo.get((st.st_dev, st.st_ino))
            if known is not None and known[:3] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
                out[i] = known[3]
                continue
            out[i] = digest = file_sha256(f)
            if digest is not None:
                new.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest))
        if new and self._db is not None:
            self._write("INSERT OR REPLACE INTO contents VALUES (?, ?, ?, ?, ?, ?)", new)
        return out

    # ------------------------------------------------------------------ life cycle

    @contextlib.contextmanager
    def computing(self, *, wait_s: float = COMPUTE_LOCK_WAIT_S) -> Iterator[bool]:
        """Hold the cache folder's compute lock while computing what the cache misses.

        Several processes asking for the same missing faces at once (the test suite's workers, the demo's
        describing beside an audit) would each compute all of them, on cores they share: the second waits
        here instead, then looks again and finds them. An advisory ``flock`` on :data:`COMPUTE_LOCK_FILE`,
        freed by the kernel if its holder dies; after ``wait_s`` (or where locking is not possible) the
        caller computes anyway. Yields whether the lock is held.
        """
        lock_path = str(self.path.with_name(COMPUTE_LOCK_FILE))
        with _HELD_GUARD:
            # Already held by this process (a caller computing inside its own computing()): a second flock on
            # another descriptor would wait for this very process.
            nested = _HELD.get(lock_path, 0) > 0
            if nested:
                _HELD[lock_path] += 1
        if nested:
            try:
                yield True
            finally:
                with _HELD_GUARD:
                    _HELD[lock_path] -= 1
            return
        try:
            import fcntl
        except ImportError:  # pragma: no cover  (not POSIX)
            yield False
            return
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.warning("face cache: cannot open its compute lock (%s); computing without it", exc)
            yield False
            return
        try:
            held = False
            deadline = time.monotonic() + wait_s
            said = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if not said:
                        log.info("face cache: another process is computing faces; waiting to use its results")
                        said = True
                    if time.monotonic() >= deadline:
                        log.warning(
                            "face cache: waited %.0f s for another process's computing; computing anyway", wait_s
                        )
                        break
                    time.sleep(0.2)
                except OSError as exc:
                    log.warning("face cache: cannot take its compute lock (%s); computing without it", exc)
                    break
            if held:
                with _HELD_GUARD:
                    _HELD[lock_path] = 1
            try:
                yield held
            finally:
                if held:
                    with _HELD_GUARD:
                        _HELD.pop(lock_path, None)
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def close(self) -> None:
        """Close the database; the cache is off afterwards."""
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except sqlite3.Error:
                pass

    def __enter__(self) -> FaceCache:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
