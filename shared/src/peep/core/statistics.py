"""Mergeable face statistics (PEEP Alg. 2, Eqs. 7-10).

Each partition (a camera site, a shard of a dataset) summarises its faces by
count ``n``, mean ``mu`` and co-moment ``M = sum_i (x_i - mu)(x_i - mu)^T``.
Two summaries merge exactly (Chan, Golub & LeVeque's pairwise update)::

    n   = n_a + n_b
    d   = mu_b - mu_a
    mu  = mu_a + d * n_b / n
    M   = M_a + M_b + outer(d, d) * n_a * n_b / n

so the merged covariance ``M / (n - 1)`` equals the one computed on all faces
at once, in any merge order, and eigenfaces from k partitions equal the
centralised ones up to floating-point error. The paper merges covariances;
co-moments make the same merge exact without re-weighting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core._validation import check_array


@dataclass(frozen=True, eq=False)
class FaceStatistics:
    """Count, mean and co-moment of a set of flattened faces.

    Parameters
    ----------
    count : int
        Number of faces summarised.
    mean : ndarray of shape (n_features,)
        Mean face.
    comoment : ndarray of shape (n_features, n_features)
        Sum of outer products of the centred faces.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(10, 3))
    >>> merged = FaceStatistics.from_faces(X[:4]).merge(FaceStatistics.from_faces(X[4:]))
    >>> bool(np.allclose(merged.covariance(), np.cov(X, rowvar=False)))
    True
    """

    count: int
    mean: NDArray[np.float64]
    comoment: NDArray[np.float64]

    @property
    def n_features(self) -> int:
        """Number of pixels per face."""
        return int(self.mean.shape[0])

    @classmethod
    def from_faces(cls, X: ArrayLike) -> FaceStatistics:
        """Summarise faces.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Flattened faces of one partition.
        """
        A = check_array(X, "X", ndim=2)
        mean = A.mean(axis=0)
        centred = A - mean
        return cls(count=int(A.shape[0]), mean=mean, comoment=centred.T @ centred)

    def merge(self, other: FaceStatistics) -> FaceStatistics:
        """Exact summary of the union of both partitions."""
        if not isinstance(other, FaceStatistics):
            raise TypeError(f"other: expected FaceStatistics, received {type(other).__name__}")
        if other.n_features != self.n_features:
            raise ValueError(f"other: expected statistics over {self.n_features} features, received {other.n_features}")
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / n)
        comoment = self.comoment + other.comoment + np.outer(delta, delta) * (self.count * other.count / n)
        return FaceStatistics(count=n, mean=mean, comoment=comoment)

    def covariance(self) -> NDArray[np.float64]:
        """Unbiased covariance, shape (n_features, n_features)."""
        if self.count < 2:
            raise ValueError(f"count: expected at least 2 faces for a covariance, received {self.count}")
        return self.comoment / (self.count - 1)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for shipping a partition's summary)."""
        return {"count": self.count, "mean": self.mean.tolist(), "comoment": self.comoment.tolist()}


def merge_all(parts: Iterable[FaceStatistics]) -> FaceStatistics:
    """Merge any number of partition summaries (order does not matter)."""
    items = list(parts)
    if not items:
        raise ValueError("parts: expected at least one FaceStatistics, received none")
    return reduce(FaceStatistics.merge, items)
