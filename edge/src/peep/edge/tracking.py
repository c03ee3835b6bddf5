"""Face tracking across frames: predicted boxes, one exact assignment, and faces compared where positions are unsure.

A track is what the release policy and the privacy accountant protect: one
person walking through the view should be one track, so that the per-track
limits bound what is released about them; and a track must never hold two
people, since its releases are one appearance's and its budget one person's.

Geometry first. Each detection is compared with where each track's face is
going (its smoothed velocity: a walker at 15 frames/s moves about half a face a
frame, so comparing with where it was splits every brisk walker into several
tracks). A pair is possible when the boxes overlap (IoU at least
``iou_threshold``) or, failing that, their centres lie within ``max_distance``
box widths; and only if the two boxes' heights are within ``max_size_ratio``
(a near face does not take over a far one's track), and a track leaving through
the frame's edge is continued only by overlap (the next to enter there is
someone else). The possible pairs are split into groups that share a detection
or a track, and each group is solved exactly (the most pairs, then the least
cost), not greedily.

Faces where geometry is unsure. Measured on scenes with ground truth,
positions alone put two people in one track where two of one size cross or a
near face steps in front of a far one. Given an ``appearance`` function (the
device's face descriptor, computed only when asked), the tracker keeps a few
views of each track's face and compares a detection with their mean where a
group is unsure (a detection two tracks could take, a track two detections
could, an overlap poorer than a followed face's), at a young track's first
frames, every ``refresh_s``, and at once after faces it could not compare (cut
by the frame's edge): a pair further apart than ``max_appearance`` is refused,
or than :data:`YOUNG_APPEARANCE` while the track has fewer than :data:`SETTLED`
views: one wrong view moves the mean of so few far enough that the wrong face
passes the next frame too, and the track is then two people's (a face stepping
in front of a track five frames old lay 0.58 from its three views, then 0.44).
A detection that continues no live track may resume a track ended less than
``reid_s`` ago whose face is within ``reid_appearance`` (the same person seen
again after being hidden). A box whose height steps by more than
:data:`SIZE_JUMP` from its track's is compared too, however well they overlap.

Holding a face out rather than splitting a pass. Where faces are compared, a
face cut by the frame's edge continues no track that has views to compare it
with, and a face refused by the one track it could continue (that track having
no other face in the frame) is held for up to ``hold_s`` before it starts its
own: a face half covered or turning moves its descriptor for a few frames. Two
more faces are held so, for up to ``hold_s``, rather than start a track: one
that a followed face's box about as tall or taller overlaps (covered by a nearer
face, its descriptor mixes the two: a poor first view for a track to be compared
with, and a release of no one face); and one beyond ``reid_appearance`` but
within ``max_appearance`` of a track lost less than ``max_age_s`` ago where a
nearer face was (coming out from behind it, half covered for a frame or two, it
resumes that track once wholly in view; a track of its own splits the pass). A
held face is returned as a :class:`Track` of that frame only (``held``), kept
nowhere and never a clear view. A track's :attr:`Track.clear_view` says whether
this frame's face may be released: inside the frame and, where faces are
compared, found to be the track's own. The views stay in the device's memory and
are forgotten with the track.

What remains (docs/CAMERAS.md has the measurement): the descriptor of a small,
blurred, compressed face does not tell every two people apart (two of the
scenes' people lie 0.56 apart on average), so some crossings still swap or
split a pass; and a face entering through the frame's edge beside one the
detector misses may get a box over both as its track's first view, which
neither face is near afterwards: the pass is split.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.imaging import FaceBox

#: Descriptors a track keeps: a face is compared with their mean, so one bad view (a face turning, half covered,
#: blurred) neither splits a track nor lets another face in.
GALLERY = 8
#: A track with fewer views than this is described at each frame: one view (a face half covered as it
#: appeared) is too few to refuse a face by.
YOUNG = 3
#: A track with fewer views than this refuses a face further than :data:`YOUNG_APPEARANCE` from them (rather than
#: ``max_appearance``): one wrong view moves the mean of so few a quarter or more, and the wrong face then passes the
#: next frame too (a face stepping in front of a track five frames old: 0.58 from its three views, 0.44 a frame on).
SETTLED = 4
#: The young track's bar: dlib's descriptors of two people lie mostly beyond it.
YOUNG_APPEARANCE = 0.55
#: A face's box overlapped by a box at least this share of its height is taken as covered by that face (the nearer face
#: is the taller; two of about one size overlap only as one passes behind the other).
COVER_RATIO = 0.9
#: A pair's position cost above which the faces are compared: IoU with the predicted box under 0.6.
FIRM = 0.4
#: A pair whose box heights differ by more than this ratio is compared too, however well the boxes overlap: on the
#: scenes' ground truth a face's height changes by at most 8.5 % from one frame to the next (99th percentile
#: 5.9 %), so a larger step is most often a nearer face stepping in front of the followed one.
SIZE_JUMP = 1.15
#: Where a face's descriptor comes from: box index in this frame -> vector, or None when it cannot be described.
Appearance = Callable[[int], "NDArray[np.floating[Any]] | None"]


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
    #: The face's last few descriptors (device memory only), and when it was last described.
    gallery: deque[NDArray[np.float64]] = field(default_factory=lambda: deque(maxlen=GALLERY), repr=False)
    described_at: float = -math.inf
    #: Faces have continued the track that were not compared with its views (cut by the frame's edge).
    pending: bool = False
    #: This frame's face lies wholly inside the frame and, where faces are compared, is the track's own: what
    #: may be released or decided.
    clear_view: bool = True
    #: This face is in no track: refused by the one track it could continue, and held out for a moment in case
    #: that is its own face changed (half covered, turning). Such a Track is made for the frame only and kept
    #: nowhere; never released or decided on.
    held: bool = False
    #: When a face this track alone could take was first refused, of the refusals running now (None: none).
    refused_since: float | None = field(default=None, repr=False)
    #: When this track's face first covered a face held out, of the frames in a row it has (None: it does not).
    covering_since: float | None = field(default=None, repr=False)
    #: Unseen since where a face about as near or nearer was: hidden behind it, maybe.
    behind: bool = field(default=False, repr=False)

    @property
    def appearance(self) -> NDArray[np.float64] | None:
        """The most recent descriptor, or None before the face was described."""
        return self.gallery[-1] if self.gallery else None

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
        Minimum IoU for a detection to continue a track by overlap.
    max_distance : float
        Without overlap: maximum centre distance in units of the track's box width.
    max_age_s : float
        A track unseen for longer ends.
    max_size_ratio : float
        A detection continues a track only if the taller of the two boxes is at most this many times the
        shorter.
    max_appearance : float
        With an ``appearance`` function: a detection whose descriptor lies further than this from a track's
        (from a track of few views, :data:`YOUNG_APPEARANCE`) is never that track's (dlib's descriptor: the
        same person is mostly within 0.5, two people mostly beyond 0.55).
    reid_s, reid_appearance : float
        A detection that continues no live track resumes a track ended less than ``reid_s`` ago whose
        descriptor lies within ``reid_appearance`` of its own. ``reid_s`` 0 turns this off.
    refresh_s : float
        A track's descriptor is renewed from its face at most this often when nothing else asks for it.
    hold_s : float
        A face refused by the only track it could continue (its descriptor too far), where that track has no
        other face in the frame, is held out of every track (nothing released) for up to this long before it
        starts a track of its own: a face half covered or turning moves its descriptor for a few frames, and
        starting a track there splits its pass in two, and then in three when the face comes back. As long, a face
        covered by a followed nearer one, or coming out from behind one within ``max_appearance`` of the track lost
        there, is held rather than start a track. 0: never.
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
        max_appearance: float = 0.6,
        reid_s: float = 3.0,
        reid_appearance: float = 0.45,
        refresh_s: float = 0.5,
        hold_s: float = 0.3,
        id_prefix: str = "t",
    ) -> None:
        if not 0.0 < iou_threshold < 1.0:
            raise ValueError(f"iou_threshold: expected 0 < value < 1, received {iou_threshold}")
        if max_distance < 0 or max_age_s <= 0:
            raise ValueError(f"max_distance/max_age_s: expected >= 0 and > 0, received {max_distance}, {max_age_s}")
        if not max_size_ratio > 1.0:
            raise ValueError(f"max_size_ratio: expected a value > 1, received {max_size_ratio}")
        if not 0.0 < reid_appearance <= max_appearance:
            raise ValueError(
                f"reid_appearance: expected 0 < value <= max_appearance ({max_appearance}), received {reid_appearance}"
            )
        if reid_s < 0 or refresh_s <= 0:
            raise ValueError(f"reid_s/refresh_s: expected >= 0 and > 0, received {reid_s}, {refresh_s}")
        if not 0.0 <= hold_s <= max_age_s:
            raise ValueError(f"hold_s: expected 0 <= value <= max_age_s ({max_age_s}), received {hold_s}")
        self.iou_threshold = iou_threshold
        self.max_distance = max_distance
        self.max_age_s = max_age_s
        self.max_size_ratio = max_size_ratio
        self.max_appearance = max_appearance
        self.reid_s = reid_s
        self.reid_appearance = reid_appearance
        self.refresh_s = refresh_s
        self.hold_s = hold_s
        self.id_prefix = id_prefix
        self.tracks: dict[str, Track] = {}
        #: Tracks unseen for longer than ``max_age_s`` that a described face may still resume.
        self.ended: dict[str, Track] = {}
        #: Descriptors computed, for the cost of tracking (one per call of ``appearance``).
        self.described = 0

    # -- pairs -----------------------------------------------------------------------

    def _alike(self, a: FaceBox, b: FaceBox) -> bool:
        # heights: a turning head narrows its box, it does not shorten it
        ha, hb = max(a.h, 1e-6), max(b.h, 1e-6)
        return max(ha / hb, hb / ha) <= self.max_size_ratio

    def _geometry(self, b: FaceBox, tr: Track, ahead: FaceBox, frame_shape: tuple[int, ...] | None) -> float | None:
        """The pair's cost by position (0-1 by overlap, 1-2 by distance), or None when it is not possible."""
        if not self._alike(b, tr.box):
            return None
        iou = b.iou(ahead)
        if iou >= self.iou_threshold:
            return 1.0 - iou
        if _leaving(tr, frame_shape):
            return None
        d = math.dist(b.center, ahead.center) / max(tr.box.w, 1.0)
        # a track seen once has no velocity yet: a walker moves about half a face a frame
        reach = self.max_distance * (2.0 if tr.hits == 1 else 1.0)
        return 1.0 + d / reach if reach > 0 and d <= reach else None

    # -- a frame ---------------------------------------------------------------------

    def update(
        self,
        boxes: Sequence[FaceBox],
        t: float,
        frame_shape: tuple[int, ...] | None = None,
        appearance: Appearance | None = None,
    ) -> list[Track]:
        """Assign this frame's ``boxes`` (timestamp ``t``) to tracks.

        Parameters
        ----------
        boxes : sequence of FaceBox
        t : float
            The frame's timestamp, seconds.
        frame_shape : tuple, optional
            The frame's (height, width, ...): with it, a track that touched the frame's edge is continued only
            by overlap.
        appearance : callable, optional
            ``appearance(i)``: the descriptor of ``boxes[i]``, shape (d,), or None; called at most once per
            box, and only where it is needed. Without it, tracks are kept by position alone.

        Returns
        -------
        list of Track
            The tracks seen in this frame, one per box, in the order of ``boxes``.
        """
        for tid in [tid for tid, tr in self.tracks.items() if t - tr.last_seen > self.max_age_s]:
            tr = self.tracks.pop(tid)
            if appearance is not None and self.reid_s > 0 and tr.appearance is not None:
                self.ended[tid] = tr
        for tid in [tid for tid, tr in self.ended.items() if t - tr.last_seen > self.max_age_s + self.reid_s]:
            del self.ended[tid]
        described: dict[int, NDArray[np.float64] | None] = {}
        checked: set[int] = set()  # detections compared with the track they may continue
        refused: dict[int, set[int]] = {}  # detection -> tracks its face was refused by

        def describe(i: int) -> NDArray[np.float64] | None:
            # a face cut by the frame's edge is not a view of it to compare with
            if appearance is None or _at_edge(boxes[i], frame_shape):
                return None
            if i not in described:
                v = appearance(i)
                self.described += 1
                described[i] = None if v is None else np.asarray(v, dtype=np.float64).ravel()
            return described[i]

        live = list(self.tracks.values())
        cost: dict[tuple[int, int], float] = {}
        # A face cut by the frame's edge cannot be compared: where faces are compared it continues no track that
        # has views of a face inside the frame (someone entering where another leaves takes over the track
        # otherwise); it is held out of every track while it is cut.
        cut: dict[int, dict[int, float]] = {}
        for j, tr in enumerate(live):
            ahead = tr.predicted(t)
            for i, b in enumerate(boxes):
                c = self._geometry(b, tr, ahead, frame_shape)
                if c is None:
                    continue
                if appearance is not None and tr.gallery and _at_edge(b, frame_shape):
                    cut.setdefault(i, {})[j] = c
                else:
                    cost[(i, j)] = c
        assigned: dict[int, int] = {}
        for dets, trs in _groups(cost):
            # unsure: a detection two tracks could take, a track two detections could, or a face that overlaps
            # where its track was going less than a followed face does (a near face stepping in front)
            unsure = (
                len(dets) > 1
                or len(trs) > 1
                or any(c > FIRM or _jump(boxes[i], live[j].box) for (i, j), c in cost.items() if i in dets)
            )
            group = {k: v for k, v in cost.items() if k[0] in dets}
            if unsure and appearance is not None:
                for (i, j), c in list(group.items()):
                    d = self._distance(describe(i), live[j])
                    checked.add(i)
                    if d is not None and d > self._bar(live[j]):
                        del group[(i, j)]
                        refused.setdefault(i, set()).add(j)
                    elif d is not None:
                        # the faces decide; position breaks ties between equally alike faces
                        group[(i, j)] = d + 0.1 * c
            assigned.update(_solve(group))
        # A pair no other detection or track disputed is checked against the face now and then, and at once
        # after faces the tracker could not compare: a person stepping where another was hidden or left.
        if appearance is not None:
            for i, j in list(assigned.items()):
                tr = live[j]
                # a young track is described at every frame until it has a few views to compare with
                due = tr.pending or len(tr.gallery) < YOUNG or t - tr.described_at >= self.refresh_s
                if i in checked or not due:
                    continue
                checked.add(i)
                d = self._distance(describe(i), tr)
                if d is not None and d > self._bar(tr):
                    del assigned[i]
                    refused.setdefault(i, set()).add(j)
        out: list[Track] = []
        taken = set(assigned.values())
        resumed: set[str] = set()
        covering: set[str] = set()  # tracks whose face covers a face held out in this frame
        for i, b in enumerate(boxes):
            if i in assigned:
                tr = live[assigned[i]]
            else:
                idle = [tr for j, tr in enumerate(live) if j not in taken and tr.id not in resumed]
                tr, doubted = self._resume(i, b, t, describe, idle)
                if tr is not None:
                    resumed.add(tr.id)
                    checked.add(i)
                else:
                    # a face cut by the edge is held by the nearest track it would have continued
                    owner = (
                        live[min(cut[i], key=cut[i].__getitem__)]
                        if i in cut
                        else self._holder(i, t, cost, refused, taken, live)
                    )
                    if owner is None and doubted is not None:
                        owner = self._holding(doubted, t)
                    if owner is not None:
                        out.append(self._held(b, t, owner))
                        continue
                    coverer = None if appearance is None else self._coverer(i, boxes, t, assigned, live)
                    if coverer is not None:
                        # its own face is not in doubt: it is not asked to compare its next one
                        covering.add(coverer.id)
                        out.append(self._held(b, t, None))
                        continue
                    tr = self._new(b, t)
                    describe(i)
                    checked.add(i)  # its first face is its own
            v = described.get(i) if i in checked else None
            if appearance is not None and i not in checked and _at_edge(b, frame_shape):
                tr.pending = True  # to be compared at its first face inside the frame
            elif appearance is not None and i in checked:
                # compared (or a new track's first view) when described; else still to be compared
                tr.pending = v is None
            self._continue(tr, b, t, v)
            tr.clear_view = not tr.pending and not _at_edge(b, frame_shape)
            out.append(tr)
        seen = {tr.id for tr in out}
        followed = [tr.box for tr in out if not tr.held]  # a face held out may be the unseen track's own
        for tr in live:
            if tr.id not in covering:
                tr.covering_since = None
            if tr.id not in seen and not tr.behind:
                ahead = tr.predicted(t)
                tr.behind = any(o.h >= COVER_RATIO * tr.box.h and _overlap(ahead, o) > 0.0 for o in followed)
        return out

    def _holder(
        self,
        i: int,
        t: float,
        cost: dict[tuple[int, int], float],
        refused: dict[int, set[int]],
        taken: set[int],
        live: list[Track],
    ) -> Track | None:
        """The track that holds detection ``i`` out of every track this frame, or None (it may start its own).

        Only where the faces alone kept it out: every track it could continue by position refused its face, and
        one of them has no face of its own in this frame (the nearest of those by position holds it). For at most
        ``hold_s`` from that track's first such refusal in a row.
        """
        if self.hold_s <= 0 or i not in refused:
            return None
        could = {j: c for (k, j), c in cost.items() if k == i}
        if set(could) != refused[i]:
            return None
        free = [j for j in could if j not in taken]
        if not free:
            return None
        return self._holding(live[min(free, key=lambda j: could[j])], t)

    def _holding(self, tr: Track, t: float) -> Track | None:
        """``tr``, to hold a face it alone could take, unless it has held such faces for longer than ``hold_s`` in a
        row (then None: the face is someone else's)."""
        if self.hold_s <= 0:
            return None
        if tr.refused_since is None:
            tr.refused_since = t
        if t - tr.refused_since > self.hold_s:
            tr.refused_since = None
            return None
        return tr

    def _coverer(
        self, i: int, boxes: Sequence[FaceBox], t: float, assigned: dict[int, int], live: list[Track]
    ) -> Track | None:
        """The followed track whose face covers detection ``i``'s, to hold it; or None (it may start its own track).

        Covered: another box of this frame, about as tall or taller (:data:`COVER_RATIO`), overlaps it. For at most
        ``hold_s`` from the first frame in a row that this track's face covered a face held out.
        """
        if self.hold_s <= 0:
            return None
        b = boxes[i]
        over = {
            k: share
            for k, o in enumerate(boxes)
            if k != i and k in assigned and o.h >= COVER_RATIO * b.h and (share := _overlap(b, o)) > 0.0
        }
        if not over:
            return None
        tr = live[assigned[max(over, key=over.__getitem__)]]
        if tr.covering_since is None:
            tr.covering_since = t
        return tr if t - tr.covering_since <= self.hold_s else None

    def _bar(self, tr: Track) -> float:
        """The distance beyond which a face is not ``tr``'s: stricter while it has few views (:data:`SETTLED`)."""
        return self.max_appearance if len(tr.gallery) >= SETTLED else min(self.max_appearance, YOUNG_APPEARANCE)

    def _held(self, b: FaceBox, t: float, owner: Track | None) -> Track:
        # the track that kept this face out compares its next face, however well that one overlaps
        if owner is not None:
            owner.pending = True
        return Track(
            id=f"{self.id_prefix}-held-{secrets.token_hex(10)}",
            box=b,
            first_seen=t,
            last_seen=t,
            clear_view=False,
            held=True,
        )

    def _distance(self, v: NDArray[np.float64] | None, tr: Track) -> float | None:
        if v is None or not tr.gallery or v.shape != tr.gallery[0].shape:
            return None
        return float(np.linalg.norm(v - np.mean(tr.gallery, axis=0)))

    def _resume(
        self, i: int, b: FaceBox, t: float, describe: Callable[[int], Any], idle: list[Track]
    ) -> tuple[Track | None, Track | None]:
        """(An ended or idle live track whose face this detection's is, else None; failing that, the idle live track
        hidden behind a face (:attr:`Track.behind`) whose face it may be, within ``max_appearance``, else None)."""
        # after a gap a face may have come nearer: the size is compared loosely, the face strictly
        ratio = self.max_size_ratio**2
        candidates = [
            tr
            for tr in (*self.ended.values(), *idle)
            if tr.gallery and max(b.h / max(tr.box.h, 1e-6), tr.box.h / max(b.h, 1e-6)) <= ratio
        ]
        if not candidates:
            return None, None
        v = describe(i)
        best: Track | None = None
        best_d = self.max_appearance
        for tr in candidates:
            d = self._distance(v, tr)
            if d is not None and d <= best_d:
                best, best_d = tr, d
        if best is None or best_d > self.reid_appearance:
            # a face coming out from behind another is half covered a frame or two: too far to resume, too near to
            # start a track of its own
            doubted = best is not None and best.behind and best.id not in self.ended
            return None, best if doubted else None
        if best.id in self.ended:
            self.tracks[best.id] = self.ended.pop(best.id)
            best.velocity = (0.0, 0.0)  # its motion while hidden is unknown
        return best, None

    def _continue(self, tr: Track, b: FaceBox, t: float, v: NDArray[np.float64] | None) -> None:
        dt = t - tr.last_seen
        if dt > 0 and dt <= self.max_age_s:
            (ox, oy), (nx, ny) = tr.box.center, b.center
            vx, vy = (nx - ox) / dt, (ny - oy) / dt
            # the first step sets it; then an average that follows a turn in a few frames
            a = 1.0 if tr.hits == 1 else 0.5
            tr.velocity = (a * vx + (1 - a) * tr.velocity[0], a * vy + (1 - a) * tr.velocity[1])
        if v is not None:
            if tr.gallery and tr.gallery[0].shape != v.shape:
                tr.gallery.clear()
            tr.gallery.append(v)
            tr.described_at = t
        tr.box = b
        tr.last_seen = t
        tr.hits += 1
        tr.refused_since = None
        tr.behind = False

    def _new(self, box: FaceBox, t: float) -> Track:
        # hits 0: _continue counts its first face
        tr = Track(id=f"{self.id_prefix}-{secrets.token_hex(10)}", box=box, first_seen=t, last_seen=t, hits=0)
        self.tracks[tr.id] = tr
        return tr


