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

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.imaging import FaceBox, FaceDetector, HaarFaceDetector, YuNetFaceDetector
from peep.edge.config import DetectorConfig
from peep.edge.errors import ConfigError


def build_detector(cfg: DetectorConfig) -> FaceDetector:
    """The tracking detector named by ``[detector]``."""
    try:
        if cfg.kind == "yunet":
            assert cfg.model_path is not None  # the config model guarantees it
            return YuNetFaceDetector(model_path=str(cfg.model_path), score_threshold=cfg.score_threshold)
        return HaarFaceDetector(
            scale_factor=cfg.scale_factor,
            min_neighbors=cfg.min_neighbors,
            min_size=cfg.min_size,
            detect_width=cfg.detect_width,
        )
    except FileNotFoundError as exc:
        raise ConfigError(f"detector.model_path: {exc}") from None
    except Exception as exc:  # OpenCV raises cv2.error for unreadable models
        raise ConfigError(f"detector.{'model_path' if cfg.kind == 'yunet' else 'kind'}: {exc}") from None


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
