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

A projection of a face *descriptor* (``dlib-resnet``: a deep network's output,
not pixels) has no linear way back at all. There the adversary retrieves: the
public face whose template (in the same release domain) is nearest the
release stands for the released face, and re-identification is measured on
that retrieved face's descriptor (:class:`RetrievalDecoder`).
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

    def reconstruct(self, Z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(faces, the projection's inputs for them): for a pixel projection both are the faces."""
        faces = np.clip(self.predict(Z), 0.0, 1.0)
        return faces, faces


@dataclass(frozen=True)
class RetrievalDecoder:
    """The nearest public face: a release stands for the public face whose domain value is closest.

    ``faces`` (uint8, 1/255 steps: only for display and SSIM/PSNR) and
    ``inputs`` (the projection's inputs, e.g. descriptors) are the public
    basis faces', shared by every decoder of one basis.
    """

    Z: FloatArray  # (m, nc) domain values of the public faces
    faces: NDArray[np.uint8] = field(repr=False)  # (m, pixels)
    inputs: NDArray[np.float32] = field(repr=False)  # (m, input dimension)

    def nearest(self, Z: FloatArray) -> NDArray[np.int64]:
        Zq = np.asarray(Z, dtype=np.float64)
        # ‖a − b‖² = ‖a‖² − 2ab + ‖b‖² in blocks keeps memory at block × m.
        sq = (self.Z**2).sum(axis=1)
        out = np.empty(Zq.shape[0], dtype=np.int64)
        for start in range(0, Zq.shape[0], 1024):
            block = Zq[start : start + 1024]
            out[start : start + block.shape[0]] = np.argmin(sq[None, :] - 2.0 * block @ self.Z.T, axis=1)
        return out

    def predict(self, Z: FloatArray) -> FloatArray:
        return self.reconstruct(Z)[0]

    def reconstruct(self, Z: FloatArray) -> tuple[FloatArray, FloatArray]:
        idx = self.nearest(Z)
        faces: FloatArray = self.faces[idx].astype(np.float64) / 255.0
        return faces, self.inputs[idx].astype(np.float64)


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
    decoders : dict of str to LinearDecoder or RetrievalDecoder
        Decoders fitted on the basis faces, for the raw coefficients
        (``"coefficients"``) and every release domain without an exact
        inverse: learned linear ones for pixel projections, nearest-public-face
        retrieval for descriptor projections.
    mean_input : ndarray of shape (input dimension,)
        The basis faces' mean input (the mean face, or the mean descriptor).
    """

    projection: Projection
    bounds: BundleBounds
    variant: str
    n_fit: int
    mean_face: FloatArray = field(repr=False)
    decoders: dict[str, LinearDecoder | RetrievalDecoder] = field(default_factory=dict, repr=False)
    mean_input: FloatArray | None = field(default=None, repr=False)

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
    def input_kind(self) -> str:
        """``"pixels"`` or the descriptor the projection takes (see :attr:`Projection.input_kind`)."""
        return self.projection.input_kind

    @property
    def explained_variance_ratio(self) -> float | None:
        """Share of the basis inputs' variance the coefficients keep (PCA-based projections)."""
        model: Any = getattr(self.projection, "model_", None)
        if model is not None:
            return float(model.explained_variance_ratio_.sum())
        ratio = getattr(self.projection, "explained_variance_ratio_", None)
        return None if ratio is None else float(np.sum(ratio))

    def transform(self, X: NDArray[np.floating]) -> FloatArray:
        """Raw coefficients of the projection's inputs (flattened faces or descriptors), shape (n, nc)."""
        return self.projection.transform(np.asarray(X, dtype=np.float64))

    def faces(self, C: FloatArray) -> FloatArray:
        """Flattened faces from raw coefficients, in [0, 1] (Eq. 14, the learned decoder or retrieval)."""
        return self.reconstruct(C)[0]

    def reconstruct(self, C: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(flattened faces, the projection's inputs for them) from raw coefficients."""
        if self.exact_inverse:
            model: Any = getattr(self.projection, "model_", None)
            out: FloatArray = np.clip(model.inverse_transform(C), 0.0, 1.0)
            return out, out
        return self.decoders["coefficients"].reconstruct(C)

    def reconstruct_from(self, Z: FloatArray, domain_name: str) -> tuple[FloatArray, FloatArray]:
        """(flattened faces, the projection's inputs for them) from values of a release domain.

        For a pixel projection the inputs are the faces; for a descriptor
        projection they are the retrieved public faces' descriptors, which is
        what re-identification of a retrieved face is measured on.
        """
        dom = domain(domain_name)
        if self.exact_inverse and dom.invertible:
            return self.reconstruct(dom.inverse(Z, self.bounds))
        return self.decoders[domain_name].reconstruct(Z)

    def inputs_of_mean(self, n: int) -> FloatArray:
        """The mean basis input, ``n`` times (what the mean-face baseline is re-identified on)."""
        mean = self.mean_face if self.mean_input is None else self.mean_input
        return np.broadcast_to(mean, (n, mean.shape[0])).astype(np.float64)


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
    faces: NDArray[np.floating] | None = None,
) -> Basis:
    """Fit the projection and bounds on ``X``, the public faces' inputs, shape (n, input dimension).

    ``X`` is what the projection takes (:attr:`Projection.input_kind`):
    flattened faces for pixel projections, descriptors otherwise, in which
    case ``faces`` (the same public faces' pixels, (n, pixels)) are required
    for the retrieval decoders. ``n_components`` is capped at what the inputs
    allow: ``n − 1`` (the rank of centred inputs), and for projections that
    learn from identities one fewer than the number of identities in ``labels``.
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
    if cls.input_kind != "pixels":
        if faces is None or np.asarray(faces).shape[0] != Xf.shape[0]:
            raise ValueError(
                f"faces: expected the pixels of the {Xf.shape[0]} basis faces whose {cls.input_kind} descriptors "
                f"X holds (for retrieval), received {None if faces is None else np.asarray(faces).shape}"
            )
        pixels = np.asarray(faces, dtype=np.float64).reshape(Xf.shape[0], -1)
        public = np.round(np.clip(pixels, 0.0, 1.0) * 255.0).astype(np.uint8)
        inputs = Xf.astype(np.float32)
        retrieval: dict[str, LinearDecoder | RetrievalDecoder] = {"coefficients": RetrievalDecoder(C, public, inputs)}
        for name, dom in DOMAINS.items():
            retrieval[name] = RetrievalDecoder(dom.apply(C, bounds), public, inputs)
        return Basis(
            projection=fitted,
            bounds=bounds,
            variant=variant,
            n_fit=int(Xf.shape[0]),
            mean_face=pixels.mean(axis=0),
            decoders=retrieval,
            mean_input=Xf.mean(axis=0),
        )
    # Decoders are fitted now (the basis travels to worker processes without its faces).
    exact = hasattr(fitted, "model_")
    decoders: dict[str, LinearDecoder | RetrievalDecoder] = {} if exact else {"coefficients": LinearDecoder.fit(C, Xf)}
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
