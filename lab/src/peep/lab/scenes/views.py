"""Public photos as a scene camera sees a face: the calibration people of a run on scenes.

A device's thresholds hold their FPIR target only for strangers who look, to the descriptor, like the
people they were set on. Set on clean portraits, they are stricter than needed for faces that come out of
:mod:`peep.lab.scenes.render` (small, turned, blurred, noisy, compressed), and call enrolled people unknown.
Each public photo is drawn here through the same kinds of harm, with the renderer's own ranges: face height
log-uniform over the scenes' face sizes, a turn narrowing the frontal photo (up to about 48°), motion blur
along a crossing, a colour cast, gain drift and a light switched off, shot and read noise, then lossy
compression (JPEG at quality 30-60 standing in for H.264 at 1 Mbit/s: no encoder state across frames), and
the result scaled back to the photo's size so the desk's detector and the descriptor's alignment see it as
they see a camera's face. No scene's person is drawn: these are the calibration people's own photos.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import cv2
import numpy as np
from numpy.typing import NDArray
from peep.lab.scenes.render import LFW_FACE_BOX, WALK_SPEED_FACES_PER_S, SceneSpec


def camera_view(photo: NDArray[np.uint8], rng: np.random.Generator,
                face_px: tuple[int, int] = SceneSpec.face_px) -> NDArray[np.uint8]:  # fmt: skip
    """One LFW photo (BGR, shape (250, 250, 3)) as a scene camera would have seen its face; same shape.

    Parameters
    ----------
    photo : ndarray of uint8, shape (H, W, 3)
        The face where LFW places it (:data:`peep.lab.scenes.render.LFW_FACE_BOX`).
    rng : numpy.random.Generator
    face_px : (int, int)
        The face heights drawn from, log-uniform (the scenes' range by default).
    """
    if photo.ndim != 3 or photo.shape[2] != 3:
        raise ValueError(f"photo: expected a BGR image of shape (H, W, 3), received shape {photo.shape}")
    H, W = photo.shape[:2]
    fh = float(np.exp(rng.uniform(np.log(face_px[0]), np.log(face_px[1]))))
    s = fh / (LFW_FACE_BOX[3] - LFW_FACE_BOX[1])
    yaw = rng.uniform(-35, 35) + rng.uniform(-12.5, 12.5)  # a pass's start and the middle of its drift
    sx = s * float(np.cos(np.radians(yaw)))
    small = cv2.resize(photo.astype(np.float32), (max(2, round(W * sx)), max(2, round(H * s))),
                       interpolation=cv2.INTER_AREA)  # fmt: skip
    if rng.random() < 0.5:  # half the passes cross the frame: a quarter of a frame's travel of blur
        length = int(rng.uniform(*WALK_SPEED_FACES_PER_S) * fh / SceneSpec.fps * 0.25)
        if length >= 2:
            small = cv2.filter2D(small, -1, np.full((1, length), 1.0 / length, np.float32))
    gain = (1.0 + 0.12 * np.sin(rng.uniform(0, 2 * np.pi))) * (rng.uniform(0.6, 0.85) if rng.random() < 0.5 else 1.0)
    small = small * rng.uniform(0.9, 1.1, 3).astype(np.float32) * gain
    light = np.sqrt(np.clip(small, 0, None) / 255.0)
    shot = rng.standard_normal(small.shape[:2]).astype(np.float32)[:, :, None] * light
    small = small + shot * 4.0 + rng.standard_normal(small.shape).astype(np.float32) * SceneSpec.noise
    ok, jpeg = cv2.imencode(".jpg", np.clip(small, 0, 255).astype(np.uint8),
                            [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(30, 61))])  # fmt: skip
    if not ok:
        raise ValueError("camera_view: the JPEG encoder refused the image")
    seen = cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
    # back to the photo's scale, the turn's narrowing kept: the narrower image centred on a black frame
    w = min(W, max(2, round(seen.shape[1] / s)))
    out = np.zeros_like(photo)
    x0 = (W - w) // 2
    out[:, x0 : x0 + w] = cv2.resize(seen, (w, H), interpolation=cv2.INTER_LINEAR)
    return out


def write_camera_views(
    source: Path,
    people: Sequence[str],
    dest: Path,
    *,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Each person's photos in ``source/<person>/`` as :func:`camera_view` draws them, into ``dest/<person>/``
    (PNG: no second compression); ``dest``, a folder dataset :func:`peep.server.datasets.load_dataset` reads.

    Raises
    ------
    FileNotFoundError
        A person without a folder or without a readable photo in ``source``.
    """
    from peep.server.datasets import IMAGE_EXTENSIONS

    rng = np.random.default_rng(seed)
    for i, person in enumerate(people):
        photos = sorted(f for f in (source / person).glob("*") if f.suffix.lower() in IMAGE_EXTENSIONS)
        if not photos:
            raise FileNotFoundError(f"{source / person}: no photo of {person!r} to draw as a camera sees it")
        out = dest / person
        out.mkdir(parents=True, exist_ok=True)
        for f in photos:
            img = cv2.imread(str(f), cv2.IMREAD_COLOR)
            if img is None:
                raise FileNotFoundError(f"{f}: not a readable image")
            cv2.imwrite(str(out / f"{f.stem}.png"), camera_view(img, rng))
        if progress is not None:
            progress(i + 1, len(people))
    return dest


#: Draws of one photo tried before it is left as it is: a desk enrols only from a view it finds a face in.
REDRAWS = 5


def redraw_as_seen(
    folder: Path,
    share: float,
    rng: np.random.Generator,
    accept: Callable[[NDArray[np.uint8]], bool] = lambda _view: True,
) -> list[Path]:
    """Replace ``share`` of the photo links in ``folder`` (chosen by ``rng``) by the photo as :func:`camera_view`
    draws it: an enrolment at the camera that will see the person, with the same photos and as many of them.

    A draw ``accept`` refuses (the desk's detector finds no face in it) is drawn again, up to :data:`REDRAWS`
    times, then the photo stays as it is: the desk must find a face in every photo it is given.

    Returns the drawn files (``<link's stem>-seen.png``: PNG, no second compression), which the caller deletes
    once they are released.

    Raises
    ------
    ValueError
        ``share`` outside [0, 1].
    FileNotFoundError
        A link to a file that is not a readable image.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share: expected 0 <= share <= 1, received {share}")
    links = sorted(f for f in folder.iterdir() if f.is_symlink())
    k = round(share * len(links))
    out = []
    for j in sorted(rng.permutation(len(links))[:k]):
        link = links[int(j)]
        img = cv2.imread(str(link), cv2.IMREAD_COLOR)
        if img is None:
            raise FileNotFoundError(f"{link.resolve()}: not a readable image")
        view = next((v for v in (camera_view(img, rng) for _ in range(REDRAWS)) if accept(v)), None)
        if view is None:
            continue
        dest = link.with_name(f"{link.stem}-seen.png")
        cv2.imwrite(str(dest), view)
        link.unlink()
        out.append(dest)
    return out
