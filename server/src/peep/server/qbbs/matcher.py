"""Bayesian fusion of the face score with soft traits (chapter Eqs. 5.5-5.7).

* :func:`gaussian_log_likelihood`: log P(Y*'|Y') = log N(Y*' - Y'; 0, c²).
* :class:`ParzenScoreModel`: P(genuine | face score s) from Parzen-window
  (Gaussian-kernel) densities of genuine and impostor scores on validation
  data, by Bayes' rule with a prior P(genuine) (Eq. 5.5).
* :func:`fused_score`: g = a0·log P(genuine|s) + Σ_j a_j·log P(Y_j*'|Y_j')
  (Eq. 5.7), weights non-negative and summing to 1.

Examples
--------
>>> round(gaussian_log_likelihood(172.0, 170.0, 5.0), 6)
-2.608376
>>> round(fused_score(-0.1, {"height": -2.608376}, {"face": 0.8, "height": 0.2}), 6)
-0.601675
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.server.config.qbbs import FACE

__all__ = ["ParzenScoreModel", "check_weights", "fused_score", "gaussian_log_likelihood"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# log P(genuine | s) is floored here: a face score far outside both training
# densities must not make the fused score -inf (which no trait could offset).
_LOG_POSTERIOR_FLOOR = math.log(1e-12)


def gaussian_log_likelihood(observed: ArrayLike, reference: ArrayLike, width: ArrayLike) -> np.ndarray | float:
    """log N(observed - reference; 0, width²), elementwise.

    Parameters
    ----------
    observed : float or ndarray
        Y*' (observed trait, possibly transformed).
    reference : float or ndarray
        Y' (the module's synthesised value).
    width : float or ndarray
        Standard deviation c > 0.
    """
    o = np.asarray(observed, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    c = np.asarray(width, dtype=np.float64)
    if np.any(~(c > 0)):
        raise ValueError(f"width: expected values > 0, received {width!r}")
    z = (o - r) / c
    out = -0.5 * z * z - np.log(c) - _LOG_SQRT_2PI
    return float(out) if out.ndim == 0 else out


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Validate fusion weights: a ``"face"`` entry, all finite and >= 0, sum 1 (±1e-9)."""
    if FACE not in weights:
        raise ValueError(f"weights: expected a {FACE!r} entry (a0), received keys {sorted(weights)}")
    out: dict[str, float] = {}
    for k, v in weights.items():
        fv = float(v)
        if not (math.isfinite(fv) and fv >= 0.0):
            raise ValueError(f"weights.{k}: expected a finite number >= 0, received {v!r}")
        out[k] = fv
    total = math.fsum(out.values())
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"weights: expected values summing to 1, received a sum of {total!r}")
    return out


def fused_score(
    log_p_genuine_face: float, trait_log_likelihoods: Mapping[str, float], weights: Mapping[str, float]
) -> float:
    """g = a0·log P(genuine|s) + Σ_j a_j·log P(Y_j*'|Y_j') (chapter Eq. 5.7).

    ``weights`` must hold ``"face"`` and every trait in ``trait_log_likelihoods``
    and sum to 1 over those keys.
    """
    w = check_weights({FACE: weights[FACE], **{t: weights[t] for t in trait_log_likelihoods}})
    return w[FACE] * float(log_p_genuine_face) + math.fsum(w[t] * float(ll) for t, ll in trait_log_likelihoods.items())


def _silverman(x: NDArray[np.float64]) -> float:
    n = x.size
    sd = float(np.std(x, ddof=1)) if n > 1 else 0.0
    q75, q25 = np.percentile(x, [75, 25])
    iqr = float(q75 - q25) / 1.34
    spread = min(sd, iqr) if iqr > 0 else sd
    if not spread > 0:
        spread = max(abs(float(np.mean(x))), 1.0) * 1e-3
    return float(0.9 * spread * n ** (-0.2))