def _groups(cost: dict[tuple[int, int], float]) -> list[tuple[set[int], set[int]]]:
    """The possible pairs' connected groups: (detections, tracks) that share no pair with another group."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x: tuple[str, int]) -> tuple[str, int]:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in cost:
        parent[find(("d", i))] = find(("t", j))
    members: dict[tuple[str, int], tuple[set[int], set[int]]] = {}
    for i, j in cost:
        dets, trs = members.setdefault(find(("d", i)), (set(), set()))
        dets.add(i)
        trs.add(j)
    return list(members.values())


def _solve(cost: dict[tuple[int, int], float]) -> dict[int, int]:
    """detection -> track: the most pairs, then the least total cost (exact for a group of up to 8 detections)."""
    dets = sorted({i for i, _ in cost})
    options = {i: sorted((c, j) for (k, j), c in cost.items() if k == i) for i in dets}
    if len(dets) > 8:  # a crowd this dense is rare: best pairs first
        out: dict[int, int] = {}
        used: set[int] = set()
        for _c, i, j in sorted((c, i, j) for (i, j), c in cost.items()):
            if i not in out and j not in used:
                out[i] = j
                used.add(j)
        return out
    best: tuple[int, float, dict[int, int]] = (0, 0.0, {})

    def search(k: int, used: frozenset[int], n: int, total: float, chosen: dict[int, int]) -> None:
        nonlocal best
        if k == len(dets):
            if n > best[0] or (n == best[0] and total < best[1]):
                best = (n, total, dict(chosen))
            return
        if n + (len(dets) - k) < best[0]:
            return
        i = dets[k]
        for c, j in options[i]:
            if j not in used:
                chosen[i] = j
                search(k + 1, used | {j}, n + 1, total + c, chosen)
                del chosen[i]
        search(k + 1, used, n, total, chosen)

    search(0, frozenset(), 0, 0.0, {})
    return best[2]


def _jump(a: FaceBox, b: FaceBox) -> bool:
    """Whether two boxes' heights differ by more than :data:`SIZE_JUMP`."""
    ha, hb = max(a.h, 1e-6), max(b.h, 1e-6)
    return max(ha / hb, hb / ha) > SIZE_JUMP


def _leaving(tr: Track, frame_shape: tuple[int, ...] | None, margin: float = 2.0) -> bool:
    """Whether the track's last box touches the frame's edge while it moves out through it."""
    if frame_shape is None:
        return False
    h, w = frame_shape[0], frame_shape[1]
    b, (vx, vy) = tr.box, tr.velocity
    return (
        (b.x <= margin and vx < 0)
        or (b.y <= margin and vy < 0)
        or (b.x + b.w >= w - margin and vx > 0)
        or (b.y + b.h >= h - margin and vy > 0)
    )


def _overlap(a: FaceBox, b: FaceBox) -> float:
    """The share of ``a``'s area that ``b`` overlaps."""
    return a.intersection(b) / max(a.area, 1e-6)


def _at_edge(box: FaceBox, frame_shape: tuple[int, ...] | None, margin: float = 2.0) -> bool:
    """Whether ``box`` touches the frame's edge (never, without the frame's shape)."""
    if frame_shape is None:
        return False
    h, w = frame_shape[0], frame_shape[1]
    return box.x <= margin or box.y <= margin or box.x + box.w >= w - margin or box.y + box.h >= h - margin
