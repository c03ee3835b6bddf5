"""Scalar mechanisms: Laplace and Gaussian for a value or each entry of an array, randomized response for a bit.

Used for soft traits (age, gender) on the device and for QBBS query answers on
the server. Like the template mechanisms they validate at construction and
draw every random number from the injected sampler (secure by default).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.mechanisms.calibration import check_delta, check_epsilon, gaussian_on_grid, laplace_on_grid
from peep.core.sampling import NoiseSampler, check_random_state, gaussian_variance, laplace_variance
from peep.core.validation import check_array, check_positive, check_real

__all__ = ["GaussianMechanism", "LaplaceMechanism", "RandomizedResponse"]

FloatArray = NDArray[np.float64]


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
        self.epsilon = check_epsilon(epsilon)
        self.sensitivity = check_positive(sensitivity, "sensitivity")
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.scale, self.grid_step = laplace_on_grid(self._sampler, self.epsilon, self.sensitivity, 1)
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
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.sensitivity = check_positive(sensitivity, "sensitivity")
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.sigma, self.grid_step = gaussian_on_grid(self._sampler, self.epsilon, self.delta, self.sensitivity, 1)
        self.variance = gaussian_variance(self.sigma, self.grid_step)
        self.is_secure = bool(self._sampler.is_secure)

    def __repr__(self) -> str:
        return (
            f"GaussianMechanism(epsilon={self.epsilon!r}, delta={self.delta!r}, "
            f"sensitivity={self.sensitivity!r}, random_state={self.random_state!r})"
        )

    def _perturb(self, arr: FloatArray) -> FloatArray:
        return self._sampler.perturb_gaussian(arr, self.sigma)


class RandomizedResponse:
    """Randomized response for one bit: report it truthfully with probability ``e^ε/(1+e^ε)``.

    ε-LDP for the bit (Warner 1965): the odds of any report under the two
    possible true bits differ by at most ``e^ε``.

    Parameters
    ----------
    epsilon : float
        ε > 0.
    random_state : None, NoiseSampler, int or Generator
        ``None`` uses the secure sampler (the OS CSPRNG); seeds require the
        ``"seeded-noise"`` feature.

    Attributes
    ----------
    p_keep : float
        The probability the true bit is reported. The secure sampler decides
        with a 53-bit uniform integer against ``floor(p·2**53)``, i.e. with a
        probability rounded *down* by less than ``2**-53``: the odds
        ``p/(1−p)`` only shrink, so the stated ε holds exactly.
    is_secure : bool

    Examples
    --------
    >>> rr = RandomizedResponse(epsilon=math.log(3.0))
    >>> round(rr.p_keep, 6), rr.randomise(1) in (0, 1)
    (0.75, True)
    """

    def __init__(self, *, epsilon: float, random_state: object = None) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        self.p_keep = 1.0 / (1.0 + math.exp(-self.epsilon))
        self.is_secure = bool(self._sampler.is_secure)
        self.delta = 0.0

    def __repr__(self) -> str:
        return f"RandomizedResponse(epsilon={self.epsilon!r}, random_state={self.random_state!r})"

    def randomise(self, bit: int) -> int:
        """The reported bit for a true ``bit`` in {0, 1}."""
        if isinstance(bit, bool) or bit not in (0, 1):
            raise ValueError(f"bit: expected 0 or 1, received {bit!r}")
        keep = bool(self._sampler.bernoulli(self.p_keep, 1)[0])
        return int(bit) if keep else 1 - int(bit)
