"""A registry of classes by kind, filled by the modules of one package.

The mechanisms and the projections each keep one: every module of the
package is imported on the first lookup and registers its classes with a
decorator, so adding a kind is one new class in one module and nothing else
lists kinds.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Classes by their ``kind`` class attribute.

    Parameters
    ----------
    package : str
        The package whose modules register into this registry (all are
        imported on the first lookup, except ``skip`` and private ones).
    what : str
        What a kind is, for messages (``"mechanism kind"``).
    required : collection of str
        Class attributes every registered class must declare as non-empty str.
    check : callable ``cls -> None``, optional
        Further checks of a class's declarations; raises ``TypeError``.
    skip : collection of str
        Modules of the package that hold no registered classes.
    unique : collection of str
        Class attributes (besides ``kind``) no two classes may share.
    """

    def __init__(
        self,
        package: str,
        *,
        what: str,
        required: Collection[str] = ("kind",),
        check: Callable[[T], None] | None = None,
        skip: Collection[str] = (),
        unique: Collection[str] = (),
    ) -> None:
        self.package = package
        self.what = what
        self.required = tuple(dict.fromkeys(("kind", *required)))
        self.check = check
        self.skip = frozenset(skip)
        self.unique = tuple(unique)
        self._classes: dict[str, T] = {}
        self._lock = threading.RLock()
        self._discovered = False
        self._ordered: dict[str, T] | None = None  # classes() once sorted; dropped by register()

    def register(self, cls: T) -> T:
        """Class decorator: add ``cls``; ``TypeError``/``ValueError`` naming what is wrong."""
        for attr in self.required:
            value = getattr(cls, attr, None)
            if not isinstance(value, str) or not value:
                raise TypeError(f"{cls.__name__}.{attr}: expected a non-empty str class attribute, received {value!r}")
        if self.check is not None:
            self.check(cls)
        with self._lock:
            for other in self._classes.values():
                if other is cls:
                    return cls
                for attr in ("kind", *self.unique):
                    if getattr(other, attr) == getattr(cls, attr):
                        raise ValueError(
                            f"{cls.__name__}.{attr}: {getattr(cls, attr)!r} is already registered by {other.__name__}"
                        )
            self._classes[cls.kind] = cls  # type: ignore[attr-defined]
            self._ordered = None
        return cls

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            package = importlib.import_module(self.package)
            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
                if not info.name.startswith("_") and info.name not in self.skip:
                    importlib.import_module(f"{self.package}.{info.name}")
            self._discovered = True

    def classes(self) -> Mapping[str, T]:
        """Every kind and its class: by module name, then in the order each module defines them.

        The order does not depend on which module happened to be imported first.
        """
        self._discover()
        with self._lock:
            if self._ordered is None:
                items = list(self._classes.items())
                items.sort(key=lambda kv: kv[1].__module__)  # stable: keeps each module's definition order
                self._ordered = dict(items)
            return dict(self._ordered)

    def kinds(self) -> tuple[str, ...]:
        """Every registered kind."""
        return tuple(self.classes())

    def get(self, kind: str) -> T:
        """The class of ``kind``; ``TypeError`` for a non-str, ``ValueError`` listing the kinds otherwise."""
        if not isinstance(kind, str):
            raise TypeError(f"kind: expected a str, received {kind!r} ({type(kind).__name__})")
        self._discover()
        found = self._classes.get(kind)  # the ingest hot path: no copy, no sort
        if found is not None:
            return found
        classes = self.classes()
        try:
            return classes[kind]
        except KeyError:
            raise ValueError(
                f"kind: expected a {self.what}, one of {', '.join(classes)}, received {kind[:64]!r}"
            ) from None
