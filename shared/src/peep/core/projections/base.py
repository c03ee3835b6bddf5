"""What every projection declares: :class:`Projection`, and its ONNX projector.

A projection maps a normalised face (flattened, in [0, 1]) to a template's
raw coefficients; it is fitted only on the bundle's public (background)
faces, never on people who will be released. The bundle ships it as an ONNX
graph whose first output is ``coefficients`` and whose further outputs are the
coefficients in every release domain (:mod:`peep.core.domains`), bounded with
public bounds fitted on the same public faces; each mechanism releases the
output its ``domain`` names. The projection contributes the *head* of the
graph (faces → coefficients); the bounding tails are shared by all.

ONNX is imported only inside :func:`build_projector` (graph building runs
where bundles are built; a device only runs graphs with onnxruntime).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.base import ParamsMixin, check_is_fitted
from peep.core.bounding import BundleBounds, fit_bundle_bounds
from peep.core.domains import COEFFICIENTS, DOMAINS, SHARED_CONSTANTS, DomainGraph
from peep.core.validation import check_array, check_real

__all__ = ["FACES", "Projection", "build_projector", "mirror_faces", "projector_outputs"]

#: Name of the projector's input: faces of shape (N, n_features), float32 in [0, 1].
FACES = "faces"
_OPSET = 18
_IR_VERSION = 9


def mirror_faces(X: ArrayLike, shape: tuple[int, int]) -> NDArray[np.float64]:
    """Flattened faces of geometry ``shape`` = (height, width), flipped left to right.

    Parameters
    ----------
    X : array-like of shape (n_samples, height * width)

    Examples
    --------
    >>> mirror_faces(np.arange(6.0).reshape(1, 6), (2, 3)).tolist()
    [[2.0, 1.0, 0.0, 5.0, 4.0, 3.0]]
    """
    arr = check_array(X, "X", ndim=2)
    try:
        h, w = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"mirror_shape: expected (height, width), received {shape!r}") from None
    if h * w != arr.shape[1] or h < 1 or w < 1:
        raise ValueError(
            f"mirror_shape: expected (height, width) with height*width = {arr.shape[1]} pixels, received {shape!r}"
        )
    out: NDArray[np.float64] = arr.reshape(-1, h, w)[:, :, ::-1].reshape(arr.shape[0], -1)
    return out


def projector_outputs() -> tuple[str, ...]:
    """The outputs a projector built now has, in order: ``coefficients``, then every release domain."""
    return (COEFFICIENTS, *DOMAINS)


class Projection(ParamsMixin):
    """Base of the projections (scikit-learn estimator contract).

    Subclasses declare ``kind`` and ``summary`` (one line for help texts),
    register with :func:`peep.core.projections.registry.register_projection`
    and implement :meth:`_fit`, :meth:`transform`, :meth:`head_graph`,
    :meth:`from_arrays` and, if they ship extra metadata, :meth:`metadata`.

    Every projection takes ``n_components``, ``radius_quantile`` and
    ``mirror_shape`` (and may take more, with defaults), so builders can make
    any kind by name.

    Parameters
    ----------
    n_components : int
        Dimension of a template.
    radius_quantile : float, default=0.95
        Quantile of the public faces' norms used as the L2/L1 clip radii
        (:func:`peep.core.bounding.fit_bundle_bounds`).
    mirror_shape : (height, width) or None, default=None
        When given, the public faces are fitted together with their mirror
        images (faces of that geometry, flipped left to right, same
        identities): twice the public data, and a projection that treats a
        face and its mirror alike, so left/right pose and lighting carry less
        weight against identity. Measured on LFW-5 with Fisherfaces K = 16 from
        the 5–99-image background, privunit: 0.66 / 0.80 / 0.87 accuracy at
        ε = 8 / 16 / 64 against 0.63 / 0.77 / 0.86 without.

    Attributes
    ----------
    bounds_ : BundleBounds
        Public bounds of the coefficients, fitted on the same public faces.
    n_components_ : int
        Dimension of a template.
    n_features_in_ : int
        Pixels per face.
    """

    kind: ClassVar[str]
    summary: ClassVar[str]
    #: Whether :meth:`fit` needs identity labels ``y``.
    needs_labels: ClassVar[bool] = False
    #: Whether builders (``peep bundle build``, the audit) fit it on mirrored faces too unless told not to.
    mirror_by_default: ClassVar[bool] = False
    #: What the projector's input is: ``"pixels"`` (a normalised face, flattened) or the kind of a
    #: face descriptor the device computes first (e.g. ``"dlib-resnet"``; see :meth:`input_description`).
    input_kind: ClassVar[str] = "pixels"

    bounds_: BundleBounds
    n_components_: int
    n_features_in_: int

    def __init__(
        self, *, n_components: int, radius_quantile: float = 0.95, mirror_shape: tuple[int, int] | None = None
    ) -> None:
        self.n_components = n_components
        self.radius_quantile = radius_quantile
        self.mirror_shape = mirror_shape

    def fit(self, X: ArrayLike, y: ArrayLike | None = None) -> Self:
        """Fit on the public faces ``X`` of shape (n_samples, n_features) (and their identities ``y``).

        Then fit the public bounds on the same faces' coefficients.
        """
        arr = check_array(X, "X", ndim=2)
        q = check_real(self.radius_quantile, "radius_quantile", low=0.0, high=1.0, low_inclusive=False)
        if self.needs_labels and y is None:
            raise ValueError(f"y: expected the identities of the faces for projection {self.kind!r}, received None")
        labels = None if y is None else np.asarray(y)
        if self.mirror_shape is not None and self.input_kind != "pixels":
            raise ValueError(
                f"mirror_shape: expected None for projection {self.kind!r}, whose input is a {self.input_kind} "
                "descriptor, not pixels (mirror the images before computing descriptors), "
                f"received {self.mirror_shape!r}"
            )
        if self.mirror_shape is not None:
            arr = np.vstack([arr, mirror_faces(arr, self.mirror_shape)])
            labels = None if labels is None else np.concatenate([labels, labels])
        self._fit(arr, labels)
        self.bounds_ = fit_bundle_bounds(self.transform(arr), radius_quantile=q)
        return self

    def _fit(self, X: NDArray[np.float64], y: NDArray[Any] | None) -> None:
        raise NotImplementedError

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """Raw coefficients, ndarray of shape (n_samples, n_components_)."""
        raise NotImplementedError

    def head_graph(self) -> DomainGraph:
        """ONNX nodes from ``faces`` to ``coefficients``, with their initialisers."""
        raise NotImplementedError

    def metadata(self) -> dict[str, Any]:
        """Projection-specific entries for the bundle's ``metadata.json`` (JSON-able)."""
        return {}

    def input_description(self) -> dict[str, Any]:
        """What a device feeds the projector (``metadata.json``'s ``input``, covered by the signature).

        ``{"kind": "pixels"}`` for projections of normalised faces; descriptor
        projections also name the descriptor network a device must run, by
        file hash and version, so a device with another network refuses the bundle.
        """
        return {"kind": self.input_kind}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]], metadata: Mapping[str, Any]) -> Self:
        """Rebuild the fitted projection from a projector's initialisers and the bundle metadata."""
        raise NotImplementedError

    def to_onnx(self) -> bytes:
        """The signed bundle's projector for this fitted projection (see :func:`build_projector`)."""
        check_is_fitted(self, ("bounds_", "n_components_"))
        return build_projector(self, self.bounds_)


