"""The Gaussian family of template mechanisms: ``gaussian-l2``.

Rotation-invariant: the input is clipped to an L2 ball from the bundle and
perturbed with analytic-Gaussian noise (Balle & Wang 2018) calibrated on the
secure sampler's grid (:mod:`peep.core.mechanisms.calibration`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray
from peep.core.mechanisms.base import PrivacyGuarantee, PublicParameters, TemplateMechanism, clip_to_ball
from peep.core.mechanisms.calibration import check_delta, check_epsilon, gaussian_on_grid
from peep.core.mechanisms.registry import register_mechanism
from peep.core.sampling import check_random_state, gaussian_variance
from peep.core.validation import check_int, check_positive

__all__ = ["GaussianL2Mechanism"]

FloatArray = NDArray[np.float64]


def _require_delta(delta: float | None, kind: str) -> float:
    if delta is None:
        raise ValueError(f"delta: expected a value for mechanism kind {kind!r}, received None")
    return delta


@register_mechanism
class GaussianL2Mechanism(TemplateMechanism):
    """``gaussian-l2``: clip to an L2 ball of radius R, analytic Gaussian noise.

    The (centred) PCA coefficients are scaled by ``min(1, R/‖x‖₂)``, so two
    templates differ by at most ``2R`` in L2; σ comes from
    :func:`analytic_gaussian_sigma` at sensitivity ``2R + γ·√nc``.
    Rotation-invariant.

    Parameters
    ----------
    epsilon, delta : float
        (ε, δ) per vector; δ in (0, 1).
    radius : float
        Public L2 radius R (from the bundle).
    n_components : int
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    sigma : float
    guarantee : PrivacyGuarantee
        (ε, δ) per vector; the same (ε, δ) per coordinate, since a coordinate
        is a post-processing of the vector (no tighter claim is made).
    """

    kind: ClassVar[str] = "gaussian-l2"
    wire_name: ClassVar[str] = "MECHANISM_KIND_GAUSSIAN_L2"
    domain: ClassVar[str] = "l2_clipped"
    takes_delta: ClassVar[bool] = True
    summary: ClassVar[str] = (
        "coefficients clipped to an L2 ball of radius R, analytic Gaussian noise; (ε, δ) per template"
    )

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        radius: float,
        n_components: int,
        random_state: object = None,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.radius = check_positive(radius, "radius")
        self.n_components = nc = check_int(n_components, "n_components", low=1)
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.sigma, self.grid_step = gaussian_on_grid(self._sampler, self.epsilon, self.delta, 2.0 * self.radius, nc)
        self.guarantee = PrivacyGuarantee(
            epsilon_coordinate=self.epsilon,
            epsilon_vector=self.epsilon,
            delta=self.delta,
            n_components=nc,
            description=(
                "gaussian-l2: coefficients clipped to an L2 ball of radius R (sensitivity 2R), "
                "analytic Gaussian noise; a coordinate is post-processing of the vector"
            ),
        )
        self._set_noise_summary(gaussian_variance(self.sigma, self.grid_step))

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        return cls(
            epsilon=epsilon,
            delta=_require_delta(delta, cls.kind),
            radius=public.require("radius_l2", cls.kind),
            n_components=public.n_components,
            random_state=random_state,
        )

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        return np.full(self.n_components, -self.radius), np.full(self.n_components, self.radius)

    def _clip(self, X: FloatArray) -> FloatArray:
        return clip_to_ball(X, self.radius, 2)

    def _perturb(self, X: FloatArray) -> FloatArray:
        return self._sampler.perturb_gaussian(X, self.sigma)
