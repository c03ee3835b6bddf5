"""The contract every template mechanism states: :class:`TemplateMechanism`.

Each mechanism class declares, as class attributes, everything the rest of
PEEP reads about its kind — the registry (:mod:`peep.core.mechanisms.registry`)
is the only list of kinds, and the wire format, the edge and server
configurations, ingest validation, training, the audit and the CLI all read
these attributes instead of spelling kinds out (scikit-learn's
``_parameter_constraints`` and diffprivlib's ``mechanisms`` package are the
models: each class states its own contract):

``kind``
    The name in configurations, the CLI and reports (``"laplace-l1"``).
``wire_name``
    The ``peep.v1.MechanismKind`` enum value name (``"MECHANISM_KIND_LAPLACE_L1"``).
``domain``
    The projector output it releases (:mod:`peep.core.domains`).
``takes_delta``
    Whether it is (ε, δ)-LDP with δ > 0 (only then does a δ parameter exist).
``epsilon_scope``
    What its ε parameter bounds: ``"coordinate"`` (the vector composes to
    more) or ``"vector"``.
``frontier``
    Whether the audit's frontier searches it (``False`` only where another
    kind releases exactly the same noise).
``max_epsilon``
    The largest ε parameter it accepts (``inf`` unless its numerics stop there).
``summary``
    One line: domain, noise and guarantee, for help texts and docs.

and implements :meth:`TemplateMechanism.from_parameters` (how it is built from
the bundle's public bounds), :meth:`~TemplateMechanism.domain_box` (the range
of its clipped input) and, where ε is not per vector,
:meth:`~TemplateMechanism.epsilon_for_vector`. Instances state their
:class:`PrivacyGuarantee` (per coordinate and per vector) and their exact noise
variance.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.bounding import BundleBounds
from peep.core.exceptions import PrivacyLeakWarning
from peep.core.sampling import NoiseSampler
from peep.core.validation import check_array

__all__ = [
    "PrivacyGuarantee",
    "PublicParameters",
    "TemplateMechanism",
    "bounds_from_data",
    "clip_to_ball",
]

FloatArray = NDArray[np.float64]

# Float rounding of x·(R/‖x‖) can leave ‖result‖ a few ulps above R; shrinking
# by 2**-32 keeps the clipped norm <= R for any d < 2**20, so the sensitivity
# 2R is never exceeded. The distortion (2e-10 relative) is far below the noise.
_NORM_SAFETY: Final = 1.0 - 2.0**-32


def _fmt(v: float) -> str:
    return f"{v:.6g}"


@dataclass(frozen=True, kw_only=True)
class PublicParameters:
    """The public, data-independent parameters a mechanism may be built from (a bundle's bounds).

    Attributes
    ----------
    n_components : int
    lower, upper : array_like of shape (n_components,), optional
        The per-coordinate box.
    radius_l2, radius_l1 : float, optional
        The ball radii.
    """

    n_components: int
    lower: ArrayLike | None = None
    upper: ArrayLike | None = None
    radius_l2: float | None = None
    radius_l1: float | None = None

    @classmethod
    def of(cls, bounds: BundleBounds) -> PublicParameters:
        """Everything a bundle's :class:`BundleBounds` holds."""
        return cls(
            n_components=bounds.n_components,
            lower=bounds.lower,
            upper=bounds.upper,
            radius_l2=bounds.radius_l2,
            radius_l1=bounds.radius_l1,
        )

    def require(self, name: str, kind: str) -> Any:
        """The parameter ``name``; ``ValueError`` naming it if mechanism ``kind`` needs it and it is missing."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{name}: expected a value for mechanism kind {kind!r}, received None")
        return value


@dataclass(frozen=True, kw_only=True)
class PrivacyGuarantee:
    """What one release of a mechanism guarantees.

    Attributes
    ----------
    epsilon_coordinate : float
        ε for any single released coordinate (the worst coordinate).
    epsilon_vector : float
        ε for the whole released vector (what protects the person).
    delta : float
        δ (0 for pure ε-LDP), for both the coordinate and the vector.
    n_components : int
        Number of coordinates ``nc`` in one release.
    description : str
        One sentence saying how the numbers arise.

    Examples
    --------
    >>> print(PrivacyGuarantee(epsilon_coordinate=8.0, epsilon_vector=1024.0,
    ...                        n_components=128, description="peep"))
    ε=8 per coordinate, ε=1024 per vector (nc=128)
    """

    epsilon_coordinate: float
    epsilon_vector: float
    delta: float = 0.0
    n_components: int
    description: str

    def __str__(self) -> str:
        text = (
            f"ε={_fmt(self.epsilon_coordinate)} per coordinate, "
            f"ε={_fmt(self.epsilon_vector)} per vector (nc={self.n_components})"
        )
        if self.delta:
            text += f", δ={self.delta:g}"
        return text


class TemplateMechanism:
    """Base of the template mechanisms: clip into the domain, then perturb.

    Subclasses declare the class attributes listed in the module docstring
    and set, at construction: ``n_components``, ``epsilon``, ``delta``,
    ``guarantee``, ``variance`` (ndarray of shape (n_components,)),
    ``noise_std`` (root-mean-square noise per coordinate), ``grid_step`` and
    ``is_secure``. Register a subclass with
    :func:`peep.core.mechanisms.registry.register_mechanism`.
    """

    kind: ClassVar[str]
    wire_name: ClassVar[str]
    domain: ClassVar[str]
    takes_delta: ClassVar[bool] = False
    epsilon_scope: ClassVar[Literal["coordinate", "vector"]] = "vector"
    frontier: ClassVar[bool] = True
    max_epsilon: ClassVar[float] = math.inf
    summary: ClassVar[str]

    n_components: int
    epsilon: float
    delta: float
    guarantee: PrivacyGuarantee
    variance: FloatArray
    noise_std: float
    grid_step: float
    is_secure: bool
    _sampler: NoiseSampler

    # -- construction from public parameters ------------------------------------------

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        """Build the mechanism from the public parameters a bundle ships, taking what it needs.

        Parameters
        ----------
        public : PublicParameters
            Dimension and public bounds (the kind reads only those it needs).
        epsilon : float
            The mechanism's ε parameter (see :attr:`epsilon_scope`).
        delta : float, optional
            Required when :attr:`takes_delta`; ignored by pure-ε kinds (a pure
            ε-LDP mechanism satisfies every δ).
        random_state : None, NoiseSampler, int or Generator
            ``None`` = the secure sampler; seeds need the ``"seeded-noise"`` feature.

        Raises
        ------
        ValueError
            A parameter the kind needs is missing (the message names it) or inconsistent.
        """
        raise NotImplementedError

    @classmethod
    def from_bounds(
        cls,
        bounds: BundleBounds,
        *,
        epsilon: float,
        delta: float | None = None,
        random_state: object = None,
    ) -> TemplateMechanism:
        """The mechanism with the public bounds a bundle ships (:class:`BundleBounds`)."""
        return cls.from_parameters(
            PublicParameters.of(bounds),
            epsilon=epsilon,
            delta=delta if cls.takes_delta else None,
            random_state=random_state,
        )

    @classmethod
    def epsilon_for_vector(
        cls,
        bounds: BundleBounds,
        epsilon_vector: float,
        *,
        delta: float | None = None,
        random_state: object = None,
    ) -> float:
        """The ε parameter whose per-vector guarantee is ``epsilon_vector`` with these bounds.

        The identity for kinds whose ε is per vector; kinds whose ε is per
        coordinate override it.
        """
        return float(epsilon_vector)

    @property
    def epsilon_vector_cap(self) -> float:
        """The largest per-vector ε this configuration lets any release of the same device have.

        The guarantee's per-vector ε; for a kind whose ε is per vector, the configured ε when it is larger
        (PrivUnit's calibrated guarantee sits a hair under the ε asked for and depends on the dimension, so a
        bundle of another dimension may land on either side of it: the deployer's own ε is the cap). A device
        refuses a new bundle whose release would exceed the cap of the configured one.
        """
        cap = float(self.guarantee.epsilon_vector)
        if self.epsilon_scope == "vector":
            cap = max(cap, float(self.epsilon))
        return cap

    # -- what a release can be --------------------------------------------------------

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        """Per-coordinate (lower, upper) of the clipped input, each ndarray of shape (n_components,)."""
        raise NotImplementedError

    def plausible_range(self, sigmas: float) -> tuple[FloatArray, FloatArray]:
        """Where a genuine release lies: :meth:`domain_box` widened by ``sigmas`` noise standard deviations.

        Ingest refuses values outside it as forged or corrupted; a genuine
        Laplace release falls outside with probability below
        ``exp(-sigmas·√2)`` per coordinate.
        """
        lo, hi = self.domain_box()
        margin = float(sigmas) * float(self.noise_std)
        with np.errstate(over="ignore"):
            return np.asarray(lo - margin, dtype=np.float64), np.asarray(hi + margin, dtype=np.float64)

    def _set_noise_summary(self, per_coordinate_variance: float) -> None:
        self.variance = np.full(self.n_components, per_coordinate_variance, dtype=np.float64)
        self.noise_std = math.sqrt(float(np.mean(self.variance)))
        self.is_secure = bool(self._sampler.is_secure)

    def clip(self, X: ArrayLike) -> FloatArray:
        """Project ``X`` into the mechanism's domain.

        Parameters
        ----------
        X : array_like of shape (n_components,) or (n_samples, n_components)

        Returns
        -------
        ndarray of the same shape
        """
        arr = check_array(X, "X", ndim=(1, 2), n_features=self.n_components)
        return self._clip(arr)

    def _clip(self, X: FloatArray) -> FloatArray:
        raise NotImplementedError

    def _perturb(self, X: FloatArray) -> FloatArray:
        raise NotImplementedError

    def release(self, X: ArrayLike) -> FloatArray:
        """Clip ``X`` into the domain (never trusting the caller), then add noise.

        Parameters
        ----------
        X : array_like of shape (n_components,) or (n_samples, n_components)
            One template or a batch (each row is a separate release with the
            guarantee :attr:`guarantee`).

        Returns
        -------
        ndarray of the same shape, float64
        """
        return self._perturb(self.clip(X))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, {self.guarantee})"


def clip_to_ball(X: FloatArray, radius: float, order: int) -> FloatArray:
    """Scale each row (or the vector) by ``min(1, R/‖x‖)`` (with a safety margin)."""
    norms = np.linalg.norm(X, ord=order, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        factor = np.minimum(1.0, radius * _NORM_SAFETY / norms)  # norm 0 → inf → 1
    out: FloatArray = X * factor
    return out


def bounds_from_data(X: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Per-coordinate (min, max) of ``X`` — and a :class:`PrivacyLeakWarning`.

    Bounds computed from the data being released make the sensitivity depend
    on that data, which voids the guarantee (diffprivlib warns the same way).
    Use the bundle's public bounds in anything real.

    Parameters
    ----------
    X : array_like of shape (n_samples, n_components)

    Returns
    -------
    lower, upper : ndarray of shape (n_components,)
    """
    arr = check_array(X, "X", ndim=2)
    warnings.warn(
        "bounds derived from the data being released leak information about it and void the "
        "privacy guarantee; use fixed public bounds (the bundle's) instead",
        PrivacyLeakWarning,
        stacklevel=2,
    )
    lower: FloatArray = arr.min(axis=0)
    upper: FloatArray = arr.max(axis=0)
    return lower, upper
