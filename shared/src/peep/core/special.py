"""The special functions the unit-sphere and Gaussian mechanisms need, without scipy.

A device releases templates; importing ``scipy.special`` for a handful of
functions would cost it about 21 MB of resident memory (a third of an
MQTT-only agent's imports), so the few it needs are here, on ``math`` and
numpy alone, to the accuracy the mechanisms' floating-point argument asks for
(relative errors around 1e-13 or better, tested against scipy and against
mpmath at 40 digits; for ``a = b`` as large as 1023.5 ``log B`` and ``I``
are more accurate than scipy's):

- :func:`betainc`, :func:`log_betainc` — the regularised incomplete beta
  function ``I_x(a, b)`` (a continued fraction, Lentz's method; the prefactor
  ``x^a (1−x)^b / B(a, b)`` from Stirling's series around its maximum when
  ``a`` and ``b`` are large, so that it does not lose digits to cancellation);
- :func:`betaincinv` — its inverse in ``x`` (Halley's method on ``log I``
  in ``log x``, bracketed, from the tail approximation or Abramowitz &
  Stegun 26.5.22: two evaluations of ``I`` for a typical release);
- :func:`betaln` — ``log B(a, b)``;
- :func:`ndtr`, :func:`log_ndtr`, :func:`ndtri` — the standard normal CDF,
  its logarithm (asymptotic series in the far left tail) and its inverse
  (Wichura's algorithm AS 241, about 1e-16 relative on its own).

Scalars are Python floats; :func:`betaincinv` and :func:`ndtri` also take
arrays (element by element for a few values, vectorised for many).

Examples
--------
>>> round(betainc(2.0, 3.0, 0.4), 12)
0.5248
>>> round(betaincinv(2.0, 3.0, 0.5248), 12)
0.4
>>> round(ndtri(ndtr(1.5)), 12)
1.5
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache
from typing import Final, overload

import numpy as np
from numpy.typing import NDArray

__all__ = ["betainc", "betaincinv", "betaln", "log_betainc", "log_ndtr", "ndtr", "ndtri"]

FloatArray = NDArray[np.float64]

_TINY: Final = 1e-300
_LOG_MIN_NORMAL: Final = math.log(2.2250738585072014e-308)
_CF_EPS: Final = 2.0**-52
_CF_MAX_ITER: Final = 100_000
_NEWTON_MAX_ITER: Final = 200
# Halley's method stops after a step below this (over √(1 + a + b), the scale of log x's variation in the bulk):
# the step after it would be below its cube, far under double precision.
_ACCEPT_STEP: Final = 1e-6
# Below this, log B(a, b) and the prefactor are computed from lgamma directly (no cancellation to fear).
_STIRLING_MIN: Final = 8.0
_LOG_SQRT_2PI: Final = 0.5 * math.log(2.0 * math.pi)
# Arrays up to this size go element by element (the agent releases one template at a time).
_SCALAR_LOOP_MAX: Final = 16


# --------------------------------------------------------------------------- beta


# B_2k / (2k (2k − 1)): the coefficients of 1/z^(2k−1) in log Γ(z)'s Stirling series, k = 1..7.
_STIRLING = (1.0 / 12.0, -1.0 / 360.0, 1.0 / 1260.0, -1.0 / 1680.0, 1.0 / 1188.0, -691.0 / 360360.0, 1.0 / 156.0)


def _stirling_remainder(z: float) -> float:
    """``log Γ(z) − [(z − ½) log z − z + ½ log 2π]`` for ``z >= 8`` (error below 1e-16)."""
    r = 1.0 / (z * z)
    total = 0.0
    for c in reversed(_STIRLING):
        total = total * r + c
    return total / z


@lru_cache(maxsize=256)  # a mechanism asks for the same (a, b) on every release
def betaln(a: float, b: float) -> float:
    """``log B(a, b)`` for ``a, b > 0``.

    From ``lgamma`` when a parameter is small; for large ones ``lgamma(a) + lgamma(b) − lgamma(a + b)``
    would cancel terms of size ``a·log a`` (1e-12 lost at ``a = b = 500``), so Stirling's series instead:
    ``½ log 2π − ½ log s + (a − ½) log(a/s) + (b − ½) log(b/s) + R(a) + R(b) − R(s)``, ``s = a + b``.
    """
    if min(a, b) < _STIRLING_MIN:
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    s = a + b
    out = _LOG_SQRT_2PI - 0.5 * math.log(s) + (a - 0.5) * math.log(a / s) + (b - 0.5) * math.log(b / s)
    return out + _stirling_remainder(a) + _stirling_remainder(b) - _stirling_remainder(s)


def _log_ratio(d: float, u0: float, log_u: float) -> float:
    """``log(u/u0)`` given ``d = u − u0`` and ``log u``: through ``log1p(d/u0)`` when ``u`` is close to ``u0``."""
    return math.log1p(d / u0) if abs(d) < 0.5 * u0 else log_u - math.log(u0)


def _log_power_terms(a: float, b: float, x: float) -> float:
    """``log(x^a · (1 − x)^b / B(a, b))``.

    ``1 − x`` is never rounded first: below 1/2 it can lose half an ulp, which ``b`` (up to 1e3 here)
    would multiply into the result (1e-13); ``log1p(−x)`` and ``(1 − x) − b/s = a/s − x`` are exact or nearly.
    """
    if min(a, b) < _STIRLING_MIN:
        return a * math.log(x) + b * math.log1p(-x) - betaln(a, b)
    x0, y0, peak = _peak(a, b)
    return peak + a * _log_ratio(x - x0, x0, math.log(x)) + b * _log_ratio(x0 - x, y0, math.log1p(-x))


@lru_cache(maxsize=256)
def _peak(a: float, b: float) -> tuple[float, float, float]:
    """``(x0, y0, log(x0^a · y0^b / B(a, b)))`` with ``x0 = a/s``, ``y0 = b/s``, by Stirling (no large terms cancel)."""
    s = a + b
    peak = 0.5 * math.log(a * b / s) - _LOG_SQRT_2PI
    peak += _stirling_remainder(s) - _stirling_remainder(a) - _stirling_remainder(b)
    return a / s, b / s, peak


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (converges fast for ``x < (a + 1)/(a + b + 2)``).

    Lentz's method; a release runs it twice, so the loop keeps to local names.
    """
    tiny, eps = _TINY, _CF_EPS
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, _CF_MAX_ITER):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        if abs(c) <= tiny:
            c = tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        if abs(c) <= tiny:
            c = tiny
        step = d * c
        h *= step
        if abs(step - 1.0) <= eps:
            break
    return h


