"""Every image read, searched for a face, cropped and described once: in a process pool, cached by content.

:func:`process_files` is what :func:`peep.server.datasets.load_dataset` runs
over a dataset's files. Per image it reads the file's bytes once (their
SHA-256 is the cache key), decodes them, finds the face once, and derives
from that one box both the normalised face (the bundle geometry) and, with
an encoder, the face's descriptor (dlib's network: ~5 ms a face on one core
through onnxruntime, ~80 ms through dlib's own loops; the faces of a chunk
are described in one batch). Three kinds of entries go to the :class:`~peep.server.facecache.FaceCache`:

``box``
    Where the face is (or that there is none, or that the bytes do not
    decode), keyed by the content and the detector (its settings, its
    cascade file's hash, OpenCV's version, which also decodes the image).
``face``
    The normalised face, keyed by the box entry's key and the geometry.
``descriptor``
    The descriptor, keyed by the box entry's key and the network's identity
    (its model files' hashes, package and dlib versions, ``jitter``).

Each key also holds the version of this module's computation
(:data:`COMPUTATION_VERSION`): bump it when the way a result is computed
from the same inputs changes, so old entries are no longer used.

What is not cached is computed in chunks of :data:`CHUNK` images by worker
processes, one per core (at most :data:`MAX_WORKERS`), each with one thread
per native library: the pool is the parallelism. The workers are started
with ``spawn``, not ``fork``: the parent may hold OpenCV's and OpenBLAS's
thread pools (and, in the demo, gRPC's threads), and a forked child can
inherit a lock held by a thread it does not have. A worker computes exactly
what the serial path computes (same decoding, same detector settings, same
network, no randomness): results are bit-for-bit identical (tested). Chunks
finish every second or so, and progress is reported as they do; at most two
chunks per worker are in flight, so what waits in queues stays small
whatever the dataset. Like any ``spawn`` pool, the workers import the main
module of the program: a script calling this needs the
``if __name__ == "__main__":`` guard (without it each worker re-runs the
script's top level and fails; the work is then finished in the calling
process, with a warning).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
from numpy.typing import NDArray
from peep.core.imaging import (
    LFW_FIXED_BOX,
    FaceBox,
    FaceDetector,
    FaceGeometry,
    HaarFaceDetector,
    normalise_face,
    primary_face,
)
from peep.server.facecache import FaceCache

log = logging.getLogger(__name__)

__all__ = [
    "CHUNK",
    "COMPUTATION_VERSION",
    "MAX_WORKERS",
    "FaceResults",
    "ImageResult",
    "detector_description",
    "process_files",
    "process_image",
    "process_images",
    "worker_count",
]

#: Version of the computation behind each kind of cache entry (part of its key).
COMPUTATION_VERSION = {"box": 1, "face": 1, "descriptor": 1}
#: Images per task sent to a worker, and per batch of the descriptor network: ~0.25 s of detection and
#: onnxruntime's descriptors (~0.9 s with dlib's network) on one core; progress is reported as chunks finish,
#: and a busy machine can make that several times longer. onnxruntime's cost per face is lowest near 8-16
#: faces a batch (27 % below one at a time, here) and rises again at 32.
CHUNK = 8
#: Most worker processes by default, to bound memory: each holds dlib's models (~0.11 GB resident).
MAX_WORKERS = 8
# Estimated serial seconds below which starting workers (~0.5 s: Python, OpenCV, dlib, the models) does not pay.
_POOL_MIN_SECONDS = 3.0
# Rough costs per image on one core (x86-64): a Haar detection and crop; the landmarks and network on top,
# per descriptor back end.
_DETECT_S, _DESCRIBE_S = 0.03, {"dlib": 0.11, "onnxruntime": 0.035}
# Environment variables that make the native libraries a worker may load run one thread each.
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")

Status = Literal["face", "no-face", "unreadable"]
Box = tuple[float, float, float, float, float]  # x, y, w, h, score of a FaceBox


@dataclass(frozen=True)
class ImageResult:
    """What one image yielded.

    Attributes
    ----------
    digest : str or None
        SHA-256 (hex) of the bytes decoded; None when the file could not be read.
    status : {"face", "no-face", "unreadable"}
    box : tuple of 5 floats or None
        The face's ``(x, y, w, h, score)`` when ``status == "face"``.
    face : ndarray of shape (height, width), float32, or None
        The normalised face, when asked for and found.
    descriptor : ndarray of shape (dimension,), float32, or None
        The face's descriptor, when asked for and found.
    """

    digest: str | None
    status: Status
    box: Box | None = None
    face: NDArray[np.float32] | None = None
    descriptor: NDArray[np.float32] | None = None


@dataclass
class FaceResults:
    """The faces (and descriptors) of the files that hold one, in file order.

    Attributes
    ----------
    faces : ndarray of shape (n_ok, height, width), float32 in [0, 1]
    descriptors : ndarray of shape (n_ok, dimension), float32, or None
        None without an encoder.
    ok : ndarray of shape (n_files,), bool
        Which files yielded a face.
    n_computed : int
        Images computed in this call (the rest came from the cache).
    """

    faces: NDArray[np.float32]
    descriptors: NDArray[np.float32] | None
    ok: NDArray[np.bool_]
    n_computed: int = 0


@dataclass
class _Steps:
    """What a process needs to compute an image: the detector (None: LFW's fixed box), geometry, encoder."""

    detector: FaceDetector | None
    geometry: FaceGeometry
    encoder: Any = None


# --------------------------------------------------------------------------- one image


def process_image(
    path: str,
    steps: _Steps,
    *,
    want_face: bool = True,
    want_descriptor: bool = False,
    known_box: Box | None = None,
    known_digest: str | None = None,
) -> ImageResult:
    """Read ``path`` once, find its face once (or take ``known_box``), then crop and/or describe it.

    Parameters
    ----------
    path : str
    steps : _Steps
    want_face, want_descriptor : bool
        Which results to compute (a descriptor needs ``steps.encoder``).
    known_box, known_digest : optional
        The face's box found earlier in the bytes whose SHA-256 is
        ``known_digest`` (from the cache); used only if the file still holds
        those bytes, else the face is searched again.
    """
    return process_images([(path, want_face, want_descriptor, known_box, known_digest)], steps)[0]


_Item = tuple[str, bool, bool, Box | None, str | None]  # path, face?, descriptor?, known box, its bytes' digest


def process_images(items: Sequence[_Item], steps: _Steps) -> list[ImageResult]:
    """:func:`process_image` of several images, their descriptors computed in one batch.

    The network runs once for every face of ``items`` that wants a
    descriptor (onnxruntime's convolutions cost about a quarter less per face
    in batches of 8 than one at a time, and give the same bits); an encoder
    without ``encode_many`` describes one face at a time.

    Parameters
    ----------
    items : sequence of (path, want_face, want_descriptor, known_box, known_digest)
    steps : _Steps

    Returns
    -------
    list of ImageResult, one per item, in order
    """
    results: list[ImageResult] = []
    waiting: list[tuple[int, NDArray[np.uint8], FaceBox]] = []  # result index, colour image, box
    for path, want_face, want_descriptor, known_box, known_digest in items:
        res, color, box = _find_and_crop(path, steps, want_face, want_descriptor, known_box, known_digest)
        if color is not None and box is not None:
            waiting.append((len(results), color, box))
        results.append(res)
    if waiting:
        pairs = [(color, box) for _, color, box in waiting]
        encode_many = getattr(steps.encoder, "encode_many", None)
        if encode_many is not None:
            vectors = np.asarray(encode_many(pairs), dtype=np.float32)
        else:
            vectors = np.stack([np.asarray(steps.encoder.encode(c, b), dtype=np.float32) for c, b in pairs])
        for (k, _, _), vec in zip(waiting, vectors, strict=True):
            results[k] = dataclasses.replace(results[k], descriptor=np.ascontiguousarray(vec))
    return results


def _find_and_crop(
    path: str,
    steps: _Steps,
    want_face: bool,
    want_descriptor: bool,
    known_box: Box | None,
    known_digest: str | None,
) -> tuple[ImageResult, NDArray[np.uint8] | None, FaceBox | None]:
    """One image's result without its descriptor, and the colour image and box to describe (if wanted)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ImageResult(None, "unreadable"), None, None
    digest = hashlib.sha256(data).hexdigest()
    buf = np.frombuffer(data, dtype=np.uint8)
    # Decoded from the bytes hashed, as cv2.imread decodes the file (EXIF orientation included).
    gray = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE) if buf.size else None
    if gray is None:
        return ImageResult(digest, "unreadable"), None, None
    if known_digest is not None and known_digest != digest:
        # The file changed since it was hashed: what the cache gave for the old bytes is no longer its.
        known_box, want_face, want_descriptor = None, True, steps.encoder is not None
    box: FaceBox | None
    if known_box is not None:
        x, y, w, h, score = known_box
        box = FaceBox(x=x, y=y, w=w, h=h, score=score)
    elif steps.detector is None:
        box = LFW_FIXED_BOX
    else:
        box = primary_face(steps.detector.detect(gray), gray.shape)
    if box is None:
        return ImageResult(digest, "no-face"), None, None
    found: Box = (box.x, box.y, box.w, box.h, box.score)
    face = normalise_face(gray, box, steps.geometry) if want_face else None
    if not want_descriptor:
        return ImageResult(digest, "face", found, face), None, None
    # The encoder sees the colour image (a device's frame), the detector the grayscale decoding.
    color = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if color is None:
        return ImageResult(digest, "unreadable"), None, None
    return ImageResult(digest, "face", found, face), color, box


# --------------------------------------------------------------------------- cache keys


def detector_description(detector: object) -> dict[str, Any]:
    """The detector's class and settings (recorded in bundle metadata as the normalisation)."""
    desc: dict[str, Any] = {"detector": type(detector).__name__}
    for attr in ("scale_factor", "min_neighbors", "min_size", "detect_width", "score_threshold"):
        if hasattr(detector, attr):
            desc[attr] = getattr(detector, attr)
    return desc


def _file_sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _detection_identity(detector: FaceDetector | None) -> dict[str, Any]:
    """Everything besides the bytes that decides the box entry: decoder and detector."""
    ident: dict[str, Any] = {"opencv": cv2.__version__, "version": COMPUTATION_VERSION["box"]}
    if detector is None:
        ident["box"] = "lfw-fixed"
        return ident
    ident.update(detector_description(detector))
    cascade = getattr(detector, "cascade_path", None)
    if isinstance(cascade, str):
        ident["cascade_sha256"] = _file_sha256(cascade)
    model = getattr(detector, "model_path", None)
    if isinstance(model, str):
        ident["model_sha256"] = _file_sha256(model)
    return ident


def _key(kind: str, parent: str, params: str) -> str:
    return hashlib.sha256(f"{kind}\0{parent}\0{params}".encode()).hexdigest()


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


class _Keys:
    """Cache keys of one configuration (detector, geometry, encoder), per content hash."""

    def __init__(self, detector: FaceDetector | None, geometry: FaceGeometry, encoder: Any) -> None:
        self._detection = _json(_detection_identity(detector))
        self._geometry = _json({"geometry": geometry.to_dict(), "version": COMPUTATION_VERSION["face"]})
        self._network = ""
        if encoder is not None:
            self._network = _json(
                {
                    "identity": encoder.identity,
                    "kind": getattr(encoder, "kind", type(encoder).__name__),
                    "dimension": int(encoder.dimension),
                    "jitter": getattr(encoder, "jitter", None),
                    "version": COMPUTATION_VERSION["descriptor"],
                }
            )

    def box(self, digest: str) -> str:
        return _key("box", digest, self._detection)

    def face(self, box_key: str) -> str:
        return _key("face", box_key, self._geometry)

    def descriptor(self, box_key: str) -> str:
        return _key("descriptor", box_key, self._network)


def _box_value(result: ImageResult) -> bytes:
    return json.dumps({"status": result.status, "box": result.box}).encode()


def _parse_box(value: bytes) -> tuple[Status, Box | None] | None:
    """A box entry's (status, box), or None if it is not one this code wrote."""
    try:
        doc = json.loads(value)
        status, box = doc["status"], doc["box"]
        if status == "face":
            x, y, w, h, score = (float(v) for v in box)
            return "face", (x, y, w, h, score)
        if status in ("no-face", "unreadable"):
            return status, None
    except (ValueError, KeyError, TypeError):
        pass
    return None


def _array(value: bytes | None, shape: tuple[int, ...]) -> NDArray[np.float32] | None:
    if value is None or len(value) != 4 * int(np.prod(shape)):
        return None
    return np.frombuffer(value, dtype=np.float32).reshape(shape)


# --------------------------------------------------------------------------- worker processes

_WORKER_STEPS: _Steps | None = None
_WORKER_LIMITS: Any = None  # threadpoolctl's limiter, kept for the worker's life


def _recipe(detector: FaceDetector | None, encoder: Any) -> tuple[Any, Any] | None:
    """How a worker process rebuilds the detector and the encoder, or None if it cannot (run serially).

    Exact types only: a subclass (or a test's fake) may compute something else.
    """
    det: Any
    if detector is None:
        det = None
    elif type(detector) is HaarFaceDetector:
        det = (
            "haar",
            {
                "scale_factor": detector.scale_factor,
                "min_neighbors": detector.min_neighbors,
                "min_size": detector.min_size,
                "detect_width": detector.detect_width,
                "cascade_path": detector.cascade_path,
            },
        )
    else:
        return None
    enc: Any = None
    if encoder is not None:
        cls = type(encoder)
        known = {"DlibResNetEncoder": "dlib", "OnnxResNetEncoder": "onnxruntime"}
        if cls.__module__ != "peep.edge.embedding" or cls.__qualname__ not in known:
            return None
        if encoder.jitter:
            # dlib draws its jitters from one generator per model object: a descriptor would depend on how
            # many faces that process described before, so chunks in other processes would differ.
            return None
        enc = ("dlib-resnet", {"backend": known[cls.__qualname__]})
    return det, enc


def _init_worker(recipe: tuple[Any, Any], geometry: FaceGeometry) -> None:
    """Build the worker's detector and encoder; one thread per native library (the pool is the parallelism)."""
    global _WORKER_STEPS, _WORKER_LIMITS
    for var in _ONE_THREAD:  # for libraries loaded from here on
        os.environ[var] = "1"
    cv2.setNumThreads(1)
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        _WORKER_LIMITS = threadpool_limits(1)  # for the BLAS numpy loaded before this ran
    except ImportError:
        pass
    det_recipe, enc_recipe = recipe
    detector = None if det_recipe is None else HaarFaceDetector(**det_recipe[1])
    encoder = None
    if enc_recipe is not None:
        from peep.edge.embedding import make_encoder

        encoder = make_encoder(**enc_recipe[1])
    _WORKER_STEPS = _Steps(detector, geometry, encoder)


_Task = tuple[int, str, bool, bool, Box | None, str | None]  # index, path, face?, descriptor?, known box, digest


def _run_tasks(tasks: Sequence[_Task], steps: _Steps | None = None) -> list[tuple[int, ImageResult]]:
    use = steps if steps is not None else _WORKER_STEPS
    assert use is not None, "a worker runs _init_worker first"
    results = process_images([(path, wf, wd, box, digest) for _, path, wf, wd, box, digest in tasks], use)
    return [(task[0], res) for task, res in zip(tasks, results, strict=True)]


def worker_count(jobs: int | None, n_tasks: int) -> int:
    """Worker processes for ``n_tasks`` chunks: ``jobs`` if given, else the cores this process may run on.

    At most :data:`MAX_WORKERS` unless ``jobs`` asks for more, never more than there are chunks.
    """
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs: expected >= 1 or None (one per core), received {jobs}")
    if jobs is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
        jobs = min(max(1, cores), MAX_WORKERS)
    return max(1, min(jobs, n_tasks))


# --------------------------------------------------------------------------- many images


def process_files(
    files: Sequence[str | os.PathLike[str]],
    *,
    geometry: FaceGeometry,
    detector: FaceDetector | None,
    encoder: Any = None,
    cache: FaceCache | None = None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FaceResults:
    """The normalised face (and descriptor) of the primary face of every file; each image computed once.

    Parameters
    ----------
    files : sequence of paths
    geometry : FaceGeometry
    detector : FaceDetector or None
        None crops LFW's fixed box instead of searching.
    encoder : DescriptorEncoder, optional
        Also compute each face's descriptor from the same box.
    cache : FaceCache, optional
        Where results are looked up and stored (None: all computed, nothing stored).
    jobs : int, optional
        Worker processes (None: one per core, at most :data:`MAX_WORKERS`; 1: in this process).
        Small amounts of work run in this process whatever ``jobs`` says.
    progress : callable, optional
        Called as ``progress(done, total)`` over the images to compute (not those found in the cache):
        ``(0, total)`` first, then as each chunk finishes. Not called when everything is cached.

    Returns
    -------
    FaceResults
    """
    paths = [str(f) for f in files]
    n = len(paths)
    shape = geometry.shape
    dimension = 0 if encoder is None else int(encoder.dimension)
    faces = np.zeros((n, *shape), dtype=np.float32)
    descriptors = None if encoder is None else np.zeros((n, dimension), dtype=np.float32)
    status: list[Status | None] = [None] * n
    keys = _Keys(detector, geometry, encoder)
    digests: list[str | None] = [None] * n
    if cache is not None and cache.enabled:
        digests = cache.content_hashes(paths)

    def look_up() -> list[_Task]:
        """Fill in what the cache holds (boxes first, then the faces and descriptors of the images that
        have one); the images still to compute."""
        need_face = [True] * n
        need_descriptor = [encoder is not None] * n
        known_box: list[Box | None] = [None] * n
        if cache is not None and cache.enabled:
            box_keys = {i: keys.box(d) for i, d in enumerate(digests) if d is not None}
            stored = cache.get(list(box_keys.values()))
            with_face: dict[int, str] = {}
            for i, k in box_keys.items():
                parsed = _parse_box(stored[k]) if k in stored else None
                if parsed is None:
                    continue
                st, box = parsed
                if st != "face":
                    status[i], need_face[i], need_descriptor[i] = st, False, False
                else:
                    known_box[i] = box
                    with_face[i] = k
            wanted = [keys.face(k) for k in with_face.values()]
            if encoder is not None:
                wanted += [keys.descriptor(k) for k in with_face.values()]
            stored = cache.get(wanted)
            for i, k in with_face.items():
                face = _array(stored.get(keys.face(k)), shape)
                if face is not None:
                    faces[i], need_face[i] = face, False
                if descriptors is not None:
                    desc = _array(stored.get(keys.descriptor(k)), (dimension,))
                    if desc is not None:
                        descriptors[i], need_descriptor[i] = desc, False
                if not need_face[i] and not need_descriptor[i]:
                    status[i] = "face"

        return [
            (i, paths[i], need_face[i], need_descriptor[i], known_box[i], digests[i])
            for i in range(n)
            if status[i] is None
        ]

    def take(chunk_results: Sequence[tuple[int, ImageResult]]) -> None:
        entries: dict[str, bytes] = {}
        for i, res in chunk_results:
            status[i] = res.status
            if res.status == "unreadable":
                log.warning("unreadable image skipped: %s", paths[i])
            if res.face is not None:
                faces[i] = res.face
            if descriptors is not None and res.descriptor is not None:
                descriptors[i] = res.descriptor
            if res.digest is None:
                continue
            box_key = keys.box(res.digest)
            entries[box_key] = _box_value(res)
            if res.face is not None:
                entries[keys.face(box_key)] = np.ascontiguousarray(res.face, dtype=np.float32).tobytes()
            if res.descriptor is not None:
                entries[keys.descriptor(box_key)] = np.ascontiguousarray(res.descriptor, dtype=np.float32).tobytes()
        if cache is not None:
            cache.put(entries)

    todo = look_up()
    if todo and cache is not None and cache.enabled:
        # Another process may be computing the same faces (the suite's workers start together): wait for it,
        # then look again, rather than compute them a second time on the same cores.
        with cache.computing():
            todo = look_up()
            if todo:
                _compute(todo, _Steps(detector, geometry, encoder), _recipe(detector, encoder), jobs, take, progress)
    elif todo:
        _compute(todo, _Steps(detector, geometry, encoder), _recipe(detector, encoder), jobs, take, progress)
    ok = np.array([s == "face" for s in status], dtype=bool)
    return FaceResults(
        faces=faces[ok],
        descriptors=None if descriptors is None else descriptors[ok],
        ok=ok,
        n_computed=len(todo),
    )


def _compute(
    todo: Sequence[_Task],
    steps: _Steps,
    recipe: tuple[Any, Any] | None,
    jobs: int | None,
    take: Callable[[Sequence[tuple[int, ImageResult]]], None],
    progress: Callable[[int, int], None] | None,
) -> None:
    """Run ``todo`` in chunks (in worker processes when it pays), handing each chunk's results to ``take``."""
    total = len(todo)
    chunks = [todo[i : i + CHUNK] for i in range(0, total, CHUNK)]
    per_image = _DETECT_S
    if any(t[3] for t in todo):
        backend = recipe[1][1]["backend"] if recipe is not None and recipe[1] is not None else "dlib"
        per_image = _DESCRIBE_S.get(backend, _DESCRIBE_S["dlib"])
    workers = worker_count(jobs, len(chunks))
    if recipe is None or workers < 2 or total * per_image < _POOL_MIN_SECONDS:
        workers = 1
    if progress is not None:
        progress(0, total)
    done = 0
    if workers > 1:
        assert recipe is not None
        try:
            done = _compute_in_pool(chunks, steps.geometry, recipe, workers, take, progress, total)
        except BrokenProcessPool as exc:  # a worker died (killed, out of memory): finish here
            log.warning(
                "face workers stopped (%s); computing the remaining faces in this process (a script that loads "
                'datasets needs `if __name__ == "__main__":`: each worker imports it)',
                exc,
            )
            chunks = [c for c in chunks if c]
            done = total - sum(len(c) for c in chunks)
        else:
            return
    for chunk in chunks:  # the chunks a pool would run, so the batches (and the bits) are the same
        take(_run_tasks(chunk, steps))
        done += len(chunk)
        if progress is not None:
            progress(done, total)


def _compute_in_pool(
    chunks: list[Sequence[_Task]],
    geometry: FaceGeometry,
    recipe: tuple[Any, Any],
    workers: int,
    take: Callable[[Sequence[tuple[int, ImageResult]]], None],
    progress: Callable[[int, int], None] | None,
    total: int,
) -> int:
    """Chunks in ``workers`` spawned processes, at most two per worker in flight.

    Each chunk handed to ``take`` is emptied in ``chunks`` (what is left is what
    a broken pool did not finish).
    """
    ctx = multiprocessing.get_context("spawn")
    done = 0
    pending: dict[Future[list[tuple[int, ImageResult]]], int] = {}
    next_chunk = 0
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(recipe, geometry)) as pool:
        try:
            while next_chunk < len(chunks) or pending:
                while next_chunk < len(chunks) and len(pending) < 2 * workers:
                    pending[pool.submit(_run_tasks, chunks[next_chunk])] = next_chunk
                    next_chunk += 1
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    j = pending.pop(fut)
                    take(fut.result())
                    done += len(chunks[j])
                    chunks[j] = []
                    if progress is not None:
                        progress(done, total)
        finally:
            for fut in pending:
                fut.cancel()
    return done
