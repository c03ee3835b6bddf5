"""The one face-normalisation path (image geometry, OpenCV).

Bundle building, enrolment, identification and the audit all turn an image
plus a face box into the bundle geometry here, so there is no train/serve
skew. Face detection sits behind :class:`FaceDetector`; the Haar cascade
shipped with opencv-python 4.x is the default and YuNet
(``cv2.FaceDetectorYN``) is used when a model file is configured. Detectors
live in core, not in the edge, because a bundle built for devices must see
its faces through the same detector the devices run.

The default crop (:data:`DEFAULT_GEOMETRY`) was calibrated so that, on LFW's
250x250 deep-funneled images, a Haar box (median 116 px at (68, 65)) yields
the same region as scikit-learn's fixed LFW crop (rows 70:195, columns
78:172): 0.81 box widths wide, starting 0.04 box heights below the box top,
62x47 pixels out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import cv2
import numpy as np
from numpy.typing import NDArray
from peep.core.validation import check_int, check_positive, check_real

GrayImage = NDArray[np.uint8]


@dataclass(frozen=True, kw_only=True)
class FaceBox:
    """A detected face: top-left corner, size in pixels, detector score."""

    x: float
    y: float
    w: float
    h: float
    score: float = 1.0

    @property
    def center(self) -> tuple[float, float]:
        return (self.x + self.w / 2.0, self.y + self.h / 2.0)

    @property
    def area(self) -> float:
        return self.w * self.h

    def intersection(self, other: FaceBox) -> float:
        """The area this box shares with ``other`` (square pixels)."""
        ix = max(0.0, min(self.x + self.w, other.x + other.w) - max(self.x, other.x))
        iy = max(0.0, min(self.y + self.h, other.y + other.h) - max(self.y, other.y))
        return ix * iy

    def iou(self, other: FaceBox) -> float:
        """Intersection over union with ``other``."""
        inter = self.intersection(other)
        union = self.area + other.area - inter
        return inter / union if union > 0 else 0.0

    def scaled(self, factor: float) -> FaceBox:
        """The same box in an image resized by ``factor``."""
        return FaceBox(x=self.x * factor, y=self.y * factor, w=self.w * factor, h=self.h * factor, score=self.score)


#: The region scikit-learn's ``fetch_lfw_people`` crops from a 250x250 LFW
#: image (rows 70:195, columns 78:172); with :data:`LFW_FIXED_GEOMETRY`
#: it reproduces the fixed crop the PEEP paper used.
LFW_FIXED_BOX = FaceBox(x=78.0, y=70.0, w=94.0, h=125.0)


@dataclass(frozen=True, kw_only=True)
class FaceGeometry:
    """Output geometry and crop rule of the normalisation.

    Parameters
    ----------
    width, height : int
        Output size in pixels (the bundle's; the paper uses 47x62).
    crop_scale : float
        Crop width as a multiple of the face box width; the crop height
        follows from the output aspect ratio, so faces are never stretched.
    crop_offset_y : float
        Crop top below the box top, as a fraction of the box height.
    equalize : bool
        Histogram-equalise the crop (robustness to lighting).
    """

    width: int = 47
    height: int = 62
    crop_scale: float = 0.81
    crop_offset_y: float = 0.04
    equalize: bool = False

    def __post_init__(self) -> None:
        check_int(self.width, "width", low=8, high=1024)
        check_int(self.height, "height", low=8, high=1024)
        check_positive(self.crop_scale, "crop_scale")
        check_real(self.crop_offset_y, "crop_offset_y", low=-1.0, high=1.0)

    @property
    def n_pixels(self) -> int:
        return self.width * self.height

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)``, numpy order."""
        return (self.height, self.width)

    def to_dict(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "height": self.height,
            "crop_scale": self.crop_scale,
            "crop_offset_y": self.crop_offset_y,
            "equalize": self.equalize,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaceGeometry:
        allowed = {"width", "height", "crop_scale", "crop_offset_y", "equalize"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"geometry: expected keys {sorted(allowed)}, received unknown {sorted(unknown)}")
        return cls(**data)


DEFAULT_GEOMETRY = FaceGeometry()
#: Use with :data:`LFW_FIXED_BOX`: the box already is the crop.
LFW_FIXED_GEOMETRY = FaceGeometry(crop_scale=1.0, crop_offset_y=0.0)


def to_gray(image: NDArray[Any]) -> GrayImage:
    """8-bit grayscale from a grayscale, BGR or BGRA image (uint8 or [0,1] float)."""
    img = np.asarray(image)
    if img.dtype != np.uint8:
        if np.issubdtype(img.dtype, np.floating) and img.size and float(np.nanmax(img)) <= 1.0:
            img = img * 255.0
        img = np.clip(np.nan_to_num(img), 0, 255).astype(np.uint8)
    if img.ndim == 2:
        return img
    if img.ndim == 3 and img.shape[2] == 3:
        return np.asarray(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), dtype=np.uint8)
    if img.ndim == 3 and img.shape[2] == 4:
        return np.asarray(cv2.cvtColor(img, cv2.COLOR_BGRA2GRAY), dtype=np.uint8)
    if img.ndim == 3 and img.shape[2] == 1:
        return img[:, :, 0]
    raise ValueError(f"image: expected a 2-d gray or 3-d BGR/BGRA image, received shape {img.shape}")


def crop_rect(box: FaceBox, geometry: FaceGeometry) -> tuple[int, int, int, int]:
    """Integer crop ``(x0, y0, width, height)`` for ``box`` under ``geometry``."""
    cw = box.w * geometry.crop_scale
    ch = cw * geometry.height / geometry.width
    cx = box.x + box.w / 2.0
    y0 = box.y + geometry.crop_offset_y * box.h
    x0 = cx - cw / 2.0
    return (round(x0), round(y0), max(1, round(cw)), max(1, round(ch)))


def normalise_face(image: NDArray[Any], box: FaceBox, geometry: FaceGeometry = DEFAULT_GEOMETRY) -> NDArray[np.float32]:
    """Crop a face to the bundle geometry.

    Parameters
    ----------
    image : ndarray of shape (H, W) or (H, W, 3)
        The frame (grayscale or BGR).
    box : FaceBox
        The detected face.
    geometry : FaceGeometry

    Returns
    -------
    ndarray of shape (geometry.height, geometry.width), float32 in [0, 1]
        Regions outside the frame are filled by replicating the border.
    """
    gray = to_gray(image)
    x0, y0, cw, ch = crop_rect(box, geometry)
    h, w = gray.shape
    pad_l, pad_t = max(0, -x0), max(0, -y0)
    pad_r, pad_b = max(0, x0 + cw - w), max(0, y0 + ch - h)
    if pad_l or pad_t or pad_r or pad_b:
        gray = np.asarray(cv2.copyMakeBorder(gray, pad_t, pad_b, pad_l, pad_r, cv2.BORDER_REPLICATE), dtype=np.uint8)
        x0, y0 = x0 + pad_l, y0 + pad_t
    crop = gray[y0 : y0 + ch, x0 : x0 + cw]
    if geometry.equalize:
        crop = np.asarray(cv2.equalizeHist(np.ascontiguousarray(crop)), dtype=np.uint8)
    # INTER_AREA averages pixels when shrinking, which avoids aliasing.
    interp = cv2.INTER_AREA if cw >= geometry.width else cv2.INTER_LINEAR
    out = cv2.resize(crop, (geometry.width, geometry.height), interpolation=interp)
    return out.astype(np.float32) / np.float32(255.0)


@runtime_checkable
class FaceDetector(Protocol):
    """Finds faces in a frame. Implementations: Haar, YuNet, test fakes."""

    def detect(self, image: NDArray[Any]) -> list[FaceBox]:
        """Boxes of the faces in ``image`` (grayscale or BGR), best first."""
        ...


class HaarFaceDetector:
    """OpenCV's Viola-Jones frontal-face cascade (ships with opencv-python 4.x).

    Parameters
    ----------
    scale_factor : float, default=1.1
    min_neighbors : int, default=5
    min_size : int, default=40
        Smallest face in pixels (of the detection image).
    detect_width : int or None, default=None
        Downscale frames wider than this before detecting (speed on a Pi);
        boxes are mapped back to the original frame.
    cascade_path : str or None
        Defaults to ``haarcascade_frontalface_default.xml`` from ``cv2.data``.
    """

    def __init__(
        self,
        *,
        scale_factor: float = 1.1,
        min_neighbors: int = 5,
        min_size: int = 40,
        detect_width: int | None = None,
        cascade_path: str | None = None,
    ) -> None:
        self.scale_factor = check_real(scale_factor, "scale_factor", low=1.0, low_inclusive=False)
        self.min_neighbors = check_int(min_neighbors, "min_neighbors", low=0)
        self.min_size = check_int(min_size, "min_size", low=4)
        self.detect_width = None if detect_width is None else check_int(detect_width, "detect_width", low=32)
        cascades = cv2.data.haarcascades  # type: ignore[attr-defined]  # missing from OpenCV's stubs
        path = cascade_path or os.path.join(cascades, "haarcascade_frontalface_default.xml")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"cascade_path: expected a Haar cascade XML file, received {path!r} (not found)")
        self.cascade_path = path
        self._cascade = cv2.CascadeClassifier(path)
        if self._cascade.empty():
            raise ValueError(f"cascade_path: expected a valid Haar cascade, OpenCV could not load {path!r}")

    def detect(self, image: NDArray[Any]) -> list[FaceBox]:
        gray = to_gray(image)
        factor = 1.0
        if self.detect_width is not None and gray.shape[1] > self.detect_width:
            factor = self.detect_width / gray.shape[1]
            gray = np.asarray(
                cv2.resize(gray, None, fx=factor, fy=factor, interpolation=cv2.INTER_AREA), dtype=np.uint8
            )
        min_size = max(4, round(self.min_size * factor)) if factor < 1.0 else self.min_size
        found, _, weights = self._cascade.detectMultiScale3(
            gray,
            scaleFactor=self.scale_factor,
            minNeighbors=self.min_neighbors,
            minSize=(min_size, min_size),
            outputRejectLevels=True,
        )
        boxes = [
            FaceBox(x=float(x), y=float(y), w=float(w), h=float(h), score=float(s)).scaled(1.0 / factor)
            for (x, y, w, h), s in zip(found, np.ravel(weights) if len(found) else [], strict=False)
        ]
        boxes.sort(key=lambda b: b.area, reverse=True)
        return boxes