def _log_betainc_terms(a: float, b: float, x: float) -> tuple[float, float]:
    """``(log I_x(a, b), log(x^a (1 − x)^b / B(a, b)))`` for ``0 < x < 1`` (the second is the inverse's slope)."""
    if x < (a + 1.0) / (a + b + 2.0):
        log_terms = _log_power_terms(a, b, x)
        return log_terms + math.log(_continued_fraction(a, b, x) / a), log_terms
    # 1 − I_x(a, b) = I_{1−x}(b, a), whose prefactor is the same; 1 − x is exact when x >= 1/2 (always when a = b).
    y = 1.0 - x
    log_terms = _log_power_terms(b, a, y)
    upper = math.exp(log_terms + math.log(_continued_fraction(b, a, y) / b))
    return (math.log1p(-upper) if upper < 1.0 else -math.inf), log_terms


def log_betainc(a: float, b: float, x: float) -> float:
    """``log I_x(a, b)``, accurate in the far lower tail (no ``log`` of a number that underflowed early)."""
    if not (a > 0.0 and b > 0.0):
        raise ValueError(f"a, b: expected > 0, received {a}, {b}")
    if x <= 0.0:
        return -math.inf
    if x >= 1.0:
        return 0.0
    return _log_betainc_terms(a, b, x)[0]


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)``."""
    return math.exp(log_betainc(a, b, x))


def _start(a: float, b: float, y: float, log_y: float) -> float:
    """``log x0``: where Halley's method starts for ``I_x(a, b) = y`` with ``y <= 1/2``.

    The tail ``I_x ≈ x^a / (a·B(a, b))`` while ``b·x`` is small beside ``a``
    (its relative error is about ``b·x/a``); above, for ``a, b >= 1``,
    Abramowitz & Stegun 26.5.22 (a normal approximation in ``log(x/(1 − x))``,
    good to a few per cent in the tails too), else the power laws at both ends
    (Numerical Recipes' start for small parameters).
    """
    log_x = (log_y + math.log(a) + betaln(a, b)) / a
    if log_x < _LOG_MIN_NORMAL or b * math.exp(log_x) <= 0.05 * a:
        return log_x
    if a >= 1.0 and b >= 1.0:
        z = -_ndtri_scalar(y)  # the upper quantile, >= 0
        lam = (z * z - 3.0) / 6.0
        ra, rb = 1.0 / (2.0 * a - 1.0), 1.0 / (2.0 * b - 1.0)
        h = 2.0 / (ra + rb)
        w = z * math.sqrt(h + lam) / h - (rb - ra) * (lam + 5.0 / 6.0 - 2.0 / (3.0 * h))
        t = math.log(b / a) + 2.0 * w  # x = 1/(1 + e^t)
        return -(t + math.log1p(math.exp(-t))) if t > 0.0 else -math.log1p(math.exp(t))
    s = a + b
    lower = math.exp(a * math.log(a / s)) / a
    upper = math.exp(b * math.log(b / s)) / b
    if y < lower / (lower + upper):
        return math.log(a * (lower + upper) * y) / a
    return math.log1p(-math.exp(math.log(b * (lower + upper) * (1.0 - y)) / b))


def _betaincinv_scalar(a: float, b: float, y: float) -> float:
    if not 0.0 < y < 1.0:
        if y == 0.0:
            return 0.0
        if y == 1.0:
            return 1.0
        raise ValueError(f"y: expected a probability in [0, 1], received {y}")
    if y > 0.5:
        return 1.0 - _betaincinv_scalar(b, a, 1.0 - y)  # 1 − y is exact here
    log_y = math.log(y)
    log_x = _table_start(_table(a, b), log_y)
    if log_x is None:
        log_x = _start(a, b, y, log_y)
        if log_x < _LOG_MIN_NORMAL:
            return math.exp(log_x)  # I_x = x^a/(a·B)·(1 + O(x)): exact to double precision down there
    return _solve(a, b, log_y, log_x)


def _solve(a: float, b: float, log_y: float, log_x: float) -> float:
    """``I_x(a, b) = e^log_y`` (at most 1/2) by Halley's method in ``log x`` from ``log_x``, bracketed."""
    x = min(math.exp(log_x), 0.5 if a == b else 1.0 - 2.0**-53)
    lo, hi = 0.0, 1.0
    accept = _ACCEPT_STEP / math.sqrt(1.0 + a + b)
    for _ in range(_NEWTON_MAX_ITER):
        log_i, log_terms = _log_betainc_terms(a, b, x)
        f = log_i - log_y
        if f == 0.0:
            return x
        if f > 0.0:
            hi = x
        else:
            lo = x
        step = _halley_step(a, b, x, f, log_terms - math.log1p(-x) - log_i)
        if abs(step) <= accept:  # the next step would be below double precision
            return x * math.exp(step)
        nxt = x * math.exp(step)
        # Inside the bracket, Halley's step; else bisect the bracket (in log x).
        x = nxt if lo < nxt < hi else (math.sqrt(lo) * math.sqrt(hi) if lo > 0.0 else 0.5 * hi)
    return x


# A mechanism inverts I_x(a, b) for one (a, b) on every release. The first call with an (a, b) tabulates
# log I at evenly spaced log x (with its slope), from I = 1e-12 to 1/2; from there on, cubic Hermite
# interpolation in the table starts Halley's method so close (1e-7 to 1e-9) that one evaluation of I and one
# step finish: half the work of the general start. The table only chooses where the method starts, and it is
# built on the first call, so a result depends on (a, b, y) alone, never on what was asked before (seeded
# releases repeat bit for bit).
_TABLE_NODES: Final = 96
_TABLE_Y_MIN: Final = 1e-12
_tables: dict[tuple[float, float], tuple[list[float], list[float], list[float]]] = {}


def _table(a: float, b: float) -> tuple[list[float], list[float], list[float]]:
    key = (a, b)
    table = _tables.get(key)
    if table is None:
        table = _build_table(a, b)  # deterministic: a rebuilt table is the same table
        if len(_tables) >= 64:
            _tables.clear()
        _tables[key] = table
    return table


def _build_table(a: float, b: float) -> tuple[list[float], list[float], list[float]]:
    """``(log I, log x, d log x / d log I)`` at ``_TABLE_NODES`` values of ``log x`` from ``I = 1e-12`` to 1/2."""
    ends = [_solve(a, b, math.log(y), _start(a, b, y, math.log(y))) for y in (_TABLE_Y_MIN, 0.5)]
    lo, hi = math.log(ends[0]), math.log(ends[1])
    log_is, log_xs, inverse_slopes = [], [], []
    for k in range(_TABLE_NODES):
        log_x = lo + (hi - lo) * k / (_TABLE_NODES - 1)
        x = math.exp(log_x)
        log_i, log_terms = _log_betainc_terms(a, b, x)
        log_is.append(log_i)
        log_xs.append(log_x)
        inverse_slopes.append(math.exp(log_i + math.log1p(-x) - log_terms))
    return log_is, log_xs, inverse_slopes


def _table_start(table: tuple[list[float], list[float], list[float]], log_y: float) -> float | None:
    """``log x`` for ``log I = log_y`` by cubic Hermite interpolation in the table (``None`` outside it)."""
    log_is, log_xs, inverse_slopes = table
    if not log_is[0] <= log_y <= log_is[-1]:
        return None
    k = min(bisect.bisect_right(log_is, log_y) - 1, len(log_is) - 2)
    h = log_is[k + 1] - log_is[k]
    if not h > 0.0:
        return None
    t = (log_y - log_is[k]) / h
    t2 = t * t
    t3 = t2 * t
    return (
        (2.0 * t3 - 3.0 * t2 + 1.0) * log_xs[k]
        + (t3 - 2.0 * t2 + t) * h * inverse_slopes[k]
        + (3.0 * t2 - 2.0 * t3) * log_xs[k + 1]
        + (t3 - t2) * h * inverse_slopes[k + 1]
    )


def _halley_step(a: float, b: float, x: float, f: float, log_slope: float) -> float:
    """Halley's step in ``log x`` for ``g(log x) = log I_x(a, b)`` with ``f = g − log y``.

    ``g' = x·pdf(x)/I = exp(log_slope)`` and ``g'' = g'·(a − (b − 1)·x/(1 − x) − g')``; the cubic
    correction is used only while it is a modest one (else Newton's step, ``−f/g'``).
    """
    slope = math.exp(log_slope)
    if not (slope > 0.0 and math.isfinite(slope)):
        return math.nan
    newton = -f / slope
    curvature = a - (b - 1.0) * x / (1.0 - x) - slope  # g''/g'
    denom = 1.0 + 0.5 * newton * curvature
    return newton / denom if 0.5 < denom < 2.0 else newton


# -- the same, vectorised over x (or y), for batches of releases -------------------------


def _log_ratio_array(d: FloatArray, u0: float, log_u: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out: FloatArray = np.where(np.abs(d) < 0.5 * u0, np.log1p(d / u0), log_u - math.log(u0))
    return out


def _log_power_terms_array(a: float, b: float, x: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        log_x, log_y = np.log(x), np.log1p(-x)
    if min(a, b) < _STIRLING_MIN:
        out: FloatArray = a * log_x + b * log_y - betaln(a, b)
        return out
    x0, y0, peak = _peak(a, b)
    out = peak + a * _log_ratio_array(x - x0, x0, log_x) + b * _log_ratio_array(x0 - x, y0, log_y)
    return out


def _continued_fraction_array(a: float, b: float, x: FloatArray) -> FloatArray:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) > _TINY, d, _TINY)
    h = d.copy()
    active = np.ones(x.shape, dtype=bool)
    for m in range(1, _CF_MAX_ITER):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / np.where(np.abs(d) > _TINY, d, _TINY)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) > _TINY, c, _TINY)
        step1 = d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / np.where(np.abs(d) > _TINY, d, _TINY)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) > _TINY, c, _TINY)
        step = d * c
        h = np.where(active, h * step1 * step, h)
        active &= np.abs(step - 1.0) > _CF_EPS
        if not active.any():
            break
    return h


