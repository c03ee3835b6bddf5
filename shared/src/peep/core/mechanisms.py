"""Local differential privacy mechanisms for scalars and eigenface templates.

Following diffprivlib's mechanisms: keyword-only parameters validated at
construction (wrong type → ``TypeError``, out of range → ``ValueError``, each
naming the parameter), and every mechanism states its guarantee and its exact
noise variance.

Scalar mechanisms
    :class:`LaplaceMechanism`, :class:`GaussianMechanism` (analytic Gaussian
    calibration of Balle & Wang 2018, :func:`analytic_gaussian_sigma`).

Template mechanisms (one class per ``kind``, see docs/DESIGN.md, "Privacy semantics")
    ``peep`` (:class:`PeepMechanism`), ``peep-raw`` (:class:`PeepRawMechanism`),
    ``laplace-vector`` (:class:`LaplaceVectorMechanism`), ``gaussian-l2``
    (:class:`GaussianL2Mechanism`) and ``laplace-l1``
    (:class:`LaplaceL1Mechanism`); :func:`make_mechanism` builds one by name.
    ``release(X)`` always clips ``X`` into the mechanism's domain first: the
    sensitivity, and hence ε, holds whatever the caller passes.

Sensitivity comes from fixed public bounds (from the eigenface bundle), never
from the data being released; :func:`bounds_from_data` exists for experiments
and warns with :class:`~peep.core.exceptions.PrivacyLeakWarning`.

Grid inflation
--------------
With the secure sampler the output is rounded to a power-of-two grid of step
``γ <= scale·2**-20`` (see :mod:`peep.core.sampling`), which can enlarge a
sensitivity by ``γ`` per coordinate. Each mechanism adds that inflation to its
sensitivity before calibrating the noise, so the stated ε (and δ) hold exactly
for what is released. The noise grows by a relative ``≈ k·2**-20/ε`` with
``k = 1`` for per-coordinate calibration (``peep``: 1e-6 at ε = 1) and
``k = nc`` for the L1 vector mechanisms (``laplace-vector``, ``laplace-l1``:
1.2e-4 at nc = 128, ε = 1); for ``gaussian-l2`` it is ``√nc·2**-20·σ/Δ₂``
(4e-5 at nc = 128, ε = 1, δ = 1e-5). Only for absurdly small ε (around
``k·2**-20`` and below) does the grid become comparable with the data and the
inflation large; where no calibration exists ``ValueError`` is raised.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core._validation import check_array, check_int, check_positive, check_real
from peep.core.exceptions import PrivacyLeakWarning
from peep.core.sampling import (
    NoiseSampler,
    check_random_state,
    gaussian_variance,
    grid_inflation_l1,
    grid_inflation_l2,
    laplace_variance,
)

__all__ = [
    "MECHANISM_KINDS",
    "GaussianL2Mechanism",
    "GaussianMechanism",
    "LaplaceL1Mechanism",
    "LaplaceMechanism",
    "LaplaceVectorMechanism",
    "PeepMechanism",
    "PeepRawMechanism",
    "PrivacyGuarantee",
    "TemplateMechanism",
    "analytic_gaussian_sigma",
    "bounds_from_data",
    "classic_gaussian_sigma",
    "make_mechanism",
]

FloatArray = NDArray[np.float64]

#: Names accepted by :func:`make_mechanism` (and by configs and the CLI).
MECHANISM_KINDS: Final = ("peep", "peep-raw", "laplace-vector", "gaussian-l2", "laplace-l1")

# Float rounding of x·(R/‖x‖) can leave ‖result‖ a few ulps above R; shrinking
# by 2**-32 keeps the clipped norm <= R for any d < 2**20, so the sensitivity
# 2R is never exceeded. The distortion (2e-10 relative) is far below the noise.
_NORM_SAFETY: Final = 1.0 - 2.0**-32
# Noise scales beyond this are meaningless (and would overflow downstream).
_MAX_SCALE: Final = 1e300


# --------------------------------------------------------------------------- guarantee


def _fmt(v: float) -> str:
    return f"{v:.6g}"


@dataclass(frozen=True, kw_only=True)
class PrivacyGuarantee:
    """What one release of a mechanism guarantees.

    Attributes
    ----------
    epsilon_coordinate : float
        ε for any single released coordinate (the worst coordinate).
    epsilon_vector : float
        ε for the whole released vector (what protects the person).
    delta : float
        δ (0 for pure ε-LDP), for both the coordinate and the vector.
    n_components : int
        Number of coordinates ``nc`` in one release.
    description : str
        One sentence saying how the numbers arise.

    Examples
    --------
    >>> print(PrivacyGuarantee(epsilon_coordinate=8.0, epsilon_vector=1024.0,
    ...                        n_components=128, description="peep"))
    ε=8 per coordinate, ε=1024 per vector (nc=128)
    """

    epsilon_coordinate: float
    epsilon_vector: float
    delta: float = 0.0
    n_components: int
    description: str

    def __str__(self) -> str:
        text = (
            f"ε={_fmt(self.epsilon_coordinate)} per coordinate, "
            f"ε={_fmt(self.epsilon_vector)} per vector (nc={self.n_components})"
        )
        if self.delta:
            text += f", δ={self.delta:g}"
        return text


# --------------------------------------------------------------------------- Gaussian calibration


def _check_epsilon(epsilon: Any) -> float:
    return check_positive(epsilon, "epsilon")


def _check_delta(delta: Any) -> float:
    return check_real(delta, "delta", low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)


def _log_delta(u: float, epsilon: float) -> float:
    """log δ(σ) of the Gaussian mechanism for ``u = σ/Δ`` (Balle & Wang 2018, Thm 8).

    δ = Φ(1/(2u) − εu) − e^ε·Φ(−1/(2u) − εu), evaluated in log space so that
    e^ε never overflows (ε up to 1e4 and beyond).
    """
    # Imported here: only gaussian-l2 calibration needs scipy, and a device
    # running a Laplace mechanism should not pay its import memory.
    from scipy.special import log_ndtr

    a = 0.5 / u - epsilon * u
    b = -0.5 / u - epsilon * u
    log_pa = float(log_ndtr(a))
    r = epsilon + float(log_ndtr(b)) - log_pa  # log of e^ε·Φ(b)/Φ(a), < 0
    if r >= 0.0:
        return -math.inf  # numerically no δ left (only at extreme u)
    return log_pa + math.log(-math.expm1(r))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest σ for which the Gaussian mechanism is (ε, δ)-DP, for any ε > 0.

    The analytic Gaussian mechanism (Balle & Wang 2018, Thm 8 / Alg. 1): the
    exact condition ``Φ(Δ/2σ − εσ/Δ) − e^ε·Φ(−Δ/2σ − εσ/Δ) <= δ``, solved by
    bisection on ``σ/Δ`` in log space (``scipy.special.log_ndtr``). The result
    is the upper end of the final bracket, so the condition holds for it.

    Parameters
    ----------
    epsilon : float
        ε > 0 (no upper limit, unlike the classic formula).
    delta : float
        δ in (0, 1).
    sensitivity : float
        L2 sensitivity Δ > 0.

    Returns
    -------
    float
        σ, linear in Δ.

    Examples
    --------
    >>> round(analytic_gaussian_sigma(1.0, 1e-5, 1.0), 3)
    3.731
    """
    epsilon = _check_epsilon(epsilon)
    delta = _check_delta(delta)
    sensitivity = check_positive(sensitivity, "sensitivity")
    log_target = math.log(delta)
    hi = 1.0
    while _log_delta(hi, epsilon) > log_target:
        hi *= 2.0
    lo = hi / 2.0
    while lo > 1e-300 and _log_delta(lo, epsilon) <= log_target:
        lo /= 2.0
    # Bisection in log u: δ(u) is decreasing, so keep δ(lo) > target >= δ(hi).
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        if _log_delta(mid, epsilon) <= log_target:
            hi = mid
        else:
            lo = mid
    return hi * sensitivity


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The classic calibration ``σ = Δ·√(2 ln(1.25/δ))/ε`` (Dwork & Roth, Thm A.1).

    Only valid for ε < 1 (the proof needs it), and larger than the analytic σ
    there; kept for comparison. ε >= 1 raises ``ValueError`` rather than
    returning a σ that guarantees nothing.
    """
    epsilon = check_real(epsilon, "epsilon", low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
    delta = _check_delta(delta)
    sensitivity = check_positive(sensitivity, "sensitivity")
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


# --------------------------------------------------------------------------- grid calibration


def _calibrate_on_grid(
    scale_for: Callable[[float], float],
    sensitivity: float,
    inflation: Callable[[float], float],
    sampler: NoiseSampler,
    epsilon: float,
) -> tuple[float, float]:
    """Noise scale ``s`` with ``s >= scale_for(sensitivity + inflation(grid_step(s)))``.

    The grid step depends on the scale, so iterate to a fixed point; the
    sequence of scales increases and the step is a power of two, so it
    settles in two or three rounds unless the grid would outgrow the
    sensitivity (absurdly small ε), which raises.

    Returns
    -------
    (scale, step)
    """
    scale = scale_for(sensitivity)
    for _ in range(64):
        if not scale < _MAX_SCALE:  # also NaN: ε so small that the scale overflows
            break
        step = sampler.grid_step(scale)
        new_scale = scale_for(sensitivity + inflation(step))
        if not new_scale < _MAX_SCALE:
            break
        if sampler.grid_step(new_scale) <= step:
            return new_scale, sampler.grid_step(new_scale)
        scale = new_scale
    raise ValueError(
        "epsilon: expected a value large enough that the secure sampler's grid "
        f"(step <= scale·2**-20) stays below the sensitivity {sensitivity:g}, received "
        f"{epsilon:g} (the noise scale would exceed {scale:g})"
    )


def _laplace_on_grid(sampler: NoiseSampler, epsilon: float, sensitivity: float, dim: int) -> tuple[float, float]:
    """(scale, step) of Laplace noise giving ε for an L1 sensitivity over ``dim`` grid-rounded coordinates."""
    return _calibrate_on_grid(lambda d: d / epsilon, sensitivity, lambda g: grid_inflation_l1(g, dim), sampler, epsilon)


def _gaussian_on_grid(
    sampler: NoiseSampler, epsilon: float, delta: float, sensitivity: float, dim: int
) -> tuple[float, float]:
    """(sigma, step) of the analytic Gaussian for an L2 sensitivity over ``dim`` grid-rounded coordinates."""
    unit = analytic_gaussian_sigma(epsilon, delta, 1.0)
    return _calibrate_on_grid(lambda d: d * unit, sensitivity, lambda g: grid_inflation_l2(g, dim), sampler, epsilon)


# --------------------------------------------------------------------------- scalar


class _ScalarMechanism:
    """Shared by the scalar mechanisms: ``randomise`` over a float or an array."""

    _sampler: NoiseSampler

    def _perturb(self, arr: FloatArray) -> FloatArray:
        raise NotImplementedError

    def randomise(self, x: float | ArrayLike) -> Any:
        """Return ``x`` plus noise: a float for a scalar, an ndarray of ``x``'s shape otherwise."""
        if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
            value = check_real(x, "x")
            return float(self._perturb(np.array([value]))[0])
        return self._perturb(check_array(x, "x", ndim=tuple(range(0, 8))))