def build_projector(projection: Projection, bounds: BundleBounds) -> bytes:
    """Serialised ONNX graph: the projection's head, then every release domain's bounding.

    Parameters
    ----------
    projection : Projection
        Fitted.
    bounds : BundleBounds
        Public bounds of its coefficients.

    Returns
    -------
    bytes
        An ONNX model with input ``faces`` of shape (N, n_features) and the
        outputs :func:`projector_outputs`, each of shape (N, n_components).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nc, d = int(projection.n_components_), int(projection.n_features_in_)
    if bounds.n_components != nc:
        raise ValueError(f"bounds: expected {nc} components (the projection's), received {bounds.n_components}")
    parts = [projection.head_graph(), *(dom.graph(bounds) for dom in DOMAINS.values())]
    initializers: dict[str, NDArray[Any]] = dict(SHARED_CONSTANTS)
    nodes = []
    for part in parts:
        for name, value in part.initializers.items():
            if name in initializers:
                raise ValueError(f"projector: initializer {name!r} defined twice")
            initializers[name] = value
        for op, inputs, outputs, attrs in part.nodes:
            nodes.append(helper.make_node(op, list(inputs), list(outputs), **dict(attrs)))
    graph = helper.make_graph(
        nodes,
        f"peep_{projection.kind}_projector",
        [helper.make_tensor_value_info(FACES, TensorProto.FLOAT, ["N", d])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", nc]) for name in projector_outputs()],
        initializer=[numpy_helper.from_array(np.asarray(v), name) for name, v in initializers.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name="peep",
        doc_string=f"PEEP {projection.kind} projector: faces -> coefficients, then public bounding per release domain",
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data
