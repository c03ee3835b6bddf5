"""The edge tracker: one person one track, even walking briskly; never two people in one track by size, edge or face.

Faces' descriptors are stood in for by fixed vectors per person (two people 1.0 apart, a person's views 0.1
apart): what is tested is when the tracker compares them and what it does with the distance.
"""

from __future__ import annotations

import numpy as np
import pytest
from peep.core.imaging import FaceBox
from peep.edge.config import TrackerConfig
from peep.edge.tracking import YOUNG, Tracker

SHAPE = (480, 640, 3)
DT = 1 / 15
_FACES = {p: np.eye(8)[k] / np.sqrt(2) for k, p in enumerate("ABCD")}  # 1.0 apart


def _face(person: str, k: int = 0) -> np.ndarray:
    """A view of a person's face: their vector, a little off by the view."""
    jitter = np.random.default_rng(k).normal(0.0, 0.1 / np.sqrt(8), 8)
    return _FACES[person] + jitter


class Faces:
    """The appearance function for one frame's boxes: who each box is; counts what the tracker asks."""

    def __init__(self) -> None:
        self.calls = 0

    def of(self, people: list[str], k: int = 0):
        def appearance(i: int) -> np.ndarray:
            self.calls += 1
            return _face(people[i], k)

        return appearance


def _box(x: float, y: float = 100.0, h: float = 60.0) -> FaceBox:
    return FaceBox(x=x, y=y, w=0.75 * h, h=h)


def test_a_brisk_walker_stays_one_track() -> None:
    # 0.7 box widths a frame at 15 frames/s: no overlap from one frame to the next after the first step
    tr, dt = Tracker(), 1 / 15
    step = 0.7 * 45.0
    ids = {tr.update([_box(20 + k * step)], k * dt)[0].id for k in range(12)}
    assert len(ids) == 1, ids


def test_a_near_face_does_not_take_over_a_far_ones_track() -> None:
    tr = Tracker()
    far = tr.update([_box(300, h=40)], 0.0)[0]
    # next frame the far face is hidden and a face twice its height appears in the same place
    near = tr.update([_box(290, y=90, h=80)], 1 / 15)[0]
    assert near.id != far.id


def test_someone_entering_where_another_left_gets_a_new_track() -> None:
    tr = Tracker()
    tr.update([_box(20.0)], 0.0, SHAPE)
    leaving = tr.update([_box(0.0)], DT, SHAPE)[0]  # at the left edge, on the way out
    entering = tr.update([_box(30.0)], 0.3, SHAPE)[0]  # near, same size, no overlap: only the fallback would join
    assert entering.id != leaving.id
    # without the frame's shape the fallback joins them: the shape is what tells the edge
    tr2 = Tracker()
    first = tr2.update([_box(0.0)], 0.0)[0]
    assert tr2.update([_box(30.0)], 0.3)[0].id == first.id


def test_a_face_coming_in_through_the_edge_stays_one_track() -> None:
    # its box widens as more of it shows: the overlap is poor, the centre close, and it moves inwards
    tr = Tracker()
    ids = {tr.update([FaceBox(x=0.0, y=100.0, w=w, h=60.0)], k * DT, SHAPE)[0].id for k, w in enumerate((15, 30, 45))}
    assert len(ids) == 1


def test_two_alike_faces_crossing_keep_their_tracks_by_their_faces() -> None:
    """A and B of one size walk towards each other and cross; each keeps its own track throughout."""
    faces, tr = Faces(), Tracker()
    first: dict[str, str] = {}
    for k in range(30):
        xa, xb = 100.0 + 12.0 * k, 460.0 - 12.0 * k
        order = ["A", "B"] if k % 2 else ["B", "A"]  # the detector's order means nothing
        boxes = [_box(xa if p == "A" else xb, y=100.0 + (2.0 if p == "B" else 0.0)) for p in order]
        tracks = tr.update(boxes, k * DT, SHAPE, appearance=faces.of(order, k))
        for p, track in zip(order, tracks, strict=True):
            assert first.setdefault(p, track.id) == track.id, (k, p)
    assert first["A"] != first["B"]


