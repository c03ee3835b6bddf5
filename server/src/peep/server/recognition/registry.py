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
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

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
