"""dlib's face descriptor network run by onnxruntime: the graph, where it is kept, and the check against dlib.

The network's weights are dlib's own file (``dlib_face_recognition_resnet_model_v1.dat``
in ``face_recognition_models``), read by :mod:`peep.edge.dlibdat` and turned into an
ONNX graph by :mod:`peep.edge.dlibgraph`. The graph is built **at first use** and
kept in a cache folder under the ``.dat``'s SHA-256 (``dlib-resnet-<sha256>.onnx``),
because every place that describes faces (a device, the demo, the audit) already
has the ``.dat`` and dlib, and a wheel cannot carry a file derived from another
package's data: no install step, no download, and a changed ``.dat`` gets a graph of
its own. Building takes about a second.

Whatever graph is found, built now or read from the cache, is run beside dlib's own
network on :data:`REFERENCE_CHIPS` fixed chips before it describes a face; a graph
whose descriptors differ from dlib's by more than :data:`TOLERANCE` in any
coordinate is refused by name (:class:`DescriptorGraphError`), so a corrupted or
altered cache file never describes anyone.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.exceptions import BundleError

__all__ = [
    "CHIP_PADDING",
    "CHIP_SIZE",
    "REFERENCE_CHIPS",
    "TOLERANCE",
    "DescriptorGraphError",
    "OnnxDescriptorNetwork",
    "default_cache_dir",
    "graph_path",
    "reference_chips",
]

#: The aligned chip dlib's descriptor takes: 150×150 pixels, 25 % padding around the 5 landmarks.
CHIP_SIZE = 150
CHIP_PADDING = 0.25
#: Largest difference from dlib's descriptor, per coordinate, a graph may show on the reference chips.
TOLERANCE = 1e-4
#: How many fixed chips the graph is checked on before it describes a face.
REFERENCE_CHIPS = 3


class DescriptorGraphError(BundleError):
    """The ONNX graph of the descriptor network does not compute dlib's descriptor (names the file and the gap)."""


def default_cache_dir() -> Path:
    """The graphs' folder: ``descriptor`` in ``$PEEP_CACHE_DIR``, else in systemd's ``$CACHE_DIRECTORY`` (the
    units' ``CacheDirectory=``), else in ``$XDG_CACHE_HOME/peep`` or ``~/.cache/peep``."""
    root = (
        os.environ.get("PEEP_CACHE_DIR")
        or os.environ.get("CACHE_DIRECTORY", "").split(":")[0]
        or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "peep")
    )
    return Path(root) / "descriptor"


def graph_path(cache_dir: Path, network_sha256: str) -> Path:
    """Where the graph of the network whose ``.dat`` has ``network_sha256`` is kept."""
    return Path(cache_dir) / f"dlib-resnet-{network_sha256}.onnx"


def reference_chips(n: int = REFERENCE_CHIPS) -> NDArray[np.uint8]:
    """``n`` fixed 150×150 RGB chips (uint8, shape (n, 150, 150, 3)): gradients with seeded texture.

    Not faces: the check is that the graph computes dlib's function, and smooth
    gradients under a texture drive every channel of every layer.
    """
    rng = np.random.default_rng(0x0D1B)
    yy, xx = np.mgrid[0:CHIP_SIZE, 0:CHIP_SIZE].astype(np.float32) / (CHIP_SIZE - 1)
    chips = np.empty((n, CHIP_SIZE, CHIP_SIZE, 3), dtype=np.uint8)
    for k in range(n):
        base = np.stack([xx, yy, (xx + yy) / 2], axis=-1)[..., np.roll(np.arange(3), k)] * 200.0 + 28.0
        noise = rng.normal(0.0, 18.0, size=base.shape)
        chips[k] = np.clip(base + noise, 0, 255).astype(np.uint8)
    return chips


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _build(network_file: Path, path: Path) -> bytes:
    from peep.edge.dlibdat import read_network
    from peep.edge.dlibgraph import build_graph

    data = build_graph(read_network(network_file))
    try:
        _write_atomically(path, data)
    except OSError:
        pass  # a read-only cache: the graph is used from memory, built again next time
    return data


class OnnxDescriptorNetwork:
    """dlib's descriptor network as an onnxruntime session, checked against dlib's own before use.

    Parameters
    ----------
    network_file : Path
        dlib's ``.dat``.
    network_sha256 : str
        Its SHA-256 (hex): the cache key.
    reference : object
        dlib's ``face_recognition_model_v1`` of the same file; only used for the check.
    threads : int, default=1
        onnxruntime's intra-op threads.
    cache_dir : Path, optional
        Where graphs are kept (default :func:`default_cache_dir`).

    Raises
    ------
    DescriptorGraphError
        The graph, cached or just built, differs from dlib's network by more
        than :data:`TOLERANCE` on the reference chips, or onnxruntime cannot
        load it (a damaged file).
    """

    def __init__(self, network_file: Path, network_sha256: str, reference: Any, *, threads: int = 1,
                 cache_dir: Path | None = None) -> None:  # fmt: skip
        import onnxruntime as ort

        if not 1 <= int(threads) <= 64:
            raise ValueError(f"threads: expected 1-64, received {threads}")
        self.path = graph_path(cache_dir if cache_dir is not None else default_cache_dir(), network_sha256)
        self.built = False
        try:
            data = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            data = _build(Path(network_file), self.path)
            self.built = True
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for a damaged model
            raise DescriptorGraphError(
                f"descriptor graph {self.path}: onnxruntime cannot load it ({str(exc)[:200]}); delete it and it "
                "is built again from the network file"
            ) from None
        self.threads = int(threads)
        self.max_difference = self._check(reference)

    def _check(self, reference: Any) -> float:
        chips = reference_chips()
        ours = self.describe(chips)
        theirs = np.stack([np.asarray(reference.compute_face_descriptor(c), dtype=np.float32) for c in chips])
        if ours.shape != theirs.shape:
            raise DescriptorGraphError(
                f"descriptor graph {self.path}: expected descriptors of shape {theirs.shape[1:]}, "
                f"received {ours.shape[1:]}"
            )
        gap = float(np.max(np.abs(ours - theirs)))
        if not gap <= TOLERANCE:  # NaN included
            raise DescriptorGraphError(
                f"descriptor graph {self.path}: expected dlib's descriptor within {TOLERANCE:g} per coordinate on "
                f"{len(chips)} reference chips, this graph differs by {gap:.3g}; refusing it (delete the file to "
                "build it again from the network file)"
            )
        return gap

    def describe(self, chips: NDArray[np.uint8]) -> NDArray[np.float32]:
        """Descriptors of aligned chips: uint8 RGB, shape (N, 150, 150, 3) → float32, shape (N, 128)."""
        from peep.edge.dlibgraph import INPUT, OUTPUT

        chips = np.ascontiguousarray(chips, dtype=np.uint8)
        if chips.ndim != 4 or chips.shape[1:] != (CHIP_SIZE, CHIP_SIZE, 3):
            raise ValueError(f"chips: expected shape (N, {CHIP_SIZE}, {CHIP_SIZE}, 3), received {chips.shape}")
        if len(chips) == 0:
            return np.zeros((0, 128), dtype=np.float32)
        out = self._session.run([OUTPUT], {INPUT: chips})[0]
        return np.asarray(out, dtype=np.float32)
