"""What differs between the stores' SQLite and PostgreSQL text, and nothing else.

The SQL itself is written once (:mod:`peep.server.storage.sql`,
:mod:`peep.server.storage.migrations`); a :class:`Dialect` fills in the
placeholder, the column types and the form of an ``IN`` list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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
        Ids (or id pairs) bound per ``IN (...)`` list; None when a list is bound as
        one array parameter (``= ANY(...)``, ``unnest(...)``) and never needs splitting.
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

    def any_pair_of(self, columns: tuple[str, str], pairs: Sequence[tuple[str, str]]) -> tuple[str, list[object]]:
        """The condition "``(columns[0], columns[1])`` is one of ``pairs``" and its parameters."""
        a, b = columns
        if self.chunk is None:
            firsts, seconds = [p[0] for p in pairs], [p[1] for p in pairs]
            arrays = f"unnest({self.param}::text[], {self.param}::text[])"
            return f"({a}, {b}) IN (SELECT * FROM {arrays})", [firsts, seconds]
        # SQLite scans the whole key for a row-value IN list; the IN list on the second column lets it
        # search that column's index (templates_message) and test the pair only on what it finds.
        seconds_in = ",".join([self.param] * len(pairs))
        rows = ",".join([f"({self.param}, {self.param})"] * len(pairs))
        params: list[object] = [p[1] for p in pairs]
        params.extend(v for p in pairs for v in p)
        return f"{b} IN ({seconds_in}) AND ({a}, {b}) IN (VALUES {rows})", params

    def chunks(self, values: Sequence[Any]) -> list[list[Any]]:
        """``values`` split into lists :meth:`any_of` / :meth:`any_pair_of` can bind (one list when it binds arrays)."""
        if self.chunk is None:
            return [list(values)]
        return [list(values[i : i + self.chunk]) for i in range(0, len(values), self.chunk)]


SQLITE = Dialect("sqlite", param="?", real="REAL", blob="BLOB", chunk=500)  # SQLite binds at most 32,766 parameters
POSTGRES = Dialect("postgres", param="%s", real="DOUBLE PRECISION", blob="BYTEA", chunk=None)

__all__ = ["POSTGRES", "SQLITE", "Dialect"]
