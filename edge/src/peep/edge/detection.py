"""Detector construction from config, and box refinement for releases.

Tracking runs on a fast detector (Haar on a downscaled frame, or YuNet). A
release, though, must crop the face exactly as the bundle's faces were
cropped, or the eigenface coefficients shift (train/serve skew). With
``detector.refine`` the agent re-detects the face at full resolution in a
region around the tracked box, using the detector settings recorded in the
bundle's ``normalisation`` metadata, and falls back to the tracked box when
that finds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.imaging import FaceBox, FaceDetector, HaarFaceDetector, YuNetFaceDetector, to_gray
from peep.edge.config import DetectorConfig
from peep.edge.errors import ConfigError
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.detection")


class DlibHogFaceDetector:
    """dlib's HOG + linear SVM frontal-face detector (compiled into the ``dlib-bin`` wheel: no model file).

    Its window is 80 px: each pyramid upsampling halves the smallest face it finds (about 40 px at
    ``upsample=1``) and roughly quadruples its time, so a camera trades the two with ``detect_width`` (frames
    scaled to this width first) and ``upsample``.

    Parameters
    ----------
    upsample : int, default=1
        Times the image is doubled before detecting (0-3).
    detect_width : int or None, default=None
        Downscale frames wider than this before detecting; boxes are mapped back to the frame.
    min_size : int, default=0
        Drop boxes smaller than this, pixels of the full frame.
    score_threshold : float, default=0.0
        Drop boxes whose SVM score is below this (dlib's own threshold is 0).

    Raises
    ------
    ImportError
        dlib is not installed (the message names the extra that installs it).
    """

    def __init__(
        self, *, upsample: int = 1, detect_width: int | None = None, min_size: int = 0, score_threshold: float = 0.0
    ) -> None:
        try:
            import dlib
        except ImportError as exc:
            raise ImportError(
                "dlib is not installed: the HOG detector needs it (pip install 'peep-edge[dlib]')"
            ) from exc
        if isinstance(upsample, bool) or not isinstance(upsample, int) or not 0 <= upsample <= 3:
            raise ValueError(f"upsample: expected a whole number 0-3, received {upsample!r}")
        if detect_width is not None and (not isinstance(detect_width, int) or detect_width < 32):
            raise ValueError(f"detect_width: expected a whole number >= 32 or None, received {detect_width!r}")
        self.upsample = upsample
        self.detect_width = detect_width
        self.min_size = int(min_size)
        self.score_threshold = float(score_threshold)
        self._detector = dlib.get_frontal_face_detector()

    def detect(self, image: NDArray[Any]) -> list[FaceBox]:
        import cv2

        gray = to_gray(image)
        factor = 1.0
        if self.detect_width is not None and gray.shape[1] > self.detect_width:
            factor = self.detect_width / gray.shape[1]
            gray = np.asarray(cv2.resize(gray, None, fx=factor, fy=factor, interpolation=cv2.INTER_AREA), np.uint8)
        rects, scores, _ = self._detector.run(np.ascontiguousarray(gray, dtype=np.uint8), self.upsample, 0.0)
        h, w = gray.shape[:2]
        boxes = []
        for r, score in zip(rects, scores, strict=True):
            x0, y0 = max(0, r.left()), max(0, r.top())
            x1, y1 = min(w, r.right() + 1), min(h, r.bottom() + 1)
            box = FaceBox(x=float(x0), y=float(y0), w=float(x1 - x0), h=float(y1 - y0), score=float(score))
            box = box.scaled(1.0 / factor)
            if box.w >= self.min_size and box.h >= self.min_size and score >= self.score_threshold:
                boxes.append(box)
        boxes.sort(key=lambda b: b.area, reverse=True)
        return boxes


def resolve_kind(cfg: DetectorConfig) -> tuple[str, str | None, str]:
    """(detector kind, YuNet file or None, why) for ``[detector]``, ``auto`` resolved.

    ``auto`` is YuNet where its file is (``model_path``, else where ``peep-edge models fetch yunet`` puts it),
    measured on scenes as the only detector here that finds faces from 30 px at camera frame rates on one
    core; without the file, Haar, as before there was a choice.
    """
    if cfg.kind != "auto":
        return cfg.kind, None if cfg.model_path is None else str(cfg.model_path), f"detector.kind = {cfg.kind!r}"
    from peep.edge.models import MODELS, default_models_dir

    if cfg.model_path is not None:
        return "yunet", str(cfg.model_path), "detector.kind 'auto' with detector.model_path"
    fetched = default_models_dir() / MODELS["yunet"].filename
    if fetched.is_file():
        return "yunet", str(fetched), f"detector.kind 'auto': YuNet found at {fetched}"
    return (
        "haar",
        None,
        (
            f"detector.kind 'auto': no YuNet file at {fetched} (peep-edge models fetch yunet puts it there); "
            "Haar finds few faces under 64 px"
        ),
    )


def build_detector(cfg: DetectorConfig) -> FaceDetector:
    """The tracking detector named by ``[detector]`` (``auto`` resolved by :func:`resolve_kind`)."""
    kind, model_path, why = resolve_kind(cfg)
    if cfg.kind == "auto":
        log_event(_log, logging.INFO if kind == "yunet" else logging.WARNING, "detector_chosen", kind=kind, reason=why)
    try:
        if kind == "yunet":
            assert model_path is not None  # the config model, or resolve_kind, guarantees it
            return YuNetFaceDetector(model_path=model_path, score_threshold=cfg.score_threshold)
        if kind == "hog":
            return DlibHogFaceDetector(
                upsample=cfg.upsample, detect_width=cfg.detect_width, min_size=cfg.min_size, score_threshold=0.0
            )
        return HaarFaceDetector(
            scale_factor=cfg.scale_factor,
            min_neighbors=cfg.min_neighbors,
            min_size=cfg.min_size,
            detect_width=cfg.detect_width,
        )
    except FileNotFoundError as exc:
        raise ConfigError(f"detector.model_path: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"detector.kind: {exc}") from None
    except Exception as exc:  # OpenCV raises cv2.error for unreadable models
        raise ConfigError(f"detector.{'model_path' if kind == 'yunet' else 'kind'}: {exc}") from None


class BoxRefiner:
    """Re-detect a face at full resolution with the bundle's Haar settings.

    Parameters
    ----------
    normalisation : mapping
        The bundle's ``normalisation`` metadata. Refinement is only possible
        when it records a Haar detector (``"detector": "HaarFaceDetector"``);
        otherwise :meth:`refine` returns the box unchanged.
    margin : float
        Search region = the box grown by this fraction on every side.
    """

    def __init__(self, normalisation: Mapping[str, Any], *, margin: float = 0.5) -> None:
        self.margin = margin
        self._detector: HaarFaceDetector | None = None
        if normalisation.get("detector") == "HaarFaceDetector":
            self._detector = HaarFaceDetector(
                scale_factor=float(normalisation.get("scale_factor", 1.1)),
                min_neighbors=int(normalisation.get("min_neighbors", 5)),
                min_size=int(normalisation.get("min_size", 40)),
                detect_width=None,
            )

    @property
    def active(self) -> bool:
        return self._detector is not None

    def refine(self, image: NDArray[Any], box: FaceBox) -> FaceBox:
        if self._detector is None:
            return box
        h, w = image.shape[:2]
        mx, my = box.w * self.margin, box.h * self.margin
        x0, y0 = max(0, int(box.x - mx)), max(0, int(box.y - my))
        x1, y1 = min(w, int(np.ceil(box.x + box.w + mx))), min(h, int(np.ceil(box.y + box.h + my)))
        if x1 - x0 < 16 or y1 - y0 < 16:
            return box
        found = self._detector.detect(image[y0:y1, x0:x1])
        if not found:
            return box
        cx, cy = box.center
        best = min(found, key=lambda b: (b.center[0] + x0 - cx) ** 2 + (b.center[1] + y0 - cy) ** 2)
        refined = FaceBox(x=best.x + x0, y=best.y + y0, w=best.w, h=best.h, score=best.score)
        return refined if refined.iou(box) > 0.2 else box