class LaplaceMechanism(_ScalarMechanism):
    """The Laplace mechanism for a real value (or each entry of an array).

    Parameters
    ----------
    epsilon : float
        ε > 0 per value.
    sensitivity : float, default 1.0
        L1 sensitivity Δ of the value (the caller's promise; the scalar
        mechanism does not clip).
    random_state : None, NoiseSampler, int or Generator
        ``None`` uses the secure sampler; seeds require the ``"seeded-noise"``
        feature.

    Attributes
    ----------
    scale : float
        Laplace scale ``(Δ + γ)/ε`` (``Δ/ε`` for a continuous sampler).
    grid_step : float
        Output grid ``γ`` (0.0 for a continuous sampler).
    variance : float
        Exact variance of the noise: ``2q/(1−q)²·γ²`` with ``q = exp(−γ/scale)``
        on the grid, ``2·scale²`` for a continuous sampler.
    is_secure : bool

    Examples
    --------
    >>> m = LaplaceMechanism(epsilon=1.0, sensitivity=1.0)
    >>> m.is_secure, round(m.scale, 4)
    (True, 1.0)
    """

    def __init__(self, *, epsilon: float, sensitivity: float = 1.0, random_state: object = None) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.sensitivity = check_positive(sensitivity, "sensitivity")
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = _laplace_on_grid(self._sampler, self.epsilon, self.sensitivity, 1)
        self.variance = laplace_variance(self.scale, self.grid_step)
        self.is_secure = bool(self._sampler.is_secure)
        self.delta = 0.0

    def __repr__(self) -> str:
        return (
            f"LaplaceMechanism(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r}, "
            f"random_state={self.random_state!r})"
        )

    def _perturb(self, arr: FloatArray) -> FloatArray:
        return self._sampler.perturb_laplace(arr, self.scale)


