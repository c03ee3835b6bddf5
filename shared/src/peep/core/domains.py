"""Release domains: the bounded forms of a template a projector outputs.

A mechanism is calibrated for one bounded input domain (a box, a ball, the
unit sphere); the bundle's projector outputs the projected coefficients in
every domain, and each mechanism releases the output named by its
``domain`` (:attr:`peep.core.mechanisms.TemplateMechanism.domain`). One
:class:`Domain` per output says, in one place, everything the rest of PEEP
needs about it:

* :meth:`Domain.apply` — the output computed in numpy from the raw
  coefficients (the audit and tests use it; it must equal the projector's
  output, which ``tests/core/test_bundle.py`` checks);
* :meth:`Domain.inverse` — back to coefficient units where the domain
  rescaled them (the reconstruction attack's first step);
* :meth:`Domain.graph` — the same computation as ONNX node specifications
  (plain tuples, so this module imports no ONNX; the projection's graph
  builder turns them into nodes).

Bounds are always the bundle's public :class:`~peep.core.bounding.BundleBounds`,
fitted on the public background faces, never on a released person.

==================  ===============================================  =====================
output              value                                            used by
==================  ===============================================  =====================
``scaled``          per coordinate ``(y − lo)/(hi − lo)`` in [0, 1]  ``peep``, ``laplace-vector``
``box_clipped``     per coordinate clipped to ``[lo, hi]``           ``peep-raw``
``l2_clipped``      scaled into the L2 ball of radius R              ``gaussian-l2``
``l1_clipped``      scaled into the L1 ball of radius R₁             ``laplace-l1``
``unit``            the direction ``y/‖y‖₂`` on the unit sphere      ``privunit``, ``privunit-g``
==================  ===============================================  =====================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.bounding import BundleBounds, clip_box, clip_l1, clip_l2

__all__ = [
    "COEFFICIENTS",
    "DOMAINS",
    "Domain",
    "DomainGraph",
    "NodeSpec",
    "domain",
    "domain_names",
    "unit_rows",
]

FloatArray = NDArray[np.float64]

#: Name of the projector's first output: the raw projected coefficients.
COEFFICIENTS: Final = "coefficients"

#: One ONNX node: (op_type, inputs, outputs, attributes).
NodeSpec = tuple[str, tuple[str, ...], tuple[str, ...], Mapping[str, Any]]

#: Constants every domain graph may use, provided once by the graph builder.
SHARED_CONSTANTS: Final[Mapping[str, Any]] = {
    "zero": np.array(0.0, dtype=np.float32),
    "one": np.array(1.0, dtype=np.float32),
    "tiny": np.array(np.finfo(np.float32).tiny, dtype=np.float32),
    "axis1": np.array([1], dtype=np.int64),
}


@dataclass(frozen=True)
class DomainGraph:
    """ONNX computation of one output from ``coefficients``."""

    nodes: list[NodeSpec]
    initializers: dict[str, NDArray[Any]] = field(default_factory=dict)


class Domain:
    """One bounded output of the projector (see the module docstring)."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Whether :meth:`inverse` recovers coefficient units (False: only a direction is kept).
    invertible: ClassVar[bool] = True
    #: Whether the output depends on the bundle's public bounds (the unit sphere needs none).
    uses_bounds: ClassVar[bool] = True
    #: Whether every rotation maps the domain onto itself (balls and spheres of the L2 norm): a site key's
    #: rotation then keeps each release in the domain, nothing clipped, so ε and accuracy are unchanged.
    rotation_invariant: ClassVar[bool] = False

    def apply(self, coefficients: ArrayLike, bounds: BundleBounds) -> FloatArray:
        """The output for raw ``coefficients`` of shape (n, nc) or (nc,)."""
        raise NotImplementedError

    def inverse(self, values: ArrayLike, bounds: BundleBounds) -> FloatArray:
        """Values of this domain in coefficient units (identity unless the domain rescales)."""
        return np.asarray(values, dtype=np.float64)

    def unit(self, bounds: BundleBounds) -> FloatArray:
        """Coefficient units per domain unit, shape (nc,): what :meth:`inverse` multiplies by."""
        return np.ones(bounds.n_components)

    def graph(self, bounds: BundleBounds) -> DomainGraph:
        """ONNX nodes computing output :attr:`name` from ``coefficients``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class ScaledDomain(Domain):
    name = "scaled"
    description = "each coordinate scaled to [0, 1] with the bundle's box [lo_j, hi_j] and clipped (PEEP Alg. 3)"

    def apply(self, coefficients: ArrayLike, bounds: BundleBounds) -> FloatArray:
        return bounds.scaler().transform(np.asarray(coefficients, dtype=np.float64))

    def inverse(self, values: ArrayLike, bounds: BundleBounds) -> FloatArray:
        return np.asarray(np.asarray(values, dtype=np.float64) * self.unit(bounds) + bounds.lower)

    def unit(self, bounds: BundleBounds) -> FloatArray:
        return np.asarray(bounds.upper - bounds.lower)

    def graph(self, bounds: BundleBounds) -> DomainGraph:
        return DomainGraph(
            nodes=[
                ("Sub", ("coefficients", "lower"), ("shifted",), {}),
                ("Mul", ("shifted", "inv_range"), ("unclipped",), {}),
                ("Clip", ("unclipped", "zero", "one"), (self.name,), {}),
            ],
            initializers={
                "lower": bounds.lower.astype(np.float32),
                "inv_range": (1.0 / (bounds.upper - bounds.lower)).astype(np.float32),
            },
        )


class BoxDomain(Domain):
    name = "box_clipped"
    description = "each coordinate clipped to the bundle's [lo_j, hi_j], unscaled"

    def apply(self, coefficients: ArrayLike, bounds: BundleBounds) -> FloatArray:
        return clip_box(coefficients, bounds.lower, bounds.upper)

    def graph(self, bounds: BundleBounds) -> DomainGraph:
        return DomainGraph(
            nodes=[
                ("Max", ("coefficients", "box_lower"), ("above_lower",), {}),
                ("Min", ("above_lower", "box_upper"), (self.name,), {}),
            ],
            initializers={"box_lower": bounds.lower.astype(np.float32), "box_upper": bounds.upper.astype(np.float32)},
        )


class _BallDomain(Domain):
    order: ClassVar[int]
    reduce_op: ClassVar[str]

    def radius(self, bounds: BundleBounds) -> float:
        raise NotImplementedError

    def graph(self, bounds: BundleBounds) -> DomainGraph:
        p = f"l{self.order}"
        return DomainGraph(
            nodes=[
                (self.reduce_op, ("coefficients", "axis1"), (f"norm_{p}",), {"keepdims": 1}),
                ("Max", (f"norm_{p}", "tiny"), (f"safe_{p}",), {}),
                ("Div", (f"radius_{p}", f"safe_{p}"), (f"ratio_{p}",), {}),
                ("Min", (f"ratio_{p}", "one"), (f"factor_{p}",), {}),
                ("Mul", ("coefficients", f"factor_{p}"), (self.name,), {}),
            ],
            initializers={f"radius_{p}": np.array(self.radius(bounds), dtype=np.float32)},
        )


class L2BallDomain(_BallDomain):
    name = "l2_clipped"
    rotation_invariant = True
    description = "the vector scaled into the L2 ball of the bundle's radius R"
    order = 2
    reduce_op = "ReduceL2"

    def radius(self, bounds: BundleBounds) -> float:
        return float(bounds.radius_l2)

    def apply(self, coefficients: ArrayLike, bounds: BundleBounds) -> FloatArray:
        return clip_l2(coefficients, bounds.radius_l2)


class L1BallDomain(_BallDomain):
    name = "l1_clipped"
    description = "the vector scaled into the L1 ball of the bundle's radius R₁"
    order = 1
    reduce_op = "ReduceL1"

    def radius(self, bounds: BundleBounds) -> float:
        return float(bounds.radius_l1)

    def apply(self, coefficients: ArrayLike, bounds: BundleBounds) -> FloatArray:
        return clip_l1(coefficients, bounds.radius_l1)


class UnitSphereDomain(Domain):
    name = "unit"
    invertible = False
    uses_bounds = False
    rotation_invariant = True
    description = "the direction y/‖y‖₂ on the unit sphere (no public bound needed: every direction is allowed)"

    def apply(self, coefficients: ArrayLike, bounds: BundleBounds) -> FloatArray:
        return unit_rows(coefficients)

    def graph(self, bounds: BundleBounds) -> DomainGraph:
        return DomainGraph(
            nodes=[
                ("ReduceL2", ("coefficients", "axis1"), ("norm_unit",), {"keepdims": 1}),
                ("Max", ("norm_unit", "tiny"), ("safe_unit",), {}),
                ("Div", ("coefficients", "safe_unit"), (self.name,), {}),
            ]
        )


def unit_rows(Y: ArrayLike) -> FloatArray:
    """Each row (or the vector) scaled to unit L2 norm; a zero row becomes the first basis vector.

    The zero vector has no direction; mapping it to a fixed, data-independent
    direction keeps the release domain exactly the unit sphere.
    """
    arr = np.array(Y, dtype=np.float64)
    norms = np.linalg.norm(arr, axis=-1, keepdims=True)
    zero = norms[..., 0] == 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = arr / norms
    if np.any(zero):
        out[zero] = 0.0
        out[zero, 0] = 1.0
    return out


#: Every release domain, in the projector's output order (after ``coefficients``).
DOMAINS: Final[Mapping[str, Domain]] = {
    d.name: d for d in (ScaledDomain(), BoxDomain(), L2BallDomain(), L1BallDomain(), UnitSphereDomain())
}


def domain_names() -> tuple[str, ...]:
    """Names of the release domains, in projector output order."""
    return tuple(DOMAINS)


def domain(name: str) -> Domain:
    """The :class:`Domain` called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return DOMAINS[name]
    except KeyError:
        raise ValueError(f"domain: expected one of {', '.join(DOMAINS)}, received {name!r}") from None
