"""The estimator contract, without importing scikit-learn.

``get_params``/``set_params`` read the keyword-only ``__init__`` signature, so
PEEP estimators work with ``sklearn.base.clone`` and inside a ``Pipeline``
while the core stays free of scikit-learn (see scikit-learn's ``base.py``).
"""

from __future__ import annotations

import inspect
from typing import Any, Self

from peep.core.exceptions import NotFittedError


class ParamsMixin:
    """``get_params``/``set_params``/``__repr__`` from the ``__init__`` signature."""

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Parameters of this estimator (as passed to ``__init__``)."""
        out: dict[str, Any] = {}
        for name in self._param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                for k, v in value.get_params().items():
                    out[f"{name}__{k}"] = v
            out[name] = value
        return out

    def set_params(self, **params: Any) -> Self:
        """Set parameters; unknown names raise ValueError naming them."""
        valid = set(self._param_names())
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"{type(self).__name__}.set_params: expected one of {sorted(valid)}, received {name!r}"
                )
            if sub:
                getattr(self, name).set_params(**{sub: value})
            else:
                setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"


def check_is_fitted(estimator: object, attributes: tuple[str, ...]) -> None:
    """Raise :class:`NotFittedError` unless all fitted ``attributes`` exist."""
    missing = [a for a in attributes if not hasattr(estimator, a)]
    if missing:
        raise NotFittedError(
            f"{type(estimator).__name__} is not fitted yet (missing {', '.join(missing)}); call fit first"
        )
