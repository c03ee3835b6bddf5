"""Face descriptors computed on the device for descriptor bundles (``dlib-resnet``).

A bundle whose projector's input is a descriptor (``metadata.json``'s
``input.kind``, e.g. ``"dlib-resnet"``) needs the device to compute that
descriptor for each face it is about to release, from the frame and the face
box: :class:`DlibResNetEncoder` runs dlib's 5-point landmark model and its
ResNet face descriptor network (29 convolutional layers, 128-d output). Both
models ship inside the PyPI package ``face_recognition_models`` (optional extra
``peep-edge[dlib]``) under CC0 (public domain); the package's 68-point landmark
model, trained on data restricted to non-commercial use, is never loaded.
Nothing is downloaded at run time.

The network is identified by the SHA-256 of both model files and the dlib and
package versions (:attr:`DlibResNetEncoder.identity`); :func:`encoder_for_bundle`
refuses a bundle built for another network, naming both.

The descriptor is computed only for faces the release policy is about to
release (once per release, not per frame): detection and tracking stay on the
cheap Haar/YuNet path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np
from numpy.typing import NDArray
from peep.core.exceptions import BundleError
from peep.core.imaging import FaceBox
from peep.edge.errors import MissingExtraError

__all__ = [
    "BACKENDS",
    "DescriptorEncoder",
    "DlibResNetEncoder",
    "OnnxResNetEncoder",
    "encoder_for_bundle",
    "make_encoder",
    "model_files",
]

#: Where the descriptor network runs: onnxruntime (the default) or dlib's own loops (the reference).
BACKENDS = ("onnxruntime", "dlib")

_PACKAGE = "face_recognition_models"
_LANDMARKS = "shape_predictor_5_face_landmarks.dat"
_NETWORK = "dlib_face_recognition_resnet_model_v1.dat"


class DescriptorEncoder(Protocol):
    """Computes a face descriptor from an image and a face box."""

    kind: str
    dimension: int

    @property
    def identity(self) -> dict[str, Any]: ...

    def encode(self, image: NDArray[Any], box: FaceBox) -> NDArray[np.float32]: ...


def _missing(reason: str) -> MissingExtraError:
    return MissingExtraError(
        "bundle input 'dlib-resnet': expected the optional extra peep-edge[dlib] (packages 'dlib-bin' and "
        f"'face_recognition_models') to compute the descriptor this bundle projects, {reason}; install it with "
        "pip install 'peep-edge[dlib]' or use a bundle whose input is pixels (eigenfaces, fisherfaces)"
    )


def model_files() -> dict[str, Path]:
    """Paths of the two model files inside the installed ``face_recognition_models`` (without importing it).

    The package's ``__init__`` imports the deprecated ``pkg_resources``; the
    files are located from its spec instead.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(f"the package {_PACKAGE!r} is not installed")
    root = Path(next(iter(spec.submodule_search_locations))) / "models"
    files = {"landmarks": root / _LANDMARKS, "network": root / _NETWORK}
    for name, path in files.items():
        if not path.is_file():
            raise _missing(f"its {name} model {path} is missing")
    return files


@lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_hash(path: Path) -> str:
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


class DlibResNetEncoder:
    """dlib's 5-point alignment and 128-d ResNet descriptor (``kind = "dlib-resnet"``).

    Parameters
    ----------
    jitter : int, default=0
        dlib's ``num_jitters``: descriptors averaged over this many random
        perturbations of the aligned chip (0 = one pass; slower otherwise).

    Raises
    ------
    MissingExtraError
        dlib or ``face_recognition_models`` is not installed (names the extra).

    Notes
    -----
    Thread-safe: dlib's models are not, so :meth:`encode` holds a lock.
    """

    kind = "dlib-resnet"
    dimension = 128

    def __init__(self, *, jitter: int = 0) -> None:
        try:
            import dlib
        except ImportError as exc:
            raise _missing(f"dlib is not importable ({exc})") from None
        self._dlib = dlib
        self.files = model_files()
        self._landmarks = dlib.shape_predictor(str(self.files["landmarks"]))
        self._network = dlib.face_recognition_model_v1(str(self.files["network"]))
        self.jitter = int(jitter)
        self._lock = threading.Lock()

    @property
    def identity(self) -> dict[str, Any]:
        """What a bundle records about the network: model hashes and versions."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            package = version(_PACKAGE)
        except PackageNotFoundError:
            package = "unknown"
        return {
            "kind": self.kind,
            "network_sha256": _file_hash(self.files["network"]),
            "landmarks_sha256": _file_hash(self.files["landmarks"]),
            "network_file": _NETWORK,
            "landmarks_file": _LANDMARKS,
            "package": f"{_PACKAGE} {package}",
            "dlib": str(self._dlib.__version__),
        }

    backend = "dlib"

    def _shape(self, image: NDArray[Any], box: FaceBox) -> tuple[NDArray[np.uint8], Any]:
        """The image as RGB and dlib's 5 landmarks of the face in ``box`` (call with the lock held)."""
        rgb = cv2.cvtColor(image, cv2.COLOR_GRAY2RGB if image.ndim == 2 else cv2.COLOR_BGR2RGB)
        rect = self._dlib.rectangle(round(box.x), round(box.y), round(box.x + box.w), round(box.y + box.h))
        return rgb, self._landmarks(rgb, rect)

    def encode(self, image: NDArray[Any], box: FaceBox) -> NDArray[np.float32]:
        """The descriptor of the face in ``box`` of ``image`` (BGR or gray uint8), shape (128,)."""
        with self._lock:
            rgb, shape = self._shape(image, box)
            vec = self._network.compute_face_descriptor(rgb, shape, self.jitter)
        return np.asarray(vec, dtype=np.float32)

    def encode_many(self, faces: Sequence[tuple[NDArray[Any], FaceBox]]) -> NDArray[np.float32]:
        """Descriptors of several faces, each an (image, box) pair; shape (len(faces), 128)."""
        out = np.zeros((len(faces), self.dimension), dtype=np.float32)
        for k, (image, box) in enumerate(faces):
            out[k] = self.encode(image, box)
        return out


