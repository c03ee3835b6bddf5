"""dlib's HOG detector as ``[detector] kind = "hog"``: real LFW photos placed in a camera-sized frame."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from peep.edge.config import DetectorConfig
from peep.edge.detection import DlibHogFaceDetector, build_detector

pytest.importorskip("dlib", reason="dlib-bin is the edge's [dlib] extra; CI installs it")


def _frame(data_home: str, person: str, at: tuple[int, int], scale: float) -> tuple[np.ndarray, tuple[int, int]]:
    """A 640x480 grey frame with ``person``'s first LFW photo pasted at ``at``, resized by ``scale``."""
    photo = cv2.imread(str(sorted(Path(data_home, "lfw_home", "lfw_funneled", person).glob("*.jpg"))[0]))
    photo = cv2.resize(photo, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    frame = np.full((480, 640, 3), 96, np.uint8)
    x, y = at
    frame[y : y + photo.shape[0], x : x + photo.shape[1]] = photo
    return frame, (x + photo.shape[1] // 2, y + photo.shape[0] // 2)


def test_hog_finds_a_face_where_it_is_and_upsampling_finds_smaller_ones(data_home: str) -> None:
    big, centre = _frame(data_home, "Colin_Powell", (300, 120), 1.0)  # face about 100 px
    boxes = DlibHogFaceDetector(upsample=0).detect(big)
    assert len(boxes) == 1
    cx, cy = boxes[0].center
    assert abs(cx - centre[0]) < 30 and abs(cy - centre[1]) < 30 and 60 <= boxes[0].w <= 140
    small, _ = _frame(data_home, "Colin_Powell", (100, 200), 0.45)  # face about 45 px: below HOG's 80 px window
    assert DlibHogFaceDetector(upsample=0).detect(small) == []
    found = DlibHogFaceDetector(upsample=1).detect(small)
    assert len(found) == 1 and 30 <= found[0].w <= 70
    # boxes come back in the full frame's pixels when the frame is scaled down first
    scaled = DlibHogFaceDetector(upsample=1, detect_width=320).detect(big)
    assert len(scaled) == 1 and abs(scaled[0].center[0] - centre[0]) < 30
    # and min_size drops what is smaller
    assert DlibHogFaceDetector(upsample=1, min_size=60).detect(small) == []


def test_an_empty_scene_has_no_face() -> None:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 255, (480, 640), dtype=np.uint8)
    assert DlibHogFaceDetector(upsample=1).detect(noise) == []


def test_the_config_builds_it_and_refuses_what_does_not_apply() -> None:
    det = build_detector(DetectorConfig(kind="hog", upsample=2, detect_width=640, min_size=24))
    assert isinstance(det, DlibHogFaceDetector) and det.upsample == 2 and det.detect_width == 640
    with pytest.raises(ValueError, match="detector.upsample: expected only with detector.kind 'hog'"):
        DetectorConfig(kind="haar", upsample=0)
    # a config written out whole (every field at its default) loads again
    assert DetectorConfig(**DetectorConfig().model_dump()).kind == "auto"
    with pytest.raises(ValueError, match="upsample"):
        DetectorConfig(kind="hog", upsample=4)
    with pytest.raises(ValueError, match="upsample: expected a whole number 0-3"):
        DlibHogFaceDetector(upsample=5)
