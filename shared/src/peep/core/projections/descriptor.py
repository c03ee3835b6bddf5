"""``dlib-resnet``: a deep public face descriptor reduced by a public PCA (whitened).

The device computes dlib's 128-d ResNet face descriptor (5-point landmark
alignment, then the network; both models ship in the PyPI package
``face_recognition_models`` under CC0, see :mod:`peep.edge.embedding`) for
each face it is about to release, and the bundle's signed projector reduces
it to ``n_components`` dimensions: the descriptor minus the public mean, on
the top principal axes of descriptors of the *public background*, each axis
scaled to unit variance (whitening), so every kept direction carries the same
weight before the ``unit`` output normalises the template for the unit-sphere
mechanisms. The network itself is not in the bundle: the bundle names it by
the SHA-256 of its model files and its package version (:meth:`input_description`,
signed with the rest of ``metadata.json``), and a device running another
network refuses the bundle.

Why reduce: released whole (128-d), the descriptor loses to 32-d Fisherfaces at
per-template ε <= 16 (PrivUnit's variance grows with the dimension); a few
public directions keep most of its identity information.
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

__all__ = ["DESCRIPTOR_DIMENSION", "DLIB_RESNET_MODEL_SHA256", "DlibResNetProjection", "untrusted_network"]

#: Dimension of dlib's face descriptor.
DESCRIPTOR_DIMENSION = 128
#: SHA-256 of the model files of ``face_recognition_models`` 0.3.0 (the release PEEP is measured with):
#: what a server trusts by default (``[bundle] trusted_descriptor_models``).
DLIB_RESNET_MODEL_SHA256 = {
    "network_sha256": "55533b28a95800a551ba546ba62fe69625c7e95a7061c338adffead08719da30",
    "landmarks_sha256": "c4b1e9804792707d3a405c2c16a80a20269e6675021f64a41d30fffafbc41888",
}
# Variances below this (relative to the largest) are numerically zero: not whitened.
_MIN_RELATIVE_VARIANCE = 1e-10


@register_projection
class DlibResNetProjection(Projection):
    """A public, whitened PCA of dlib ResNet face descriptors.

    Parameters
    ----------
    n_components : int, default=16
        Dimension of a template (at most 128 and at most the public
        descriptors' rank).
    radius_quantile : float, default=0.95
        See :class:`~peep.core.projections.base.Projection`.
    mirror_shape : None
        Must be None: the input is a descriptor (mirror the images before
        computing their descriptors instead).
    network : mapping, optional
        The descriptor network's identity (``kind``, file SHA-256s, versions)
        as :attr:`peep.edge.embedding.DlibResNetEncoder.identity` gives it;
        recorded in the bundle so that devices check they run the same network.

    Attributes
    ----------
    mean_ : ndarray of shape (128,)
        Mean public descriptor.
    components_ : ndarray of shape (n_components, 128)
        Principal axes of the public descriptors.
    scales_ : ndarray of shape (n_components,)
        ``1/√variance`` along each axis (whitening).
    explained_variance_ratio_ : ndarray of shape (n_components,)

    Examples
    --------
    >>> import numpy as np
    >>> D = np.random.default_rng(0).normal(size=(200, 128))
    >>> p = DlibResNetProjection(n_components=8).fit(D)
    >>> np.round(p.transform(D).std(axis=0).mean(), 2)
    np.float64(1.0)
    """

    kind: ClassVar[str] = "dlib-resnet"
    summary: ClassVar[str] = (
        "dlib's 128-d ResNet face descriptor (5-point alignment, computed on the device per release), reduced by "
        "a whitened PCA of public descriptors"
    )
    input_kind: ClassVar[str] = "dlib-resnet"

    mean_: NDArray[np.float64]
    components_: NDArray[np.float64]
    scales_: NDArray[np.float64]
    explained_variance_ratio_: NDArray[np.float64]

    def __init__(
        self,
        *,
        n_components: int = 16,
        radius_quantile: float = 0.95,
        mirror_shape: tuple[int, int] | None = None,
        network: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(n_components=n_components, radius_quantile=radius_quantile, mirror_shape=mirror_shape)
        self.network = network

    def _fit(self, X: NDArray[np.float64], y: NDArray[Any] | None) -> None:
        if X.shape[1] != DESCRIPTOR_DIMENSION:
            raise ValueError(
                f"X: expected dlib descriptors of dimension {DESCRIPTOR_DIMENSION}, received dimension {X.shape[1]}"
            )
        model = EigenfaceModel(n_components=self.n_components).fit(X)
        var = np.asarray(model.explained_variance_, dtype=np.float64)
        floor = _MIN_RELATIVE_VARIANCE * float(var.max())
        self.mean_ = model.mean_
        self.components_ = model.components_
        self.scales_ = 1.0 / np.sqrt(np.maximum(var, floor))
        self.explained_variance_ratio_ = model.explained_variance_ratio_
        self.n_components_ = int(model.n_components_)
        self.n_features_in_ = DESCRIPTOR_DIMENSION

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, ("components_", "scales_"))
        arr = np.asarray(X, dtype=np.float64)
        out: NDArray[np.float64] = ((arr - self.mean_) @ self.components_.T) * self.scales_
        return out

    def head_graph(self) -> DomainGraph:
        check_is_fitted(self, ("components_", "scales_"))
        weights = (self.components_.T * self.scales_).astype(np.float32)
        return DomainGraph(
            nodes=[
                ("Sub", (FACES, "descriptor_mean"), ("centred",), {}),
                ("MatMul", ("centred", "descriptor_axes"), (COEFFICIENTS,), {}),
            ],
            initializers={
                "descriptor_mean": self.mean_.astype(np.float32),
                "descriptor_axes": np.ascontiguousarray(weights),
            },
        )

    def metadata(self) -> dict[str, Any]:
        check_is_fitted(self, ("components_",))
        return {
            "dlib_resnet": {
                "explained_variance_ratio": [float(v) for v in self.explained_variance_ratio_],
                "whitened": True,
            }
        }

    def input_description(self) -> dict[str, Any]:
        return {"kind": self.input_kind, "dimension": DESCRIPTOR_DIMENSION, "network": dict(self.network or {})}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]], metadata: Mapping[str, Any]) -> Self:
        axes = np.asarray(arrays["descriptor_axes"], dtype=np.float64)  # (128, k) = components.T * scales
        scales = np.linalg.norm(axes, axis=0)
        projection = cls(n_components=int(axes.shape[1]), network=dict(metadata.get("input", {}).get("network", {})))
        projection.mean_ = np.asarray(arrays["descriptor_mean"], dtype=np.float64)
        projection.components_ = (axes / scales).T
        projection.scales_ = scales
        ratio = metadata.get("dlib_resnet", {}).get("explained_variance_ratio", [0.0] * axes.shape[1])
        projection.explained_variance_ratio_ = np.asarray(ratio, dtype=np.float64)
        projection.n_components_ = int(axes.shape[1])
        projection.n_features_in_ = DESCRIPTOR_DIMENSION
        projection.bounds_ = BundleBounds.from_dict(dict(metadata["bounds"]))
        return projection


def untrusted_network(bundle_input: Mapping[str, Any], trusted_sha256: frozenset[str] | set[str]) -> str | None:
    """Why a bundle's descriptor network is not trusted (None when it is, or when its input is pixels).

    Parameters
    ----------
    bundle_input : mapping
        The bundle's ``metadata.json`` ``input`` entry.
    trusted_sha256 : set of str
        SHA-256 (hex) of the model files trusted; every model file the bundle
        names (``network_sha256``, ``landmarks_sha256``) must be among them.
    """
    kind = str(bundle_input.get("kind", "pixels"))
    if kind == "pixels":
        return None
    network = bundle_input.get("network")
    if not isinstance(network, Mapping):
        return f"input.network: expected the {kind} network's model hashes, received none"
    for key in ("network_sha256", "landmarks_sha256"):
        value = str(network.get(key, ""))[:64]
        if value not in trusted_sha256:
            return f"input.network.{key}: expected a trusted model file SHA-256, received {value[:16] or 'none'}…"
    return None
