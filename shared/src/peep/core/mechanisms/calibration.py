"""Noise calibration: the analytic Gaussian σ and calibration on the secure sampler's grid.

Shared by every mechanism family, so each states its noise scale the same way.

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
from collections.abc import Callable
from typing import Any, Final

from peep.core.sampling import NoiseSampler, grid_inflation_l1, grid_inflation_l2
from peep.core.special import log_ndtr
from peep.core.validation import check_positive, check_real

__all__ = [
    "analytic_gaussian_sigma",
    "check_delta",
    "check_epsilon",
    "classic_gaussian_sigma",
    "gaussian_on_grid",
    "laplace_on_grid",
]

# Noise scales beyond this are meaningless (and would overflow downstream).
_MAX_SCALE: Final = 1e300


def check_epsilon(epsilon: Any) -> float:
    return check_positive(epsilon, "epsilon")


def check_delta(delta: Any) -> float:
    return check_real(delta, "delta", low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)


def _log_delta(u: float, epsilon: float) -> float:
    """log δ(σ) of the Gaussian mechanism for ``u = σ/Δ`` (Balle & Wang 2018, Thm 8).

    δ = Φ(1/(2u) − εu) − e^ε·Φ(−1/(2u) − εu), evaluated in log space so that
    e^ε never overflows (ε up to 1e4 and beyond).
    """
    a = 0.5 / u - epsilon * u
    b = -0.5 / u - epsilon * u
    log_pa = log_ndtr(a)
    r = epsilon + log_ndtr(b) - log_pa  # log of e^ε·Φ(b)/Φ(a), < 0
    if r >= 0.0:
        return -math.inf  # numerically no δ left (only at extreme u)
    return log_pa + math.log(-math.expm1(r))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest σ for which the Gaussian mechanism is (ε, δ)-DP, for any ε > 0.

    The analytic Gaussian mechanism (Balle & Wang 2018, Thm 8 / Alg. 1): the
    exact condition ``Φ(Δ/2σ − εσ/Δ) − e^ε·Φ(−Δ/2σ − εσ/Δ) <= δ``, solved by
    bisection on ``σ/Δ`` in log space (:func:`peep.core.special.log_ndtr`). The result
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
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
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
    delta = check_delta(delta)
    sensitivity = check_positive(sensitivity, "sensitivity")
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


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


def laplace_on_grid(sampler: NoiseSampler, epsilon: float, sensitivity: float, dim: int) -> tuple[float, float]:
    """(scale, step) of Laplace noise giving ε for an L1 sensitivity over ``dim`` grid-rounded coordinates."""
    return _calibrate_on_grid(lambda d: d / epsilon, sensitivity, lambda g: grid_inflation_l1(g, dim), sampler, epsilon)


def gaussian_on_grid(
    sampler: NoiseSampler, epsilon: float, delta: float, sensitivity: float, dim: int
) -> tuple[float, float]:
    """(sigma, step) of the analytic Gaussian for an L2 sensitivity over ``dim`` grid-rounded coordinates."""
    unit = analytic_gaussian_sigma(epsilon, delta, 1.0)
    return _calibrate_on_grid(lambda d: d * unit, sensitivity, lambda g: grid_inflation_l2(g, dim), sampler, epsilon)
