"""From normalised faces to perturbed templates: bundle projector + mechanism.

The one release path shared by the edge agent (real releases), the server's
tests and the audit (simulations), so they cannot drift apart. Each mechanism
kind releases the projector output named by its ``domain``
(:attr:`peep.core.mechanisms.TemplateMechanism.domain`, see
:mod:`peep.core.domains`); the mechanism clips again in numpy (defence in
depth: its guarantee must not depend on the projector being right).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.bounding import BundleBounds
from peep.core.domains import domain
from peep.core.mechanisms import TemplateMechanism, mechanism_class, mechanism_kinds
from peep.core.sitekey import SiteKey
from peep.core.wire import MechanismDescription


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
    kind : str
        One of :func:`peep.core.mechanisms.mechanism_kinds`.
    epsilon : float
        The mechanism's ε parameter (per coordinate for ``peep``/``peep-raw``,
        per vector for the others; the guarantee states both).
    delta : float, optional
        Required by kinds that take δ (``gaussian-l2``); ignored by the others.
    random_state : None or seed
        ``None`` = the secure sampler. Seeds need the ``seeded-noise`` feature.
    """
    return mechanism_class(kind).from_bounds(bounds, epsilon=epsilon, delta=delta, random_state=random_state)


def bounded_coefficients(coefficients: ArrayLike, bounds: BundleBounds, kind: str) -> NDArray[np.float64]:
    """What the projector's output for ``kind`` would be, computed in numpy.

    Parameters
    ----------
    coefficients : array-like of shape (n_samples, n_components)
        Raw projected coefficients.
    """
    return domain(mechanism_class(kind).domain).apply(coefficients, bounds)


def check_keyed_kind(kind: str) -> None:
    """``ValueError`` naming ``kind`` unless a site key may rotate its input (a rotation-invariant domain)."""
    name = mechanism_class(kind).domain
    if not domain(name).rotation_invariant:
        keyed = sorted(k for k in mechanism_kinds() if domain(mechanism_class(k).domain).rotation_invariant)
        raise ValueError(
            f"mechanism {kind!r}: a site key rotates the template, and {kind!r} releases from the "
            f"{name!r} domain, which a rotation does not map onto itself (values would be clipped); "
            f"keyed release needs one of {', '.join(keyed)}"
        )


class TemplateReleaser:
    """Project normalised faces with a bundle and perturb them.

    Parameters
    ----------
    bundle : ProjectionBundle
        A verified bundle (:class:`peep.core.bundle.ProjectionBundle`).
    kind, epsilon, delta, random_state
        See :func:`mechanism_for_bounds`.
    site_key : SiteKey, optional
        The site's template key (:mod:`peep.core.sitekey`): each bounded
        projection ``u`` is released as ``mechanism(Q u)``. Only for kinds
        whose domain every rotation maps onto itself (unit sphere, L2 ball),
        where ``Q u`` stays in the domain, so ε and δ are those of the
        mechanism, unchanged.

    Raises
    ------
    ValueError
        Unknown kind, or the bundle's projector has no output for the kind's
        domain (a mechanism for another projection), or a site key with a
        kind whose domain is not rotation-invariant.

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
        site_key: SiteKey | None = None,
    ) -> None:
        self.bundle = bundle
        self.kind = kind
        bundle.check_mechanism(kind)
        self.mechanism = mechanism_for_bounds(
            bundle.bounds, kind=kind, epsilon=epsilon, delta=delta, random_state=random_state
        )
        self.output = self.mechanism.domain
        self.description = MechanismDescription.of(self.mechanism)
        if site_key is not None:
            check_keyed_kind(kind)
        self.site_key = site_key

    @property
    def key_id(self) -> str:
        """The site key's public id, ``""`` when unkeyed: what every template's ``key_id`` carries."""
        return self.site_key.key_id if self.site_key is not None else ""

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
        """Perturb already projected-and-bounded coefficients (rotated by the site key first, if any)."""
        values = np.atleast_2d(np.asarray(bounded, dtype=np.float64))
        if self.site_key is not None:
            values = self.site_key.apply(values)
        return np.asarray(self.mechanism.release(values), dtype=np.float32)


def secure_releaser(
    bundle: Any, *, kind: str, epsilon: float, delta: float | None = None, site_key: SiteKey | None = None
) -> TemplateReleaser:
    """A :class:`TemplateReleaser` on the secure sampler, refusing anything else: what a device releases with.

    ``random_state=None`` selects the OS-CSPRNG sampler; the check guards against a future default change,
    because a device must never release with seeded noise.

    Parameters
    ----------
    bundle : ProjectionBundle
        A verified bundle.
    kind, epsilon, delta
        See :func:`mechanism_for_bounds`.
    site_key : SiteKey, optional
        Rotates every release (its id goes into each template).

    Raises
    ------
    RuntimeError
        The mechanism's sampler is not the secure one.
    ValueError, BundleError
        As :class:`TemplateReleaser`.
    """
    releaser = TemplateReleaser(bundle, kind=kind, epsilon=epsilon, delta=delta, random_state=None, site_key=site_key)
    if not releaser.mechanism.is_secure:
        raise RuntimeError("the release mechanism is not on the secure sampler; refusing to release")
    return releaser
