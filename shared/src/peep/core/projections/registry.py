"""The one list of projection kinds (what a bundle's projector computes from a face).

Every module of :mod:`peep.core.projections` is imported on the first lookup
and registers its classes with :func:`register_projection`; a new projection
is one new module here and its tests. ``peep bundle build --projection``, the
audit's ``--projection`` and bundle loading read the kinds from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

from peep.core._registry import Registry

if TYPE_CHECKING:
    from peep.core.projections.base import Projection

__all__ = ["projection_class", "projection_classes", "projection_kinds", "register_projection"]

P = TypeVar("P", bound="type[Projection]")

_REGISTRY: Registry[type[Projection]] = Registry(
    "peep.core.projections",
    what="projection kind",
    required=("kind", "summary"),
    skip=("base", "registry"),
)


def register_projection(cls: P) -> P:
    """Class decorator: add a :class:`~peep.core.projections.base.Projection` subclass to the registry."""
    _REGISTRY.register(cls)
    return cls


def projection_classes() -> Mapping[str, type[Projection]]:
    """Every registered projection kind and its class."""
    return _REGISTRY.classes()


def projection_kinds() -> tuple[str, ...]:
    """Names of every registered projection kind."""
    return _REGISTRY.kinds()


def projection_class(kind: str) -> type[Projection]:
    """The class registered for ``kind``; ``ValueError`` listing the kinds otherwise."""
    return _REGISTRY.get(kind)
