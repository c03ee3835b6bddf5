"""Bounding of eigenface coefficients before noise is added.

Local DP needs a bounded input domain, and the bounds must be public and not
depend on the person being released (docs/CONVENTIONS.md, item 7). PEEP's domain is a box:
per-coordinate ``[lo_j, hi_j]``, scaled to ``[0, 1]`` (Alg. 3); the
rotation-invariant mechanisms use an L2 or L1 ball. All bounds are fitted on
the bundle's faces (:func:`fit_bundle_bounds`) and shipped inside the bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.base import ParamsMixin, check_is_fitted
from peep.core.validation import check_array, check_positive, check_real


def clip_box(Y: ArrayLike, lower: ArrayLike, upper: ArrayLike) -> NDArray[np.float64]:
    """Clip each coordinate into ``[lower_j, upper_j]``.

    Parameters
    ----------
    Y : array-like of shape (n_components,) or (n_samples, n_components)
    lower, upper : array-like of shape (n_components,)
    """
    return np.clip(np.asarray(Y, dtype=np.float64), lower, upper)


def clip_l2(Y: ArrayLike, radius: float) -> NDArray[np.float64]:
    """Scale each vector into the L2 ball of ``radius`` (identity inside it).

    Parameters
    ----------
    Y : array-like of shape (n_components,) or (n_samples, n_components)
    radius : float
    """
    arr = np.asarray(Y, dtype=np.float64)
    norms = np.linalg.norm(arr, axis=-1, keepdims=True)
    # min(1, R/||y||) written without dividing by zero for the zero vector.
    factor = np.minimum(1.0, radius / np.maximum(norms, np.finfo(np.float64).tiny))
    return np.asarray(arr * factor)


def clip_l1(Y: ArrayLike, radius: float) -> NDArray[np.float64]:
    """Scale each vector into the L1 ball of ``radius`` (identity inside it).

    Scaling (not Euclidean projection) is enough for privacy: any map into the
    ball bounds the sensitivity by ``2 * radius``.
    """
    arr = np.asarray(Y, dtype=np.float64)
    norms = np.abs(arr).sum(axis=-1, keepdims=True)
    factor = np.minimum(1.0, radius / np.maximum(norms, np.finfo(np.float64).tiny))
    return np.asarray(arr * factor)


class CoordinateScaler(ParamsMixin):
    """Per-coordinate min-max scaling into ``[0, 1]`` with clipping (PEEP Alg. 3).

    Fitted on the bundle's faces only; vectors outside the fitted range are
    clipped, so the released domain is exactly ``[0, 1]^nc``.

    Parameters
    ----------
    clip : bool, default=True
        Clip transformed values into ``[0, 1]``. Only turn off for analysis.

    Attributes
    ----------
    data_min_ : ndarray of shape (n_components,)
    data_max_ : ndarray of shape (n_components,)
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> s = CoordinateScaler().fit(np.array([[0.0, -2.0], [4.0, 2.0]]))
    >>> s.transform(np.array([[2.0, 0.0], [9.0, -9.0]])).tolist()
    [[0.5, 0.5], [1.0, 0.0]]
    """

    data_min_: NDArray[np.float64]
    data_max_: NDArray[np.float64]
    n_features_in_: int

    def __init__(self, *, clip: bool = True) -> None:
        self.clip = clip

    def fit(self, Y: ArrayLike, y: Any = None) -> Self:
        """Learn per-coordinate bounds from coefficients of the bundle's faces.

        Parameters
        ----------
        Y : array-like of shape (n_samples, n_components)
        """
        arr = check_array(Y, "Y", ndim=2)
        return self._set_bounds(arr.min(axis=0), arr.max(axis=0))

    @classmethod
    def from_bounds(cls, lower: ArrayLike, upper: ArrayLike, *, clip: bool = True) -> CoordinateScaler:
        """A fitted scaler from known (shipped) bounds."""
        lo = check_array(lower, "lower", ndim=1)
        hi = check_array(upper, "upper", ndim=1, n_features=lo.shape[0])
        return cls(clip=clip)._set_bounds(lo, hi)

    def _set_bounds(self, lo: NDArray[np.float64], hi: NDArray[np.float64]) -> Self:
        if np.any(hi <= lo):
            j = int(np.argmax(hi <= lo))
            raise ValueError(
                f"upper: expected upper > lower for every coordinate, received lower={lo[j]} upper={hi[j]} at {j}"
            )
        self.data_min_ = lo.astype(np.float64)
        self.data_max_ = hi.astype(np.float64)
        self.n_features_in_ = int(lo.shape[0])
        return self

    def transform(self, Y: ArrayLike) -> NDArray[np.float64]:
        """Scale to ``[0, 1]`` per coordinate (clipped).

        Parameters
        ----------
        Y : array-like of shape (n_samples, n_components)

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        check_is_fitted(self, ("data_min_", "data_max_"))
        arr = check_array(Y, "Y", ndim=(1, 2), n_features=self.n_features_in_)
        out = (arr - self.data_min_) / (self.data_max_ - self.data_min_)
        return np.clip(out, 0.0, 1.0) if self.clip else out

    def inverse_transform(self, Z: ArrayLike) -> NDArray[np.float64]:
        """Back to coefficient units (noisy values are not clipped)."""
        check_is_fitted(self, ("data_min_", "data_max_"))
        arr = check_array(Z, "Z", ndim=(1, 2), n_features=self.n_features_in_)
        return np.asarray(arr * (self.data_max_ - self.data_min_) + self.data_min_)


