"""Parameter validation shared by estimators and mechanisms.

Messages follow one shape: ``<name>: expected <what>, received <value>``.
Wrong type -> TypeError, right type but out of range -> ValueError.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray


def check_real(
    value: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
    """Validate a finite real scalar in an interval and return it as ``float``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, received {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name}: expected a number, received NaN")
    if math.isinf(v):
        raise ValueError(f"{name}: expected a finite number, received {v}")
    if low is not None and (v < low or (v == low and not low_inclusive)):
        bound = ">=" if low_inclusive else ">"
        raise ValueError(f"{name}: expected {bound} {low}, received {v}")
    if high is not None and (v > high or (v == high and not high_inclusive)):
        bound = "<=" if high_inclusive else "<"
        raise ValueError(f"{name}: expected {bound} {high}, received {v}")
    return v


def check_positive(value: Any, name: str) -> float:
    """A finite real strictly greater than zero."""
    return check_real(value, name, low=0.0, low_inclusive=False)


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """Validate an integer (numpy integers accepted, bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, received {value!r} ({type(value).__name__})")
    v = int(value)
    if low is not None and v < low:
        raise ValueError(f"{name}: expected >= {low}, received {v}")
    if high is not None and v > high:
        raise ValueError(f"{name}: expected <= {high}, received {v}")
    return v


def check_array(
    X: ArrayLike,
    name: str = "X",
    *,
    ndim: int | tuple[int, ...] = 2,
    n_features: int | None = None,
    dtype: type = np.float64,
    allow_empty: bool = False,
) -> NDArray[Any]:
    """Convert to a finite numeric array of the expected rank and width.

    Raises ValueError naming ``name`` for NaN/Inf, wrong rank, wrong number of
    features (last axis) or an empty array.
    """
    try:
        arr: NDArray[Any] = np.asarray(X, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: expected a numeric array, received {type(X).__name__} ({exc})") from exc
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in ndims:
        raise ValueError(f"{name}: expected a {' or '.join(map(str, ndims))}-d array, received shape {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, received shape {arr.shape}")
    if n_features is not None and arr.shape[-1] != n_features:
        raise ValueError(
            f"{name}: expected {n_features} features (last axis), received {arr.shape[-1]} (shape {arr.shape})"
        )
    if not np.all(np.isfinite(arr)):
        bad = "NaN" if np.isnan(arr).any() else "Inf"
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise ValueError(f"{name}: expected finite values, received {bad} at index {where}")
    return arr