def _log_betainc_array(a: float, b: float, x: FloatArray) -> FloatArray:
    """:func:`log_betainc` for ``x`` in (0, 1), element by element."""
    out = np.empty_like(x)
    lower = x < (a + 1.0) / (a + b + 2.0)
    if lower.any():
        xl = x[lower]
        out[lower] = _log_power_terms_array(a, b, xl) + np.log(_continued_fraction_array(a, b, xl) / a)
    upper = ~lower
    if upper.any():
        yu = 1.0 - x[upper]  # exact: x >= the switch point, about 1/2 or more
        tail = np.exp(_log_power_terms_array(b, a, yu) + np.log(_continued_fraction_array(b, a, yu) / b))
        with np.errstate(divide="ignore"):
            out[upper] = np.log1p(-np.minimum(tail, 1.0))
    return out


def _start_array(a: float, b: float, y: FloatArray, log_y: FloatArray) -> FloatArray:
    """:func:`_start` for ``y`` in (0, 1/2], element by element."""
    log_x = (log_y + math.log(a) + betaln(a, b)) / a
    tail = (log_x < _LOG_MIN_NORMAL) | (b * np.exp(log_x) <= 0.05 * a)
    if tail.all():
        return log_x
    if a >= 1.0 and b >= 1.0:
        z = -_ndtri_array(y)
        lam = (z * z - 3.0) / 6.0
        ra, rb = 1.0 / (2.0 * a - 1.0), 1.0 / (2.0 * b - 1.0)
        h = 2.0 / (ra + rb)
        w = z * np.sqrt(h + lam) / h - (rb - ra) * (lam + 5.0 / 6.0 - 2.0 / (3.0 * h))
        t = math.log(b / a) + 2.0 * w
        other: FloatArray = -(np.maximum(t, 0.0) + np.log1p(np.exp(-np.abs(t))))
    else:
        s = a + b
        lower = math.exp(a * math.log(a / s)) / a
        upper = math.exp(b * math.log(b / s)) / b
        with np.errstate(divide="ignore", invalid="ignore"):
            other = np.where(
                y < lower / (lower + upper),
                np.log(a * (lower + upper) * y) / a,
                np.log1p(-np.exp(np.log(b * (lower + upper) * (1.0 - y)) / b)),
            )
    out: FloatArray = np.where(tail, log_x, other)
    return out


