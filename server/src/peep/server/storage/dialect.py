"""What differs between the stores' SQLite and PostgreSQL text, and nothing else.

The SQL itself is written once (:mod:`peep.server.storage.base`,
:mod:`peep.server.storage.migrations`); a :class:`Dialect` fills in the
placeholder, the column types and the form of an ``IN`` list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dialect:
    """One SQL dialect.

    Attributes
    ----------
    name : str
        ``Store.dialect`` and the key of :data:`~peep.server.storage.migrations.MIGRATIONS`.
    param : str
        Placeholder of a bound parameter.
    real, blob : str
        Column types of float and bytes values.
    chunk : int or None
        Ids bound per ``IN (...)`` list; None when a list is bound as one array
        parameter (``= ANY(...)``) and never needs splitting.
    """

    name: str
    param: str
    real: str
    blob: str
    chunk: int | None

    def any_of(self, column: str, values: Sequence[str]) -> tuple[str, list[object]]:
        """The condition "``column`` is one of ``values``" and its parameters."""
        if self.chunk is None:
            return f"{column} = ANY({self.param})", [list(values)]
        return f"{column} IN ({','.join([self.param] * len(values))})", list(values)

    def chunks(self, values: Sequence[str]) -> list[list[str]]:
        """``values`` split into lists that :meth:`any_of` can bind (one list when it binds arrays)."""
        if self.chunk is None:
            return [list(values)]
        return [list(values[i : i + self.chunk]) for i in range(0, len(values), self.chunk)]


SQLITE = Dialect("sqlite", param="?", real="REAL", blob="BLOB", chunk=500)  # SQLite binds at most 32,766 parameters
POSTGRES = Dialect("postgres", param="%s", real="DOUBLE PRECISION", blob="BYTEA", chunk=None)

__all__ = ["POSTGRES", "SQLITE", "Dialect"]