class OnnxResNetEncoder(DlibResNetEncoder):
    """dlib's alignment, and the same ResNet run by onnxruntime (``kind = "dlib-resnet"``, the same numbers).

    The 5 landmarks and the 150×150 chip are dlib's, as for
    :class:`DlibResNetEncoder`; the network is the graph
    :mod:`peep.edge.descriptor_onnx` builds from the same ``.dat`` and checks
    against dlib's network before first use. The identity (the files' hashes)
    is the same, so bundles, calibration sets and device models built with
    either back end serve both.

    Parameters
    ----------
    threads : int, default=1
        onnxruntime's threads for one batch.
    cache_dir : Path, optional
        Where the graph is kept (:func:`peep.edge.descriptor_onnx.default_cache_dir`).

    Raises
    ------
    MissingExtraError
        dlib, ``face_recognition_models`` or onnx is not installed.
    DescriptorGraphError
        The graph does not compute dlib's descriptor (a damaged or altered cache file).
    """

    backend = "onnxruntime"

    def __init__(self, *, threads: int = 1, cache_dir: Path | None = None) -> None:
        super().__init__(jitter=0)
        if importlib.util.find_spec("onnx") is None:
            raise _missing("the package 'onnx' (which builds the network's graph) is not installed")
        from peep.edge.descriptor_onnx import OnnxDescriptorNetwork

        self.graph = OnnxDescriptorNetwork(self.files["network"], _file_hash(self.files["network"]), self._network,
                                           threads=threads, cache_dir=cache_dir)  # fmt: skip
        self._network = None  # dlib's copy served the check; a device keeps one network in memory, not two

    @property
    def identity(self) -> dict[str, Any]:
        return {**super().identity, "backend": self.backend}

    def chip(self, image: NDArray[Any], box: FaceBox) -> NDArray[np.uint8]:
        """dlib's aligned chip of the face in ``box`` of ``image``: uint8 RGB, shape (150, 150, 3)."""
        from peep.edge.descriptor_onnx import CHIP_PADDING, CHIP_SIZE

        with self._lock:
            rgb, shape = self._shape(image, box)
            chip = self._dlib.get_face_chip(rgb, shape, size=CHIP_SIZE, padding=CHIP_PADDING)
        return np.asarray(chip, dtype=np.uint8)

    def encode(self, image: NDArray[Any], box: FaceBox) -> NDArray[np.float32]:
        """The descriptor of the face in ``box`` of ``image`` (BGR or gray uint8), shape (128,)."""
        return self.graph.describe(self.chip(image, box)[None])[0]

    def encode_many(self, faces: Sequence[tuple[NDArray[Any], FaceBox]]) -> NDArray[np.float32]:
        """Descriptors of several faces, each an (image, box) pair, in one batch; shape (len(faces), 128)."""
        if not faces:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self.graph.describe(np.stack([self.chip(image, box) for image, box in faces]))


def make_encoder(backend: str = "onnxruntime", *, threads: int = 1, cache_dir: Path | None = None,
                 jitter: int = 0) -> DlibResNetEncoder:  # fmt: skip
    """The ``dlib-resnet`` encoder on ``backend`` (:data:`BACKENDS`); jitter needs dlib's own network."""
    if backend not in BACKENDS:
        raise ValueError(f"descriptor backend: expected one of {', '.join(BACKENDS)}, received {backend!r}")
    if backend == "dlib" or jitter:
        if jitter and backend != "dlib":
            raise ValueError(f"jitter: expected 0 with the {backend} back end (dlib's own draws the jitters), "
                             f"received {jitter}")  # fmt: skip
        return DlibResNetEncoder(jitter=jitter)
    return OnnxResNetEncoder(threads=threads, cache_dir=cache_dir)


def encoder_for_bundle(bundle_input: Mapping[str, Any], *, bundle_id: str = "", backend: str = "onnxruntime",
                       threads: int = 1, cache_dir: Path | None = None) -> DescriptorEncoder | None:  # fmt: skip
    """The encoder a bundle's input needs (None for pixels), checked against the network it names.

    Raises
    ------
    BundleError
        The bundle names a descriptor kind this device does not know, or a
        network whose files differ from the installed ones (both hashes named).
    MissingExtraError
        The extra the descriptor needs is not installed.
    """
    kind = str(bundle_input.get("kind", "pixels"))
    if kind == "pixels":
        return None
    if kind != DlibResNetEncoder.kind:
        raise BundleError(f"bundle {bundle_id}: input kind {kind!r} is not a descriptor this device can compute")
    encoder = make_encoder(backend, threads=threads, cache_dir=cache_dir)
    wanted = dict(bundle_input.get("network", {}))
    have = encoder.identity
    for key in ("network_sha256", "landmarks_sha256"):
        if wanted.get(key) != have[key]:
            raise BundleError(
                f"bundle {bundle_id}: built for a dlib-resnet network with {key} {str(wanted.get(key))[:16]}…, "
                f"this device has {have[key][:16]}… ({have['package']}, dlib {have['dlib']}); install the bundle's "
                "network or rebuild the bundle with this one"
            )
    return encoder
