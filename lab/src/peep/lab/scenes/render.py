"""Render a scene: people on paths through a synthetic room, entrance or street, with per-frame ground truth.

What is real and what is drawn
------------------------------
Each person is real: their head, hair, shoulders and the photo's own surroundings come from one of their
LFW photos (funneled, 250x250), cut out with a soft head-and-shoulders mask and set on a drawn torso;
the face is never isolated in an oval. The places are drawn (no photo of a room, an entrance or a street
is available offline here): a perspective floor, walls, doors, windows, shelves, facades and posts with
low-frequency texture, so that a detector meets edges, grids and bright windows rather than a flat grey.
The camera is simulated: a slow gain drift and a light switched once, colour cast, sensor noise (shot
and read noise), motion blur along each person's motion, and H.264 at a camera's bitrate (libx264 through
PyAV, the encoder a camera's own chip stands in for).

The ground truth
----------------
A face's box is the region scikit-learn's LFW loader crops as "the face" (rows 70-195, columns 78-172 of
the funneled photo: eyebrows to chin, ear to ear), carried through the person's scale, turn and position;
``height_px`` is that box's height. ``visible`` is the share of the box not covered by a nearer person or a
fixture. ``<name>.gt.jsonl`` has one line per frame; ``<name>.json`` the scene, the people and their passes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
from numpy.typing import NDArray

Setting = Literal["room", "entrance", "street"]
SETTINGS: tuple[Setting, ...] = ("room", "entrance", "street")
#: The face box in a funneled LFW photo (x0, y0, x1, y1): scikit-learn's ``fetch_lfw_people`` crop.
LFW_FACE_BOX = (78, 70, 172, 195)
_PHOTO = 250
#: Walking speed in face heights per second (1.4 m/s over a 0.2 m face box, slower at doors).
WALK_SPEED_FACES_PER_S = (2.5, 7.0)

Image = NDArray[np.uint8]


@dataclass(frozen=True)
class ScenePerson:
    """Someone who may walk through: an identity, a role, their LFW photos."""

    name: str
    role: str
    photos: tuple[str, ...]


@dataclass(frozen=True)
class SceneSpec:
    """What to render.

    Attributes
    ----------
    width, height : int
        Frame size (640x480 or 1280x720 for a camera's sub- and main stream).
    fps : float
        Frames per second (a camera's 10-15 for analytics).
    seconds : float
        Length.
    setting : {"room", "entrance", "street"}
    max_people : int
        People at once, at most (1-4).
    face_px : (int, int)
        Face-box heights a pass draws from (each pass draws its start and end heights in this range).
    bitrate : int
        H.264 bits per second (about 1 Mbit/s for 640x480, 2-4 for 1280x720).
    noise : float
        Read noise, standard deviation in grey levels (shot noise is added in proportion to the signal).
    seed : int
    """

    width: int = 640
    height: int = 480
    fps: float = 15.0
    seconds: float = 20.0
    setting: Setting = "room"
    max_people: int = 3
    face_px: tuple[int, int] = (30, 160)
    bitrate: int = 1_000_000
    noise: float = 3.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (32 <= self.width <= 3840 and 32 <= self.height <= 2160, "width, height", "32-3840 x 32-2160"),
            (1.0 <= self.fps <= 60.0, "fps", "1-60"),
            (1.0 <= self.seconds <= 3600.0, "seconds", "1-3600"),
            (self.setting in SETTINGS, "setting", " or ".join(SETTINGS)),
            (1 <= self.max_people <= 4, "max_people", "1-4"),
            (8 <= self.face_px[0] <= self.face_px[1] <= self.height, "face_px", "8 <= low <= high <= height"),
            (10_000 <= self.bitrate <= 50_000_000, "bitrate", "10,000-50,000,000 bits/s"),
            (0.0 <= self.noise <= 50.0, "noise", "0-50"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(f"{name}: expected {expected}, received {getattr(self, name.split(',')[0])!r}")

    @property
    def n_frames(self) -> int:
        return round(self.seconds * self.fps)


@dataclass
class Pass:
    """One person crossing the scene once: a track of the ground truth."""

    track: int
    name: str
    role: str
    photo: str
    first_frame: int
    last_frame: int
    x: tuple[float, float]
    face_h: tuple[float, float]
    yaw: tuple[float, float]
    depth_order: float = 0.0
    faces: int = 0
    min_face_px: float = field(default=float("inf"))
    max_face_px: float = 0.0


# --------------------------------------------------------------------------- places


def _texture(rng: np.random.Generator, h: int, w: int, scale: int, amp: float) -> NDArray[np.float32]:
    """Low-frequency noise in [-amp, amp]: plaster, wood, asphalt."""
    small = rng.standard_normal((max(2, h // scale), max(2, w // scale))).astype(np.float32)
    return np.asarray(cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC), np.float32) * amp


def _background(spec: SceneSpec, rng: np.random.Generator) -> tuple[NDArray[np.float32], list[tuple[int, ...]], int]:
    """(BGR float image, fixtures in front of people as (x0, y0, x1, y1, B, G, R), the horizon row)."""
    w, h = spec.width, spec.height
    horizon = int(h * rng.uniform(0.30, 0.42))
    img = np.zeros((h, w, 3), np.float32)
    # walls and floors of the colours buildings have: greys, beiges, a tint at most
    wall = rng.uniform(150, 215) * rng.uniform(0.9, 1.05, 3)
    floor = rng.uniform(70, 140) * rng.uniform(0.85, 1.1, 3)
    fixtures: list[tuple[int, ...]] = []
    if spec.setting == "street":
        sky = np.linspace(1.0, 0.75, horizon)[:, None] * rng.uniform(190, 250, 3)[None, :]
        img[:horizon] = sky[:, None, :]
        # facades with window grids, then pavement
        x = 0
        while x < w:
            bw = int(rng.uniform(0.2, 0.45) * w)
            top = int(rng.uniform(0.02, 0.25) * h)
            col = rng.uniform(90, 190) * rng.uniform(0.85, 1.1, 3)
            img[top : int(horizon * 1.15), x : x + bw] = col
            for wy in range(top + 12, int(horizon * 1.1) - 20, int(rng.uniform(28, 44))):
                for wx in range(x + 8, x + bw - 18, int(rng.uniform(26, 40))):
                    img[wy : wy + 16, wx : wx + 12] = rng.uniform(30, 200) * rng.uniform(0.9, 1.1, 3)
            x += bw
        img[int(horizon * 1.15) :] = floor * 0.8
        px = int(rng.uniform(0.55, 0.9) * w)
        fixtures.append((px, int(0.05 * h), px + max(6, w // 60), h, 40, 40, 45))  # a lamp post
    else:
        img[:] = wall
        img[horizon:] = floor
        # the floor's perspective lines and the skirting
        for i in range(-8, 9):
            x_far = w / 2 + i * w / 16
            x_near = w / 2 + i * w / 3
            cv2.line(img, (int(x_far), horizon), (int(x_near), h), tuple(float(c) * 0.85 for c in floor), 2)
        img[horizon - 4 : horizon + 2] = wall * 0.6
        if spec.setting == "entrance":
            # glass doors, bright behind, framed
            dx0, dx1 = int(w * rng.uniform(0.3, 0.4)), int(w * rng.uniform(0.6, 0.7))
            img[int(h * 0.05) : horizon, dx0:dx1] = rng.uniform(200, 250, 3)
            for xx in (dx0, (dx0 + dx1) // 2, dx1):
                img[int(h * 0.05) : horizon, xx - 3 : xx + 3] = 50
            img[horizon : horizon + int(h * 0.12), dx0 - 20 : dx1 + 20] = rng.uniform(30, 70, 3)  # a mat
            fixtures.append((0, int(h * 0.55), int(w * 0.12), h, 90, 90, 100))  # a reception counter edge
        else:
            # a door, a window, a shelf with boxes, a picture
            d0 = int(w * rng.uniform(0.05, 0.6))
            img[int(horizon * 0.25) : horizon, d0 : d0 + int(w * 0.12)] = rng.uniform(60, 140, 3)
            w0 = int(w * rng.uniform(0.2, 0.8))
            img[int(horizon * 0.15) : int(horizon * 0.7), w0 : w0 + int(w * 0.18)] = rng.uniform(210, 255, 3)
            s0 = int(w * rng.uniform(0.0, 0.75))
            for k in range(3):
                y = int(horizon * (0.3 + 0.22 * k))
                img[y : y + 4, s0 : s0 + int(w * 0.22)] = 60
                for bx in range(s0 + 4, s0 + int(w * 0.22) - 12, 14):
                    img[y - int(rng.uniform(8, 22)) : y, bx : bx + 10] = rng.uniform(40, 200) * rng.uniform(0.8, 1.2, 3)
            if rng.random() < 0.7:
                fx = int(w * rng.uniform(0.0, 0.85))
                fixtures.append((fx, int(h * 0.6), fx + int(w * 0.15), h, 110, 80, 60))  # a desk's end
    img += _texture(rng, h, w, 24, 5.0)[:, :, None] + _texture(rng, h, w, 4, 2.0)[:, :, None]
    return np.clip(img, 0, 255), fixtures, horizon


# --------------------------------------------------------------------------- people


def _sprite(photo: Image, rng: np.random.Generator) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """(BGR float, alpha) of a person: the photo's head, shoulders and near surroundings on a drawn torso.

    The sprite's frame is the photo's, extended downwards by a torso; coordinates of :data:`LFW_FACE_BOX`
    stay valid in it.
    """
    extra = int(_PHOTO * 1.6)
    img = np.zeros((_PHOTO + extra, _PHOTO, 3), np.float32)
    img[:_PHOTO] = photo
    alpha = np.zeros(img.shape[:2], np.float32)
    cx = (LFW_FACE_BOX[0] + LFW_FACE_BOX[2]) / 2
    fw = LFW_FACE_BOX[2] - LFW_FACE_BOX[0]
    # head and hair with a margin of the photo's own surroundings, then the shoulders; kept narrow, because
    # LFW photos often hold another face beside the subject's (press photos), which the ground truth would
    # not know of
    cv2.ellipse(alpha, (int(cx), 120), (int(fw * 0.68), 104), 0, 0, 360, 1.0, -1)
    cv2.ellipse(alpha, (int(cx), _PHOTO + 30), (int(fw * 1.1), 90), 0, 180, 360, 1.0, -1)
    # the torso below the photo: clothing of the photo's own colour at the shoulders, darker further down
    shoulder = photo[-12:, int(cx - fw) : int(cx + fw)].reshape(-1, 3).mean(axis=0)
    torso_w = int(fw * 1.1)
    img[_PHOTO - 20 :, int(cx) - torso_w : int(cx) + torso_w] = shoulder * rng.uniform(0.7, 1.0)
    img[_PHOTO - 20 :] += _texture(rng, extra + 20, _PHOTO, 16, 6.0)[:, :, None]
    alpha[_PHOTO - 20 :, int(cx) - torso_w : int(cx) + torso_w] = 1.0
    alpha = np.asarray(cv2.GaussianBlur(alpha, (0, 0), 6.0), np.float32)
    return np.clip(img, 0, 255), alpha


def _place(spec: SceneSpec, p: Pass, t: float, horizon: int) -> tuple[float, float, float, float]:
    """(face centre x, face centre y, face height, yaw) of pass ``p`` at its fraction ``t`` in [0, 1]."""
    fh = p.face_h[0] + (p.face_h[1] - p.face_h[0]) * t
    x = p.x[0] + (p.x[1] - p.x[0]) * t
    # A camera above head height: nearer faces (larger) sit lower in the frame.
    y = horizon - 0.05 * spec.height + 0.9 * fh + 0.015 * spec.height * np.sin(12.0 * t)
    yaw = p.yaw[0] + (p.yaw[1] - p.yaw[0]) * t
    return float(x), float(y), float(fh), float(yaw)


def _plan(
    spec: SceneSpec, people: Sequence[ScenePerson], rng: np.random.Generator, *, each_once: bool = False
) -> list[Pass]:
    """Passes through the scene: people enter while fewer than ``max_people`` are in view.

    ``each_once``: each of ``people`` walks through once, in order, with their first photo, however long that
    takes (``spec.seconds`` is then ignored); otherwise people are drawn at random until ``spec.seconds``.
    """
    lo, hi = spec.face_px
    passes: list[Pass] = []
    active_until: list[int] = []
    frame, track = 0, 1
    n = spec.n_frames
    queue = list(people)
    while (frame < n) if not each_once else bool(queue):
        active_until = [e for e in active_until if e > frame]
        if len(active_until) < spec.max_people and rng.random() < 0.5:
            person = queue.pop(0) if each_once else people[int(rng.integers(len(people)))]
            kind = rng.choice(["cross", "approach", "leave"], p=[0.5, 0.3, 0.2])
            h0 = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            if kind == "cross":
                h1 = h0 * rng.uniform(0.85, 1.2)
                x0, x1 = (-0.15 * spec.width, 1.15 * spec.width)
                if rng.random() < 0.5:
                    x0, x1 = x1, x0
            elif kind == "approach":
                h1 = min(hi, h0 * rng.uniform(1.6, 3.0))
                x0 = rng.uniform(0.2, 0.8) * spec.width
                x1 = x0 + rng.uniform(-0.3, 0.3) * spec.width
            else:
                h1 = max(lo, h0 / rng.uniform(1.6, 3.0))
                x0 = rng.uniform(0.2, 0.8) * spec.width
                x1 = x0 + rng.uniform(-0.3, 0.3) * spec.width
            hmean = (h0 + h1) / 2
            dist = abs(x1 - x0) + abs(h1 - h0) * 4.0
            speed = rng.uniform(*WALK_SPEED_FACES_PER_S) * hmean
            frames = int(np.clip(dist / speed * spec.fps, spec.fps * 1.5, spec.fps * 12))
            yaw0 = rng.uniform(-35, 35)
            passes.append(
                Pass(
                    track=track,
                    name=person.name,
                    role=person.role,
                    photo=str(person.photos[0] if each_once else person.photos[int(rng.integers(len(person.photos)))]),
                    first_frame=frame,
                    # may lie past the video's end: a pass still under way then is cut off, not hurried
                    last_frame=frame + frames,
                    x=(float(x0), float(x1)),
                    face_h=(h0, float(h1)),
                    yaw=(float(yaw0), float(yaw0 + rng.uniform(-25, 25))),
                )
            )
            active_until.append(frame + frames)
            track += 1
            frame += int(rng.integers(1, max(2, int(spec.fps))))
        else:
            frame += int(rng.integers(1, max(2, int(spec.fps // 2))))
    return passes


# --------------------------------------------------------------------------- the camera


def _encoder(path: Path, spec: SceneSpec) -> tuple[Any, Any]:
    try:
        import av
    except ImportError as exc:  # a lab dependency: name its install
        raise RuntimeError(
            "scenes need PyAV for H.264, a peep-lab dependency: reinstall it (pip install ./lab)"
        ) from exc
    container = av.open(str(path), "w")
    stream = container.add_stream("libx264", rate=round(spec.fps))
    stream.width, stream.height = spec.width, spec.height
    stream.pix_fmt = "yuv420p"
    stream.bit_rate = spec.bitrate
    stream.options = {"preset": "veryfast", "g": str(int(2 * spec.fps)), "bf": "0"}
    return container, stream


def render_scene(
    spec: SceneSpec,
    people: Sequence[ScenePerson],
    out: str | Path,
    name: str = "scene",
    progress: Callable[[int, int], None] | None = None,
    each_once: bool = False,
) -> dict[str, Any]:
    """Render ``spec`` with ``people`` into ``out/<name>.mp4``, ``<name>.gt.jsonl`` and ``<name>.json``.

    Parameters
    ----------
    spec : SceneSpec
    people : sequence of ScenePerson
        Who may walk through (each pass picks one, and one of their photos).
    each_once : bool
        Each person walks through once, in order, with their first photo; the scene lasts until the last has
        left (``spec.seconds`` is ignored): a demo camera's people, each dealt to it once.
    out : path
        Folder (created).
    progress : callable, optional
        ``progress(frames done, frames)``.

    Returns
    -------
    dict
        The scene description written to ``<name>.json``.
    """
    if not people:
        raise ValueError("people: expected at least one person, received none")
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7_001]))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    background, fixtures, horizon = _background(spec, rng)
    passes = _plan(spec, people, rng, each_once=each_once)
    n_frames = spec.n_frames if not each_once else max(p.last_frame for p in passes) + 1
    sprites: dict[int, tuple[NDArray[np.float32], NDArray[np.float32]]] = {}
    for p in passes:
        photo = cv2.imread(p.photo, cv2.IMREAD_COLOR)
        if photo is None or photo.shape[:2] != (_PHOTO, _PHOTO):
            raise ValueError(f"people: expected funneled 250x250 LFW photos, {p.photo!r} is not one")
        sprites[p.track] = _sprite(photo, rng)
        p.depth_order = float(rng.random())
    cast = rng.uniform(0.9, 1.1, 3).astype(np.float32)
    switch_at = int(rng.integers(n_frames // 4, max(n_frames // 4 + 1, 3 * n_frames // 4)))
    switch_gain = float(rng.uniform(0.6, 0.85))
    container, stream = _encoder(folder / f"{name}.mp4", spec)
    gt_lines: list[str] = []
    fixture_mask = np.zeros((spec.height, spec.width), np.float32)
    for x0, y0, x1, y1, *_ in fixtures:
        fixture_mask[y0:y1, x0:x1] = 1.0
    try:
        import av

        for f in range(n_frames):
            frame = background.copy()
            in_view = [p for p in passes if p.first_frame <= f <= p.last_frame]
            placed = []
            for p in in_view:
                t = (f - p.first_frame) / max(1, p.last_frame - p.first_frame)
                placed.append((p, *_place(spec, p, t, horizon)))
            placed.sort(key=lambda r: (r[3], r[0].depth_order))  # farther (smaller) faces first
            faces: list[tuple[Pass, tuple[float, float, float, float]]] = []
            covers: list[tuple[int, int, NDArray[np.float32]] | None] = []
            for p, fx, fy, fh, yaw in placed:
                box, cover = _draw(frame, sprites[p.track], fx, fy, fh, yaw, p)
                faces.append((p, box))
                covers.append(cover)
            # visibility: the share of each face box not covered by people drawn after it, or by fixtures
            records = []
            for i, (p, box) in enumerate(faces):
                visible = _visible(box, [c for c in covers[i + 1 :] if c is not None], fixture_mask)
                if visible < 0.001:  # wholly hidden or outside: not in this frame
                    continue
                bx, by, bw, bh = box
                records.append(
                    {
                        "track": p.track,
                        "identity": p.name,
                        "role": p.role,
                        "box": [round(bx, 1), round(by, 1), round(bw, 1), round(bh, 1)],
                        "height_px": round(bh, 1),
                        "visible": round(visible, 3),
                    }
                )
                if visible >= 0.5:
                    p.faces += 1
                    p.min_face_px = min(p.min_face_px, bh)
                    p.max_face_px = max(p.max_face_px, bh)
            for x0, y0, x1, y1, b, g, r in fixtures:
                frame[y0:y1, x0:x1] = (b, g, r)
            gain = (1.0 + 0.12 * np.sin(2 * np.pi * f / (spec.fps * 9.0))) * (switch_gain if f >= switch_at else 1.0)
            frame = frame * cast * gain
            shot = (
                rng.standard_normal(frame.shape[:2]).astype(np.float32)[:, :, None]
                * np.sqrt(np.clip(frame, 0, None) / 255.0)
                * 4.0
            )
            frame = frame + shot + rng.standard_normal(frame.shape).astype(np.float32) * spec.noise
            bgr = np.clip(frame, 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(bgr, format="bgr24")):
                container.mux(packet)
            gt_lines.append(json.dumps({"frame": f, "t": round(f / spec.fps, 4), "faces": records}))
            if progress is not None:
                progress(f + 1, n_frames)
        for packet in stream.encode():
            container.mux(packet)
    finally:
        container.close()
    (folder / f"{name}.gt.jsonl").write_text("\n".join(gt_lines) + "\n")
    description = {
        "spec": asdict(spec),
        "frames": n_frames,
        "video": f"{name}.mp4",
        "ground_truth": f"{name}.gt.jsonl",
        "face_box": "scikit-learn's LFW face crop (rows 70-195, columns 78-172 of the funneled photo), scaled, "
        "turned and placed with the person; height_px is its height",
        "people": [{"name": q.name, "role": q.role} for q in people],
        "passes": [
            {
                **{k: v for k, v in asdict(p).items() if k not in ("depth_order", "min_face_px")},
                "min_face_px": None if p.faces == 0 else round(p.min_face_px, 1),
                "max_face_px": round(p.max_face_px, 1),
                "photo": Path(p.photo).name,
            }
            for p in passes
        ],
        "fixtures": len(fixtures),
        "light_switch_frame": switch_at,
    }
    (folder / f"{name}.json").write_text(json.dumps(description, indent=2) + "\n")
    return description


def _draw(
    frame: NDArray[np.float32],
    sprite: tuple[NDArray[np.float32], NDArray[np.float32]],
    fx: float,
    fy: float,
    fh: float,
    yaw: float,
    p: Pass,
) -> tuple[tuple[float, float, float, float], tuple[int, int, NDArray[np.float32]] | None]:
    """Composite one person so that their face box is ``fh`` high centred at (fx, fy).

    Returns the face box and where the person covers the frame: (x0, y0, alpha of that region), None when
    the person is wholly outside.
    """
    img, alpha = sprite
    box_h = LFW_FACE_BOX[3] - LFW_FACE_BOX[1]
    s = fh / box_h
    sx = s * float(np.cos(np.radians(yaw)))  # a turn narrows the head (a frontal photo can do no more)
    cxs = (LFW_FACE_BOX[0] + LFW_FACE_BOX[2]) / 2
    cys = (LFW_FACE_BOX[1] + LFW_FACE_BOX[3]) / 2
    bw = (LFW_FACE_BOX[2] - LFW_FACE_BOX[0]) * sx
    box = (fx - bw / 2, fy - fh / 2, bw, fh)
    H, W = frame.shape[:2]
    h, w = img.shape[:2]
    # the sprite's corners in the frame, then only that region is warped and blended
    x0 = max(0, int(np.floor(fx - sx * cxs)) - 1)
    y0 = max(0, int(np.floor(fy - s * cys)) - 1)
    x1 = min(W, int(np.ceil(fx + sx * (w - cxs))) + 1)
    y1 = min(H, int(np.ceil(fy + s * (h - cys))) + 1)
    if x1 - x0 < 2 or y1 - y0 < 2:
        return box, None
    M = np.array([[sx, 0.0, fx - sx * cxs - x0], [0.0, s, fy - s * cys - y0]], np.float32)
    size = (x1 - x0, y1 - y0)
    warped = cv2.warpAffine(img, M, size, flags=cv2.INTER_AREA, borderValue=(0, 0, 0))
    a = cv2.warpAffine(alpha, M, size, flags=cv2.INTER_LINEAR, borderValue=0)
    # motion blur along the motion: a quarter of a frame's interval of exposure
    vx = (p.x[1] - p.x[0]) / max(1, p.last_frame - p.first_frame)
    length = int(abs(vx) * 0.25)
    if length >= 2:
        k = np.full((1, length), 1.0 / length, np.float32)
        warped = cv2.filter2D(warped, -1, k)
        a = cv2.filter2D(a, -1, k)
    a = np.asarray(a, np.float32)
    region = frame[y0:y1, x0:x1]
    region *= 1.0 - a[:, :, None]
    region += warped * a[:, :, None]
    return box, (x0, y0, a)


def _visible(box: tuple[float, float, float, float], covers: Sequence[tuple[int, int, NDArray[np.float32]]],
             fixture_mask: NDArray[np.float32]) -> float:  # fmt: skip
    """The share of ``box`` inside the frame and covered by neither a later-drawn person nor a fixture."""
    H, W = fixture_mask.shape
    bx, by, bw, bh = box
    x0, y0 = max(0, int(bx)), max(0, int(by))
    x1, y1 = min(W, int(bx + bw)), min(H, int(by + bh))
    if x1 <= x0 or y1 <= y0 or bw <= 0 or bh <= 0:
        return 0.0
    cover = fixture_mask[y0:y1, x0:x1].copy()
    for cx0, cy0, a in covers:
        ox0, oy0 = max(x0, cx0), max(y0, cy0)
        ox1, oy1 = min(x1, cx0 + a.shape[1]), min(y1, cy0 + a.shape[0])
        if ox1 > ox0 and oy1 > oy0:
            sub = cover[oy0 - y0 : oy1 - y0, ox0 - x0 : ox1 - x0]
            np.maximum(sub, a[oy0 - cy0 : oy1 - cy0, ox0 - cx0 : ox1 - cx0], out=sub)
    inside = min(1.0, (x1 - x0) * (y1 - y0) / (bw * bh))
    return float(inside * (1.0 - cover.mean()))


def lfw_people(data_home: str | None, names: Sequence[str], role: str, max_photos: int = 20) -> list[ScenePerson]:
    """``ScenePerson`` entries for LFW identities (folder names, ``_`` or spaces), their photos in file order."""
    from peep.server.datasets import ensure_lfw

    root = ensure_lfw(data_home)
    out = []
    for n in names:
        folder = root / n.replace(" ", "_")
        photos = tuple(str(p) for p in sorted(folder.glob("*.jpg"))[:max_photos])
        if not photos:
            raise ValueError(f"people: {n!r} has no photo under {root}")
        out.append(ScenePerson(name=n.replace("_", " "), role=role, photos=photos))
    return out


def read_ground_truth(path: str | Path) -> list[dict[str, Any]]:
    """The frames of a ``<name>.gt.jsonl`` file, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
