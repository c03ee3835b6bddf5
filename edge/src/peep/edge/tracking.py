"""Face tracking across frames: greedy IoU association with a centroid fallback.

A track is what the release policy and the privacy accountant protect: one
person walking through the view should be one track, so that the per-track
limits bound what is released about them. Association is greedy by IoU
(best pairs first); a detection that overlaps no track may still join the
nearest track whose centre is within ``max_distance`` box widths (fast
movement at a low frame rate). Tracks unseen for ``max_age_s`` end.
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
        id_prefix: str = "t",
    ) -> None:
        if not 0.0 < iou_threshold < 1.0:
            raise ValueError(f"iou_threshold: expected 0 < value < 1, received {iou_threshold}")
        if max_distance < 0 or max_age_s <= 0:
            raise ValueError(f"max_distance/max_age_s: expected >= 0 and > 0, received {max_distance}, {max_age_s}")
        self.iou_threshold = iou_threshold
        self.max_distance = max_distance
        self.max_age_s = max_age_s
        self.id_prefix = id_prefix
        self.tracks: dict[str, Track] = {}

    def update(self, boxes: list[FaceBox], t: float) -> list[Track]:
        """Assign this frame's ``boxes`` (timestamp ``t``) to tracks.

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
        pairs = sorted(
            ((b.iou(tr.box), i, tr) for i, b in enumerate(boxes) for tr in live),
            key=lambda p: p[0],
            reverse=True,
        )
        for iou, i, tr in pairs:
            if iou < self.iou_threshold:
                break
            if i in assigned or tr.id in used:
                continue
            assigned[i] = tr
            used.add(tr.id)
        for i, b in enumerate(boxes):
            if i in assigned:
                continue
            best: Track | None = None
            best_d = math.inf
            for tr in live:
                if tr.id in used:
                    continue
                d = math.dist(b.center, tr.box.center) / max(tr.box.w, 1.0)
                if d <= self.max_distance and d < best_d:
                    best, best_d = tr, d
            if best is not None:
                assigned[i] = best
                used.add(best.id)
        out: list[Track] = []
        for i, b in enumerate(boxes):
            found = assigned.get(i)
            if found is None:
                tr = Track(id=f"{self.id_prefix}-{secrets.token_hex(10)}", box=b, first_seen=t, last_seen=t)
                self.tracks[tr.id] = tr
            else:
                tr = found
                tr.box = b
                tr.last_seen = t
                tr.hits += 1
            out.append(tr)
        return out
