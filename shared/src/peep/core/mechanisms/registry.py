"""The one list of template mechanism kinds.

Every module of the :mod:`peep.core.mechanisms` package is imported on the
first lookup, and each registers its classes with :func:`register_mechanism`;
so a new kind is one new class in its family's module (or a new module in this
package), one ``MechanismKind`` value in ``proto/peep/v1/template.proto``, and
its tests. Nothing else lists kinds: the wire format, configurations, ingest,
training, the audit and the CLI read them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from numpy.typing import ArrayLike
from peep.core._registry import Registry

if TYPE_CHECKING:
    from peep.core.mechanisms.base import TemplateMechanism

__all__ = [
    "make_mechanism",
    "mechanism_class",
    "mechanism_classes",
    "mechanism_kind_literal",
    "mechanism_kinds",
    "register_mechanism",
]

M = TypeVar("M", bound="type[TemplateMechanism]")


def _check_contract(cls: type[TemplateMechanism]) -> None:
    from peep.core.domains import DOMAINS

    if cls.epsilon_scope not in ("coordinate", "vector"):
        raise TypeError(
            f"{cls.__name__}.epsilon_scope: expected 'coordinate' or 'vector', received {cls.epsilon_scope!r}"
        )
    if cls.domain not in DOMAINS:
        raise TypeError(f"{cls.__name__}.domain: expected one of {', '.join(DOMAINS)}, received {cls.domain!r}")


_REGISTRY: Registry[type[TemplateMechanism]] = Registry(
    "peep.core.mechanisms",
    what="mechanism kind",
    required=("kind", "wire_name", "domain", "summary"),
    check=_check_contract,
    skip=("base", "registry", "calibration", "scalar"),
    unique=("wire_name",),
)


def register_mechanism(cls: M) -> M:
    """Class decorator: add a :class:`TemplateMechanism` subclass to the registry.

    Raises
    ------
    TypeError
        The class does not declare its contract (``kind``, ``wire_name``,
        ``domain`` — a known release domain —, ``summary``) or
        ``epsilon_scope`` is not ``"coordinate"`` or ``"vector"``.
    ValueError
        Another class already has its kind or wire name.
    """
    _REGISTRY.register(cls)
    return cls


def mechanism_classes() -> Mapping[str, type[TemplateMechanism]]:
    """Every registered kind and its class (by module name, then as each module defines them)."""
    return _REGISTRY.classes()


def mechanism_kinds() -> tuple[str, ...]:
    """Names of every registered kind (configurations and the CLI accept exactly these)."""
    return _REGISTRY.kinds()


def mechanism_class(kind: str) -> type[TemplateMechanism]:
    """The class registered for ``kind``.

    Raises
    ------
    TypeError
        ``kind`` is not a str.
    ValueError
        Unknown kind; the message lists the known ones.
    """
    return _REGISTRY.get(kind)


def mechanism_kind_literal() -> Any:
    """``typing.Literal`` of every registered kind, for typed configuration models.

    Configuration schemas (edge ``privacy.mechanism``, server
    ``training.mechanism_kind``) use it so they accept exactly the registry's
    kinds and list them in their errors and generated docs.
    """
    return Literal[mechanism_kinds()]


def make_mechanism(
    kind: str,
    *,
    epsilon: float,
    delta: float | None = None,
    n_components: int,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    radius_l2: float | None = None,
    radius_l1: float | None = None,
    random_state: object = None,
) -> TemplateMechanism:
    """Build the template mechanism named ``kind`` from public parameters.

    Each kind takes what it needs (see
    :meth:`~peep.core.mechanisms.base.TemplateMechanism.from_parameters`).

    Raises
    ------
    ValueError
        Unknown kind (the message lists :func:`mechanism_kinds`), or a
        parameter the kind needs is missing or inconsistent.

    Examples
    --------
    >>> make_mechanism("laplace-vector", epsilon=2.0, n_components=4).guarantee.epsilon_vector
    2.0
    """
    from peep.core.mechanisms.base import PublicParameters

    public = PublicParameters(
        n_components=n_components, lower=lower, upper=upper, radius_l2=radius_l2, radius_l1=radius_l1
    )
    return mechanism_class(kind).from_parameters(public, epsilon=epsilon, delta=delta, random_state=random_state)
