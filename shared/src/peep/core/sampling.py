"""Noise samplers: where the randomness of every release comes from.

Two samplers implement :class:`NoiseSampler`:

:class:`SecureSampler` (the default, :data:`secure_sampler`)
    Randomness only from the operating system's CSPRNG (``os.urandom``; never
    numpy's generators). Outputs live on a fixed power-of-two grid so that
    they are safe against the floating-point attack on naive Laplace sampling
    (Mironov 2012, "On significance of the least significant bits for
    differential privacy"): the noisy value is
    ``γ·(round(x/γ) + Z)`` with ``Z`` an integer drawn from the discrete
    Laplace (or discrete Gaussian) distribution in grid units. Every output is
    an exact multiple of ``γ`` and every multiple of ``γ`` has positive
    probability under every input, so the set of reachable floats does not
    depend on the input; only the probabilities do, and those are bounded by
    the mechanism's ε.

:class:`SeededSampler`
    Continuous numpy Laplace/Gaussian from a seed. Fast and reproducible, for
    simulations and tests only: it offers no privacy (the seed reproduces the
    noise) and is refused unless the ``"seeded-noise"`` feature is enabled
    (:mod:`peep.core.features`).

The grid
--------
For a noise scale ``b`` the grid step is ``γ = 2**k``, the largest power of
two with ``γ <= b·2**-20`` (:meth:`SecureSampler.grid_step`). Hence
``t = b/γ`` lies in ``[2**20, 2**21)``: the discrete Laplace on the grid has
the continuous Laplace's variance to a relative ``1/(12 t²) < 1e-13``, and the
grid is fine compared with the noise. Because γ is a power of two, ``x/γ`` and
``γ·n`` are exact in floating point, so the output determines the integer
``n = round(x/γ) + Z`` exactly and the privacy analysis is the textbook one
for integers.

Rounding to the grid moves each coordinate by at most γ/2, so the difference
between two rounded inputs is at most γ per coordinate larger than between
the inputs: an L1 sensitivity grows by at most ``γ·d`` and an L2 sensitivity
by at most ``γ·√d`` (:func:`grid_inflation_l1`, :func:`grid_inflation_l2`).
Mechanisms add this to their sensitivity before calibrating, so the ε they
state holds for the grid-rounded output. For Laplace noise calibrated per
coordinate (``b = Δ/ε``) the relative inflation is ``γ/Δ <= 2**-20/ε``; for a
vector of ``d`` coordinates calibrated on its L1 sensitivity it is
``d·2**-20/ε``: tiny for any useful ε (1.2e-4 for d = 128, ε = 1).

Why 2**-20: finer grids shrink that inflation but make ``t`` larger, and the
floating-point fidelity of the sampler (below) degrades like ``t·2**-52``;
``t ≈ 2**20`` keeps the two near 1e-6 and 1e-9 respectively.

Where floating point approximates the exact distribution
-------------------------------------------------------
The integers ``Z`` come from geometric variables ``G = floor(t·E)`` with
``E = -ln U`` exponential; ``Z = G₁ − G₂`` is then exactly discrete Laplace.
``U`` has full relative precision at every magnitude (52-bit mantissa,
unbounded exponent; see :meth:`SecureSampler.exponential`), so
``P(U <= u) = u·(1 ± 2**-52)`` for every ``u`` however small and the support
of ``Z`` is all of ℤ, for every input. What remains approximate:

* each integer cell ``t·E ∈ [g, g+1)`` is resolved by at least ~2**31
  distinct values of ``U`` (relative granularity 2**-52, cell width ``1/t``);
* ``-ln U`` and ``t·E`` are rounded to double precision, moving the cell
  boundaries by at most ``t·E·2**-52 <= E·2**-31`` cells.

Together these perturb the pmf of ``Z`` by a relative ``≲ 1e-9·max(1, E)``
(about 2e-8 for a draw with ``E = 20``, which occurs with probability 2e-9),
so a pmf ratio, and hence the effective ε, can differ from the analysed one
by that much and no more. The discrete Gaussian's Bernoulli acceptance
``exp(-c)`` is decided as ``E' > c`` with a fresh full-precision exponential
``E'`` rather than with a uniform: the error is of the same relative order,
and the probability never underflows, so tails far beyond ``38σ`` (where
``exp(-c)`` is below the smallest double) keep their positive probability.
None of this changes the set of reachable outputs, which is the whole grid
for every input: the bit pattern of an output carries no information beyond
the integer ``n = round(x/γ) + Z``, whose distribution is the analysed one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Final, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core import features
from peep.core.validation import check_int, check_positive, check_real

__all__ = [
    "GRID_BITS",
    "NoiseSampler",
    "SecureSampler",
    "SeededSampler",
    "check_random_state",
    "gaussian_variance",
    "grid_inflation_l1",
    "grid_inflation_l2",
    "laplace_variance",
    "round_to_grid",
    "secure_sampler",
]

FloatArray = NDArray[np.float64]

#: The grid step is the largest power of two ``<= scale·2**-GRID_BITS``.
GRID_BITS: Final = 20

_TWO53: Final = 2**53
_TWO52: Final = float(2**52)
_TWO_M64: Final = 2.0**-64
_TWO_M52: Final = 2.0**-52
_LN2: Final = math.log(2.0)
# Extra 64-bit words drawn with every batch for the rare slow path (each slow
# element needs one mantissa word, and more only when a whole word is zero).
_RESERVE_WORDS: Final = 4
# A CSPRNG returns 2**14 consecutive all-zero 64-bit words with probability
# 2**-(2**20): seeing that means the source is broken, so refuse rather than
# loop forever. This is a refusal, never a truncation of the distribution.
_MAX_ZERO_WORDS: Final = 2**14
# CKS rejection accepts with probability ≈ e^{-1/2}·sqrt(π/2) ≈ 0.76 when
# t = floor(σ)+1; oversample so a second round is rare.
_DG_ACCEPT: Final = 0.70
# round(x/γ) + Z is exact only while it stays below 2**53 in magnitude; |Z|
# stays below 2**45 for any draw that can occur, so inputs below 2**52 grid
# units are safe.
_MAX_GRID_UNITS: Final = 2.0**52


@runtime_checkable
class NoiseSampler(Protocol):
    """Source of Laplace and Gaussian noise for mechanisms.

    A sampler whose :meth:`grid_step` is ``γ > 0`` promises that
    ``perturb_laplace(x, b)`` returns exactly ``γ·(round(x/γ) + Z)`` with
    ``Z`` discrete Laplace, ``P(Z=z) ∝ exp(-|z|·γ/b)``, and that
    ``perturb_gaussian(x, σ)`` returns ``γ·(round(x/γ) + Y)`` with ``Y``
    discrete Gaussian of parameter ``σ/γ``; mechanisms rely on this to
    compute exact variances and to inflate sensitivities by the grid. A
    sampler with ``grid_step == 0`` adds continuous noise.
    """

    is_secure: bool

    def laplace(self, scale: float, size: int) -> FloatArray:
        """Laplace noise of the given scale, ndarray of shape (size,)."""
        ...

    def gaussian(self, sigma: float, size: int) -> FloatArray:
        """Gaussian noise of standard deviation ``sigma``, shape (size,)."""
        ...

    def perturb_laplace(self, x: ArrayLike, scale: float) -> FloatArray:
        """``x`` plus Laplace noise, same shape as ``x``."""
        ...

    def perturb_gaussian(self, x: ArrayLike, sigma: float) -> FloatArray:
        """``x`` plus Gaussian noise, same shape as ``x``."""
        ...

    def grid_step(self, scale: float) -> float:
        """Output grid step for noise of this scale (0.0 if continuous)."""
        ...

    def bernoulli(self, p: float, size: int) -> NDArray[np.bool_]:
        """``size`` independent coins, each True with probability ``p`` (at most ``p``, never more)."""
        ...

    def exponential(self, size: int) -> FloatArray:
        """Standard exponential variates ``E = −ln U``, shape (size,), continuous (not on a grid).

        The secure sampler keeps ``U``'s full relative precision at every
        magnitude, so ``exp(−E)`` is a uniform whose small values keep all their
        significant bits. Mechanisms that release functions of these must put
        the result on a grid themselves (see :mod:`peep.core.mechanisms.privunit`).
        """
        ...


# --------------------------------------------------------------------------- helpers


def _power_of_two_step(scale: float) -> float:
    """Largest power of two ``<= scale·2**-GRID_BITS``."""
    scale = check_positive(scale, "scale")
    # frexp: scale = m·2**e with m in [0.5, 1), so 2**(e-1) <= scale < 2**e.
    _, e = math.frexp(scale)
    k = e - 1 - GRID_BITS
    if k < -1022:
        # A subnormal step would make x/γ overflow and lose exactness.
        raise ValueError(
            f"scale: expected >= {math.ldexp(1.0, -1022 + GRID_BITS)} for the secure grid, received {scale}"
        )
    return math.ldexp(1.0, k)


def round_to_grid(x: ArrayLike, step: float) -> FloatArray:
    """Round ``x`` to the nearest multiple of ``step`` (ties to even).

    Parameters
    ----------
    x : array_like of any shape
    step : float
        Grid step (a power of two for exactness); ``0.0`` returns ``x``
        unchanged (continuous samplers).

    Returns
    -------
    ndarray of the shape of ``x``, float64

    Examples
    --------
    >>> round_to_grid([0.3, -1.74], 0.5).tolist()
    [0.5, -1.5]
    """
    arr = np.asarray(x, dtype=np.float64)
    if step == 0.0:
        return arr.copy()
    step = check_positive(step, "step")
    out: FloatArray = np.rint(arr / step) * step
    return out


def grid_inflation_l1(step: float, d: int) -> float:
    """Increase of an L1 sensitivity caused by rounding ``d`` coordinates to the grid.

    Each coordinate moves by at most ``step/2``, so two rounded inputs differ
    by at most ``step`` more per coordinate than the inputs: ``step·d``.

    Examples
    --------
    >>> grid_inflation_l1(2.0**-20, 128) == 128 * 2.0**-20
    True
    """
    d = check_int(d, "d", low=1)
    if step < 0 or not math.isfinite(step):
        raise ValueError(f"step: expected a finite number >= 0, received {step}")
    return step * d  # exact: step is a power of two (or 0)


def grid_inflation_l2(step: float, d: int) -> float:
    """Increase of an L2 sensitivity caused by rounding ``d`` coordinates: ``step·√d``.

    Rounded up by one ulp so that float rounding never understates it.
    """
    d = check_int(d, "d", low=1)
    if step < 0 or not math.isfinite(step):
        raise ValueError(f"step: expected a finite number >= 0, received {step}")
    if step == 0.0:
        return 0.0
    return math.nextafter(step * math.sqrt(d), math.inf)


def laplace_variance(scale: float, step: float) -> float:
    """Exact variance of the Laplace noise a sampler adds.

    Parameters
    ----------
    scale : float
        Laplace scale ``b``.
    step : float
        The sampler's ``grid_step(scale)``. ``0`` means continuous Laplace
        (variance ``2b²``); otherwise discrete Laplace on the grid with
        ``t = b/γ`` and ``q = exp(-1/t)``: variance ``2q/(1-q)²·γ²``.
    """
    if step == 0.0:
        return 2.0 * scale * scale
    t = scale / step
    q = math.exp(-1.0 / t)
    one_minus_q = -math.expm1(-1.0 / t)  # 1 - q without cancellation
    return 2.0 * q / (one_minus_q * one_minus_q) * step * step


def gaussian_variance(sigma: float, step: float) -> float:
    """Variance of the Gaussian noise a sampler adds: ``σ²``.

    For the discrete Gaussian of parameter ``s = σ/γ >= 2**20`` grid units the
    variance is ``s²`` minus a term of order ``s⁴·exp(-2π²s²)`` (Poisson
    summation; Canonne, Kamath & Steinke 2020), which is zero in double
    precision, so ``σ²`` is exact to the last bit for both samplers.
    """
    del step  # same value on and off the grid, see above
    return sigma * sigma


# --------------------------------------------------------------------------- secure


class SecureSampler:
    """Floating-point-safe discrete noise from the OS CSPRNG.

    Parameters
    ----------
    random_bytes : callable ``int -> bytes``, default ``os.urandom``
        Source of uniformly random bytes. Injectable so tests can drive rare
        paths deterministically; production always uses the default. All the
        bytes one call needs are drawn with one call (plus, with probability
        about 2**-11 per variate, a small follow-up call).

    Notes
    -----
    Thread-safe: it keeps no state besides the byte source.

    Examples
    --------
    >>> s = SecureSampler()
    >>> y = s.perturb_laplace([0.25, 0.5], scale=1.0)
    >>> y.shape, bool(np.all(y / s.grid_step(1.0) == np.rint(y / s.grid_step(1.0))))
    ((2,), True)
    """

    is_secure: bool = True

    def __init__(self, *, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        if not callable(random_bytes):
            raise TypeError(f"random_bytes: expected a callable int -> bytes, received {random_bytes!r}")
        self._random_bytes = random_bytes

    def __repr__(self) -> str:
        src = getattr(self._random_bytes, "__qualname__", repr(self._random_bytes))
        return f"SecureSampler(random_bytes={src})"

    # -- randomness ---------------------------------------------------------------

    def _words(self, n: int) -> NDArray[np.uint64]:
        """``n`` uniformly random 64-bit words (little-endian, one source call)."""
        buf = self._random_bytes(8 * n)
        if len(buf) != 8 * n:
            raise RuntimeError(f"random_bytes: expected {8 * n} bytes, received {len(buf)}; broken random source")
        return np.frombuffer(buf, dtype="<u8", count=n)

    def exponential(self, size: int) -> FloatArray:
        """Standard exponential variates ``E = -ln U`` with full-precision ``U``.

        ``U`` is uniform on (0, 1] with full relative precision at every
        magnitude, so the tail of ``E`` is not truncated (naively, ``U`` on a
        2**-53 grid caps ``E`` at 53·ln 2 ≈ 36.7).

        Fast path: a random 64-bit word ``w >= 2**53`` gives ``U = w/2**64``,
        exact to 2**-53 relative after rounding to double. Slow path (``w <
        2**53``, probability 2**-11): ``U``'s binary exponent is the number of
        leading zero bits, counted across as many further words as it takes
        (unbounded), and its mantissa is a fresh 52-bit word; ``E`` is then
        computed from exponent and mantissa directly so it never underflows.

        Parameters
        ----------
        size : int

        Returns
        -------
        ndarray of shape (size,), float64, values >= 0
        """
        size = check_int(size, "size", low=0)
        words = self._words(size + _RESERVE_WORDS)
        w = words[:size]
        e: FloatArray = w.astype(np.float64)
        # +0.5 leaves every fast-path value (>= 2**53, ulp >= 2) unchanged and
        # keeps log() finite for w == 0, whose result the slow path replaces.
        e += 0.5
        e *= _TWO_M64  # exact: scaling by a power of two
        np.log(e, out=e)
        np.negative(e, out=e)
        if size and w.min() < _TWO53:
            self._slow_path(w, e, words[size:])
        return e

    def _slow_path(self, w: NDArray[np.uint64], e: FloatArray, reserve: NDArray[np.uint64]) -> None:
        """Recompute ``e[i]`` for the words ``w[i] < 2**53`` (see :meth:`exponential`)."""
        pool = [int(v) for v in reserve]
        pool.reverse()

        def next_word() -> int:
            if not pool:
                pool.extend(int(v) for v in self._words(8)[::-1])
            return pool.pop()

        for i in np.flatnonzero(w < _TWO53):
            word = int(w[i])
            zeros = 0
            zero_words = 0
            while word == 0:
                zeros += 64
                zero_words += 1
                if zero_words > _MAX_ZERO_WORDS:
                    raise RuntimeError(
                        f"random_bytes: {zero_words} consecutive zero 64-bit words; the random source is broken"
                    )
                word = next_word()
            zeros += 64 - word.bit_length()
            mantissa = next_word() >> 12  # fresh, independent 52 bits
            # U = 2**-(zeros+1)·(1 + f): uniform within its binade, and the
            # binade has probability 2**-(zeros+1) as for a uniform U.
            e[i] = (zeros + 1) * _LN2 - math.log1p(mantissa * _TWO_M52)

    def _discrete_laplace_units(self, t: float, n: int) -> FloatArray:
        """Discrete Laplace ``P(Z=z) ∝ exp(-|z|/t)`` as integer-valued floats, shape (n,)."""
        g = self.exponential(2 * n)
        g *= t
        np.floor(g, out=g)  # geometric: P(G >= k) = exp(-k/t)
        z: FloatArray = g[:n] - g[n:]
        return z

    def _discrete_gaussian_units(self, sigma: float, n: int) -> FloatArray:
        """Discrete Gaussian of parameter ``sigma`` (grid units), shape (n,).

        Canonne, Kamath & Steinke 2020, Algorithm 3: ``Y`` discrete Laplace
        with ``t = floor(σ)+1``, accepted with probability
        ``exp(-(|Y| - σ²/t)²/(2σ²))``; vectorised by drawing a batch of
        candidates and repeating for any shortfall.
        """
        t = math.floor(sigma) + 1.0
        shift = sigma * sigma / t
        two_var = 2.0 * sigma * sigma
        out = np.empty(n, dtype=np.float64)
        filled = 0
        while filled < n:
            need = n - filled
            m = int(need / _DG_ACCEPT) + 8
            ex = self.exponential(3 * m)
            g = ex[: 2 * m]
            g *= t
            np.floor(g, out=g)
            y = g[:m] - g[m:]
            c = np.abs(y)
            c -= shift
            c *= c
            c /= two_var
            # Bernoulli(exp(-c)) decided as E' > c: exact in the tails, where
            # exp(-c) would underflow.
            accepted = y[ex[2 * m :] > c]
            take = min(need, accepted.size)
            out[filled : filled + take] = accepted[:take]
            filled += take
        return out

    # -- NoiseSampler ---------------------------------------------------------------

    def grid_step(self, scale: float) -> float:
        """Grid step ``γ``: the largest power of two ``<= scale·2**-20``."""
        return _power_of_two_step(scale)

    def _on_grid(self, x: ArrayLike, step: float) -> FloatArray:
        k: FloatArray = np.asarray(x, dtype=np.float64) * (1.0 / step)  # exact
        np.rint(k, out=k)
        if k.size and not float(np.abs(k).max()) < _MAX_GRID_UNITS:  # also catches NaN
            raise ValueError(
                f"x: expected finite values with |x| < {_MAX_GRID_UNITS * step:g} "
                f"(2**52 grid steps of {step:g}), received max |x| = {np.abs(x).max()}"
            )
        return k

    def perturb_laplace(self, x: ArrayLike, scale: float) -> FloatArray:
        """``γ·(round(x/γ) + Z)`` with ``Z`` discrete Laplace of parameter ``scale/γ``.

        Parameters
        ----------
        x : array_like of any shape
            Finite values.
        scale : float
            Laplace scale ``b > 0``.

        Returns
        -------
        ndarray of the shape of ``x``, float64; exact multiples of
        ``γ = grid_step(scale)``.
        """
        step = _power_of_two_step(scale)
        k = self._on_grid(x, step)
        k += self._discrete_laplace_units(scale / step, k.size).reshape(k.shape)
        k *= step  # exact
        return k

    def perturb_gaussian(self, x: ArrayLike, sigma: float) -> FloatArray:
        """``γ·(round(x/γ) + Y)`` with ``Y`` discrete Gaussian of parameter ``σ/γ``.

        Parameters
        ----------
        x : array_like of any shape
        sigma : float
            Standard deviation ``σ > 0``.

        Returns
        -------
        ndarray of the shape of ``x``, float64; exact multiples of
        ``γ = grid_step(sigma)``.
        """
        step = _power_of_two_step(sigma)
        k = self._on_grid(x, step)
        k += self._discrete_gaussian_units(sigma / step, k.size).reshape(k.shape)
        k *= step
        return k

    def laplace(self, scale: float, size: int) -> FloatArray:
        """Discrete Laplace noise on the grid of ``scale``, ndarray of shape (size,)."""
        size = check_int(size, "size", low=0)
        return self.perturb_laplace(np.zeros(size), scale)

    def gaussian(self, sigma: float, size: int) -> FloatArray:
        """Discrete Gaussian noise on the grid of ``sigma``, ndarray of shape (size,)."""
        size = check_int(size, "size", low=0)
        return self.perturb_gaussian(np.zeros(size), sigma)

    def bernoulli(self, p: float, size: int) -> NDArray[np.bool_]:
        """Coins that are True with probability ``floor(p·2**53)/2**53``.

        A 53-bit uniform integer from the OS CSPRNG is compared with an exact
        integer threshold, so the probability is ``p`` rounded *down* by less
        than ``2**-53``: a mechanism whose guarantee needs "at most ``p``"
        keeps it exactly.
        """
        p = check_real(p, "p", low=0.0, high=1.0)
        size = check_int(size, "size", low=0)
        threshold = np.uint64(math.floor(p * _TWO53))
        words = self._words(size) >> np.uint64(11)  # 53 uniform bits each
        out: NDArray[np.bool_] = words < threshold
        return out


#: The process-wide default sampler (``random_state=None`` everywhere).
secure_sampler: Final = SecureSampler()


# --------------------------------------------------------------------------- seeded


class SeededSampler:
    """Continuous numpy noise from a seed: reproducible, fast, NOT private.

    For simulations and tests only. Construction raises
    :class:`~peep.core.exceptions.UnsafeFeatureError` unless the
    ``"seeded-noise"`` feature is enabled.

    Parameters
    ----------
    seed : int or numpy.random.Generator

    Examples
    --------
    >>> from peep.core import features
    >>> with features.enabled("seeded-noise"):
    ...     s = SeededSampler(0)
    >>> s.is_secure, s.grid_step(1.0)
    (False, 0.0)
    """

    is_secure: bool = False

    def __init__(self, seed: int | np.random.Generator) -> None:
        features.require("seeded-noise", "SeededSampler")
        if isinstance(seed, np.random.Generator):
            self._rng = seed
        else:
            self._rng = np.random.default_rng(check_int(seed, "seed", low=0))
        self.seed = seed

    def __repr__(self) -> str:
        return f"SeededSampler(seed={self.seed!r})"

    def grid_step(self, scale: float) -> float:
        """0.0: the noise is continuous."""
        check_positive(scale, "scale")
        return 0.0

    def laplace(self, scale: float, size: int) -> FloatArray:
        """Continuous Laplace noise, ndarray of shape (size,)."""
        scale = check_positive(scale, "scale")
        return self._rng.laplace(0.0, scale, check_int(size, "size", low=0))

    def gaussian(self, sigma: float, size: int) -> FloatArray:
        """Continuous Gaussian noise, ndarray of shape (size,)."""
        sigma = check_positive(sigma, "sigma")
        return self._rng.normal(0.0, sigma, check_int(size, "size", low=0))

    def bernoulli(self, p: float, size: int) -> NDArray[np.bool_]:
        """Coins that are True with probability ``p`` (numpy's uniform; not private)."""
        p = check_real(p, "p", low=0.0, high=1.0)
        out: NDArray[np.bool_] = self._rng.random(check_int(size, "size", low=0)) < p
        return out

    def exponential(self, size: int) -> FloatArray:
        """Standard exponential variates (numpy's; not private)."""
        return self._rng.standard_exponential(check_int(size, "size", low=0))

    def perturb_laplace(self, x: ArrayLike, scale: float) -> FloatArray:
        """``x + Laplace(scale)`` (naive float addition: no FP protection)."""
        arr = np.asarray(x, dtype=np.float64)
        scale = check_positive(scale, "scale")
        out: FloatArray = arr + self._rng.laplace(0.0, scale, arr.shape)
        return out

    def perturb_gaussian(self, x: ArrayLike, sigma: float) -> FloatArray:
        """``x + N(0, σ²)`` (naive float addition: no FP protection)."""
        arr = np.asarray(x, dtype=np.float64)
        sigma = check_positive(sigma, "sigma")
        out: FloatArray = arr + self._rng.normal(0.0, sigma, arr.shape)
        return out


def check_random_state(random_state: object) -> NoiseSampler:
    """Turn a ``random_state`` parameter into a sampler.

    Parameters
    ----------
    random_state : None, NoiseSampler, int or numpy.random.Generator
        ``None`` → :data:`secure_sampler`; a sampler → itself; an int or a
        Generator → :class:`SeededSampler` (which requires the
        ``"seeded-noise"`` feature).

    Raises
    ------
    TypeError
        For anything else.
    UnsafeFeatureError
        For a seed while ``"seeded-noise"`` is not enabled.
    """
    if random_state is None:
        return secure_sampler
    if isinstance(random_state, NoiseSampler):
        return random_state
    if isinstance(random_state, np.random.Generator):
        return SeededSampler(random_state)
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return SeededSampler(int(random_state))
    raise TypeError(
        "random_state: expected None (secure OS randomness), a NoiseSampler, an int seed "
        f"or a numpy Generator, received {random_state!r} ({type(random_state).__name__})"
    )
