"""The Laplace family of template mechanisms: ``peep``, ``peep-raw``, ``laplace-vector``, ``laplace-l1``.

Each clips its input into a public domain (a box or an L1 ball from the
bundle), then adds Laplace noise from the injected sampler, calibrated on the
sampler's grid (:mod:`peep.core.mechanisms.calibration`) so the stated ε holds
for what is released. See DESIGN "Privacy semantics" (docs/DESIGN.md).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.bounding import BundleBounds
from peep.core.mechanisms.base import PrivacyGuarantee, PublicParameters, TemplateMechanism, clip_to_ball
from peep.core.mechanisms.calibration import check_epsilon, laplace_on_grid
from peep.core.mechanisms.registry import register_mechanism
from peep.core.sampling import check_random_state, grid_inflation_l1, laplace_variance
from peep.core.validation import check_array, check_int, check_positive

__all__ = ["LaplaceL1Mechanism", "LaplaceVectorMechanism", "PeepMechanism", "PeepRawMechanism"]

FloatArray = NDArray[np.float64]


class _LaplaceTemplate(TemplateMechanism):
    scale: float

    def _perturb(self, X: FloatArray) -> FloatArray:
        return self._sampler.perturb_laplace(X, self.scale)


def _clip_unit(X: FloatArray) -> FloatArray:
    out: FloatArray = np.clip(X, 0.0, 1.0)
    return out


@register_mechanism
class PeepMechanism(_LaplaceTemplate):
    """``peep`` (paper mode): coordinates scaled to [0, 1], Laplace scale 1/ε each.

    The input must already be scaled to [0, 1] per coordinate with the
    bundle's public bounds; ``release`` clips to [0, 1] regardless.

    Parameters
    ----------
    epsilon : float
        ε per coordinate.
    n_components : int
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    scale : float
        ``(1 + γ)/ε``: sensitivity 1 per coordinate plus the grid inflation.
    guarantee : PrivacyGuarantee
        ε per coordinate, ``nc·ε`` per vector.

    Examples
    --------
    >>> print(PeepMechanism(epsilon=8, n_components=128).guarantee)
    ε=8 per coordinate, ε=1024 per vector (nc=128)
    """

    kind: ClassVar[str] = "peep"
    wire_name: ClassVar[str] = "MECHANISM_KIND_PEEP"
    domain: ClassVar[str] = "scaled"
    epsilon_scope: ClassVar[Literal["coordinate", "vector"]] = "coordinate"
    summary: ClassVar[str] = (
        "paper mode: coordinates scaled to [0,1] with the bundle's box, Laplace(1/ε) each; "
        "ε per coordinate, nc·ε per template"
    )

    def __init__(self, *, epsilon: float, n_components: int, random_state: object = None) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.n_components = check_int(n_components, "n_components", low=1)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = laplace_on_grid(self._sampler, self.epsilon, 1.0, 1)
        self.guarantee = PrivacyGuarantee(
            epsilon_coordinate=self.epsilon,
            epsilon_vector=self.n_components * self.epsilon,
            n_components=self.n_components,
            description=(
                "peep: coordinates scaled to [0,1] with public bounds and clipped, Laplace "
                "scale 1/ε per coordinate; the vector composes to nc·ε"
            ),
        )
        self._set_noise_summary(laplace_variance(self.scale, self.grid_step))

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        return cls(epsilon=epsilon, n_components=public.n_components, random_state=random_state)

    @classmethod
    def epsilon_for_vector(
        cls, bounds: BundleBounds, epsilon_vector: float, *, delta: float | None = None, random_state: object = None
    ) -> float:
        return float(epsilon_vector) / bounds.n_components

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        return np.zeros(self.n_components), np.ones(self.n_components)

    def _clip(self, X: FloatArray) -> FloatArray:
        return _clip_unit(X)


@register_mechanism
class PeepRawMechanism(_LaplaceTemplate):
    """``peep-raw``: Laplace scale 1/ε on unscaled coefficients clipped to public bounds.

    The reading that reproduces the paper's accuracy: the noise scale is 1/ε
    whatever the coordinate's range, so the honest guarantee grows with the
    range: ``ε·(hi_j − lo_j)`` for coordinate ``j`` and ``ε·Σ_j(hi_j − lo_j)``
    per vector (plus the grid inflation ``ε·γ`` per coordinate with the
    secure sampler).

    Parameters
    ----------
    epsilon : float
        The nominal ε (noise scale 1/ε); NOT the guarantee.
    lower, upper : array_like of shape (n_components,)
        The bundle's public per-coordinate bounds, ``lower <= upper``.
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    scale : float
        ``1/ε``.
    epsilon_per_coordinate : ndarray of shape (n_components,)
        Honest ε of each coordinate, ``(hi_j − lo_j + γ)/scale``.
    guarantee : PrivacyGuarantee
        Worst coordinate's ε and the vector's ``Σ_j`` of the above.
    """

    kind: ClassVar[str] = "peep-raw"
    wire_name: ClassVar[str] = "MECHANISM_KIND_PEEP_RAW"
    domain: ClassVar[str] = "box_clipped"
    epsilon_scope: ClassVar[Literal["coordinate", "vector"]] = "coordinate"
    summary: ClassVar[str] = (
        "the reading that reproduces the paper's accuracy: Laplace(1/ε) on unscaled coefficients clipped to "
        "[lo_j, hi_j]; honest ε·(hi_j − lo_j) per coordinate, ε·Σ(hi_j − lo_j) per template"
    )

    def __init__(
        self,
        *,
        epsilon: float,
        lower: ArrayLike,
        upper: ArrayLike,
        random_state: object = None,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        lo = check_array(lower, "lower", ndim=1)
        hi = check_array(upper, "upper", ndim=1, n_features=lo.shape[0])
        if np.any(hi < lo):
            j = int(np.flatnonzero(hi < lo)[0])
            raise ValueError(
                f"upper: expected upper >= lower for every coordinate, received upper[{j}]={hi[j]} < lower[{j}]={lo[j]}"
            )
        self.lower: FloatArray = lo.copy()
        self.upper: FloatArray = hi.copy()
        self.lower.setflags(write=False)
        self.upper.setflags(write=False)
        self.n_components = int(lo.shape[0])
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale = 1.0 / self.epsilon
        self.grid_step = self._sampler.grid_step(self.scale)
        width = self.upper - self.lower
        inflation = grid_inflation_l1(self.grid_step, 1)
        self.epsilon_per_coordinate: FloatArray = (width + inflation) / self.scale
        self.epsilon_per_coordinate.setflags(write=False)
        self.guarantee = PrivacyGuarantee(
            epsilon_coordinate=float(self.epsilon_per_coordinate.max()),
            epsilon_vector=math.fsum(self.epsilon_per_coordinate.tolist()),
            n_components=self.n_components,
            description=(
                f"peep-raw: Laplace scale 1/ε (ε={self.epsilon:g}) on coefficients clipped to "
                "public bounds [lo_j, hi_j]; honest ε is ε·(hi_j − lo_j) per coordinate and "
                "ε·Σ(hi_j − lo_j) per vector"
            ),
        )
        self._set_noise_summary(laplace_variance(self.scale, self.grid_step))

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        mechanism = cls(
            epsilon=epsilon,
            lower=public.require("lower", cls.kind),
            upper=public.require("upper", cls.kind),
            random_state=random_state,
        )
        nc = check_int(public.n_components, "n_components", low=1)
        if mechanism.n_components != nc:
            raise ValueError(
                f"n_components: expected {mechanism.n_components} (the length of lower/upper), received {nc}"
            )
        return mechanism

    @classmethod
    def epsilon_for_vector(
        cls, bounds: BundleBounds, epsilon_vector: float, *, delta: float | None = None, random_state: object = None
    ) -> float:
        # The guarantee is linear in ε (Σ_j (hi_j − lo_j + γ)·ε): calibrate with a probe at ε = 1,
        # on the caller's sampler so its grid inflation counts.
        probe = cls.from_bounds(bounds, epsilon=1.0, random_state=random_state)
        return float(epsilon_vector) / float(probe.guarantee.epsilon_vector)

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        return self.lower.copy(), self.upper.copy()

    def _clip(self, X: FloatArray) -> FloatArray:
        out: FloatArray = np.clip(X, self.lower, self.upper)
        return out


@register_mechanism
class LaplaceVectorMechanism(_LaplaceTemplate):
    """``laplace-vector``: coordinates in [0, 1], Laplace scale nc/ε ⇒ ε per vector.

    Parameters
    ----------
    epsilon : float
        ε per vector.
    n_components : int
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    scale : float
        ``nc·(1 + γ)/ε`` (L1 sensitivity nc plus grid inflation nc·γ).
    guarantee : PrivacyGuarantee
        ε per vector, ε/nc per coordinate.
    """

    kind: ClassVar[str] = "laplace-vector"
    wire_name: ClassVar[str] = "MECHANISM_KIND_LAPLACE_VECTOR"
    domain: ClassVar[str] = "scaled"
    # The same noise as ``peep`` at per-coordinate ε/nc: searching both would count one point twice.
    frontier: ClassVar[bool] = False
    summary: ClassVar[str] = "coordinates scaled to [0,1], Laplace(nc/ε) each; ε per template, ε/nc per coordinate"

    def __init__(self, *, epsilon: float, n_components: int, random_state: object = None) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.n_components = nc = check_int(n_components, "n_components", low=1)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = laplace_on_grid(self._sampler, self.epsilon, float(nc), nc)
        self.guarantee = PrivacyGuarantee(
            epsilon_coordinate=self.epsilon / nc,
            epsilon_vector=self.epsilon,
            n_components=nc,
            description=(
                "laplace-vector: coordinates scaled to [0,1] and clipped (L1 sensitivity nc), "
                "Laplace scale nc/ε per coordinate"
            ),
        )
        self._set_noise_summary(laplace_variance(self.scale, self.grid_step))

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        return cls(epsilon=epsilon, n_components=public.n_components, random_state=random_state)

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        return np.zeros(self.n_components), np.ones(self.n_components)

    def _clip(self, X: FloatArray) -> FloatArray:
        return _clip_unit(X)


@register_mechanism
class LaplaceL1Mechanism(_LaplaceTemplate):
    """``laplace-l1``: clip to an L1 ball of radius R₁, Laplace scale 2R₁/ε ⇒ ε per vector.

    Parameters
    ----------
    epsilon : float
        ε per vector.
    radius : float
        Public L1 radius R₁ (from the bundle).
    n_components : int
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    scale : float
        ``(2R₁ + nc·γ)/ε``.
    guarantee : PrivacyGuarantee
        ε per vector; per coordinate ``(2R₁ + γ)/scale`` (<= ε: one
        coordinate also moves by at most 2R₁).
    """

    kind: ClassVar[str] = "laplace-l1"
    wire_name: ClassVar[str] = "MECHANISM_KIND_LAPLACE_L1"
    domain: ClassVar[str] = "l1_clipped"
    summary: ClassVar[str] = "coefficients clipped to an L1 ball of radius R₁, Laplace(2R₁/ε) each; ε per template"

    def __init__(
        self,
        *,
        epsilon: float,
        radius: float,
        n_components: int,
        random_state: object = None,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.radius = check_positive(radius, "radius")
        self.n_components = nc = check_int(n_components, "n_components", low=1)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = laplace_on_grid(self._sampler, self.epsilon, 2.0 * self.radius, nc)
        self.guarantee = PrivacyGuarantee(
            epsilon_coordinate=min(
                self.epsilon,
                (2.0 * self.radius + grid_inflation_l1(self.grid_step, 1)) / self.scale,
            ),
            epsilon_vector=self.epsilon,
            n_components=nc,
            description=(
                "laplace-l1: coefficients clipped to an L1 ball of radius R₁ (sensitivity 2R₁), "
                "Laplace scale 2R₁/ε per coordinate"
            ),
        )
        self._set_noise_summary(laplace_variance(self.scale, self.grid_step))

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        return cls(
            epsilon=epsilon,
            radius=public.require("radius_l1", cls.kind),
            n_components=public.n_components,
            random_state=random_state,
        )

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        return np.full(self.n_components, -self.radius), np.full(self.n_components, self.radius)

    def _clip(self, X: FloatArray) -> FloatArray:
        return clip_to_ball(X, self.radius, 1)
