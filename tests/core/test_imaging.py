from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from peep.core.imaging import (
    DEFAULT_GEOMETRY,
    LFW_FIXED_BOX,
    LFW_FIXED_GEOMETRY,
    FaceBox,
    FaceDetector,
    FaceGeometry,
    HaarFaceDetector,
    YuNetFaceDetector,
    crop_rect,
    normalise_face,
    primary_face,
    to_gray,
)


def _lfw_image(data_home: str, person: str = "Tony_Blair", i: int = 1) -> np.ndarray:
    path = Path(data_home) / "lfw_home" / "lfw_funneled" / person / f"{person}_{i:04d}.jpg"
    img = cv2.imread(str(path))
    assert img is not None, path
    return img


def test_haar_finds_the_face_in_real_lfw_images(data_home):
    det = HaarFaceDetector()
    assert isinstance(det, FaceDetector)
    hits = 0
    for i in range(1, 21):
        img = _lfw_image(data_home, "Colin_Powell", i)
        box = primary_face(det.detect(img), img.shape)
        if box is None:
            continue
        hits += 1
        # The subject is centred in LFW; the box must be around the centre.
        cx, cy = box.center
        assert abs(cx - 125) < 30 and abs(cy - 125) < 35
        assert 70 < box.w < 170
    assert hits >= 18


def test_detector_crop_matches_the_fixed_lfw_crop(data_home):
    """The calibrated crop from a Haar box reproduces scikit-learn's fixed LFW crop."""
    det = HaarFaceDetector()
    diffs = []
    for i in range(1, 16):
        img = _lfw_image(data_home, "George_W_Bush", i)
        box = primary_face(det.detect(img), img.shape)
        if box is None:
            continue
        a = normalise_face(img, box, DEFAULT_GEOMETRY)
        b = normalise_face(img, LFW_FIXED_BOX, LFW_FIXED_GEOMETRY)
        diffs.append(np.abs(a - b).mean())
        unrelated = normalise_face(img, FaceBox(x=0, y=0, w=94, h=125), LFW_FIXED_GEOMETRY)
        assert np.abs(a - unrelated).mean() > 2 * diffs[-1]
    assert np.median(diffs) < 0.08


def test_normalise_face_output_contract(data_home):
    img = _lfw_image(data_home)
    out = normalise_face(img, FaceBox(x=60, y=60, w=120, h=120))
    assert out.shape == (62, 47) and out.dtype == np.float32
    assert 0.0 <= out.min() and out.max() <= 1.0
    # Boxes reaching outside the frame are padded, not an error.
    edge = normalise_face(img, FaceBox(x=-50, y=200, w=120, h=120))
    assert edge.shape == (62, 47) and np.isfinite(edge).all()
    g = FaceGeometry(width=32, height=40, equalize=True)
    eq = normalise_face(img, FaceBox(x=60, y=60, w=120, h=120), g)
    assert eq.shape == (40, 32)
    # Equalisation stretches the histogram over the whole range.
    assert eq.max() > 0.95 and eq.min() < 0.05


def test_crop_keeps_aspect_ratio():
    x0, _y0, w, h = crop_rect(FaceBox(x=100, y=50, w=100, h=100), DEFAULT_GEOMETRY)
    assert h / w == pytest.approx(62 / 47, rel=0.02)
    assert x0 + w / 2 == pytest.approx(150, abs=1)


def test_to_gray_accepts_common_layouts():
    bgr = np.zeros((4, 5, 3), np.uint8)
    bgr[..., 2] = 255
    assert to_gray(bgr).shape == (4, 5)
    assert to_gray(np.ones((4, 5), np.float32)).max() == 255
    assert to_gray(np.zeros((4, 5, 4), np.uint8)).shape == (4, 5)
    with pytest.raises(ValueError, match="image: expected"):
        to_gray(np.zeros((2, 2, 2, 2)))


def test_detector_downscaling_maps_boxes_back(data_home):
    img = cv2.resize(_lfw_image(data_home), (500, 500))
    full = primary_face(HaarFaceDetector().detect(img), img.shape)
    fast = primary_face(HaarFaceDetector(detect_width=250).detect(img), img.shape)
    assert full is not None and fast is not None
    assert full.iou(fast) > 0.6


def test_geometry_and_detector_validation(tmp_path):
    with pytest.raises(ValueError, match="width: expected >= 8"):
        FaceGeometry(width=2)
    with pytest.raises(ValueError, match="geometry: expected keys"):
        FaceGeometry.from_dict({"width": 47, "colour": True})
    with pytest.raises(FileNotFoundError, match="cascade_path"):
        HaarFaceDetector(cascade_path=str(tmp_path / "none.xml"))
    with pytest.raises(FileNotFoundError, match="model_path"):
        YuNetFaceDetector(model_path=str(tmp_path / "yunet.onnx"))
    with pytest.raises(ValueError, match="scale_factor"):
        HaarFaceDetector(scale_factor=1.0)


def test_iou():
    a = FaceBox(x=0, y=0, w=10, h=10)
    assert a.iou(a) == 1.0
    assert a.iou(FaceBox(x=5, y=0, w=10, h=10)) == pytest.approx(50 / 150)
    assert a.iou(FaceBox(x=20, y=20, w=5, h=5)) == 0.0