def _betaincinv_lower_array(a: float, b: float, y: FloatArray) -> FloatArray:
    """``I_x(a, b) = y`` for ``y`` in [0, 1/2]: :func:`_betaincinv_scalar`'s method, element by element."""
    out = np.zeros_like(y)
    positive = y > 0.0
    with np.errstate(divide="ignore"):
        log_y = np.log(y)
    log_x = np.full_like(y, -np.inf)
    log_x[positive] = _start_array(a, b, y[positive], log_y[positive])
    deep = positive & (log_x < _LOG_MIN_NORMAL)
    out[deep] = np.exp(log_x[deep])  # the tail approximation is exact to double precision down there
    idx = np.flatnonzero(positive & ~deep)
    x = np.minimum(np.exp(log_x[idx]), 0.5 if a == b else 1.0 - 2.0**-53)
    lo, hi, log_y = np.zeros(idx.size), np.ones(idx.size), log_y[idx]
    accept = _ACCEPT_STEP / math.sqrt(1.0 + a + b)
    for _ in range(_NEWTON_MAX_ITER):
        if idx.size == 0:
            break
        log_i = _log_betainc_array(a, b, x)
        f = log_i - log_y
        hi = np.where(f > 0.0, x, hi)
        lo = np.where(f < 0.0, x, lo)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            slope = np.exp(_log_power_terms_array(a, b, x) - np.log1p(-x) - log_i)
            newton = -f / slope
            denom = 1.0 + 0.5 * newton * (a - (b - 1.0) * x / (1.0 - x) - slope)
            step = np.where((denom > 0.5) & (denom < 2.0), newton / denom, newton)
            step = np.where((slope > 0.0) & np.isfinite(slope), step, np.nan)
            nxt = x * np.exp(step)
        done = (f == 0.0) | (np.abs(step) <= accept)
        out[idx[done]] = np.where(f == 0.0, x, nxt)[done]
        inside = (lo < nxt) & (nxt < hi)
        nxt = np.where(inside, nxt, np.where(lo > 0.0, np.sqrt(lo) * np.sqrt(hi), 0.5 * hi))
        keep = ~done
        idx, x, lo, hi, log_y = idx[keep], nxt[keep], lo[keep], hi[keep], log_y[keep]
    out[idx] = x
    return out