def test_a_face_stepping_into_anothers_place_is_refused_by_its_face() -> None:
    faces, tr = Faces(), Tracker()
    for k in range(10):
        a = tr.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE, appearance=faces.of(["A"], k))[0]
    # A is hidden; B appears right where A was going, of A's size: by position alone, A's track. Its face keeps it
    # out: held out of every track for hold_s (it might be A's face, half covered), nothing released ...
    held = [
        tr.update([_box(152.0 + 5.0 * k)], (10 + k) * DT, SHAPE, appearance=faces.of(["B"], 10 + k))[0]
        for k in range(4)
    ]
    assert all(h.held and not h.clear_view and h.id != a.id for h in held)
    assert a.id in tr.tracks and not any(h.id in tr.tracks for h in held)  # a held face is kept in no track
    # ... then, still refused, it is someone else: a track of its own
    b = tr.update([_box(175.0)], 15 * DT, SHAPE, appearance=faces.of(["B"], 15))[0]
    assert b.id != a.id and not b.held and b.clear_view
    assert tr.update([_box(180.0)], 16 * DT, SHAPE, appearance=faces.of(["B"], 16))[0].id == b.id
    # the same by position without faces
    tr2 = Tracker()
    for k in range(10):
        a2 = tr2.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE)[0]
    assert tr2.update([_box(152.0)], 10 * DT, SHAPE)[0].id == a2.id


def test_a_face_seen_again_after_being_hidden_resumes_its_track_and_no_other_face_does() -> None:
    faces, tr = Faces(), Tracker(max_age_s=1.0, reid_s=3.0)
    for k in range(10):
        a = tr.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE, appearance=faces.of(["A"], k))[0]
    # hidden for 2 s (longer than max_age_s), seen again 150 px on
    again = tr.update([_box(300.0)], 10 * DT + 2.0, SHAPE, appearance=faces.of(["A"], 99))[0]
    assert again.id == a.id
    tr.update([_box(300.0)], 10 * DT + 2.0 + DT, SHAPE, appearance=faces.of(["A"], 100))
    # B where A was, after A's track ended: a track of its own
    other = tr.update([_box(310.0)], 10 * DT + 4.5, SHAPE, appearance=faces.of(["B"], 101))[0]
    assert other.id != a.id


def test_a_face_cut_by_the_edge_is_not_a_clear_view_and_is_compared_when_it_is_inside() -> None:
    faces, tr = Faces(), Tracker()
    for k in range(8):
        a = tr.update([_box(40.0 - 5.0 * k)], k * DT, SHAPE, appearance=faces.of(["A"], k))[0]
        assert a.clear_view
    # at the edge: it cannot be compared, so it continues no track that has faces to compare with: held out of
    # every track and not released, whoever it is (someone entering where A leaves would take A's track)
    edge = tr.update([FaceBox(x=0.0, y=100.0, w=40.0, h=60.0)], 8 * DT, SHAPE, appearance=faces.of(["B"], 8))[0]
    assert edge.held and edge.id != a.id and not edge.clear_view
    # the first face inside the frame is compared at once, though A was described a moment ago: B is not A
    calls = faces.calls
    inside = tr.update([_box(6.0)], 9 * DT, SHAPE, appearance=faces.of(["B"], 9))[0]
    assert faces.calls == calls + 1 and inside.id != a.id and not inside.clear_view


def test_a_face_changed_for_a_moment_is_held_and_continues_its_own_track() -> None:
    """A's face, half covered for two frames, looks like someone else's; then it is A's again."""
    faces, tr = Faces(), Tracker(hold_s=0.3)
    for k in range(10):
        a = tr.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE, appearance=faces.of(["A"], k))[0]
    covered = [
        tr.update([_box(150.0 + 5.0 * k)], (10 + k) * DT, SHAPE, appearance=faces.of(["C"], 10 + k))[0]
        for k in range(2)
    ]
    assert all(c.held and not c.clear_view for c in covered)
    back = tr.update([_box(160.0)], 12 * DT, SHAPE, appearance=faces.of(["A"], 12))[0]
    assert back.id == a.id and back.clear_view and not back.held
    # without the hold each change starts a track: the pass is split in two, then in three
    faces2, tr2 = Faces(), Tracker(hold_s=0.0)
    for k in range(10):
        a2 = tr2.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE, appearance=faces2.of(["A"], k))[0]
    split = tr2.update([_box(150.0)], 10 * DT, SHAPE, appearance=faces2.of(["C"], 10))[0]
    assert split.id != a2.id and not split.held


