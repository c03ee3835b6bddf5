"""The permissible query structure (chapter Eqs. 5.3-5.4) and its noise.

For a trait and a claimed subject i the module answers exactly
``m = 2·pairs`` SUM queries, fixed before enrolment:

* pair 1: ``Q1 = SUM(trait over all subjects)``, ``Q2 = SUM(... all but i)``;
* pair k >= 2: the same over the group containing i of a fixed public
  partition k of the subject ids (a salted hash, so membership is public and
  independent of the data): ``SUM(group)`` and ``SUM(group \\ {i})``.

Each response gets independent Laplace noise of scale Δf/ε, Δf the global
sensitivity of a SUM under replacement of one record, ``upper - lower`` of
the trait's declared range (or the chapter's ``max - min`` of the stored
values). The synthesising function f is the mean of the pair differences:
``Y' = f(R') = Y + φ`` with net noise ``φ = mean_k(η_{2k-1} - η_{2k})`` of
variance ``2·Var(η)/pairs``.

Privacy: the responses never leave the module, only Y' does. Y' does not
depend on any other subject's value (their contributions cancel in each
difference), and among the responses only the ``pairs`` that include i depend
on Y_i, so by sequential composition and post-processing one synthesised
value costs subject i ``pairs·ε`` and everyone else nothing. m = 2 is the
best structure for a given spend.

Examples
--------
>>> plan = QueryPlan(pairs=1, partitions=8, salt="s")
>>> [q.describe() for q in plan.queries("age", "alice")]
['SUM(age) over all subjects', "SUM(age) over all subjects except 'alice'"]
>>> r = plan.exact_responses("age", "alice", ["alice", "bob", "carol"], np.array([30.0, 40.0, 50.0]))
>>> r.tolist(), plan.synthesise(r)
([120.0, 90.0], 30.0)
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.exceptions import PrivacyLeakWarning
from peep.server.config.qbbs import QbbsConfig, TraitSpec
from peep.server.qbbs.errors import QueryShapeError

__all__ = ["QueryPlan", "SumQuery", "sensitivity", "structure_fingerprint"]


@dataclass(frozen=True, kw_only=True)
class SumQuery:
    """One permissible query: SUM of a trait over a public subject set, optionally minus one id.

    Attributes
    ----------
    trait : str
    scheme : int
        0 = all subjects; k >= 1 = group ``group`` of public partition k.
    group : int or None
    exclude : str or None
        The claimed subject, left out of the second query of each pair.
    aggregate : str
        Always ``"SUM"`` for a permissible query.
    """

    trait: str
    scheme: int
    group: int | None
    exclude: str | None
    aggregate: str = "SUM"

    def describe(self) -> str:
        where = "all subjects" if self.scheme == 0 else f"group {self.group} of public partition {self.scheme}"
        if self.exclude is not None:
            where += f" except {self.exclude!r}"
        return f"{self.aggregate}({self.trait}) over {where}"


class QueryPlan:
    """The fixed structure of ``2·pairs`` SUM queries per (trait, claimed subject).

    Parameters
    ----------
    pairs : int
        m / 2.
    partitions : int
        Groups per public partition (pairs after the first).
    salt : str
        Public salt of the group hash.
    """

    def __init__(self, *, pairs: int, partitions: int, salt: str) -> None:
        if not isinstance(pairs, int) or pairs < 1:
            raise ValueError(f"pairs: expected an int >= 1, received {pairs!r}")
        if not isinstance(partitions, int) or partitions < 2:
            raise ValueError(f"partitions: expected an int >= 2, received {partitions!r}")
        self.pairs = pairs
        self.partitions = partitions
        self.salt = salt

    @classmethod
    def from_config(cls, config: QbbsConfig) -> QueryPlan:
        return cls(pairs=config.pairs, partitions=config.partitions, salt=config.partition_salt)

    @property
    def m(self) -> int:
        return 2 * self.pairs

    def group(self, subject: str, scheme: int) -> int:
        """Group of ``subject`` in public partition ``scheme`` (>= 1)."""
        digest = hashlib.sha256(f"{self.salt}\x00{scheme}\x00{subject}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.partitions

    def groups(self, subjects: Sequence[str], scheme: int) -> NDArray[np.int64]:
        return np.fromiter((self.group(s, scheme) for s in subjects), dtype=np.int64, count=len(subjects))

    def queries(self, trait: str, subject: str) -> list[SumQuery]:
        """The m permissible queries for ``subject``'s ``trait``, in answer order."""
        out: list[SumQuery] = []
        for k in range(self.pairs):
            group = None if k == 0 else self.group(subject, k)
            out.append(SumQuery(trait=trait, scheme=k, group=group, exclude=None))
            out.append(SumQuery(trait=trait, scheme=k, group=group, exclude=subject))
        return out

    def check(self, queries: Sequence[SumQuery], trait: str, subject: str) -> None:
        """Raise :class:`QueryShapeError` unless ``queries`` is exactly the plan for (trait, subject)."""
        expected = self.queries(trait, subject)
        if list(queries) != expected:
            got = "; ".join(q.describe() if isinstance(q, SumQuery) else repr(q) for q in queries) or "nothing"
            raise QueryShapeError(
                f"query: expected the fixed structure of {self.m} SUM queries "
                f"({'; '.join(q.describe() for q in expected)}), received {got}; "
                "no other query shape is answered"
            )

    # -- exact answers (inside the module only) --------------------------------------

    def exact_responses(
        self, trait: str, subject: str, subjects: Sequence[str], values: ArrayLike
    ) -> NDArray[np.float64]:
        """The m exact SUMs for ``subject`` over the column ``(subjects, values)``.

        Sums are correctly rounded (``math.fsum``), so the pair differences
        recover the stored value up to one rounding of the total.
        """
        vals = np.asarray(values, dtype=np.float64)
        try:
            i = list(subjects).index(subject)
        except ValueError:
            raise QueryShapeError(f"subject: {subject!r} is not in the column") from None
        out = np.empty(self.m, dtype=np.float64)
        out[0] = math.fsum(vals)
        out[1] = math.fsum(np.delete(vals, i))
        for k in range(1, self.pairs):
            member = self.groups(subjects, k) == self.group(subject, k)
            out[2 * k] = math.fsum(vals[member])
            member[i] = False
            out[2 * k + 1] = math.fsum(vals[member])
        return out

    def exact_responses_many(self, subjects: Sequence[str], values: ArrayLike, index: ArrayLike) -> NDArray[np.float64]:
        """Vectorised :meth:`exact_responses` for many claims (simulations).

        Parameters
        ----------
        subjects : sequence of str, length n_subjects
        values : array-like of shape (n_subjects,)
        index : array-like of int, shape (n_claims,)
            Position of each claimed subject in ``subjects``.

        Returns
        -------
        ndarray of shape (n_claims, m)
        """
        vals = np.asarray(values, dtype=np.float64)
        idx = np.asarray(index, dtype=np.int64)
        out = np.empty((idx.size, self.m), dtype=np.float64)
        total = math.fsum(vals)
        out[:, 0] = total
        out[:, 1] = total - vals[idx]
        for k in range(1, self.pairs):
            g = self.groups(subjects, k)
            sums = np.array([math.fsum(vals[g == j]) for j in range(self.partitions)])
            out[:, 2 * k] = sums[g[idx]]
            out[:, 2 * k + 1] = sums[g[idx]] - vals[idx]
        return out

    # -- synthesis -------------------------------------------------------------------

    def synthesise(self, responses: ArrayLike) -> float:
        """f(R): the mean over pairs of (with - without)."""
        r = np.asarray(responses, dtype=np.float64)
        if r.shape != (self.m,):
            raise QueryShapeError(f"responses: expected {self.m} values, received shape {r.shape}")
        return float(np.mean(r[0::2] - r[1::2]))

    def synthesise_many(self, responses: ArrayLike) -> NDArray[np.float64]:
        """Row-wise :meth:`synthesise` of an (n, m) array."""
        r = np.asarray(responses, dtype=np.float64)
        if r.ndim != 2 or r.shape[1] != self.m:
            raise QueryShapeError(f"responses: expected shape (n, {self.m}), received {r.shape}")
        out: NDArray[np.float64] = np.mean(r[:, 0::2] - r[:, 1::2], axis=1)
        return out

    def net_noise_variance(self, response_variance: float) -> float:
        """Var φ for independent response noise of variance ``response_variance``."""
        return 2.0 * response_variance / self.pairs