class GaussianMechanism(_ScalarMechanism):
    """The (analytic) Gaussian mechanism for a real value or vector.

    Parameters
    ----------
    epsilon : float
        ε > 0 (any size: the analytic calibration has no ε < 1 restriction).
    delta : float
        δ in (0, 1).
    sensitivity : float
        L2 sensitivity Δ₂ of the value or vector (the caller's promise).
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    sigma : float
        Noise standard deviation from :func:`analytic_gaussian_sigma` at
        sensitivity ``Δ₂ + γ`` (the grid inflation for one coordinate; arrays
        are treated as independent scalars each with sensitivity Δ₂).
    grid_step : float
    variance : float
        ``σ²`` (exact, see :func:`peep.core.sampling.gaussian_variance`).

    Notes
    -----
    On the secure grid the noise is a discrete Gaussian of parameter
    ``σ/γ >= 2**20`` grid units. Its (ε, δ) curve equals the continuous
    Gaussian's up to discretisation corrections of relative order ``γ/σ``
    (≈ 1e-6); CKS 2020 §4 show the two curves indistinguishable at such σ.
    Its ρ-zCDP guarantee ``ρ = Δ²/2σ²`` holds exactly.
    """

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        sensitivity: float,
        random_state: object = None,
    ) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.delta = _check_delta(delta)
        self.sensitivity = check_positive(sensitivity, "sensitivity")
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.sigma, self.grid_step = _gaussian_on_grid(self._sampler, self.epsilon, self.delta, self.sensitivity, 1)
        self.variance = gaussian_variance(self.sigma, self.grid_step)
        self.is_secure = bool(self._sampler.is_secure)

    def __repr__(self) -> str:
        return (
            f"GaussianMechanism(epsilon={self.epsilon!r}, delta={self.delta!r}, "
            f"sensitivity={self.sensitivity!r}, random_state={self.random_state!r})"
        )

    def _perturb(self, arr: FloatArray) -> FloatArray:
        return self._sampler.perturb_gaussian(arr, self.sigma)