def _betaincinv_array(a: float, b: float, y: FloatArray) -> FloatArray:
    if np.any((y < 0.0) | (y > 1.0)) or np.any(np.isnan(y)):
        raise ValueError("y: expected probabilities in [0, 1]")
    out = np.empty_like(y)
    upper = y > 0.5
    out[~upper] = _betaincinv_lower_array(a, b, y[~upper])
    out[upper] = 1.0 - _betaincinv_lower_array(b, a, 1.0 - y[upper])  # 1 − y is exact here
    return out


@overload
def betaincinv(a: float, b: float, y: float) -> float: ...
@overload
def betaincinv(a: float, b: float, y: FloatArray) -> FloatArray: ...
def betaincinv(a: float, b: float, y: float | FloatArray) -> float | FloatArray:
    """The ``x`` with ``I_x(a, b) = y`` (``y`` a probability or an array of them)."""
    if isinstance(y, np.ndarray):
        arr = np.asarray(y, dtype=np.float64)
        if arr.size <= _SCALAR_LOOP_MAX:
            return _map(lambda v: _betaincinv_scalar(a, b, v), arr)
        return _betaincinv_array(a, b, arr.ravel()).reshape(arr.shape)
    return _betaincinv_scalar(a, b, float(y))


# --------------------------------------------------------------------------- normal


