"""Versioned model registry with atomic promotion.

Layout under ``training.model_dir``::

    versions/v000001/model.onnx     the recogniser served with onnxruntime
    versions/v000001/model.json     classes, thresholds, bundle, metrics
    versions/v000001/scores.npz     genuine/impostor validation scores
    CURRENT                         the name of the serving version
    .staging-*/                     a version being written (never served)
    .lock                           flock held while promoting

A new version is written into a staging directory (every file fsynced),
renamed into ``versions/`` (atomic on one file system) and only then named in
``CURRENT`` (written to a temporary file, fsynced, renamed, directory
fsynced). A crash, ``kill -9`` or power cut at any point leaves ``CURRENT``
naming the previous complete version, so the previous model keeps serving;
stale staging directories are removed the next time a registry is opened.

:class:`DatabaseModelRegistry` keeps the same versions in the database
(``model_versions``, ``model_current``; storage migration 3) for replicas on
one PostgreSQL: a promotion is one transaction (the version's ONNX model,
scores, metadata and thresholds, the pointer to it, the pruning of old
versions and a ``NOTIFY peep_models``), and every replica's
:class:`~peep.server.recognition.watch.ChangeWatcher` swaps to it. Both
registries answer the same calls (``current``, ``get``, ``versions``,
``pointer_stamp``, ``publish``, ``versions_knowing``, ``purge_subject``, ``training_lease``).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["AnyRegistry", "DatabaseModelRegistry", "ModelRegistry", "RegistryError"]

CURRENT = "CURRENT"
VERSIONS = "versions"
MODEL_ONNX = "model.onnx"
MODEL_JSON = "model.json"
SCORES = "scores.npz"
_VERSION_RE = re.compile(r"^v(\d{6,})$")


class RegistryError(RuntimeError):
    """The registry is unreadable or a version is incomplete (names the path)."""


@dataclass(frozen=True)
class ModelVersion:
    """A complete version on disk."""

    name: str
    path: Path
    meta: dict[str, Any]

    @property
    def onnx_path(self) -> Path:
        return self.path / MODEL_ONNX

    def onnx_bytes(self) -> bytes:
        return self.onnx_path.read_bytes()

    def scores(self) -> dict[str, NDArray[np.float64]]:
        p = self.path / SCORES
        if not p.exists():
            return {}
        with np.load(p) as data:
            return {k: np.asarray(data[k], dtype=np.float64) for k in data.files}


@dataclass(frozen=True)
class StoredModelVersion:
    """A complete version read from the database (same reading calls as :class:`ModelVersion`)."""

    name: str
    meta: dict[str, Any]
    onnx: bytes = field(repr=False)
    scores_npz: bytes | None = field(repr=False, default=None)

    def onnx_bytes(self) -> bytes:
        return self.onnx

    def scores(self) -> dict[str, NDArray[np.float64]]:
        if not self.scores_npz:
            return {}
        with np.load(io.BytesIO(self.scores_npz)) as data:
            return {k: np.asarray(data[k], dtype=np.float64) for k in data.files}


def _npz(scores: Mapping[str, NDArray[Any]] | None) -> bytes | None:
    if not scores:
        return None
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in scores.items()})  # type: ignore[arg-type]
    return buf.getvalue()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


class ModelRegistry:
    """Versions of the recogniser in a directory (see module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / VERSIONS).mkdir(parents=True, exist_ok=True)
        self._clean_stale_staging()

    # ------------------------------------------------------------ locking

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _clean_stale_staging(self) -> None:
        for d in self.root.glob(".staging-*"):
            lock = d / ".owner"
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                shutil.rmtree(d, ignore_errors=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # a live trainer owns it
                continue
            os.close(fd)
            shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------ reading

    def current_name(self) -> str | None:
        try:
            name = (self.root / CURRENT).read_text().strip()
        except FileNotFoundError:
            return None
        return name or None

    def pointer_stamp(self) -> tuple[int, int] | None:
        """Cheap change detector for ``CURRENT`` (inode, mtime_ns)."""
        try:
            st = os.stat(self.root / CURRENT)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def get(self, name: str) -> ModelVersion:
        if not _VERSION_RE.match(name):
            raise RegistryError(f"{self.root / CURRENT}: expected a version name like v000001, received {name!r}")
        path = self.root / VERSIONS / name
        try:
            meta = json.loads((path / MODEL_JSON).read_text())
        except (OSError, ValueError) as exc:
            raise RegistryError(f"{path}: incomplete model version ({exc})") from exc
        if not (path / MODEL_ONNX).is_file():
            raise RegistryError(f"{path / MODEL_ONNX}: missing")
        return ModelVersion(name=name, path=path, meta=meta)

    def current(self) -> ModelVersion | None:
        name = self.current_name()
        return None if name is None else self.get(name)

    def versions(self) -> list[str]:
        names = [p.name for p in (self.root / VERSIONS).iterdir() if _VERSION_RE.match(p.name)]
        return sorted(names, key=lambda n: int(n[1:]))

    # ------------------------------------------------------------ writing

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A private directory to write a version into; removed unless promoted."""
        d = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        fd = os.open(d / ".owner", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield d
        finally:
            os.close(fd)
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)

    def promote(
        self,
        staging: Path,
        *,
        onnx_model: bytes,
        meta: Mapping[str, Any],
        scores: Mapping[str, NDArray[Any]] | None = None,
        keep: int = 5,
    ) -> ModelVersion:
        """Write the files into ``staging``, move it into ``versions/`` and make it current."""
        _write_file(staging / MODEL_ONNX, onnx_model)
        if scores:
            with open(staging / SCORES, "wb") as fh:
                np.savez(fh, **{k: np.asarray(v) for k, v in scores.items()})  # type: ignore[arg-type]
                fh.flush()
                os.fsync(fh.fileno())
        with self._locked():
            existing = self.versions()
            number = int(existing[-1][1:]) + 1 if existing else 1
            name = f"v{number:06d}"
            full = dict(meta)
            full["version"] = name
            full.setdefault("created_at", time.time())
            _write_file(staging / MODEL_JSON, (json.dumps(full, indent=1, sort_keys=True) + "\n").encode())
            (staging / ".owner").unlink(missing_ok=True)
            os.chmod(staging, 0o755)
            _fsync_dir(staging)
            final = self.root / VERSIONS / name
            os.rename(staging, final)
            _fsync_dir(self.root / VERSIONS)
            self._set_current(name)
            self._prune(keep)
        return self.get(name)

    def publish(
        self,
        *,
        onnx_model: bytes,
        meta: Mapping[str, Any],
        scores: Mapping[str, NDArray[Any]] | None = None,
        keep: int = 5,
    ) -> ModelVersion:
        """Write a version and make it current (:meth:`staging` + :meth:`promote`)."""
        with self.staging() as staging:
            return self.promote(staging, onnx_model=onnx_model, meta=meta, scores=scores, keep=keep)

    @contextmanager
    def training_lease(self) -> Iterator[bool]:
        """Yields whether this process may train now (no other process sharing the directory is)."""
        fd = os.open(self.root / ".train.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def make_current(self, name: str) -> ModelVersion:
        """Serve the kept version ``name`` again (roll back or forward); :class:`RegistryError` if it is not kept."""
        with self._locked():
            version = self.get(name)  # complete, or RegistryError naming what is missing
            self._set_current(name)
        return version

    def _set_current(self, name: str) -> None:
        tmp = self.root / f".{CURRENT}.{os.getpid()}.tmp"
        _write_file(tmp, (name + "\n").encode())
        os.replace(tmp, self.root / CURRENT)
        _fsync_dir(self.root)

    def _prune(self, keep: int) -> None:
        current = self.current_name()
        names = self.versions()
        for name in names[: max(0, len(names) - keep)]:
            if name != current:
                shutil.rmtree(self.root / VERSIONS / name, ignore_errors=True)

    def versions_knowing(self, subject: str) -> list[str]:
        """Kept versions (the serving one included) whose classes include ``subject``; changes nothing."""
        out = []
        for name in self.versions():
            try:
                classes = self.get(name).meta.get("classes", [])
            except RegistryError:  # incomplete, or pruned meanwhile: it serves no one
                continue
            if subject in classes:
                out.append(name)
        return out

    def purge_key(self, key_id: str) -> list[str]:
        """Delete every non-current version trained under site key ``key_id`` (a retired key: no roll-back to it)."""
        removed = []
        with self._locked():
            current = self.current_name()
            for name in self.versions():
                try:
                    meta = self.get(name).meta
                except RegistryError:
                    continue
                if name != current and str(meta.get("key_id", "")) == key_id:
                    shutil.rmtree(self.root / VERSIONS / name, ignore_errors=True)
                    removed.append(name)
        return removed

    def purge_subject(self, subject: str) -> list[str]:
        """Delete every non-current version whose classes include ``subject`` (erasure)."""
        removed = []
        with self._locked():
            current = self.current_name()
            for name in self.versions():
                if name == current:
                    continue
                try:
                    classes = self.get(name).meta.get("classes", [])
                except RegistryError:
                    continue
                if subject in classes:
                    shutil.rmtree(self.root / VERSIONS / name, ignore_errors=True)
                    removed.append(name)
        return removed


class DatabaseModelRegistry:
    """Versions of the recogniser in the database, shared by every replica (see module docstring).

    Parameters
    ----------
    store : SqlStore
        The server's store (PostgreSQL for replicas; SQLite works the same on one node).
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def current_name(self) -> str | None:
        row = self.store.get_model()
        return None if row is None else str(row[0])

    def pointer_stamp(self) -> tuple[int, float] | None:
        """(version number, promotion time) of the serving version: one small query."""
        stamp: tuple[int, float] | None = self.store.current_model_stamp()
        return stamp

    def _version(self, row: tuple[str, str, bytes, bytes | None, str]) -> StoredModelVersion:
        import hashlib

        name, meta, onnx, scores, sha = row
        if hashlib.sha256(onnx).hexdigest() != sha:
            raise RegistryError(f"model_versions {name}: the stored ONNX model does not match its sha256")
        try:
            parsed = json.loads(meta)
        except ValueError as exc:
            raise RegistryError(f"model_versions {name}: unreadable metadata ({exc})") from exc
        return StoredModelVersion(name=name, meta=parsed, onnx=onnx, scores_npz=scores)

    def get(self, name: str) -> StoredModelVersion:
        if not _VERSION_RE.match(name):
            raise RegistryError(f"model_versions: expected a version name like v000001, received {name!r}")
        row = self.store.get_model(name)
        if row is None:
            raise RegistryError(f"model_versions: no version {name}")
        return self._version(row)

    def current(self) -> StoredModelVersion | None:
        row = self.store.get_model()
        return None if row is None else self._version(row)

    def versions(self) -> list[str]:
        return [name for name, _ in self.store.model_names()]

    def make_current(self, name: str) -> StoredModelVersion:
        """Serve the stored version ``name`` again (roll back or forward); :class:`RegistryError` if not stored."""
        version = self.get(name)  # the ONNX checks out against its hash before it is served
        try:
            self.store.set_current_model(name)
        except KeyError:
            raise RegistryError(f"model_versions: no version {name}") from None
        return version

    def publish(
        self,
        *,
        onnx_model: bytes,
        meta: Mapping[str, Any],
        scores: Mapping[str, NDArray[Any]] | None = None,
        keep: int = 5,
    ) -> StoredModelVersion:
        """Store a version and make it current in one transaction (the replicas are notified on commit)."""
        name = self.store.promote_model(meta=meta, onnx=onnx_model, scores=_npz(scores), keep=keep)
        return self.get(name)

    @contextmanager
    def training_lease(self) -> Iterator[bool]:
        """Yields whether this replica may train now (PostgreSQL: an advisory lock no other replica holds)."""
        lock = getattr(self.store, "training_lock", None)
        if lock is None:
            yield True
            return
        with lock() as held:
            yield bool(held)

    def versions_knowing(self, subject: str) -> list[str]:
        """Kept versions (the serving one included) whose classes include ``subject``; changes nothing."""
        out = []
        for name, meta in self.store.model_names():
            try:
                classes = json.loads(meta).get("classes", [])
            except ValueError:
                continue
            if subject in classes:
                out.append(name)
        return out

    def purge_subject(self, subject: str) -> list[str]:
        """Delete every non-current version whose classes include ``subject`` (erasure)."""
        removed: list[str] = self.store.delete_models(self.versions_knowing(subject))
        return removed

    def purge_key(self, key_id: str) -> list[str]:
        """Delete every non-current version trained under site key ``key_id`` (a retired key: no roll-back to it)."""
        names = []
        for name, meta in self.store.model_names():
            try:
                held = str(json.loads(meta).get("key_id", ""))
            except ValueError:
                continue
            if held == key_id:
                names.append(name)
        removed: list[str] = self.store.delete_models(names)
        return removed


#: Either registry: the server picks the database one on PostgreSQL, the directory on SQLite.
AnyRegistry = ModelRegistry | DatabaseModelRegistry