# --------------------------------------------------------------------------- templates


class TemplateMechanism:
    """Base of the template mechanisms: clip into the domain, then perturb.

    Subclasses set, at construction: ``n_components``, ``epsilon``,
    ``delta``, ``guarantee``, ``variance`` (ndarray of shape
    (n_components,)), ``noise_std`` (root-mean-square noise per coordinate),
    ``grid_step`` and ``is_secure``.
    """

    kind: ClassVar[str]
    n_components: int
    epsilon: float
    delta: float
    guarantee: PrivacyGuarantee
    variance: FloatArray
    noise_std: float
    grid_step: float
    is_secure: bool
    _sampler: NoiseSampler

    def _set_noise_summary(self, per_coordinate_variance: float) -> None:
        self.variance = np.full(self.n_components, per_coordinate_variance, dtype=np.float64)
        self.noise_std = math.sqrt(float(np.mean(self.variance)))
        self.is_secure = bool(self._sampler.is_secure)

    def clip(self, X: ArrayLike) -> FloatArray:
        """Project ``X`` into the mechanism's domain.

        Parameters
        ----------
        X : array_like of shape (n_components,) or (n_samples, n_components)

        Returns
        -------
        ndarray of the same shape
        """
        arr = check_array(X, "X", ndim=(1, 2), n_features=self.n_components)
        return self._clip(arr)

    def _clip(self, X: FloatArray) -> FloatArray:
        raise NotImplementedError

    def _perturb(self, X: FloatArray) -> FloatArray:
        raise NotImplementedError

    def release(self, X: ArrayLike) -> FloatArray:
        """Clip ``X`` into the domain (never trusting the caller), then add noise.

        Parameters
        ----------
        X : array_like of shape (n_components,) or (n_samples, n_components)
            One template or a batch (each row is a separate release with the
            guarantee :attr:`guarantee`).

        Returns
        -------
        ndarray of the same shape, float64
        """
        return self._perturb(self.clip(X))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, {self.guarantee})"