def ndtr(x: float) -> float:
    """``Φ(x)``, the standard normal CDF (relative accuracy kept in the left tail)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def log_ndtr(x: float) -> float:
    """``log Φ(x)``, finite far into the left tail (an asymptotic series below −20)."""
    if x > 0.0:
        return math.log1p(-0.5 * math.erfc(x / math.sqrt(2.0)))  # log(1 − Φ(−x)), no digits lost near 0
    if x > -20.0:
        return math.log(ndtr(x))
    # Φ(x) = φ(x)/|x| · (1 − 1/x² + 3/x⁴ − 15/x⁶ + …)
    r = 1.0 / (x * x)
    term, total = 1.0, 1.0
    for k in range(1, 60):
        term *= -(2 * k - 1) * r
        if abs(term) < 1e-17:
            break
        total += term
    return -0.5 * x * x - math.log(-x) - _LOG_SQRT_2PI + math.log(total)


# Wichura's AS 241 (PPND16) coefficients: numerator and denominator, highest power first.
_AS241_CENTRAL = (
    (2509.0809287301226727, 33430.575583588128105, 67265.770927008700853, 45921.953931549871457,
     13731.693765509461125, 1971.5909503065514427, 133.14166789178437745, 3.387132872796366608),
    (5226.495278852545925, 28729.085735721942674, 39307.89580009271061, 21213.794301586595867,
     5394.1960214247511077, 687.1870074920579083, 42.313330701600911252, 1.0),
)  # fmt: skip
_AS241_NEAR = (
    (7.7454501427834140764e-4, 0.0227238449892691845833, 0.24178072517745061177, 1.27045825245236838258,
     3.64784832476320460504, 5.7694972214606914055, 4.6303378461565452959, 1.42343711074968357734),
    (1.05075007164441684324e-9, 5.475938084995344946e-4, 0.0151986665636164571966, 0.14810397642748007459,
     0.68976733498510000455, 1.6763848301838038494, 2.05319162663775882187, 1.0),
)  # fmt: skip
_AS241_FAR = (
    (2.01033439929228813265e-7, 2.71155556874348757815e-5, 0.0012426609473880784386, 0.026532189526576123093,
     0.29656057182850489123, 1.7848265399172913358, 5.4637849111641143699, 6.6579046435011037772),
    (2.04426310338993978564e-15, 1.4215117583164458887e-7, 1.8463183175100546818e-5, 7.868691311456132591e-4,
     0.0148753612908506148525, 0.13692988092273580531, 0.59983220655588793769, 1.0),
)  # fmt: skip


def _rational(coef: tuple[tuple[float, ...], tuple[float, ...]], r: float) -> float:
    num = den = 0.0
    for c in coef[0]:
        num = num * r + c
    for c in coef[1]:
        den = den * r + c
    return num / den


def _ndtri_scalar(p: float) -> float:
    """Wichura's AS 241 (PPND16): ``Φ⁻¹(p)`` to about 1e-15 relative (tested against scipy)."""
    if not 0.0 < p < 1.0:
        if p == 0.0:
            return -math.inf
        if p == 1.0:
            return math.inf
        raise ValueError(f"p: expected a probability in [0, 1], received {p}")
    q = p - 0.5
    if abs(q) <= 0.425:
        return q * _rational(_AS241_CENTRAL, 0.180625 - q * q)
    r = math.sqrt(-math.log(p if q < 0.0 else 1.0 - p))
    z = _rational(_AS241_NEAR, r - 1.6) if r <= 5.0 else _rational(_AS241_FAR, r - 5.0)
    return -z if q < 0.0 else z


