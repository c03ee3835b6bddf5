"""Running a trained SGAP generator: its ONNX graph on onnxruntime, no torch.

The file ``sgap.onnx`` written by ``peep sgap train`` is self-describing: its
metadata property ``peep.sgap`` holds λ, the face geometry and the training
population, so ``--model FILE.onnx`` is all a caller passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: ONNX metadata key holding the generator's description (JSON).
METADATA_KEY = "peep.sgap"
INPUT_NAME = "faces"
OUTPUT_NAME = "privatized"
FACE_SHAPE = (62, 47)
#: The Siamese discriminator written next to the generator (the paper's own privacy protocol).
DISCRIMINATOR_FILE = "discriminator.onnx"
DISCRIMINATOR_METADATA_KEY = "peep.sgap.discriminator"
DISCRIMINATOR_INPUTS = ("left", "right")
DISCRIMINATOR_OUTPUT = "p_different"


class SgapModelError(ValueError):
    """An SGAP model file is missing, unreadable or not an SGAP generator (names the path)."""


def ssim_per_face(a: NDArray[np.floating[Any]], b: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
    """SSIM of each pair of faces: the audit's :func:`~peep.lab.audit.measures.ssim_batch` (scikit-image's default).

    Parameters
    ----------
    a, b : ndarray of shape (n, height, width), values in [0, 1]

    Returns
    -------
    ndarray of shape (n,)
    """
    from peep.lab.audit.measures import ssim_batch

    return ssim_batch(a, b, data_range=1.0)


@dataclass
class SgapPrivatizer:
    """A trained SGAP generator, run with onnxruntime.

    Parameters
    ----------
    path : path
        The ``.onnx`` file.
    enforce_ssim : bool
        Guarantee SSIM(original, privatized) >= 1 − λ on every face, not only on
        the faces training saw: a face whose generator output falls below the
        floor is replaced by the point on the segment from the original to the
        output that reaches it (bisection on the blend, 20 steps).
    threads : int
        onnxruntime intra-op threads (1: a per-core figure, as docs/ANONYMISATION.md reports).
    """

    path: Path
    enforce_ssim: bool = True
    threads: int = 1
    metadata: dict[str, Any] = field(init=False)
    sha256: str = field(init=False)
    #: Faces the last :meth:`privatize` call pulled back to the SSIM floor.
    n_projected_: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self._session, self.metadata, self.sha256 = _open_model(
            self.path, self.threads, METADATA_KEY, "SGAP generator", f"--model {self.path}"
        )
        names = [i.name for i in self._session.get_inputs()]
        if names != [INPUT_NAME]:
            raise SgapModelError(f"--model {self.path}: expected one input '{INPUT_NAME}', found {names}")

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> SgapPrivatizer:
        return cls(path=Path(path), **kwargs)

    @property
    def lam(self) -> float:
        return float(self.metadata["lambda"])

    @property
    def ssim_floor(self) -> float:
        return 1.0 - self.lam

    def generate(self, faces: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
        """The generator's raw output, without the SSIM guarantee.

        Parameters
        ----------
        faces : ndarray of shape (n, 62, 47), values in [0, 1]

        Returns
        -------
        ndarray of shape (n, 62, 47), float32 in [0, 1]
        """
        x = self._check(faces)
        if len(x) == 0:
            return x.copy()
        (out,) = self._session.run([OUTPUT_NAME], {INPUT_NAME: x[:, None]})
        return np.asarray(out, dtype=np.float32)[:, 0]

    def privatize(self, faces: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
        """Privatized faces: the generator's output, pulled back to SSIM >= 1 − λ where needed.

        Parameters
        ----------
        faces : ndarray of shape (n, 62, 47), values in [0, 1]

        Returns
        -------
        ndarray of shape (n, 62, 47), float32 in [0, 1]
        """
        x = self._check(faces)
        out = self.generate(x)
        self.n_projected_ = 0
        if not self.enforce_ssim or len(x) == 0:
            return out
        s = ssim_per_face(x, out)
        # A small margin over the floor: SSIM computed in float64 on float32 images may differ in the 6th digit.
        floor = self.ssim_floor + 1e-4
        for i in np.flatnonzero(s < floor):
            out[i] = _pull_back(x[i], out[i], floor)
            self.n_projected_ += 1
        return out

    def _check(self, faces: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
        x = np.asarray(faces, dtype=np.float32)
        if x.ndim == 2:
            x = x[None]
        if x.ndim != 3 or x.shape[1:] != FACE_SHAPE:
            raise ValueError(f"faces: expected shape (n, {FACE_SHAPE[0]}, {FACE_SHAPE[1]}), received {x.shape}")
        if x.size and (not np.isfinite(x).all() or x.min() < 0.0 or x.max() > 1.0):
            raise ValueError("faces: expected finite values in [0, 1]")
        return np.ascontiguousarray(x)


@dataclass
class SgapDiscriminator:
    """The Siamese discriminator trained with a generator, run with onnxruntime.

    Parameters
    ----------
    path : path
        Its ``discriminator.onnx`` (written by ``peep sgap train`` next to ``sgap.onnx``).
    """

    path: Path
    threads: int = 1
    metadata: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self._session, self.metadata, _ = _open_model(
            self.path, self.threads, DISCRIMINATOR_METADATA_KEY, "SGAP discriminator", str(self.path)
        )

    @classmethod
    def beside(cls, generator: str | os.PathLike[str]) -> SgapDiscriminator | None:
        """The discriminator stored next to a generator file, or None if there is none."""
        path = Path(generator).parent / DISCRIMINATOR_FILE
        return cls(path=path) if path.is_file() else None

    def p_different(
        self, left: NDArray[np.floating[Any]], right: NDArray[np.floating[Any]], batch: int = 256
    ) -> NDArray[np.float64]:
        """P(left[i] and right[i] show different people).

        Parameters
        ----------
        left, right : ndarray of shape (n, 62, 47), values in [0, 1]

        Returns
        -------
        ndarray of shape (n,)
        """
        a = np.asarray(left, dtype=np.float32)
        b = np.asarray(right, dtype=np.float32)
        if a.shape != b.shape or a.ndim != 3 or a.shape[1:] != FACE_SHAPE:
            raise ValueError(
                f"left, right: expected two arrays of shape (n, {FACE_SHAPE[0]}, {FACE_SHAPE[1]}), "
                f"received {a.shape} and {b.shape}"
            )
        out = []
        for i in range(0, a.shape[0], batch):
            feed = {
                DISCRIMINATOR_INPUTS[0]: np.ascontiguousarray(a[i : i + batch, None]),
                DISCRIMINATOR_INPUTS[1]: np.ascontiguousarray(b[i : i + batch, None]),
            }
            (p,) = self._session.run([DISCRIMINATOR_OUTPUT], feed)
            out.append(np.asarray(p, dtype=np.float64).reshape(-1))
        return np.concatenate(out) if out else np.zeros(0)


def _open_model(path: Path, threads: int, key: str, what: str, name: str) -> tuple[Any, dict[str, Any], str]:
    """(onnxruntime session, the ``key`` metadata, file SHA-256) of an SGAP ONNX file; errors start with ``name``."""
    import onnxruntime as ort

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SgapModelError(f"{name}: cannot read it ({exc.strerror})") from exc
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise SgapModelError(f"{name}: not an ONNX model onnxruntime can load ({exc})") from exc
    meta = session.get_modelmeta().custom_metadata_map
    if key not in meta:
        raise SgapModelError(f"{name}: no '{key}' metadata; not an {what}")
    return session, json.loads(meta[key]), hashlib.sha256(data).hexdigest()


def _pull_back(x: NDArray[np.float32], y: NDArray[np.float32], floor: float) -> NDArray[np.float32]:
    """The blend x + t(y − x) with the largest t in [0, 1] (to 2⁻²⁰) whose SSIM to x is >= floor."""
    lo, hi = 0.0, 1.0  # SSIM(x, x) = 1 >= floor at t = 0
    for _ in range(20):
        mid = (lo + hi) / 2
        z = (x + mid * (y - x)).astype(np.float32)
        if ssim_per_face(x[None], z[None])[0] >= floor:
            lo = mid
        else:
            hi = mid
    return (x + lo * (y - x)).astype(np.float32)


def file_sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
