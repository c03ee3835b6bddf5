"""The edge tracker: one person one track, even walking briskly; never two people in one track by size or edge."""

from __future__ import annotations

import pytest
from peep.core.imaging import FaceBox
from peep.edge.tracking import Tracker


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
    shape = (480, 640, 3)
    tr = Tracker()
    leaving = tr.update([_box(0.0)], 0.0, shape)[0]  # at the left edge, on the way out
    entering = tr.update([_box(30.0)], 0.3, shape)[0]  # near, same size, no overlap: only the fallback would join
    assert entering.id != leaving.id
    # without the frame's shape the fallback joins them, as before: the shape is what tells the edge
    tr2 = Tracker()
    first = tr2.update([_box(0.0)], 0.0)[0]
    assert tr2.update([_box(30.0)], 0.3)[0].id == first.id


def test_size_ratio_is_checked() -> None:
    with pytest.raises(ValueError, match="max_size_ratio: expected a value > 1"):
        Tracker(max_size_ratio=1.0)
