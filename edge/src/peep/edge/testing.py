"""Real-face material for tests, the edge benchmark and ``peep demo``; never imported by the agent.

It lives in peep-edge, not in the server, because :mod:`peep.edge.bench`
needs it and must run on a device where only peep-edge is installed (the
edge may not depend on the server); the server's demo, which needs the
edge agent anyway (peep-lab depends on peep-edge), imports it from here. A
test keeps it out of the agent's import path.

- :func:`lfw_people` finds LFW images in scikit-learn's layout
  (``<data_home>/lfw_home/lfw_funneled/<Person>/<Person>_0001.jpg``).
- :func:`compose_video` writes a 640x480 video (``cv2.VideoWriter``) of LFW
  faces moving over a static background, each face visible during its own
  frame interval, so detection and tracking run on real faces.
- :func:`build_bundle_from_images` fits and signs a projection bundle from
  image files with the core only (Haar detection + the one normalisation
  path), for places that must not depend on the server package.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from numpy.typing import NDArray
from peep.core.bundle import build_bundle_files, write_bundle_files
from peep.core.imaging import DEFAULT_GEOMETRY, HaarFaceDetector, normalise_face, primary_face
from peep.core.projections import EigenfaceProjection


def lfw_home(data_home: str | os.PathLike[str] | None = None) -> Path:
    """The ``lfw_funneled`` directory.

    Looked up under ``data_home``, else ``$SCIKIT_LEARN_DATA``, else the
    repository's staged copy (``.data/scikit_learn_data``, for a source
    checkout), else ``~/scikit_learn_data``.
    """
    if data_home is not None:
        candidates = [Path(data_home)]
    elif os.environ.get("SCIKIT_LEARN_DATA"):
        candidates = [Path(os.environ["SCIKIT_LEARN_DATA"])]
    else:
        candidates = [
            Path(__file__).resolve().parents[4] / ".data" / "scikit_learn_data",
            Path.home() / "scikit_learn_data",
        ]
    for home in candidates:
        root = home / "lfw_home" / "lfw_funneled"
        if root.is_dir():
            return root
    raise FileNotFoundError(
        f"LFW images not found: expected lfw_home/lfw_funneled under {', '.join(map(str, candidates))} "
        "(stage them with scripts/stage-lfw.sh and set SCIKIT_LEARN_DATA)"
    )


def lfw_people(data_home: str | os.PathLike[str] | None = None, *, min_images: int = 1) -> dict[str, list[Path]]:
    """Image paths per person with at least ``min_images`` images, names sorted."""
    root = lfw_home(data_home)
    out: dict[str, list[Path]] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(d.glob("*.jpg"))
        if len(files) >= min_images:
            out[d.name] = files
    return out


def _background(size: tuple[int, int], seed: int) -> NDArray[np.uint8]:
    w, h = size
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 70 + 40 * (xx / w) + 25 * (yy / h)
    noise = cv2.GaussianBlur(rng.normal(0, 12, (h, w)).astype(np.float32), (0, 0), 6)
    gray = np.clip(base + noise, 0, 255).astype(np.uint8)
    img = cv2.merge([gray, (gray * 0.95).astype(np.uint8), (gray * 0.9).astype(np.uint8)])
    return np.ascontiguousarray(img)


@dataclass(frozen=True)
class FaceTrack:
    """One face in a composed video: the image, when it is visible and how it moves."""

    image: Path
    start: int
    stop: int
    x0: float
    y0: float
    amplitude: float = 60.0
    period_frames: float = 150.0
    phase: float = 0.0


def _elliptic_mask(size: int) -> NDArray[np.float32]:
    mask = np.zeros((size, size), np.float32)
    c = size // 2
    cv2.ellipse(mask, (c, c), (int(size * 0.34), int(size * 0.44)), 0, 0, 360, 1.0, -1)
    blurred = cv2.GaussianBlur(mask, (0, 0), size * 0.03)
    return np.asarray(blurred, dtype=np.float32)[:, :, None]


def compose_frames(
    tracks: Sequence[FaceTrack],
    *,
    n_frames: int,
    size: tuple[int, int] = (640, 480),
    face_size: int = 200,
    seed: int = 0,
) -> Iterator[tuple[NDArray[np.uint8], int]]:
    """The frames :func:`compose_video` writes, each with how many faces it shows.

    Yields
    ------
    frame : ndarray of shape (height, width, 3), uint8
        BGR.
    visible : int
    """
    w, h = size
    bg = _background(size, seed)
    bg_f32 = bg.astype(np.float32)
    mask = _elliptic_mask(face_size)
    faces = []
    for tr in tracks:
        img = cv2.imread(os.fspath(tr.image), cv2.IMREAD_COLOR)
        if img is None:
            raise FileNotFoundError(f"could not read face image {tr.image}")
        faces.append(cv2.resize(img, (face_size, face_size), interpolation=cv2.INTER_AREA).astype(np.float32))
    for f in range(n_frames):
        at = []
        for tr, face in zip(tracks, faces, strict=True):
            if tr.start <= f < tr.stop:
                x = tr.x0 + tr.amplitude * math.sin(2 * math.pi * f / tr.period_frames + tr.phase)
                at.append((round(min(max(x, 0), w - face_size)), round(min(max(tr.y0, 0), h - face_size)), face))
        if not at:
            yield bg, 0
            continue
        # Blended in float only over the window the faces cover: the same bytes as blending the whole
        # frame (outside the window the frame is the background), at a fraction of the cost.
        x0, y0 = min(a[0] for a in at), min(a[1] for a in at)
        x1, y1 = max(a[0] for a in at) + face_size, max(a[1] for a in at) + face_size
        window = bg_f32[y0:y1, x0:x1].copy()
        for xi, yi, face in at:
            roi = window[yi - y0 : yi - y0 + face_size, xi - x0 : xi - x0 + face_size]
            roi[:] = roi * (1 - mask) + face * mask
        frame = bg.copy()
        frame[y0:y1, x0:x1] = np.clip(window, 0, 255).astype(np.uint8)
        yield frame, len(at)


def compose_video(
    path: str | os.PathLike[str],
    tracks: Sequence[FaceTrack],
    *,
    n_frames: int,
    fps: float = 30.0,
    size: tuple[int, int] = (640, 480),
    face_size: int = 200,
    seed: int = 0,
    fourcc: str = "mp4v",
) -> dict[str, Any]:
    """Write a video of LFW faces moving over a background.

    Each face is the LFW image scaled to ``face_size`` pixels and cut out with
    a soft elliptic mask (so faces in the photo's own background do not come
    along), moving horizontally on a sine path while ``start <= frame < stop``.

    Returns
    -------
    dict
        ``path``, ``n_frames``, ``fps``, ``size`` and, per frame, how many faces are visible.
    """
    w, h = size
    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter.fourcc(*fourcc), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"cv2.VideoWriter could not open {path} with codec {fourcc!r}")
    visible = []
    try:
        for frame, n in compose_frames(tracks, n_frames=n_frames, size=size, face_size=face_size, seed=seed):
            visible.append(n)
            writer.write(frame)
    finally:
        writer.release()
    return {"path": str(path), "n_frames": n_frames, "fps": fps, "size": [w, h], "visible": visible}


def build_bundle_from_images(
    images: Sequence[Path],
    *,
    n_components: int,
    signing_key: Ed25519PrivateKey,
    out_dir: str | os.PathLike[str],
    radius_quantile: float = 0.95,
) -> Path:
    """Fit eigenfaces on the Haar-detected, normalised faces of ``images``; write a signed bundle.

    The detector settings are those of the server's bundle builder (Haar,
    scale 1.1, 5 neighbours, 40 px), recorded in the bundle's normalisation
    metadata so devices can crop the same way.
    """
    det = HaarFaceDetector()
    faces = []
    for p in images:
        img = cv2.imread(os.fspath(p), cv2.IMREAD_GRAYSCALE)
        if img is None:
            continue
        box = primary_face(det.detect(img), img.shape)
        if box is not None:
            faces.append(normalise_face(img, box, DEFAULT_GEOMETRY).ravel())
    if len(faces) <= n_components:
        raise ValueError(f"images: expected more than n_components={n_components} detectable faces, found {len(faces)}")
    X = np.asarray(faces, dtype=np.float64)
    projection = EigenfaceProjection(n_components=n_components, radius_quantile=radius_quantile).fit(X)
    normalisation = {
        "method": "detector",
        "detector": "HaarFaceDetector",
        "scale_factor": det.scale_factor,
        "min_neighbors": det.min_neighbors,
        "min_size": det.min_size,
        "detect_width": None,
        "geometry": DEFAULT_GEOMETRY.to_dict(),
    }
    files = build_bundle_files(
        projection=projection,
        geometry=DEFAULT_GEOMETRY,
        signing_key=signing_key,
        normalisation=normalisation,
        mechanism_defaults={"kind": "peep", "epsilon": 8.0, "delta": 0.0},
        provenance={"dataset": "lfw images", "n_images": len(faces), "software": "peep-edge testing"},
    )
    return write_bundle_files(files, out_dir)