class YuNetFaceDetector:
    """OpenCV's YuNet CNN detector (``cv2.FaceDetectorYN``) from a local ONNX file.

    Parameters
    ----------
    model_path : str
        Path of ``face_detection_yunet_*.onnx`` (never downloaded at run time).
    score_threshold : float, default=0.7
    nms_threshold : float, default=0.3
    """

    def __init__(self, *, model_path: str, score_threshold: float = 0.7, nms_threshold: float = 0.3) -> None:
        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"model_path: expected a YuNet ONNX file, received {model_path!r} (not found)")
        self.model_path = model_path
        self.score_threshold = check_real(score_threshold, "score_threshold", low=0.0, high=1.0)
        self.nms_threshold = check_real(nms_threshold, "nms_threshold", low=0.0, high=1.0)
        self._detector = cv2.FaceDetectorYN.create(model_path, "", (320, 320), self.score_threshold, self.nms_threshold)
        self._size: tuple[int, int] = (320, 320)

    def detect(self, image: NDArray[Any]) -> list[FaceBox]:
        img = np.asarray(image)
        if img.ndim == 2:
            img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
        size = (int(img.shape[1]), int(img.shape[0]))
        if size != self._size:
            self._detector.setInputSize(size)
            self._size = size
        _, faces = self._detector.detect(img)
        if faces is None:
            return []
        boxes = [FaceBox(x=float(f[0]), y=float(f[1]), w=float(f[2]), h=float(f[3]), score=float(f[14])) for f in faces]
        boxes.sort(key=lambda b: b.score, reverse=True)
        return boxes


def primary_face(boxes: Sequence[FaceBox], image_shape: tuple[int, ...]) -> FaceBox | None:
    """The face nearest the image centre among the larger half of ``boxes``.

    Portrait datasets (LFW) centre the subject; background faces are smaller
    and off-centre.
    """
    if not boxes:
        return None
    h, w = image_shape[0], image_shape[1]
    biggest = max(b.area for b in boxes)
    candidates = [b for b in boxes if b.area >= 0.5 * biggest]
    return min(candidates, key=lambda b: (b.center[0] - w / 2) ** 2 + (b.center[1] - h / 2) ** 2)
