"""``eigenfaces``: the PEEP paper's projection (PCA of the public faces, Alg. 1).

The coefficients are the faces' coordinates on the top ``n_components``
eigenfaces, unbounded; each mechanism then releases them bounded by the
bundle's public box or radii. The eigenfaces may also come from merged
partition statistics (Alg. 2, :meth:`EigenfaceProjection.from_model` with
:meth:`peep.core.eigenface_model.EigenfaceModel.from_statistics`): the merge is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.base import check_is_fitted
from peep.core.bounding import BundleBounds
from peep.core.domains import COEFFICIENTS, DomainGraph
from peep.core.eigenface_model import EigenfaceModel
from peep.core.projections.base import FACES, Projection
from peep.core.projections.registry import register_projection

__all__ = ["EigenfaceProjection"]


@register_projection
class EigenfaceProjection(Projection):
    """Eigenfaces (PCA) fitted on the public faces.

    Parameters
    ----------
    n_components : int, default=128
        Number of eigenfaces kept (the paper's nc).
    radius_quantile : float, default=0.95
    mirror_shape : (height, width) or None, default=None
        See :class:`~peep.core.projections.base.Projection`: fit on the public
        faces and their mirror images.

    Attributes
    ----------
    model_ : EigenfaceModel
    bounds_ : BundleBounds
    n_components_, n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).uniform(size=(30, 40))
    >>> p = EigenfaceProjection(n_components=4).fit(X)
    >>> p.transform(X).shape, p.bounds_.n_components
    ((30, 4), 4)
    """

    kind: ClassVar[str] = "eigenfaces"
    summary: ClassVar[str] = "PCA of the public faces (PEEP Alg. 1); bounded per mechanism by the bundle's box or radii"

    model_: EigenfaceModel

    def __init__(
        self, *, n_components: int = 128, radius_quantile: float = 0.95, mirror_shape: tuple[int, int] | None = None
    ) -> None:
        super().__init__(n_components=n_components, radius_quantile=radius_quantile, mirror_shape=mirror_shape)

    def _fit(self, X: NDArray[np.float64], y: NDArray[Any] | None) -> None:
        self._set_model(EigenfaceModel(n_components=self.n_components).fit(X))

    def _set_model(self, model: EigenfaceModel) -> None:
        self.model_ = model
        self.n_components_ = int(model.n_components_)
        self.n_features_in_ = int(model.n_features_in_)

    @classmethod
    def from_model(cls, model: EigenfaceModel, bounds: BundleBounds) -> EigenfaceProjection:
        """A fitted projection from fitted eigenfaces and public bounds (e.g. from merged statistics)."""
        check_is_fitted(model, ("components_", "mean_"))
        if bounds.n_components != model.n_components_:
            raise ValueError(
                f"bounds: expected {model.n_components_} components (the model's), received {bounds.n_components}"
            )
        projection = cls(n_components=int(model.n_components_))
        projection._set_model(model)
        projection.bounds_ = bounds
        return projection

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, ("model_",))
        return self.model_.transform(X)

    def head_graph(self) -> DomainGraph:
        check_is_fitted(self, ("model_",))
        m = self.model_
        f32 = np.float32
        return DomainGraph(
            nodes=[
                ("Sub", (FACES, "mean"), ("centred",), {}),
                ("MatMul", ("centred", "components_t"), (COEFFICIENTS,), {}),
            ],
            initializers={
                "mean": m.mean_.astype(f32),
                "components_t": np.ascontiguousarray(m.components_.T.astype(f32)),
                "explained_variance": np.asarray(m.explained_variance_, dtype=f32),
            },
        )

    def metadata(self) -> dict[str, Any]:
        check_is_fitted(self, ("model_",))
        return {"explained_variance_ratio": [float(v) for v in self.model_.explained_variance_ratio_]}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]], metadata: Mapping[str, Any]) -> Self:
        model = EigenfaceModel.from_components(
            mean=arrays["mean"].astype(np.float64),
            components=arrays["components_t"].T.astype(np.float64),
            explained_variance=arrays["explained_variance"].astype(np.float64),
        )
        projection = cls(n_components=int(model.n_components_))
        projection._set_model(model)
        projection.bounds_ = BundleBounds.from_dict(dict(metadata["bounds"]))
        return projection