class _LaplaceTemplate(TemplateMechanism):
    scale: float

    def _perturb(self, X: FloatArray) -> FloatArray:
        return self._sampler.perturb_laplace(X, self.scale)


def _clip_unit(X: FloatArray) -> FloatArray:
    out: FloatArray = np.clip(X, 0.0, 1.0)
    return out


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

    def __init__(self, *, epsilon: float, n_components: int, random_state: object = None) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.n_components = check_int(n_components, "n_components", low=1)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = _laplace_on_grid(self._sampler, self.epsilon, 1.0, 1)
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

    def _clip(self, X: FloatArray) -> FloatArray:
        return _clip_unit(X)


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

    def __init__(
        self,
        *,
        epsilon: float,
        lower: ArrayLike,
        upper: ArrayLike,
        random_state: object = None,
    ) -> None:
        self.epsilon = _check_epsilon(epsilon)
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

    def _clip(self, X: FloatArray) -> FloatArray:
        out: FloatArray = np.clip(X, self.lower, self.upper)
        return out


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

    def __init__(self, *, epsilon: float, n_components: int, random_state: object = None) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.n_components = nc = check_int(n_components, "n_components", low=1)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = _laplace_on_grid(self._sampler, self.epsilon, float(nc), nc)
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

    def _clip(self, X: FloatArray) -> FloatArray:
        return _clip_unit(X)


def _clip_to_ball(X: FloatArray, radius: float, order: int) -> FloatArray:
    """Scale each row (or the vector) by ``min(1, R/‖x‖)`` (with a safety margin)."""
    norms = np.linalg.norm(X, ord=order, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        factor = np.minimum(1.0, radius * _NORM_SAFETY / norms)  # norm 0 → inf → 1
    out: FloatArray = X * factor
    return out


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

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        radius: float,
        n_components: int,
        random_state: object = None,
    ) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.delta = _check_delta(delta)
        self.radius = check_positive(radius, "radius")
        self.n_components = nc = check_int(n_components, "n_components", low=1)
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.sigma, self.grid_step = _gaussian_on_grid(self._sampler, self.epsilon, self.delta, 2.0 * self.radius, nc)
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

    def _clip(self, X: FloatArray) -> FloatArray:
        return _clip_to_ball(X, self.radius, 2)

    def _perturb(self, X: FloatArray) -> FloatArray:
        return self._sampler.perturb_gaussian(X, self.sigma)


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

    def __init__(
        self,
        *,
        epsilon: float,
        radius: float,
        n_components: int,
        random_state: object = None,
    ) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.radius = check_positive(radius, "radius")
        self.n_components = nc = check_int(n_components, "n_components", low=1)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = _laplace_on_grid(self._sampler, self.epsilon, 2.0 * self.radius, nc)
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

    def _clip(self, X: FloatArray) -> FloatArray:
        return _clip_to_ball(X, self.radius, 1)