def _log_kde(points: NDArray[np.float64], samples: NDArray[np.float64], h: float) -> NDArray[np.float64]:
    """log of the Gaussian-kernel density at ``points`` (chunked log-sum-exp)."""
    out = np.empty(points.size, dtype=np.float64)
    norm = math.log(samples.size) + math.log(h) + _LOG_SQRT_2PI
    chunk = max(1, 4_000_000 // max(samples.size, 1))
    for start in range(0, points.size, chunk):
        p = points[start : start + chunk, None]
        z = -0.5 * ((p - samples[None, :]) / h) ** 2
        m = z.max(axis=1, keepdims=True)
        out[start : start + chunk] = (m[:, 0] + np.log(np.exp(z - m).sum(axis=1))) - norm
    return out


class ParzenScoreModel:
    """P(genuine | face score) from Parzen-window densities (chapter Eq. 5.5).

    Parameters
    ----------
    prior : float, default 0.5
        P(genuine).
    bandwidth : "silverman" or float
        Kernel width per class (Silverman's rule on each class by default).
    grid_size : int, default 2048
        Densities are evaluated exactly on a grid spanning the samples ±8
        bandwidths and interpolated inside it; outside it they are evaluated
        exactly. Keeps scoring cheap with tens of thousands of impostor scores.

    Attributes
    ----------
    bandwidth_genuine_, bandwidth_impostor_ : float
    n_genuine_, n_impostor_ : int
    genuine_scores_, impostor_scores_ : ndarray of shape (n_genuine_,), (n_impostor_,)
        The validation scores the densities were fitted on (the calibration
        of the fused threshold resamples them).
    """

    def __init__(self, *, prior: float = 0.5, bandwidth: str | float = "silverman", grid_size: int = 2048) -> None:
        if not (isinstance(prior, (int, float)) and 0.0 < prior < 1.0):
            raise ValueError(f"prior: expected a number in (0, 1), received {prior!r}")
        if bandwidth != "silverman" and not (isinstance(bandwidth, (int, float)) and bandwidth > 0):
            raise ValueError(f"bandwidth: expected 'silverman' or a number > 0, received {bandwidth!r}")
        if not (isinstance(grid_size, int) and grid_size >= 16):
            raise ValueError(f"grid_size: expected an int >= 16, received {grid_size!r}")
        self.prior = float(prior)
        self.bandwidth = bandwidth
        self.grid_size = grid_size

    def fit(self, genuine: ArrayLike, impostor: ArrayLike) -> ParzenScoreModel:
        """Fit both densities on validation scores of the face recogniser."""
        g = np.asarray(genuine, dtype=np.float64).ravel()
        i = np.asarray(impostor, dtype=np.float64).ravel()
        for name, x in (("genuine", g), ("impostor", i)):
            if x.size < 2:
                raise ValueError(f"{name}: expected at least 2 validation scores, received {x.size}")
            if not np.all(np.isfinite(x)):
                raise ValueError(f"{name}: expected finite scores, received non-finite values")
        self._genuine, self._impostor = g, i
        self.genuine_scores_, self.impostor_scores_ = g, i
        if self.bandwidth == "silverman":
            self.bandwidth_genuine_, self.bandwidth_impostor_ = _silverman(g), _silverman(i)
        else:
            self.bandwidth_genuine_ = self.bandwidth_impostor_ = float(self.bandwidth)
        self.n_genuine_, self.n_impostor_ = int(g.size), int(i.size)
        h = max(self.bandwidth_genuine_, self.bandwidth_impostor_)
        lo = float(min(g.min(), i.min())) - 8 * h
        hi = float(max(g.max(), i.max())) + 8 * h
        self._grid = np.linspace(lo, hi, self.grid_size)
        self._grid_lg = _log_kde(self._grid, g, self.bandwidth_genuine_)
        self._grid_li = _log_kde(self._grid, i, self.bandwidth_impostor_)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "_grid"):
            from peep.core.exceptions import NotFittedError

            raise NotFittedError("ParzenScoreModel: call fit(genuine, impostor) first")

    def log_densities(self, scores: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(log p(s | genuine), log p(s | impostor))``."""
        self._check_fitted()
        s = np.atleast_1d(np.asarray(scores, dtype=np.float64))
        if not np.all(np.isfinite(s)):
            raise ValueError("scores: expected finite face scores, received non-finite values")
        lg = np.interp(s, self._grid, self._grid_lg)
        li = np.interp(s, self._grid, self._grid_li)
        outside = (s < self._grid[0]) | (s > self._grid[-1])
        if outside.any():
            lg[outside] = _log_kde(s[outside], self._genuine, self.bandwidth_genuine_)
            li[outside] = _log_kde(s[outside], self._impostor, self.bandwidth_impostor_)
        return lg, li

    def log_posterior(self, scores: ArrayLike) -> NDArray[np.float64]:
        """log P(genuine | s) = log[p_g·π / (p_g·π + p_i·(1 - π))], floored at log 1e-12."""
        lg, li = self.log_densities(scores)
        a = lg + math.log(self.prior)
        b = li + math.log1p(-self.prior)
        out: NDArray[np.float64] = np.maximum(a - np.logaddexp(a, b), _LOG_POSTERIOR_FLOOR)
        return out

    def describe(self) -> dict[str, float | int]:
        self._check_fitted()
        return {
            "prior": self.prior,
            "bandwidth_genuine": self.bandwidth_genuine_,
            "bandwidth_impostor": self.bandwidth_impostor_,
            "n_genuine": self.n_genuine_,
            "n_impostor": self.n_impostor_,
        }
