"""From normalised faces to perturbed templates: bundle projector + mechanism.

The one release path shared by the edge agent (real releases), the server's
tests and the audit (simulations), so they cannot drift apart. Each mechanism
kind consumes the projector output that matches its domain:

==================  ================  ==========================================
kind                projector output  domain
==================  ================  ==========================================
``peep``            ``scaled``        [0,1] per coordinate (bundle bounds)
``peep-raw``        ``box_clipped``   [lo_j, hi_j] per coordinate, unscaled
``laplace-vector``  ``scaled``        [0,1] per coordinate
``gaussian-l2``     ``l2_clipped``    L2 ball of radius R
``laplace-l1``      ``l1_clipped``    L1 ball of radius R1
==================  ================  ==========================================

The mechanism clips again in numpy (defence in depth: its guarantee must not
depend on the projector being right).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.bounding import BundleBounds
from peep.core.mechanisms import MECHANISM_KINDS, TemplateMechanism, make_mechanism
from peep.core.wire import MechanismDescription

#: Projector output each mechanism kind releases.
PROJECTOR_OUTPUT: Mapping[str, str] = {
    "peep": "scaled",
    "peep-raw": "box_clipped",
    "laplace-vector": "scaled",
    "gaussian-l2": "l2_clipped",
    "laplace-l1": "l1_clipped",
}


def mechanism_for_bounds(
    bounds: BundleBounds,
    *,
    kind: str,
    epsilon: float,
    delta: float | None = None,
    random_state: object = None,
) -> TemplateMechanism:
    """The mechanism ``kind`` with the public bounds a bundle ships.

    Parameters
    ----------
    bounds : BundleBounds
    kind : {"peep", "peep-raw", "laplace-vector", "gaussian-l2", "laplace-l1"}
    epsilon : float
        The mechanism's ε parameter (per coordinate for ``peep``/``peep-raw``,
        per vector for the others; the guarantee states both).
    delta : float, optional
        Required for ``gaussian-l2``.
    random_state : None or seed
        ``None`` = the secure sampler. Seeds need the ``seeded-noise`` feature.
    """
    if kind not in PROJECTOR_OUTPUT:
        raise ValueError(f"kind: expected one of {', '.join(MECHANISM_KINDS)}, received {kind!r}")
    return make_mechanism(
        kind,
        epsilon=epsilon,
        delta=delta,
        n_components=bounds.n_components,
        lower=bounds.lower,
        upper=bounds.upper,
        radius_l2=bounds.radius_l2,
        radius_l1=bounds.radius_l1,
        random_state=random_state,
    )


def bounded_coefficients(coefficients: ArrayLike, bounds: BundleBounds, kind: str) -> NDArray[np.float64]:
    """What the projector's output for ``kind`` would be, computed in numpy.

    Parameters
    ----------
    coefficients : array-like of shape (n_samples, n_components)
        Raw eigenface coefficients.
    """
    from peep.core.bounding import clip_box, clip_l1, clip_l2

    Y = np.asarray(coefficients, dtype=np.float64)
    output = PROJECTOR_OUTPUT.get(kind)
    if output == "scaled":
        return bounds.scaler().transform(Y)
    if output == "box_clipped":
        return clip_box(Y, bounds.lower, bounds.upper)
    if output == "l2_clipped":
        return clip_l2(Y, bounds.radius_l2)
    if output == "l1_clipped":
        return clip_l1(Y, bounds.radius_l1)
    raise ValueError(f"kind: expected one of {', '.join(MECHANISM_KINDS)}, received {kind!r}")


class TemplateReleaser:
    """Project normalised faces with a bundle and perturb them.

    Parameters
    ----------
    bundle : EigenfaceBundle
        A verified bundle (:class:`peep.core.bundle.EigenfaceBundle`).
    kind, epsilon, delta, random_state
        See :func:`mechanism_for_bounds`.

    Attributes
    ----------
    mechanism : TemplateMechanism
    description : MechanismDescription
        What goes into every template's ``mechanism`` field.
    """

    def __init__(
        self,
        bundle: Any,
        *,
        kind: str,
        epsilon: float,
        delta: float | None = None,
        random_state: object = None,
    ) -> None:
        self.bundle = bundle
        self.kind = kind
        self.mechanism = mechanism_for_bounds(
            bundle.bounds, kind=kind, epsilon=epsilon, delta=delta, random_state=random_state
        )
        self.output = PROJECTOR_OUTPUT[kind]
        self.description = MechanismDescription.of(self.mechanism)

    @property
    def bundle_id(self) -> str:
        return str(self.bundle.bundle_id)

    @property
    def n_components(self) -> int:
        return int(self.mechanism.n_components)

    def project(self, faces: ArrayLike) -> NDArray[np.float32]:
        """Bounded (not yet perturbed) coefficients, shape (n, n_components)."""
        out: NDArray[np.float32] = self.bundle.project(faces, self.output)
        return out

    def release(self, faces: ArrayLike) -> NDArray[np.float32]:
        """Perturbed templates for normalised faces.

        Parameters
        ----------
        faces : array-like of shape (n, height, width) or (height, width)
            Output of :func:`peep.core.imaging.normalise_face`.

        Returns
        -------
        ndarray of shape (n, n_components), float32
            Each row is one release with guarantee ``mechanism.guarantee``.
        """
        return self.release_bounded(self.project(faces))

    def release_bounded(self, bounded: ArrayLike) -> NDArray[np.float32]:
        """Perturb already projected-and-bounded coefficients."""
        return np.asarray(self.mechanism.release(np.atleast_2d(bounded)), dtype=np.float32)
