"""The projection, its public bounds and each mechanism's release domain for the audit.

The audit fits the projection (eigenfaces, Fisherfaces, ... — any kind in
:mod:`peep.core.projections`) and the bounds on faces that are *not* the
released test faces: each split's training part (``--basis train``, the
paper's set-up) or a disjoint background population (``--basis background``,
how a deployed bundle is built; the only honest choice for projections that
learn from identities, such as Fisherfaces). The bounds therefore never depend
on the faces whose releases are attacked.

Reconstruction needs a way back from a release to pixels. For eigenfaces and
the domains that keep the coefficients' scale, that is PEEP's Eq. 14 (undo the
scaling, multiply by the eigenfaces). Where no exact inverse exists (Fisherfaces,
or a direction on the unit sphere) the adversary learns one: a ridge
regression from the domain values of the *public* basis faces to their pixels,
the strongest linear decoder available without the released people's photos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.bounding import BundleBounds, fit_bundle_bounds
from peep.core.domains import DOMAINS, domain
from peep.core.mechanisms import mechanism_class
from peep.core.projections import Projection, projection_class

FloatArray = NDArray[np.float64]

#: ``bundle``: min/max box and 95 % norm quantile radius (what ``peep bundle
#: build`` ships); ``tight``: 5–95 % quantile box and median-norm radius, which
#: clips more faces but cuts everybody's noise (searched by ``--frontier``).
BOUNDS_VARIANTS = ("bundle", "tight")
# Ridge penalty of the learned decoders, relative to the mean squared domain value.
_DECODER_RIDGE = 1e-3


@dataclass(frozen=True)
class LinearDecoder:
    """Faces from domain values, ``mean + (Z − z_mean) @ weights``, fitted on public faces."""

    z_mean: FloatArray
    face_mean: FloatArray
    weights: FloatArray

    @classmethod
    def fit(cls, Z: FloatArray, X: FloatArray) -> LinearDecoder:
        z_mean, face_mean = Z.mean(axis=0), X.mean(axis=0)
        Zc, Xc = Z - z_mean, X - face_mean
        gram = Zc.T @ Zc
        ridge = _DECODER_RIDGE * float(np.trace(gram)) / max(gram.shape[0], 1)
        weights = np.linalg.solve(gram + ridge * np.eye(gram.shape[0]), Zc.T @ Xc)
        return cls(z_mean=z_mean, face_mean=face_mean, weights=weights)

    def predict(self, Z: FloatArray) -> FloatArray:
        out: FloatArray = self.face_mean + (np.asarray(Z, dtype=np.float64) - self.z_mean) @ self.weights
        return out


@dataclass(frozen=True)
class Basis:
    """A fitted projection with its public bounds.

    Attributes
    ----------
    projection : Projection
    bounds : BundleBounds
    variant : {"bundle", "tight"}
    n_fit : int
        Number of faces the basis was fitted on.
    mean_face : ndarray of shape (pixels,)
        The basis faces' mean.
    decoders : dict of str to LinearDecoder
        Learned decoders, fitted on the basis faces, for the raw coefficients
        (``"coefficients"``) and every release domain without an exact inverse.
    """

    projection: Projection
    bounds: BundleBounds
    variant: str
    n_fit: int
    mean_face: FloatArray = field(repr=False)
    decoders: dict[str, LinearDecoder] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return self.projection.kind

    @property
    def n_components(self) -> int:
        return int(self.projection.n_components_)

    @property
    def exact_inverse(self) -> bool:
        """Whether coefficients map back to faces exactly (eigenfaces: PEEP Eq. 14)."""
        return hasattr(self.projection, "model_")

    @property
    def explained_variance_ratio(self) -> float | None:
        """Share of the basis faces' variance the coefficients keep (eigenfaces only)."""
        model: Any = getattr(self.projection, "model_", None)
        return None if model is None else float(model.explained_variance_ratio_.sum())

    def transform(self, X: NDArray[np.floating]) -> FloatArray:
        """Raw coefficients of flattened faces, shape (n, nc)."""
        return self.projection.transform(np.asarray(X, dtype=np.float64))

    def faces(self, C: FloatArray) -> FloatArray:
        """Flattened faces from raw coefficients, clipped to [0, 1] (Eq. 14 or the learned decoder)."""
        if self.exact_inverse:
            model: Any = getattr(self.projection, "model_", None)
            out: FloatArray = np.clip(model.inverse_transform(C), 0.0, 1.0)
            return out
        return np.clip(self.decoders["coefficients"].predict(C), 0.0, 1.0)

    def faces_from(self, Z: FloatArray, domain_name: str) -> FloatArray:
        """Flattened faces from values of a release domain (undoing its rescaling where it has one)."""
        dom = domain(domain_name)
        if self.exact_inverse and dom.invertible:
            return self.faces(dom.inverse(Z, self.bounds))
        return np.clip(self.decoders[domain_name].predict(Z), 0.0, 1.0)


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


def fit_basis(
    X: NDArray[np.floating],
    n_components: int,
    *,
    variant: str = "bundle",
    projection: str = "eigenfaces",
    labels: NDArray[np.integer] | None = None,
    mirror_shape: tuple[int, int] | None = None,
) -> Basis:
    """Fit the projection and bounds on ``X`` (flattened public faces, shape (n, pixels)).

    ``n_components`` is capped at what the faces allow: ``n − 1`` (the rank
    of centred faces), and for projections that learn from identities one
    fewer than the number of identities in ``labels``.
    """
    if variant not in BOUNDS_VARIANTS:
        raise ValueError(f"variant: expected one of {BOUNDS_VARIANTS}, received {variant!r}")
    cls = projection_class(projection)
    Xf = np.asarray(X, dtype=np.float64)
    nc = int(min(n_components, Xf.shape[0] - 1, Xf.shape[1]))
    if cls.needs_labels:
        if labels is None:
            raise ValueError(f"labels: expected the identities of the basis faces for projection {projection!r}")
        nc = int(min(nc, np.unique(labels).shape[0] - 1))
    fitted = cls(n_components=nc, mirror_shape=mirror_shape).fit(Xf, labels)
    C = fitted.transform(Xf)
    bounds = fit_bundle_bounds(C) if variant == "bundle" else tight_bounds(C)
    # Decoders are fitted now (the basis travels to worker processes without its faces).
    exact = hasattr(fitted, "model_")
    decoders = {} if exact else {"coefficients": LinearDecoder.fit(C, Xf)}
    for name, dom in DOMAINS.items():
        if not (exact and dom.invertible):
            decoders[name] = LinearDecoder.fit(dom.apply(C, bounds), Xf)
    return Basis(
        projection=fitted,
        bounds=bounds,
        variant=variant,
        n_fit=int(Xf.shape[0]),
        mean_face=Xf.mean(axis=0),
        decoders=decoders,
    )


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
        self.name = mechanism_class(kind).domain
        self.domain = domain(self.name)
        #: Multiplier from domain units to coefficient units, shape (nc,).
        self.unit: FloatArray = self.domain.unit(bounds)

    def forward(self, C: FloatArray) -> FloatArray:
        return self.domain.apply(C, self.bounds)

    def inverse(self, Z: FloatArray) -> FloatArray:
        return self.domain.inverse(Z, self.bounds)
