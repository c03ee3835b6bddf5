"""``fisherfaces``: eigenfaces, whitened, then LDA on the public background identities.

Belhumeur, Hespanha & Kriegman's Fisherfaces, fitted on the bundle's public
faces and their identity labels only (never on enrolled people):

1. eigenfaces (:class:`~peep.core.eigenface_model.EigenfaceModel`) of the faces,
   ``n_pca`` of them;
2. the coefficients whitened by ``1/sqrt(explained variance)``, so the
   faces' total covariance is the identity;
3. within-class scatter ``S_w`` and between-class scatter ``S_b`` of the
   whitened coefficients, and the generalised eigenproblem
   ``S_b v = λ (S_w + ridge) v``; the top ``n_components`` directions ``v``;
4. all of it folded into one pixel-space matrix ``W`` of shape
   (n_features, n_components): ``coefficients = (faces − mean) @ W``.

The projector's ``unit`` output (:class:`~peep.core.domains.UnitSphereDomain`)
is then the L2-normalised template the unit-sphere mechanisms ``privunit`` and
``privunit-g`` release. LDA directions separate *identities*, and they carry
over to identities the background never held: measured on LFW
(``tests/core/test_fisherfaces.py``), fitted on the 5–9-image people and
tested on the five people with ≥ 100 images, 32 Fisherfaces separate the
five far better than 32 eigenfaces do.

Distributed fit (PEEP Alg. 2 extended, two passes, both merges exact):

* pass 1: partitions send :class:`~peep.core.statistics.FaceStatistics`;
  the merge gives the eigenfaces
  (:meth:`~peep.core.eigenface_model.EigenfaceModel.from_statistics`);
* pass 2: with those eigenfaces, partitions send
  :class:`~peep.core.statistics.ClassStatistics` of their faces'
  :meth:`FisherfaceProjection.whitened_coefficients` per identity; the merge
  gives ``S_w`` and ``S_b`` and :meth:`FisherfaceProjection.from_statistics`
  the same projection as a fit on all the faces at once.

Per-class D × D statistics are never formed (322 LFW identities × 2,914²
doubles would be 22 GB): pass 2 works in the n_pca-dimensional whitened space.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.base import check_is_fitted
from peep.core.bounding import BundleBounds
from peep.core.domains import COEFFICIENTS, DomainGraph
from peep.core.projections.base import FACES, Projection
from peep.core.projections.registry import register_projection
from peep.core.statistics import ClassStatistics
from peep.core.validation import check_array, check_int, check_real

if TYPE_CHECKING:
    from peep.core.eigenface_model import EigenfaceModel

__all__ = ["FisherfaceProjection"]

# Eigenfaces whose variance is below this fraction of the first one's are
# numerically zero (duplicate faces, more components than the data's rank);
# whitening would divide by rounding noise, so they are dropped.
_RANK_RTOL = 1e-10
_FITTED = ("mean_", "scalings_")


def _fix_column_signs(W: NDArray[np.float64]) -> NDArray[np.float64]:
    # A discriminant direction is defined up to sign; make the largest-magnitude
    # pixel of each column positive (as eigenfaces' _fix_signs does for rows), so
    # the central and the distributed fit, and every refit, give the same W.
    idx = np.argmax(np.abs(W), axis=0)
    signs = np.sign(W[idx, np.arange(W.shape[1])])
    signs[signs == 0] = 1.0
    fixed: NDArray[np.float64] = W * signs[None, :]
    return fixed


def _check_n_components(k: int, n_classes: int, n_pca: int) -> int:
    limit = min(n_classes - 1, n_pca)
    if k > limit:
        raise ValueError(
            f"n_components: expected <= {limit} (at most n_classes - 1 = {n_classes - 1} and at most "
            f"n_pca = {n_pca} eigenfaces used), received {k}"
        )
    return k


def _whitened_rank(model: EigenfaceModel) -> int:
    ev = np.asarray(model.explained_variance_, dtype=np.float64)
    if ev.size == 0 or ev[0] <= 0:
        return 0
    return int(np.count_nonzero(ev > ev[0] * _RANK_RTOL))


@register_projection
class FisherfaceProjection(Projection):
    """Fisherfaces: whitened eigenfaces, then LDA on the public identities.

    Parameters
    ----------
    n_components : int, default=32
        Number of discriminant directions K (a template's dimension). At most
        the number of identities − 1 and at most the eigenfaces used (see
        ``n_pca``); :meth:`fit` says which limit it exceeds.
    n_pca : int, default=200
        Eigenfaces computed before the LDA. Capped by the data: at most
        n_samples − 1 and n_features (the eigenfaces' rank), then at most
        n_samples − n_classes (the rank of the within-class scatter, as in
        Belhumeur et al.), and eigenfaces with numerically zero variance are
        dropped. ``n_pca_`` is the number used.
    regularisation : float, default=1e-3
        Shrinkage α in [0, 1] of the within-class scatter towards a multiple
        of the identity, ``(1 − α) S_w + α (tr S_w / p) I``, in the whitened
        space. It keeps the generalised eigenproblem well posed when some
        directions have (almost) no within-class spread (few faces per
        identity, near-duplicate faces). 1e-3 bounds the condition number of
        the regularised scatter by about 1,000 · p while leaving a
        well-conditioned fit unchanged (on LFW the accuracy of the projected
        templates is the same to three decimals for α from 0 to 0.3).
    radius_quantile : float, default=0.95
    mirror_shape : (height, width) or None, default=None
        See :class:`~peep.core.projections.base.Projection`: fit on the public
        faces and their mirror images.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,)
        Mean of the public faces.
    scalings_ : ndarray of shape (n_features, n_components)
        ``W``: the coefficients are ``(X − mean_) @ scalings_``. Each column is
        scaled so the (regularised) pooled within-class variance along it is 1.
    eigenvalues_ : ndarray of shape (n_components,)
        Fisher ratios λ (between- over regularised within-class scatter) of
        the directions, decreasing.
    n_pca_ : int
        Eigenfaces the LDA used.
    n_classes_ : int
        Identities the projection was fitted on.
    n_samples_ : int
        Faces it was fitted on.
    pca_variance_ratio_ : float
        Fraction of the faces' variance the ``n_pca_`` eigenfaces hold (NaN
        when rebuilt from a bundle that does not record it).
    bounds_ : BundleBounds
    n_components_, n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.arange(6), 5)
    >>> X = rng.uniform(size=(30, 40)) + rng.normal(size=(6, 40))[y]
    >>> p = FisherfaceProjection(n_components=3, n_pca=20).fit(X, y)
    >>> p.transform(X).shape, p.n_pca_, p.n_classes_
    ((30, 3), 20, 6)
    """

    kind: ClassVar[str] = "fisherfaces"
    summary: ClassVar[str] = (
        "whitened eigenfaces then LDA on the public background identities (Fisherfaces); "
        "its unit output is what privunit releases"
    )
    mirror_by_default: ClassVar[bool] = True
    needs_labels: ClassVar[bool] = True

    mean_: NDArray[np.float64]
    scalings_: NDArray[np.float64]
    eigenvalues_: NDArray[np.float64]
    n_pca_: int
    n_classes_: int
    n_samples_: int
    pca_variance_ratio_: float

    def __init__(
        self,
        *,
        n_components: int = 32,
        n_pca: int = 200,
        regularisation: float = 1e-3,
        radius_quantile: float = 0.95,
        mirror_shape: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(n_components=n_components, radius_quantile=radius_quantile, mirror_shape=mirror_shape)
        self.n_pca = n_pca
        self.regularisation = regularisation

    # ----------------------------------------------------------------- fitting

    def _fit(self, X: NDArray[np.float64], y: NDArray[Any] | None) -> None:
        from peep.core.eigenface_model import EigenfaceModel

        k = check_int(self.n_components, "n_components", low=1)
        n_pca = check_int(self.n_pca, "n_pca", low=1)
        check_real(self.regularisation, "regularisation", low=0.0, high=1.0)
        n, d = X.shape
        labels = np.asarray(y)
        if labels.ndim != 1 or labels.shape[0] != n:
            raise ValueError(f"y: expected one identity per face, shape ({n},), received shape {labels.shape}")
        n_classes = int(np.unique(labels).shape[0])
        if n_classes < 2:
            raise ValueError(f"y: expected at least 2 identities to separate, received {n_classes}")
        # The LDA never uses more than n - n_classes eigenfaces (the within-class
        # scatter's rank); computing more is wasted work. Checking K here, before
        # the eigenfaces, makes the common mistake fail fast.
        n_pca = min(n_pca, n - n_classes, n - 1, d)
        if n_pca >= 1:
            _check_n_components(k, n_classes, n_pca)
        model = EigenfaceModel(n_components=max(1, n_pca)).fit(X)
        classes = ClassStatistics.from_coefficients(self.whitened_coefficients(model, X), labels)
        self._fit_discriminants(model, classes)

    @classmethod
    def from_statistics(
        cls,
        model: EigenfaceModel,
        classes: ClassStatistics,
        *,
        n_components: int = 32,
        regularisation: float = 1e-3,
        radius_quantile: float = 0.95,
        bounds: BundleBounds | None = None,
    ) -> FisherfaceProjection:
        """The projection from merged partition statistics (distributed fit, pass 2).

        Parameters
        ----------
        model : EigenfaceModel
            Eigenfaces from the merged :class:`~peep.core.statistics.FaceStatistics`
            of every partition (pass 1); its ``n_components`` plays ``n_pca``.
        classes : ClassStatistics
            Merged per-identity statistics of every partition's
            :meth:`whitened_coefficients` with ``model`` (pass 2).
        n_components, regularisation, radius_quantile
            As for the constructor.
        bounds : BundleBounds, optional
            Public bounds of the coefficients (e.g. merged per-partition
            minima and maxima of :meth:`transform`'s output); without them the
            projection transforms but cannot be shipped until ``bounds_`` is set.

        Returns
        -------
        FisherfaceProjection
            Equal (up to rounding) to :meth:`fit` on all the partitions' faces
            with ``n_pca=model.n_components_``.
        """
        check_is_fitted(model, ("components_", "mean_"))
        if not isinstance(classes, ClassStatistics):
            raise TypeError(f"classes: expected ClassStatistics, received {type(classes).__name__}")
        projection = cls(
            n_components=n_components,
            n_pca=int(model.n_components_),
            regularisation=regularisation,
            radius_quantile=radius_quantile,
        )
        check_int(n_components, "n_components", low=1)
        check_real(regularisation, "regularisation", low=0.0, high=1.0)
        projection._fit_discriminants(model, classes)
        if bounds is not None:
            if bounds.n_components != projection.n_components_:
                raise ValueError(
                    f"bounds: expected {projection.n_components_} components (the projection's), "
                    f"received {bounds.n_components}"
                )
            projection.bounds_ = bounds
        return projection

    @staticmethod
    def whitened_coefficients(model: EigenfaceModel, X: ArrayLike) -> NDArray[np.float64]:
        """Faces' eigenface coefficients scaled to unit variance (what pass 2 summarises).

        Parameters
        ----------
        model : EigenfaceModel
            Fitted eigenfaces.
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, p)
            ``p`` is the number of eigenfaces of non-zero variance.
        """
        check_is_fitted(model, ("components_", "mean_"))
        p = _whitened_rank(model)
        if p == 0:
            raise ValueError("model: expected eigenfaces with non-zero variance, received all zero (identical faces?)")
        Z = model.transform(X)[:, :p]
        scaled: NDArray[np.float64] = Z / np.sqrt(model.explained_variance_[:p])
        return scaled

    def _fit_discriminants(self, model: EigenfaceModel, classes: ClassStatistics) -> None:
        import scipy.linalg

        rank = _whitened_rank(model)
        if classes.n_features != rank:
            raise ValueError(
                f"classes: expected statistics of {rank} whitened coefficients (the model's), "
                f"received {classes.n_features}"
            )
        n, n_classes = classes.count, classes.n_classes
        if n_classes < 2:
            raise ValueError(f"y: expected at least 2 identities to separate, received {n_classes}")
        dof = n - n_classes
        within_trace = float(np.trace(classes.within)) if dof > 0 else 0.0
        if within_trace <= 0.0:
            raise ValueError(
                f"y: expected at least one identity with two or more distinct faces (the within-class scatter "
                f"needs them), received {n_classes} identities of {n} faces"
            )
        p = min(rank, dof)
        k = _check_n_components(int(self.n_components), n_classes, p)
        alpha = float(self.regularisation)
        s_w = classes.within[:p, :p]
        s_b = classes.between_scatter()[:p, :p]
        s_w, s_b = (s_w + s_w.T) / 2.0, (s_b + s_b.T) / 2.0
        s_w_reg = (1.0 - alpha) * s_w + (alpha * float(np.trace(s_w)) / p) * np.eye(p)
        # Checked here rather than left to eigh's Cholesky: whether a numerically singular matrix
        # fails there depends on the LAPACK build's rounding, and near-singular directions would
        # get near-infinite LDA scalings.
        w = np.linalg.eigvalsh(s_w_reg)
        singular = not w[0] > w[-1] * p * 64.0 * np.finfo(np.float64).eps
        try:
            if singular:
                raise np.linalg.LinAlgError(f"smallest eigenvalue {w[0]:.3g}, largest {w[-1]:.3g}")
            evals, evecs = scipy.linalg.eigh(s_b, s_w_reg, subset_by_index=[p - k, p - 1])
        except np.linalg.LinAlgError as exc:
            raise ValueError(
                f"regularisation: the within-class scatter is singular with regularisation={alpha}; "
                f"expected a value > 0 (e.g. 1e-3) ({exc})"
            ) from None
        order = np.argsort(evals)[::-1]
        # eigh normalises v' S_w_reg v = 1; times sqrt(dof) makes the pooled
        # within-class *variance* along each direction 1 (scikit-learn's LDA scaling).
        directions = evecs[:, order] * np.sqrt(dof)
        whiten = 1.0 / np.sqrt(model.explained_variance_[:p])
        W = model.components_[:p].T @ (directions * whiten[:, None])
        self.mean_ = np.asarray(model.mean_, dtype=np.float64).copy()
        self.scalings_ = _fix_column_signs(np.ascontiguousarray(W))
        self.eigenvalues_ = np.clip(evals[order], 0.0, None)
        self.n_pca_ = p
        self.n_classes_ = n_classes
        self.n_samples_ = n
        self.pca_variance_ratio_ = float(np.sum(model.explained_variance_ratio_[:p]))
        self.n_components_ = k
        self.n_features_in_ = int(self.mean_.shape[0])

    # --------------------------------------------------------------- applying

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """Raw Fisherface coefficients.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Normalised faces, flattened.

        Returns
        -------
        ndarray of shape (n_samples, n_components_)
        """
        check_is_fitted(self, _FITTED)
        A = check_array(X, "X", ndim=2, n_features=self.n_features_in_)
        return np.asarray((A - self.mean_) @ self.scalings_)

    def head_graph(self) -> DomainGraph:
        check_is_fitted(self, _FITTED)
        f32 = np.float32
        return DomainGraph(
            nodes=[
                ("Sub", (FACES, "mean"), ("centred",), {}),
                ("MatMul", ("centred", "fisher_scalings"), (COEFFICIENTS,), {}),
            ],
            initializers={
                "mean": self.mean_.astype(f32),
                "fisher_scalings": np.ascontiguousarray(self.scalings_.astype(f32)),
            },
        )

    def metadata(self) -> dict[str, Any]:
        check_is_fitted(self, _FITTED)
        return {
            "fisherfaces": {
                "n_pca": int(self.n_pca_),
                "n_classes": int(self.n_classes_),
                "n_faces": int(self.n_samples_),
                "regularisation": float(self.regularisation),
                "mirrored": self.mirror_shape is not None,
                "pca_variance_ratio": float(self.pca_variance_ratio_),
                "discriminant_eigenvalues": [float(v) for v in self.eigenvalues_],
            }
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]], metadata: Mapping[str, Any]) -> Self:
        W = check_array(arrays["fisher_scalings"], "fisher_scalings", ndim=2)
        mean = check_array(arrays["mean"], "mean", ndim=1, n_features=W.shape[0])
        facts = dict(metadata.get("fisherfaces", {}))
        k = int(W.shape[1])
        projection = cls(
            n_components=k,
            n_pca=int(facts.get("n_pca", k)),
            regularisation=float(facts.get("regularisation", 1e-3)),
        )
        projection.mean_ = mean
        projection.scalings_ = W
        projection.eigenvalues_ = np.asarray(facts.get("discriminant_eigenvalues", np.full(k, np.nan)), dtype=float)
        projection.n_pca_ = int(facts.get("n_pca", 0))
        projection.n_classes_ = int(facts.get("n_classes", 0))
        projection.n_samples_ = int(facts.get("n_faces", 0))
        projection.pca_variance_ratio_ = float(facts.get("pca_variance_ratio", np.nan))
        projection.n_components_ = k
        projection.n_features_in_ = int(W.shape[0])
        projection.bounds_ = BundleBounds.from_dict(dict(metadata["bounds"]))
        return projection
