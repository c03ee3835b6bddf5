"""Face tracking across frames: greedy IoU association with a centroid fallback.

A track is what the release policy and the privacy accountant protect: one
person walking through the view should be one track, so that the per-track
limits bound what is released about them. Association is greedy by IoU
(best pairs first); a detection that overlaps no track may still join the
nearest track whose centre is within ``max_distance`` box widths (fast
movement at a low frame rate). Tracks unseen for ``max_age_s`` end.

Association compares each detection with where the track's face is going (its
smoothed velocity): a walker at 15 frames/s moves about half a face a frame, so
comparing with where it was splits every brisk walker into several tracks.

A track must never hold two people: its releases are one appearance's and its
budget one person's. Measured on scenes with ground truth, greedy association
on positions alone put two people in one track in about one pass of three: a
near face swallowing a far one as they cross, a person entering where another
left. So a detection continues a track only if the two boxes' heights are within
``max_size_ratio`` of each other, and a track whose last box touched the frame's
edge is continued only by overlap, never by the centroid fallback (its person
may have left, and the next to enter there is someone else). Geometry alone
does not rule out a merge where two people of one size cross: docs/CAMERAS.md
gives what remains.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from dataclasses import dataclass, field

from peep.core.imaging import FaceBox


@dataclass
class Track:
    """One face followed over time (timestamps are the frame source's seconds)."""

    id: str
    box: FaceBox
    first_seen: float
    last_seen: float
    hits: int = 1
    releases: deque[float] = field(default_factory=deque)
    exhausted: bool = False
    #: Pixels per second of the box's centre, smoothed: where the face will be, for association.
    velocity: tuple[float, float] = (0.0, 0.0)

    def predicted(self, t: float) -> FaceBox:
        """The box moved on at :attr:`velocity` to time ``t``."""
        dt = max(0.0, t - self.last_seen)
        return FaceBox(
            x=self.box.x + self.velocity[0] * dt,
            y=self.box.y + self.velocity[1] * dt,
            w=self.box.w,
            h=self.box.h,
            score=self.box.score,
        )


class Tracker:
    """Associate detections with tracks.

    Parameters
    ----------
    iou_threshold : float
        Minimum IoU for a detection to continue a track.
    max_distance : float
        Centroid fallback: maximum centre distance in units of the track's box width.
    max_age_s : float
        A track unseen for longer ends.
    max_size_ratio : float
        A detection continues a track only if the taller of the two boxes is at most this many times the
        shorter.
    id_prefix : str
        Track ids are ``<id_prefix>-<80 random bits in hex>``: each track's id is drawn
        afresh, so an id names one appearance and nothing links it to the device's other
        tracks (no counter, no start time), and track keys in the persistent ledger are
        never reused, across restarts too.
    """

    def __init__(
        self,
        *,
        iou_threshold: float = 0.3,
        max_distance: float = 0.6,
        max_age_s: float = 1.0,
        max_size_ratio: float = 1.5,
        id_prefix: str = "t",
    ) -> None:
        if not 0.0 < iou_threshold < 1.0:
            raise ValueError(f"iou_threshold: expected 0 < value < 1, received {iou_threshold}")
        if max_distance < 0 or max_age_s <= 0:
            raise ValueError(f"max_distance/max_age_s: expected >= 0 and > 0, received {max_distance}, {max_age_s}")
        if not max_size_ratio > 1.0:
            raise ValueError(f"max_size_ratio: expected a value > 1, received {max_size_ratio}")
        self.max_size_ratio = max_size_ratio
        self.iou_threshold = iou_threshold
        self.max_distance = max_distance
        self.max_age_s = max_age_s
        self.id_prefix = id_prefix
        self.tracks: dict[str, Track] = {}

    def _alike(self, a: FaceBox, b: FaceBox) -> bool:
        # heights: a turning head narrows its box, it does not shorten it
        ha, hb = max(a.h, 1e-6), max(b.h, 1e-6)
        return max(ha / hb, hb / ha) <= self.max_size_ratio

    def update(self, boxes: list[FaceBox], t: float, frame_shape: tuple[int, ...] | None = None) -> list[Track]:
        """Assign this frame's ``boxes`` (timestamp ``t``) to tracks.

        Parameters
        ----------
        boxes : list of FaceBox
        t : float
            The frame's timestamp, seconds.
        frame_shape : tuple, optional
            The frame's (height, width, ...): with it, a track that touched the frame's edge is not continued
            by the centroid fallback.

        Returns
        -------
        list of Track
            The tracks seen in this frame, one per box, in the order of ``boxes``.
        """
        for tid in [tid for tid, tr in self.tracks.items() if t - tr.last_seen > self.max_age_s]:
            del self.tracks[tid]
        live = list(self.tracks.values())
        assigned: dict[int, Track] = {}
        used: set[str] = set()
        # Against where each face is going: a walker at 15 frames/s moves half a face a frame.
        ahead = {tr.id: tr.predicted(t) for tr in live}
        ious = {(i, tr.id): b.iou(ahead[tr.id]) for i, b in enumerate(boxes) for tr in live}
        pairs = sorted(
            ((ious[(i, tr.id)], i, tr) for i, b in enumerate(boxes) for tr in live),
            key=lambda p: p[0],
            reverse=True,
        )
        for iou, i, tr in pairs:
            if iou < self.iou_threshold:
                break
            if i in assigned or tr.id in used or not self._alike(boxes[i], tr.box):
                continue
            assigned[i] = tr
            used.add(tr.id)
        for i, b in enumerate(boxes):
            if i in assigned:
                continue
            best: Track | None = None
            best_d = math.inf
            for tr in live:
                if tr.id in used or not self._alike(b, tr.box) or _at_edge(tr.box, frame_shape):
                    continue
                d = math.dist(b.center, ahead[tr.id].center) / max(tr.box.w, 1.0)
                # a track seen once has no velocity yet: a walker moves about half a face a frame
                reach = self.max_distance * (2.0 if tr.hits == 1 else 1.0)
                if d <= reach and d < best_d:
                    best, best_d = tr, d
            if best is not None:
                assigned[i] = best
                used.add(best.id)
        out: list[Track] = []
        for i, b in enumerate(boxes):
            found = assigned.get(i)
            if found is None:
                tr = self._new(b, t)
            else:
                tr = found
                dt = t - tr.last_seen
                if dt > 0:
                    (ox, oy), (nx, ny) = tr.box.center, b.center
                    vx, vy = (nx - ox) / dt, (ny - oy) / dt
                    # the first step sets it; then an average that follows a turn in a few frames
                    a = 1.0 if tr.hits == 1 else 0.5
                    tr.velocity = (a * vx + (1 - a) * tr.velocity[0], a * vy + (1 - a) * tr.velocity[1])
                tr.box = b
                tr.last_seen = t
                tr.hits += 1
            out.append(tr)
        return out

    def _new(self, box: FaceBox, t: float) -> Track:
        tr = Track(id=f"{self.id_prefix}-{secrets.token_hex(10)}", box=box, first_seen=t, last_seen=t)
        self.tracks[tr.id] = tr
        return tr


def _at_edge(box: FaceBox, frame_shape: tuple[int, ...] | None, margin: float = 2.0) -> bool:
    """Whether ``box`` touches the frame's edge (never, without the frame's shape)."""
    if frame_shape is None:
        return False
    h, w = frame_shape[0], frame_shape[1]
    return box.x <= margin or box.y <= margin or box.x + box.w >= w - margin or box.y + box.h >= h - margin