@dataclass(frozen=True, kw_only=True, eq=False)
class BundleBounds:
    """The public bounds a bundle ships for every mechanism.

    Attributes
    ----------
    lower, upper : ndarray of shape (n_components,)
        Per-coordinate box (``peep``, ``peep-raw``, ``laplace-vector``).
    radius_l2 : float
        L2 clip radius R of the centred coefficients (``gaussian-l2``).
    radius_l1 : float
        L1 clip radius R1 (``laplace-l1``).
    """

    lower: NDArray[np.float64]
    upper: NDArray[np.float64]
    radius_l2: float
    radius_l1: float

    def __post_init__(self) -> None:
        lo = check_array(self.lower, "lower", ndim=1)
        hi = check_array(self.upper, "upper", ndim=1, n_features=lo.shape[0])
        if np.any(hi <= lo):
            raise ValueError("upper: expected upper > lower for every coordinate")
        check_positive(self.radius_l2, "radius_l2")
        check_positive(self.radius_l1, "radius_l1")
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)

    @property
    def n_components(self) -> int:
        return int(self.lower.shape[0])

    def scaler(self) -> CoordinateScaler:
        """The ``[0, 1]`` scaler for these bounds."""
        return CoordinateScaler.from_bounds(self.lower, self.upper)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lower": [float(v) for v in self.lower],
            "upper": [float(v) for v in self.upper],
            "radius_l2": float(self.radius_l2),
            "radius_l1": float(self.radius_l1),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BundleBounds:
        return cls(
            lower=np.asarray(data["lower"], dtype=np.float64),
            upper=np.asarray(data["upper"], dtype=np.float64),
            radius_l2=float(data["radius_l2"]),
            radius_l1=float(data["radius_l1"]),
        )


def fit_bundle_bounds(coefficients: ArrayLike, *, radius_quantile: float = 0.95) -> BundleBounds:
    """Bounds from the coefficients of the bundle's (background) faces.

    The box is the per-coordinate min/max, as PEEP's MinMaxScaler. The ball
    radii are the ``radius_quantile`` quantile of the faces' L2/L1 norms: a
    smaller radius clips a few faces but cuts the noise for everyone.

    Parameters
    ----------
    coefficients : array-like of shape (n_samples, n_components)
        Eigenface coefficients of the bundle's faces (never of the people who
        will be released: bounds must be public and data-independent).
    radius_quantile : float, default=0.95
    """
    Y = check_array(coefficients, "coefficients", ndim=2)
    q = check_real(radius_quantile, "radius_quantile", low=0.0, high=1.0, low_inclusive=False)
    return BundleBounds(
        lower=Y.min(axis=0),
        upper=Y.max(axis=0),
        radius_l2=float(np.quantile(np.linalg.norm(Y, axis=1), q)),
        radius_l1=float(np.quantile(np.abs(Y).sum(axis=1), q)),
    )