def sensitivity(spec: TraitSpec, values: ArrayLike, mode: str) -> float:
    """Global sensitivity Δf of a SUM over the trait (replacement of one record).

    ``"declared-range"``: ``upper - lower``. ``"database-extremes"``: the
    chapter's ``max - min`` of the stored values (warns
    :class:`~peep.core.exceptions.PrivacyLeakWarning`: the noise scale then
    depends on the data it protects); falls back to the declared range when
    fewer than two distinct values are stored.
    """
    if mode == "declared-range":
        return spec.range
    if mode == "database-extremes":
        warnings.warn(
            "QBBS sensitivity from the database's max/min (the chapter's construction) depends on the "
            "stored values; the noise scale leaks the extremes. Use sensitivity = 'declared-range'.",
            PrivacyLeakWarning,
            stacklevel=2,
        )
        vals = np.asarray(values, dtype=np.float64)
        spread = float(vals.max() - vals.min()) if vals.size else 0.0
        return spread if spread > 0.0 else spec.range
    raise ValueError(f"sensitivity: expected 'declared-range' or 'database-extremes', received {mode!r}")


def structure_fingerprint(config: QbbsConfig) -> tuple[str, str]:
    """``(fingerprint, description)`` of everything that shapes the permissible queries."""
    traits: Mapping[str, TraitSpec] = config.traits
    doc = {
        "aggregate": "SUM",
        "m": config.queries_per_trait,
        "partitions": config.partitions if config.pairs > 1 else None,
        "salt": config.partition_salt if config.pairs > 1 else None,
        "sensitivity": config.sensitivity,
        "traits": {n: [t.kind, t.lower, t.upper] for n, t in sorted(traits.items())},
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32], text