# --------------------------------------------------------------------------- factory & bounds


def _require(value: Any, name: str, kind: str) -> Any:
    if value is None:
        raise ValueError(f"{name}: expected a value for mechanism kind {kind!r}, received None")
    return value


def make_mechanism(
    kind: str,
    *,
    epsilon: float,
    delta: float | None = None,
    n_components: int,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    radius_l2: float | None = None,
    radius_l1: float | None = None,
    random_state: object = None,
) -> TemplateMechanism:
    """Build the template mechanism named ``kind``.

    Parameters
    ----------
    kind : {"peep", "peep-raw", "laplace-vector", "gaussian-l2", "laplace-l1"}
    epsilon : float
    delta : float, optional
        Required for ``gaussian-l2``; ignored by the pure-ε kinds (a pure
        ε-LDP mechanism satisfies every δ).
    n_components : int
    lower, upper : array_like of shape (n_components,), optional
        Public bounds, required for ``peep-raw``.
    radius_l2, radius_l1 : float, optional
        Public radii, required for ``gaussian-l2`` / ``laplace-l1``.
    random_state : None, NoiseSampler, int or Generator

    Raises
    ------
    ValueError
        Unknown kind (the message lists :data:`MECHANISM_KINDS`), or a
        parameter the kind needs is missing or inconsistent.

    Examples
    --------
    >>> make_mechanism("laplace-vector", epsilon=2.0, n_components=4).guarantee.epsilon_vector
    2.0
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind: expected a str, received {kind!r} ({type(kind).__name__})")
    nc = check_int(n_components, "n_components", low=1)
    mechanism: TemplateMechanism
    if kind == "peep":
        mechanism = PeepMechanism(epsilon=epsilon, n_components=nc, random_state=random_state)
    elif kind == "peep-raw":
        mechanism = PeepRawMechanism(
            epsilon=epsilon,
            lower=_require(lower, "lower", kind),
            upper=_require(upper, "upper", kind),
            random_state=random_state,
        )
        if mechanism.n_components != nc:
            raise ValueError(
                f"n_components: expected {mechanism.n_components} (the length of lower/upper), received {nc}"
            )
    elif kind == "laplace-vector":
        mechanism = LaplaceVectorMechanism(epsilon=epsilon, n_components=nc, random_state=random_state)
    elif kind == "gaussian-l2":
        mechanism = GaussianL2Mechanism(
            epsilon=epsilon,
            delta=_require(delta, "delta", kind),
            radius=_require(radius_l2, "radius_l2", kind),
            n_components=nc,
            random_state=random_state,
        )
    elif kind == "laplace-l1":
        mechanism = LaplaceL1Mechanism(
            epsilon=epsilon,
            radius=_require(radius_l1, "radius_l1", kind),
            n_components=nc,
            random_state=random_state,
        )
    else:
        raise ValueError(f"kind: expected one of {', '.join(MECHANISM_KINDS)}, received {kind!r}")
    return mechanism


def bounds_from_data(X: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Per-coordinate (min, max) of ``X`` — and a :class:`PrivacyLeakWarning`.

    Bounds computed from the data being released make the sensitivity depend
    on that data, which voids the guarantee (diffprivlib warns the same way).
    Use the bundle's public bounds in anything real.

    Parameters
    ----------
    X : array_like of shape (n_samples, n_components)

    Returns
    -------
    lower, upper : ndarray of shape (n_components,)
    """
    arr = check_array(X, "X", ndim=2)
    warnings.warn(
        "bounds derived from the data being released leak information about it and void the "
        "privacy guarantee; use fixed public bounds (the bundle's) instead",
        PrivacyLeakWarning,
        stacklevel=2,
    )
    lower: FloatArray = arr.min(axis=0)
    upper: FloatArray = arr.max(axis=0)
    return lower, upper
