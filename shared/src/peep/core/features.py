"""Unsafe modes that must be switched on explicitly, by name.

Following OpenDP's ``enable_features``: seeded (reproducible) noise is useful
for simulations and tests but offers no privacy, so constructing a mechanism
with a seed fails unless ``"seeded-noise"`` was enabled in this process. The
edge agent never enables it, and its configuration has no field that could.

Examples
--------
>>> from peep.core import features
>>> features.is_enabled("seeded-noise")
False
>>> with features.enabled("seeded-noise"):
...     features.is_enabled("seeded-noise")
True
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from peep.core.exceptions import UnsafeFeatureError

#: Names of the unsafe features; anything else is a typo and is refused.
KNOWN_FEATURES = frozenset({"seeded-noise"})

_lock = threading.Lock()
_enabled: dict[str, int] = {}


def _check_name(name: str) -> None:
    if name not in KNOWN_FEATURES:
        raise ValueError(f"feature: expected one of {sorted(KNOWN_FEATURES)}, received {name!r}")


def enable_features(*names: str) -> None:
    """Enable unsafe features for the rest of the process."""
    for name in names:
        _check_name(name)
    with _lock:
        for name in names:
            _enabled[name] = _enabled.get(name, 0) + 1


def disable_features(*names: str) -> None:
    """Undo one :func:`enable_features` call for each name."""
    for name in names:
        _check_name(name)
    with _lock:
        for name in names:
            count = _enabled.get(name, 0) - 1
            if count > 0:
                _enabled[name] = count
            else:
                _enabled.pop(name, None)


def is_enabled(name: str) -> bool:
    """Whether ``name`` is currently enabled in this process."""
    _check_name(name)
    return _enabled.get(name, 0) > 0


def require(name: str, what: str) -> None:
    """Raise :class:`UnsafeFeatureError` unless ``name`` is enabled."""
    if not is_enabled(name):
        raise UnsafeFeatureError(
            f"{what} requires the unsafe feature {name!r}, which offers no privacy; "
            f"enable it explicitly with peep.core.features.enable_features({name!r}) "
            "(simulations and tests only; devices never do)"
        )


@contextmanager
def enabled(*names: str) -> Iterator[None]:
    """Context manager enabling ``names`` for the duration of the block."""
    enable_features(*names)
    try:
        yield
    finally:
        disable_features(*names)
