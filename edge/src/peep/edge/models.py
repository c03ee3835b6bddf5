"""Model files a deployer fetches once: a pinned URL and SHA-256, verified before anything is kept.

No wheel ships YuNet's ONNX file, so ``peep-edge models fetch yunet`` downloads it (or copies a file the
deployer brought, ``--from``) into a models folder. The bytes go to a temporary file in that folder, are
bounded in size and hashed while they arrive, and only a file whose SHA-256 is the pinned one is renamed
into place: a wrong file, a truncated download or an interrupted copy leaves nothing behind. Offline, the
error says what to download, its hash and where to put it. Nothing here runs at detection time: the agent
only ever opens a local file (``[detector] model_path``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["MODELS", "ModelFetchError", "ModelFile", "default_models_dir", "fetch_model"]

_CHUNK = 1 << 16


@dataclass(frozen=True)
class ModelFile:
    """One model file the edge can use, pinned by content.

    Attributes
    ----------
    name : str
        What ``peep-edge models fetch NAME`` calls it.
    filename : str
        Its file name in the models folder.
    url : str
        Where its publisher serves it.
    sha256 : str
        Hex SHA-256 of the only file accepted.
    size : int
        Its size in bytes; a download larger than twice this is cut off and refused.
    licence, source : str
    config : str
        The ``edge.toml`` lines that use it, ``{path}`` standing for where it was put.
    """

    name: str
    filename: str
    url: str
    sha256: str
    size: int
    licence: str
    source: str
    config: str

    @property
    def max_bytes(self) -> int:
        return 2 * self.size


MODELS: dict[str, ModelFile] = {
    "yunet": ModelFile(
        name="yunet",
        filename="face_detection_yunet_2026may.onnx",
        url="https://github.com/opencv/opencv_zoo/raw/main/models/face_detection_yunet/face_detection_yunet_2026may.onnx",
        sha256="ebafce4e3c118d6554634be5c27ab333b4c047a9a8c3faf1d7cf93101c22f0f0",
        size=229_738,
        licence="MIT",
        source="OpenCV Zoo, models/face_detection_yunet (Shiqi Yu et al.)",
        config='[detector]\nkind = "yunet"\nmodel_path = "{path}"',
    ),
}


class ModelFetchError(RuntimeError):
    """A model file could not be fetched or did not verify; nothing was kept."""


def default_models_dir() -> Path:
    """``$PEEP_MODELS_DIR``, else ``$XDG_DATA_HOME/peep/models``, else ``~/.local/share/peep/models``."""
    if os.environ.get("PEEP_MODELS_DIR"):
        return Path(os.environ["PEEP_MODELS_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "peep" / "models"


def _model(name: str) -> ModelFile:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelFetchError(f"model: expected one of {', '.join(sorted(MODELS))}, received {name!r}") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def is_pinned(path: Path, name: str) -> bool:
    """Whether ``path`` is a file whose SHA-256 is the one pinned for the model ``name``."""
    return path.is_file() and _sha256(path) == _model(name).sha256


def find_model(name: str, extra_dirs: Sequence[Path] = ()) -> Path | None:
    """The model ``name``'s file with its pinned SHA-256, or None: ``$PEEP_<NAME>_MODEL``, then
    :func:`default_models_dir`, then each of ``extra_dirs``."""
    filename = _model(name).filename
    candidates = [os.environ.get(f"PEEP_{name.upper()}_MODEL"), default_models_dir() / filename]
    candidates += [Path(d) / filename for d in extra_dirs]
    for c in candidates:
        if c and is_pinned(Path(c), name):
            return Path(c)
    return None


def _offline_help(model: ModelFile, target: Path) -> str:
    return (
        f"download {model.url} on a machine that reaches it, check that its SHA-256 is {model.sha256} "
        f"({model.size} bytes), and put it at {target} (or run: peep-edge models fetch {model.name} --from FILE)"
    )


def _copy_verified(model: ModelFile, source: IO[bytes], target: Path, what: str) -> None:
    """Stream ``source`` into a temporary file beside ``target``; rename it into place only if it verifies."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        n = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(_CHUNK):
                n += len(chunk)
                if n > model.max_bytes:
                    raise ModelFetchError(
                        f"{model.name}: {what} is larger than {model.max_bytes} bytes (the pinned file has "
                        f"{model.size}); refused, nothing kept"
                    )
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if digest != model.sha256:
            raise ModelFetchError(
                f"{model.name}: SHA-256 mismatch for {what}: expected {model.sha256}, received {digest} ({n} bytes); "
                "refused, nothing kept"
            )
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fetch_model(
    name: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    source_file: str | os.PathLike[str] | None = None,
    timeout: float = 30.0,
    opener: Callable[..., Any] = urllib.request.urlopen,
) -> tuple[Path, str]:
    """Put model ``name`` at ``dest/filename``, verified, and say how it got there.

    Parameters
    ----------
    name : str
        A key of :data:`MODELS`.
    dest : path, optional
        The models folder (default :func:`default_models_dir`).
    url : str, optional
        Another http(s) address serving the same file (a mirror); the pinned hash still decides.
    source_file : path, optional
        Copy this local file instead of downloading (offline installs).
    timeout : float
        Seconds a download may stall.

    Returns
    -------
    (path, how) : (Path, str)
        Where the verified file is, and ``"present"``, ``"downloaded"`` or ``"copied"``.

    Raises
    ------
    ModelFetchError
        Unknown name, unreachable address (the message says what to download and where to put it), a file
        over the size bound, or a hash that is not the pinned one. Nothing is left behind.
    """
    model = _model(name)
    folder = Path(dest) if dest is not None else default_models_dir()
    target = folder / model.filename
    if target.is_file() and _sha256(target) == model.sha256:
        return target, "present"
    if source_file is not None:
        src = Path(source_file)
        if not src.is_file():
            raise ModelFetchError(f"--from: expected a file, received {str(src)!r} (not found)")
        with src.open("rb") as f:
            _copy_verified(model, f, target, str(src))
        return target, "copied"
    address = url or model.url
    scheme = urllib.parse.urlsplit(address).scheme
    if scheme not in ("http", "https"):
        raise ModelFetchError(f"--url: expected an http or https address, received {address!r} (use --from for a file)")
    try:
        with opener(address, timeout=timeout) as response:
            _copy_verified(model, response, target, address)
    except ModelFetchError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ModelFetchError(
            f"{model.name}: could not download {address} ({reason}); {_offline_help(model, target)}"
        ) from None
    return target, "downloaded"
