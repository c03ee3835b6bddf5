"""Eigenfaces (PEEP Alg. 1) as a scikit-learn style estimator.

With N faces of D pixels and N << D (1,140 LFW faces of 62x47 = 2,914
pixels), the D x D covariance is never formed: the eigenvectors ``v`` of the
small N x N Gram matrix ``A A^T`` of the centred faces ``A`` give the
eigenfaces ``u = A^T v / sqrt(lambda)`` (Turk & Pentland's trick, Alg. 1).
Models can also be fitted from merged :class:`~peep.core.statistics.FaceStatistics`
(PEEP Alg. 2) so partitions never share faces.
"""

from __future__ import annotations

from typing import Any, Literal, Self

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray
from peep.core.base import ParamsMixin, check_is_fitted
from peep.core.statistics import FaceStatistics
from peep.core.validation import check_array, check_int

Method = Literal["auto", "gram", "covariance", "svd"]
_METHODS = ("auto", "gram", "covariance", "svd")
_FITTED = ("components_", "mean_")


def _fix_signs(components: NDArray[np.float64]) -> NDArray[np.float64]:
    # Eigenvectors are defined up to sign; make the largest-magnitude pixel of
    # each eigenface positive so every fitting method gives identical output.
    idx = np.argmax(np.abs(components), axis=1)
    signs = np.sign(components[np.arange(components.shape[0]), idx])
    signs[signs == 0] = 1.0
    fixed: NDArray[np.float64] = components * signs[:, None]
    return fixed


