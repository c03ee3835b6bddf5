"""Local differential privacy mechanisms for scalars and templates.

Following diffprivlib's ``mechanisms`` package: one module per family, each
class validates its keyword-only parameters at construction (wrong type →
``TypeError``, out of range → ``ValueError``, each naming the parameter) and
states its guarantee (per coordinate and per vector) and its exact noise
variance.

Modules
    :mod:`~peep.core.mechanisms.base`
        :class:`TemplateMechanism`, the contract each kind declares, and
        :class:`PrivacyGuarantee`.
    :mod:`~peep.core.mechanisms.registry`
        The one list of kinds: :func:`mechanism_kinds`,
        :func:`mechanism_class`, :func:`make_mechanism`.
    :mod:`~peep.core.mechanisms.calibration`
        The analytic Gaussian σ and calibration on the secure sampler's grid.
    :mod:`~peep.core.mechanisms.scalar`
        :class:`LaplaceMechanism`, :class:`GaussianMechanism`,
        :class:`RandomizedResponse` (soft traits, QBBS answers).
    :mod:`~peep.core.mechanisms.laplace`
        ``peep``, ``peep-raw``, ``laplace-vector``, ``laplace-l1``.
    :mod:`~peep.core.mechanisms.gaussian`
        ``gaussian-l2``.

Adding a kind: a class in its family's module (or a new module here)
decorated with :func:`register_mechanism`, a ``MechanismKind`` value in
``proto/peep/v1/template.proto`` (then ``scripts/gen-proto.sh``), and tests.
``release(X)`` always clips ``X`` into the mechanism's domain first: the
sensitivity, and hence ε, holds whatever the caller passes.

Sensitivity comes from fixed public bounds (from the bundle), never from the
data being released; :func:`bounds_from_data` exists for experiments and
warns with :class:`~peep.core.exceptions.PrivacyLeakWarning`.
"""

from __future__ import annotations

from peep.core.mechanisms.base import PrivacyGuarantee, PublicParameters, TemplateMechanism, bounds_from_data
from peep.core.mechanisms.calibration import analytic_gaussian_sigma, classic_gaussian_sigma
from peep.core.mechanisms.gaussian import GaussianL2Mechanism
from peep.core.mechanisms.laplace import (
    LaplaceL1Mechanism,
    LaplaceVectorMechanism,
    PeepMechanism,
    PeepRawMechanism,
)
from peep.core.mechanisms.registry import (
    make_mechanism,
    mechanism_class,
    mechanism_classes,
    mechanism_kind_literal,
    mechanism_kinds,
    register_mechanism,
)
from peep.core.mechanisms.scalar import GaussianMechanism, LaplaceMechanism, RandomizedResponse

__all__ = [
    "MECHANISM_KINDS",
    "GaussianL2Mechanism",
    "GaussianMechanism",
    "LaplaceL1Mechanism",
    "LaplaceMechanism",
    "LaplaceVectorMechanism",
    "PeepMechanism",
    "PeepRawMechanism",
    "PrivacyGuarantee",
    "PublicParameters",
    "RandomizedResponse",
    "TemplateMechanism",
    "analytic_gaussian_sigma",
    "bounds_from_data",
    "classic_gaussian_sigma",
    "make_mechanism",
    "mechanism_class",
    "mechanism_classes",
    "mechanism_kind_literal",
    "mechanism_kinds",
    "register_mechanism",
]

#: Every registered kind (read from the registry; configurations and the CLI accept exactly these).
MECHANISM_KINDS: tuple[str, ...] = mechanism_kinds()