def test_a_face_entering_where_another_leaves_is_held_while_cut_by_the_edge() -> None:
    """B comes in through the left edge just where A goes out: never in A's track."""
    faces, tr = Faces(), Tracker()
    xs = [60.0 - 12.0 * k for k in range(6)]  # A walks out through the left edge
    for k, x in enumerate(xs):
        a = tr.update([_box(x)], k * DT, SHAPE, appearance=faces.of(["A"], k))[0]
    seen = []
    for k, x in enumerate((0.0, 0.0, 4.0, 16.0, 28.0)):  # B comes in at once, cut by the edge at first
        seen.append(tr.update([_box(x)], (6 + k) * DT, SHAPE, appearance=faces.of(["B"], 6 + k))[0])
    assert all(t.id != a.id for t in seen)
    assert seen[0].held and seen[1].held and not seen[0].clear_view
    # without faces compared, position alone keeps B in A's track (what the hold is for)
    tr2 = Tracker()
    for k, x in enumerate(xs):
        a2 = tr2.update([_box(x)], k * DT, SHAPE)[0]
    assert tr2.update([_box(0.0)], 6 * DT, SHAPE)[0].id == a2.id


def test_a_nearer_face_stepping_in_front_is_compared_though_the_boxes_overlap() -> None:
    """B, 25 % taller, steps in front of A with a box that overlaps A's well: the size step makes it compared."""
    faces, tr = Faces(), Tracker(refresh_s=10.0)
    for k in range(6):
        a = tr.update([_box(200.0, h=80.0)], k * DT, SHAPE, appearance=faces.of(["A"], k))[0]
    calls = faces.calls
    b = tr.update([_box(195.0, y=95.0, h=100.0)], 6 * DT, SHAPE, appearance=faces.of(["B"], 6))[0]
    assert faces.calls > calls and b.id != a.id and not b.clear_view


def _at(*vectors: np.ndarray):
    """An appearance function giving these exact vectors, one per box."""
    return lambda i: vectors[i]


def _off(person: str, d: float) -> np.ndarray:
    """A face ``d`` from the person's own vector (in a direction no person's vector takes)."""
    return _FACES[person] + d * np.eye(8)[7]


def test_a_young_track_refuses_a_face_that_a_settled_one_would_take() -> None:
    """X, 0.58 from A (within max_appearance 0.6), steps into A's place: a track of two views refuses it."""
    a_face, x_face = _FACES["A"], _off("A", 0.58)
    tr = Tracker(refresh_s=0.01)  # faces compared at every frame
    for k in range(2):
        a = tr.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE, appearance=_at(a_face))[0]
    x = tr.update([_box(110.0)], 2 * DT, SHAPE, appearance=_at(x_face))[0]
    assert x.held and not x.clear_view and x.id != a.id and len(tr.tracks[a.id].gallery) == 2  # nothing of X kept
    # A comes out from behind X: A's track is A's alone, X starts its own
    back, x2 = tr.update([_box(120.0), _box(60.0)], 3 * DT, SHAPE, appearance=_at(a_face, x_face))
    assert back.id == a.id and back.clear_view and x2.id != a.id and not x2.held
    # a track of eight views takes the same face: its mean is not moved far by one view
    tr2 = Tracker(refresh_s=0.01)
    for k in range(8):
        a2 = tr2.update([_box(100.0 + 5.0 * k)], k * DT, SHAPE, appearance=_at(a_face))[0]
    assert tr2.update([_box(140.0)], 8 * DT, SHAPE, appearance=_at(x_face))[0].id == a2.id