class EigenfaceModel(ParamsMixin):
    """Principal components of flattened faces (eigenfaces).

    Parameters
    ----------
    n_components : int, default=128
        Number of eigenfaces kept (the paper's nc).
    method : {"auto", "gram", "covariance", "svd"}, default="auto"
        ``"gram"`` eigendecomposes the N x N Gram matrix (Alg. 1, used when
        N <= D), ``"covariance"`` the D x D covariance (used when N > D),
        ``"svd"`` takes a thin SVD of the centred faces (most accurate, slowest).

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,)
        The mean face.
    components_ : ndarray of shape (n_components, n_features)
        Orthonormal eigenfaces, by decreasing explained variance.
    explained_variance_ : ndarray of shape (n_components,)
        Variance of the training faces along each eigenface.
    explained_variance_ratio_ : ndarray of shape (n_components,)
        ``explained_variance_`` over the total variance.
    n_components_ : int
    n_features_in_ : int
    n_samples_ : int

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(20, 50))
    >>> model = EigenfaceModel(n_components=5).fit(X)
    >>> model.transform(X).shape
    (20, 5)
    >>> bool(np.allclose(model.components_ @ model.components_.T, np.eye(5)))
    True
    """

    mean_: NDArray[np.float64]
    components_: NDArray[np.float64]
    explained_variance_: NDArray[np.float64]
    explained_variance_ratio_: NDArray[np.float64]
    n_components_: int
    n_features_in_: int
    n_samples_: int

    def __init__(self, *, n_components: int = 128, method: Method = "auto") -> None:
        self.n_components = n_components
        self.method = method

    def _validate_params(self, n_samples: int, n_features: int) -> int:
        if self.method not in _METHODS:
            raise ValueError(f"method: expected one of {list(_METHODS)}, received {self.method!r}")
        limit = min(n_samples - 1, n_features)
        return check_int(self.n_components, "n_components", low=1, high=max(limit, 1))

    def fit(self, X: ArrayLike, y: Any = None) -> Self:
        """Fit eigenfaces on flattened faces.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Flattened grayscale faces, one per row.
        y : ignored

        Returns
        -------
        self : EigenfaceModel
        """
        A = check_array(X, "X", ndim=2)
        n, d = A.shape
        if n < 2:
            raise ValueError(f"X: expected at least 2 faces, received {n}")
        nc = self._validate_params(n, d)
        mean = A.mean(axis=0)
        centred = A - mean
        method = self.method
        if method == "auto":
            method = "gram" if n <= d else "covariance"
        total_var = float(np.einsum("ij,ij->", centred, centred)) / (n - 1)
        if method == "svd":
            _, s, vt = np.linalg.svd(centred, full_matrices=False)
            components = vt[:nc]
            variances = s[:nc] ** 2 / (n - 1)
        elif method == "gram":
            gram = centred @ centred.T
            evals, evecs = scipy.linalg.eigh(gram, subset_by_index=[n - nc, n - 1])
            order = np.argsort(evals)[::-1]
            evals, evecs = np.clip(evals[order], 0.0, None), evecs[:, order]
            components = evecs.T @ centred
            components /= np.linalg.norm(components, axis=1, keepdims=True)
            variances = evals / (n - 1)
        else:
            components, variances = _top_eigenpairs(centred.T @ centred / (n - 1), nc)
        self._set_fitted(mean, components, variances, total_var, n)
        return self

    @classmethod
    def from_statistics(cls, stats: FaceStatistics, *, n_components: int = 128) -> EigenfaceModel:
        """Eigenfaces from merged partition statistics (PEEP Alg. 2).

        Parameters
        ----------
        stats : FaceStatistics
            Merged count, mean and co-moment of all partitions.
        n_components : int, default=128
        """
        model = cls(n_components=n_components, method="covariance")
        nc = model._validate_params(stats.count, stats.n_features)
        cov = stats.covariance()
        components, variances = _top_eigenpairs(cov, nc)
        model._set_fitted(stats.mean.copy(), components, variances, float(np.trace(cov)), stats.count)
        return model

    @classmethod
    def from_components(
        cls,
        *,
        mean: ArrayLike,
        components: ArrayLike,
        explained_variance: ArrayLike | None = None,
    ) -> EigenfaceModel:
        """Rebuild a fitted model from shipped arrays (e.g. a bundle).

        Parameters
        ----------
        mean : array-like of shape (n_features,)
        components : array-like of shape (n_components, n_features)
        explained_variance : array-like of shape (n_components,), optional
        """
        comp = check_array(components, "components", ndim=2)
        mu = check_array(mean, "mean", ndim=1, n_features=comp.shape[1])
        var = (
            np.zeros(comp.shape[0])
            if explained_variance is None
            else check_array(explained_variance, "explained_variance", ndim=1, n_features=comp.shape[0])
        )
        model = cls(n_components=comp.shape[0], method="auto")
        model.mean_ = mu
        model.components_ = comp
        model.explained_variance_ = var
        total = float(var.sum())
        model.explained_variance_ratio_ = var / total if total > 0 else np.zeros_like(var)
        model.n_components_ = comp.shape[0]
        model.n_features_in_ = comp.shape[1]
        model.n_samples_ = 0
        return model

    def _set_fitted(
        self,
        mean: NDArray[np.float64],
        components: NDArray[np.float64],
        variances: NDArray[np.float64],
        total_var: float,
        n: int,
    ) -> None:
        self.mean_ = mean
        self.components_ = _fix_signs(np.ascontiguousarray(components))
        self.explained_variance_ = variances
        self.explained_variance_ratio_ = variances / total_var if total_var > 0 else np.zeros_like(variances)
        self.n_components_ = int(components.shape[0])
        self.n_features_in_ = int(mean.shape[0])
        self.n_samples_ = n

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """Project faces onto the eigenfaces.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        check_is_fitted(self, _FITTED)
        A = check_array(X, "X", ndim=2, n_features=self.n_features_in_)
        return np.asarray((A - self.mean_) @ self.components_.T)

    def fit_transform(self, X: ArrayLike, y: Any = None) -> NDArray[np.float64]:
        """Fit, then project the same faces."""
        return self.fit(X).transform(X)

    def inverse_transform(self, Y: ArrayLike) -> NDArray[np.float64]:
        """Faces from coefficients (PEEP Eq. 14's reconstruction).

        Parameters
        ----------
        Y : array-like of shape (n_samples, n_components)

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self, _FITTED)
        C = check_array(Y, "Y", ndim=2, n_features=self.n_components_)
        return np.asarray(C @ self.components_ + self.mean_)


def _top_eigenpairs(cov: NDArray[np.float64], nc: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    d = cov.shape[0]
    evals, evecs = scipy.linalg.eigh(cov, subset_by_index=[d - nc, d - 1])
    order = np.argsort(evals)[::-1]
    return np.ascontiguousarray(evecs[:, order].T), np.clip(evals[order], 0.0, None)