def _rational_array(coef: tuple[tuple[float, ...], tuple[float, ...]], r: FloatArray) -> FloatArray:
    num = np.zeros_like(r)
    den = np.zeros_like(r)
    for c in coef[0]:
        num = num * r + c
    for c in coef[1]:
        den = den * r + c
    out: FloatArray = num / den
    return out


def _ndtri_array(p: FloatArray) -> FloatArray:
    if np.any((p < 0.0) | (p > 1.0)) or np.any(np.isnan(p)):
        raise ValueError("p: expected probabilities in [0, 1]")
    q = p - 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        central = q * _rational_array(_AS241_CENTRAL, 0.180625 - q * q)
        r = np.sqrt(-np.log(np.where(q < 0.0, p, 1.0 - p)))
        tail = np.where(r <= 5.0, _rational_array(_AS241_NEAR, r - 1.6), _rational_array(_AS241_FAR, r - 5.0))
    out: FloatArray = np.where(np.abs(q) <= 0.425, central, np.where(q < 0.0, -tail, tail))
    return out


@overload
def ndtri(p: float) -> float: ...
@overload
def ndtri(p: FloatArray) -> FloatArray: ...
def ndtri(p: float | FloatArray) -> float | FloatArray:
    """``Φ⁻¹(p)``, the standard normal quantile (``p`` a probability or an array of them)."""
    if isinstance(p, np.ndarray):
        arr = np.asarray(p, dtype=np.float64)
        return _map(_ndtri_scalar, arr) if arr.size <= _SCALAR_LOOP_MAX else _ndtri_array(arr)
    return _ndtri_scalar(float(p))


def _map(fn: object, values: FloatArray) -> FloatArray:
    if values.size == 1:  # one release at a time: the common case on a device
        return np.full(values.shape, fn(float(values.flat[0])))  # type: ignore[operator]
    flat = np.asarray(values, dtype=np.float64).ravel()
    out = np.fromiter((fn(float(v)) for v in flat), dtype=np.float64, count=flat.size)  # type: ignore[operator]
    return out.reshape(np.shape(values))