def test_a_face_covered_by_a_nearer_one_is_held_before_it_starts_a_track() -> None:
    """C appears half behind B's nearer face: its first views mix two faces, so for hold_s it starts no track."""
    b_face, c_face = _FACES["B"], _FACES["C"]
    tr = Tracker(hold_s=0.3)
    for k in range(6):
        b = tr.update([_box(200.0, h=100.0)], k * DT, SHAPE, appearance=_at(b_face))[0]
    seen = [
        tr.update([_box(200.0, h=100.0), _box(260.0)], (6 + k) * DT, SHAPE, appearance=_at(b_face, c_face))
        for k in range(6)
    ]
    assert all(s[0].id == b.id and s[0].clear_view for s in seen)
    held = [s[1] for s in seen if s[1].held]
    assert len(held) == 5 and not any(h.clear_view or h.id in tr.tracks for h in held)
    c = seen[-1][1]  # after hold_s: its own track
    assert not c.held and c.id in tr.tracks and c.id != b.id
    # beside B, not covered: a track of its own at once; and without faces compared, at once too
    tr2 = Tracker(hold_s=0.3)
    for k in range(6):
        tr2.update([_box(200.0, h=100.0)], k * DT, SHAPE, appearance=_at(b_face))
    alone = tr2.update([_box(200.0, h=100.0), _box(400.0)], 6 * DT, SHAPE, appearance=_at(b_face, c_face))[1]
    assert not alone.held and alone.clear_view
    tr3 = Tracker(hold_s=0.3)
    for k in range(6):
        tr3.update([_box(200.0, h=100.0)], k * DT, SHAPE)
    assert not tr3.update([_box(200.0, h=100.0), _box(260.0)], 6 * DT, SHAPE)[1].held


def test_a_face_coming_out_from_behind_another_is_held_until_it_resumes_its_track() -> None:
    """A is hidden behind B's nearer face and comes out beside it, 0.5 from its views for a frame (too far to
    resume, reid_appearance 0.45): held, not a new track; then A's face again resumes A's track."""
    a_face, b_face = _FACES["A"], _FACES["B"]
    tr = Tracker()
    for k in range(8):  # A stands at x 300; B, nearer, walks towards it
        a, _b = tr.update([_box(300.0), _box(150.0 + 15.0 * k, h=80.0)], k * DT, SHAPE, appearance=_at(a_face, b_face))
    assert tr.update([_box(270.0, h=80.0)], 8 * DT, SHAPE, appearance=_at(b_face))[0].id != a.id  # A behind B
    out = tr.update([_box(285.0, h=80.0), _box(400.0)], 9 * DT, SHAPE, appearance=_at(b_face, _off("A", 0.5)))[1]
    assert out.held and not out.clear_view
    back = tr.update([_box(300.0, h=80.0), _box(405.0)], 10 * DT, SHAPE, appearance=_at(b_face, a_face))[1]
    assert back.id == a.id and back.clear_view
    # a face as far from a track that left without going behind anyone starts its own
    tr2 = Tracker()
    for k in range(8):
        a2 = tr2.update([_box(300.0)], k * DT, SHAPE, appearance=_at(a_face))[0]
    other = tr2.update([_box(400.0)], 9 * DT, SHAPE, appearance=_at(_off("A", 0.5)))[0]
    assert not other.held and other.id != a2.id


def test_hold_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="hold_s: expected 0 <= value <= max_age_s"):
        Tracker(hold_s=2.0, max_age_s=1.0)
    with pytest.raises(ValueError, match=r"tracker.hold_s: expected <= max_age_s \(1.0\), received 1.5"):
        TrackerConfig(hold_s=1.5, max_age_s=1.0)


def test_faces_are_described_only_where_needed() -> None:
    """One walker alone for 3 s: a young track's first views, then one every refresh_s."""
    faces, tr = Faces(), Tracker(refresh_s=0.5)
    n = 45
    for k in range(n):
        tr.update([_box(100.0 + 3.0 * k)], k * DT, SHAPE, appearance=faces.of(["A"], k))
    assert faces.calls == tr.described
    assert YOUNG <= faces.calls <= YOUNG + (n * DT) / 0.5 + 1, faces.calls
    # and never without the function
    tr2 = Tracker()
    for k in range(n):
        tr2.update([_box(100.0 + 3.0 * k)], k * DT, SHAPE)
    assert tr2.described == 0


def test_size_ratio_is_checked() -> None:
    with pytest.raises(ValueError, match="max_size_ratio: expected a value > 1"):
        Tracker(max_size_ratio=1.0)


def test_appearance_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="reid_appearance: expected 0 < value <= max_appearance"):
        Tracker(max_appearance=0.5, reid_appearance=0.6)
    with pytest.raises(ValueError, match=r"tracker.reid_appearance: expected <= tracker.max_appearance \(0.5\)"):
        TrackerConfig(max_appearance=0.5, reid_appearance=0.6)
