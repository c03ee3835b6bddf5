"""Eigenfaces, public bounds and each mechanism's release domain for the audit.

The audit fits eigenfaces and bounds on faces that are *not* the released
test faces: each split's training part (``--basis train``, the paper's
set-up, whose numbers the issue's reference table was measured with) or a
disjoint background population (``--basis background``, how a deployed bundle
is built). The bounds therefore never depend on the faces whose releases are
attacked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from peep.core.bounding import BundleBounds, fit_bundle_bounds
from peep.core.domains import domain
from peep.core.eigenfaces import EigenfaceModel
from peep.core.mechanisms import mechanism_class

FloatArray = NDArray[np.float64]

#: ``bundle``: min/max box and 95 % norm quantile radius (what ``peep bundle
#: build`` ships); ``tight``: 5–95 % quantile box and median-norm radius, which
#: clips more faces but cuts everybody's noise (searched by ``--frontier``).
BOUNDS_VARIANTS = ("bundle", "tight")


@dataclass(frozen=True)
class Basis:
    """A fitted eigenface model with its public bounds.

    Attributes
    ----------
    model : EigenfaceModel
    bounds : BundleBounds
    variant : {"bundle", "tight"}
    n_fit : int
        Number of faces the basis was fitted on.
    """

    model: EigenfaceModel
    bounds: BundleBounds
    variant: str
    n_fit: int

    @property
    def n_components(self) -> int:
        return int(self.model.n_components_)

    def transform(self, X: NDArray[np.floating]) -> FloatArray:
        """Eigenface coefficients of flattened faces, shape (n, nc)."""
        return self.model.transform(X)

    def faces(self, C: FloatArray) -> FloatArray:
        """Flattened faces from coefficients (PEEP Eq. 14), clipped to [0, 1]."""
        return np.clip(self.model.inverse_transform(C), 0.0, 1.0)


def tight_bounds(C: FloatArray, *, box_quantile: float = 0.90, radius_quantile: float = 0.5) -> BundleBounds:
    """Bounds that clip more: a central-quantile box and a smaller ball radius.

    Parameters
    ----------
    C : ndarray of shape (n_samples, n_components)
        Coefficients of the basis faces (never of released faces).
    """
    tail = (1.0 - box_quantile) / 2.0
    lower = np.quantile(C, tail, axis=0)
    upper = np.quantile(C, 1.0 - tail, axis=0)
    # Degenerate coordinates (constant on the basis faces) still need hi > lo.
    upper = np.maximum(upper, lower + 1e-9)
    return BundleBounds(
        lower=lower,
        upper=upper,
        radius_l2=float(np.quantile(np.linalg.norm(C, axis=1), radius_quantile)),
        radius_l1=float(np.quantile(np.abs(C).sum(axis=1), radius_quantile)),
    )


def fit_basis(X: NDArray[np.floating], n_components: int, *, variant: str = "bundle") -> Basis:
    """Fit eigenfaces and bounds on ``X`` (flattened faces, shape (n, pixels)).

    ``n_components`` is capped at ``n − 1`` (the rank of centred faces).
    """
    if variant not in BOUNDS_VARIANTS:
        raise ValueError(f"variant: expected one of {BOUNDS_VARIANTS}, received {variant!r}")
    Xf = np.asarray(X, dtype=np.float64)
    nc = int(min(n_components, Xf.shape[0] - 1, Xf.shape[1]))
    model = EigenfaceModel(n_components=nc).fit(Xf)
    C = model.transform(Xf)
    bounds = fit_bundle_bounds(C) if variant == "bundle" else tight_bounds(C)
    return Basis(model=model, bounds=bounds, variant=variant, n_fit=int(Xf.shape[0]))


class Domain:
    """Map coefficients into a mechanism's release domain and back.

    ``forward`` is what the bundle's projector outputs for the kind (the
    kind's :class:`peep.core.domains.Domain`); ``inverse`` undoes the domain's
    rescaling (the [0, 1] scaling of ``peep``/``laplace-vector``; the other
    kinds release coefficients, clipped), which is PEEP Eq. 14's first step.
    """

    def __init__(self, kind: str, bounds: BundleBounds) -> None:
        self.kind = kind
        self.bounds = bounds
        self.domain = domain(mechanism_class(kind).domain)
        #: Multiplier from domain units to coefficient units, shape (nc,).
        self.unit: FloatArray = self.domain.unit(bounds)

    def forward(self, C: FloatArray) -> FloatArray:
        return self.domain.apply(C, self.bounds)

    def inverse(self, Z: FloatArray) -> FloatArray:
        return self.domain.inverse(Z, self.bounds)
