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

A Fisherface bundle (:mod:`peep.core.projections.fisherfaces`) needs a second
pass: with the merged eigenfaces fixed, each partition summarises its faces'
whitened eigenface coefficients per identity (:class:`ClassStatistics`), and
those merge exactly too, giving the within- and between-class scatter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.validation import check_array

__all__ = ["ClassStatistics", "FaceStatistics", "merge_all"]

S = TypeVar("S", "FaceStatistics", "ClassStatistics")


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


@dataclass(frozen=True, eq=False)
class ClassStatistics:
    """Per-identity counts and means, and the total within-class co-moment, of coefficient vectors.

    The second pass of a distributed Fisherface fit (PEEP Alg. 2 extended):
    once the merged :class:`FaceStatistics` have given the eigenfaces, each
    partition summarises its faces' (whitened) eigenface coefficients per
    identity. Per-class ``n_c`` and ``mu_c`` and the sum of the classes'
    co-moments ``W = sum_c M_c`` are a few kilobytes per identity plus one
    p x p matrix, instead of a D x D matrix per identity, and merge exactly
    even when an identity has faces in several partitions: a class present
    in both adds the Chan/Golub/LeVeque cross term ``outer(d, d) * n_a * n_b / n``
    to ``W``; a class present in one carries over. The between-class scatter
    follows from counts and means, so the merged summary gives the same
    within- and between-class scatter as all the faces at once.

    Parameters
    ----------
    classes : ndarray of shape (n_classes,)
        Sorted distinct identity labels.
    counts : ndarray of shape (n_classes,)
        Number of vectors of each class (>= 1).
    means : ndarray of shape (n_classes, n_features)
        Mean vector of each class.
    within : ndarray of shape (n_features, n_features)
        ``sum_c sum_{i in c} (z_i - mu_c)(z_i - mu_c)^T``, the within-class scatter.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> Z, y = rng.normal(size=(12, 3)), np.array([0, 1, 2] * 4)
    >>> a = ClassStatistics.from_coefficients(Z[:5], y[:5])
    >>> b = ClassStatistics.from_coefficients(Z[5:], y[5:])
    >>> whole = ClassStatistics.from_coefficients(Z, y)
    >>> merged = a.merge(b)
    >>> bool(np.allclose(merged.within_scatter(), whole.within_scatter()))
    True
    >>> bool(np.allclose(merged.between_scatter(), whole.between_scatter()))
    True
    >>> merged.count, merged.n_classes
    (12, 3)
    """

    classes: NDArray[Any]
    counts: NDArray[np.int64]
    means: NDArray[np.float64]
    within: NDArray[np.float64]

    @property
    def count(self) -> int:
        """Number of vectors summarised."""
        return int(self.counts.sum())

    @property
    def n_classes(self) -> int:
        """Number of distinct identities."""
        return int(self.classes.shape[0])

    @property
    def n_features(self) -> int:
        """Dimension of the summarised vectors."""
        return int(self.means.shape[1])

    @classmethod
    def from_coefficients(cls, C: ArrayLike, labels: ArrayLike) -> ClassStatistics:
        """Summarise one partition's vectors by identity.

        Parameters
        ----------
        C : array-like of shape (n_samples, n_features)
            Coefficient vectors (e.g. whitened eigenface coefficients) of one partition.
        labels : array-like of shape (n_samples,)
            Identity of each vector (ints or strings, the same kind in every partition).
        """
        Z = check_array(C, "C", ndim=2)
        y = np.asarray(labels)
        if y.ndim != 1 or y.shape[0] != Z.shape[0]:
            raise ValueError(f"labels: expected shape ({Z.shape[0]},) (one per row of C), received {y.shape}")
        classes, inv = np.unique(y, return_inverse=True)
        counts = np.bincount(inv, minlength=classes.shape[0]).astype(np.int64)
        sums = np.zeros((classes.shape[0], Z.shape[1]))
        np.add.at(sums, inv, Z)
        means = sums / counts[:, None]
        resid = Z - means[inv]
        return cls(classes=classes, counts=counts, means=means, within=resid.T @ resid)

    def merge(self, other: ClassStatistics) -> ClassStatistics:
        """Exact summary of the union of both partitions (identities may appear in both)."""
        if not isinstance(other, ClassStatistics):
            raise TypeError(f"other: expected ClassStatistics, received {type(other).__name__}")
        if other.n_features != self.n_features:
            raise ValueError(f"other: expected statistics over {self.n_features} features, received {other.n_features}")
        if (self.classes.dtype.kind in "iub") != (other.classes.dtype.kind in "iub"):
            raise TypeError(
                f"other: expected labels of the same kind as {self.classes.dtype}, received {other.classes.dtype}"
            )
        classes, inv = np.unique(np.concatenate([self.classes, other.classes]), return_inverse=True)
        ia, ib = inv[: self.n_classes], inv[self.n_classes :]
        counts = np.zeros(classes.shape[0], dtype=np.int64)
        means = np.zeros((classes.shape[0], self.n_features))
        counts[ia], means[ia] = self.counts, self.means
        # Per class, the pairwise update; n_a = 0 for a class only `other` has (then d = mu_b, no cross term).
        n_a, n_b = counts[ib].astype(np.float64), other.counts.astype(np.float64)
        n = n_a + n_b
        delta = other.means - means[ib]
        means[ib] = means[ib] + delta * (n_b / n)[:, None]
        within = self.within + other.within + (delta * (n_a * n_b / n)[:, None]).T @ delta
        counts[ib] = counts[ib] + other.counts
        return ClassStatistics(classes=classes, counts=counts, means=means, within=within)

    def mean(self) -> NDArray[np.float64]:
        """Mean of all vectors, shape (n_features,)."""
        total: NDArray[np.float64] = self.counts @ self.means / self.count
        return total

    def within_scatter(self) -> NDArray[np.float64]:
        """Within-class scatter ``S_w = sum_c M_c``, shape (n_features, n_features)."""
        return self.within

    def between_scatter(self) -> NDArray[np.float64]:
        """Between-class scatter ``S_b = sum_c n_c (mu_c - mu)(mu_c - mu)^T``, shape (n_features, n_features)."""
        centred = self.means - self.mean()
        scatter: NDArray[np.float64] = (centred * self.counts[:, None]).T @ centred
        return scatter

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for shipping a partition's summary)."""
        return {
            "classes": self.classes.tolist(),
            "counts": self.counts.tolist(),
            "means": self.means.tolist(),
            "within": self.within.tolist(),
        }


def merge_all(parts: Iterable[S]) -> S:
    """Merge any number of partition summaries of one type (order does not matter).

    ``parts`` are :class:`FaceStatistics` (pass 1) or :class:`ClassStatistics` (pass 2).
    """
    items = list(parts)
    if not items:
        raise ValueError("parts: expected at least one FaceStatistics or ClassStatistics, received none")
    merged: S = reduce(lambda a, b: a.merge(b), items)
    return merged
