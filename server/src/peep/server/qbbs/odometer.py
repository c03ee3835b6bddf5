"""Privacy odometer: cumulative ε per subject under sequential composition.

Every answer the query module releases about a subject spends ε from that
subject's budget (``pairs·ε`` per synthesised trait value, see
:mod:`peep.server.qbbs.queries`); once the cap would be exceeded the module
refuses with :class:`~peep.server.qbbs.errors.OdometerExhaustedError`. The
spends are kept by :class:`peep.core.accounting.PrivacyAccountant` in a
persistent :class:`~peep.core.accounting.JsonlLedger` (fsync'd per spend,
replayed on open), which doubles as the audit log: one JSON line per release
with the subject, the ε, the time and a note naming the operation, the
traits, the number of responses and the requester.

This closes the chapter's gap: without it, repeating a verification draws
fresh noise each time and the average converges on the stored value.

Replicas on one PostgreSQL use :class:`DatabaseOdometer` instead: the running
total per subject is a row (``qbbs_odometer``) and every spend a row of
``qbbs_spends`` (the audit log, storage migration 4). :meth:`~DatabaseOdometer.charge`
locks the subject's row (``SELECT ... FOR UPDATE``), checks the cap, lets the
caller compute the release, and records the spend in the same transaction: a
concurrent verification of the same subject on any replica waits for the lock
and sees the new total, so the cap holds across replicas, and a release that
fails (or is refused) records nothing.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peep.core.accounting import InMemoryLedger, JsonlLedger, PrivacyAccountant, Spend, SpendLedger
from peep.core.exceptions import BudgetError
from peep.server.qbbs.errors import OdometerExhaustedError

__all__ = ["DatabaseOdometer", "OdometerReading", "PrivacyOdometer"]

_PREFIX = "qbbs:subject:"


@dataclass(frozen=True, kw_only=True)
class OdometerReading:
    """A subject's cumulative spend."""

    subject: str
    epsilon_spent: float
    epsilon_cap: float
    releases: int

    @property
    def epsilon_remaining(self) -> float:
        return max(0.0, self.epsilon_cap - self.epsilon_spent)


class PrivacyOdometer:
    """Per-subject ε odometer with a cap.

    Parameters
    ----------
    cap : float
        Cumulative ε per subject.
    ledger_path : path, optional
        JSONL ledger (audit log); in memory when ``None``.
    ledger : SpendLedger, optional
        Use this ledger instead (e.g. the server's database ledger).
    clock : callable, default ``time.time``
    """

    def __init__(
        self,
        *,
        cap: float,
        ledger_path: str | os.PathLike[str] | None = None,
        ledger: SpendLedger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
            raise ValueError(f"cap: expected a finite number > 0, received {cap!r}")
        if ledger is not None and ledger_path is not None:
            raise ValueError("ledger_path: expected None when a ledger is passed, received both")
        if ledger is None:
            if ledger_path is not None:
                Path(ledger_path).parent.mkdir(parents=True, exist_ok=True)
                ledger = JsonlLedger(ledger_path)
            else:
                ledger = InMemoryLedger()
        self.cap = float(cap)
        self.ledger = ledger
        self.accountant = PrivacyAccountant(epsilon_budget=self.cap, ledger=ledger, clock=clock)

    @staticmethod
    def key(subject: str) -> str:
        return _PREFIX + subject

    def check(self, subject: str, epsilon: float) -> None:
        """Raise :class:`OdometerExhaustedError` if spending ``epsilon`` would pass the cap."""
        try:
            self.accountant.check(self.key(subject), epsilon)
        except BudgetError as exc:
            raise self._exhausted(subject, epsilon) from exc

    def spend(
        self,
        subject: str,
        epsilon: float,
        *,
        operation: str,
        traits: Sequence[str],
        responses: int,
        requester: str = "",
    ) -> Spend:
        """Record a release (checks again, atomically with the append)."""
        note = json.dumps(
            {"op": operation, "traits": list(traits), "responses": responses, "requester": requester},
            separators=(",", ":"),
        )
        try:
            return self.accountant.spend(self.key(subject), epsilon, note=note)
        except BudgetError as exc:
            raise self._exhausted(subject, epsilon) from exc

    @contextmanager
    def charge(
        self,
        subject: str,
        epsilon: float,
        *,
        operation: str,
        traits: Sequence[str],
        responses: int,
        requester: str = "",
    ) -> Iterator[None]:
        """Check the cap, run the block (the release), record the spend; nothing is recorded if the block raises.

        The caller serialises charges of one process (the query module's lock); across
        processes see :class:`DatabaseOdometer`.
        """
        self.check(subject, epsilon)
        yield
        self.spend(subject, epsilon, operation=operation, traits=traits, responses=responses, requester=requester)

    def _exhausted(self, subject: str, epsilon: float) -> OdometerExhaustedError:
        spent = self.spent(subject)
        return OdometerExhaustedError(
            f"privacy odometer: subject {subject!r} has spent ε={spent:g} of its cap ε={self.cap:g}; "
            f"this answer needs ε={epsilon:g} more, so it is refused (nothing was released or recorded)"
        )

    def spent(self, subject: str) -> float:
        return self.accountant.spent(self.key(subject))[0]

    def reading(self, subject: str) -> OdometerReading:
        return OdometerReading(
            subject=subject,
            epsilon_spent=self.spent(subject),
            epsilon_cap=self.cap,
            releases=len(self.ledger.entries(self.key(subject))),
        )

    def audit_log(self, subject: str | None = None) -> list[dict[str, Any]]:
        """Spends in recording order (all subjects, or one), as plain dicts."""
        entries = self.ledger.entries(self.key(subject) if subject is not None else None)
        out = []
        for e in entries:
            if not e.key.startswith(_PREFIX):
                continue
            try:
                note = json.loads(e.note) if e.note else {}
            except ValueError:
                note = {"note": e.note}
            out.append({"subject": e.key[len(_PREFIX) :], "epsilon": e.epsilon, "time": e.time, **note})
        return out

    def close(self) -> None:
        if isinstance(self.ledger, JsonlLedger):
            self.ledger.close()


_RTOL = 1e-9  # as peep.core.accounting: ten spends of 0.1 fit a cap of 1.0


def _note(operation: str, traits: Sequence[str], responses: int, requester: str) -> str:
    return json.dumps(
        {"op": operation, "traits": list(traits), "responses": responses, "requester": requester},
        separators=(",", ":"),
    )


class DatabaseOdometer:
    """The odometer in PostgreSQL, one cap per subject across every replica (see module docstring).

    Parameters
    ----------
    cap : float
    connect : callable returning a psycopg connection
        Autocommit; the odometer keeps one and reconnects when it breaks. The tables come
        from the server's storage migrations (``qbbs_odometer``, ``qbbs_spends``).
    clock : callable, default ``time.time``
    """

    def __init__(self, *, cap: float, connect: Callable[[], Any], clock: Callable[[], float] = time.time) -> None:
        if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
            raise ValueError(f"cap: expected a finite number > 0, received {cap!r}")
        self.cap = float(cap)
        self._connect = connect
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: Any = None

    key = staticmethod(PrivacyOdometer.key)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = self._connect()
            yield self._conn

    def _fits(self, spent: float, epsilon: float) -> bool:
        return spent + epsilon <= self.cap * (1.0 + _RTOL)

    def _exhausted(self, subject: str, spent: float, epsilon: float) -> OdometerExhaustedError:
        return OdometerExhaustedError(
            f"privacy odometer: subject {subject!r} has spent ε={spent:g} of its cap ε={self.cap:g}; "
            f"this answer needs ε={epsilon:g} more, so it is refused (nothing was released or recorded)"
        )

    def check(self, subject: str, epsilon: float) -> None:
        """Raise :class:`OdometerExhaustedError` if spending ``epsilon`` now would pass the cap (advisory)."""
        spent = self.spent(subject)
        if not self._fits(spent, epsilon):
            raise self._exhausted(subject, spent, epsilon)

    @contextmanager
    def charge(
        self,
        subject: str,
        epsilon: float,
        *,
        operation: str,
        traits: Sequence[str],
        responses: int,
        requester: str = "",
    ) -> Iterator[None]:
        """Lock the subject's row, check the cap, run the block (the release), record the spend; one transaction."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon: expected a finite number > 0, received {epsilon!r}")
        with self._connection() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO qbbs_odometer (subject, epsilon_spent, releases) VALUES (%s, 0, 0) "
                "ON CONFLICT (subject) DO NOTHING",
                (subject,),
            )
            row = conn.execute(
                "SELECT epsilon_spent FROM qbbs_odometer WHERE subject = %s FOR UPDATE", (subject,)
            ).fetchone()
            spent = float(row[0])
            if not self._fits(spent, epsilon):
                raise self._exhausted(subject, spent, epsilon)
            yield  # the release is computed while this subject's row is locked
            conn.execute(
                "UPDATE qbbs_odometer SET epsilon_spent = epsilon_spent + %s, releases = releases + 1 "
                "WHERE subject = %s",
                (epsilon, subject),
            )
            conn.execute(
                "INSERT INTO qbbs_spends (subject, epsilon, spent_at, note) VALUES (%s, %s, %s, %s)",
                (subject, epsilon, float(self._clock()), _note(operation, traits, responses, requester)),
            )

    def spend(
        self,
        subject: str,
        epsilon: float,
        *,
        operation: str,
        traits: Sequence[str],
        responses: int,
        requester: str = "",
    ) -> None:
        """Record a release (checked under the row lock)."""
        with self.charge(
            subject, epsilon, operation=operation, traits=traits, responses=responses, requester=requester
        ):
            pass

    def spent(self, subject: str) -> float:
        with self._connection() as conn:
            row = conn.execute("SELECT epsilon_spent FROM qbbs_odometer WHERE subject = %s", (subject,)).fetchone()
        return 0.0 if row is None else float(row[0])

    def reading(self, subject: str) -> OdometerReading:
        with self._connection() as conn:
            row = conn.execute(
                "SELECT epsilon_spent, releases FROM qbbs_odometer WHERE subject = %s", (subject,)
            ).fetchone()
        spent, releases = (0.0, 0) if row is None else (float(row[0]), int(row[1]))
        return OdometerReading(subject=subject, epsilon_spent=spent, epsilon_cap=self.cap, releases=releases)

    def audit_log(self, subject: str | None = None) -> list[dict[str, Any]]:
        """Spends in recording order (all subjects, or one), as plain dicts."""
        q = "SELECT subject, epsilon, spent_at, note FROM qbbs_spends"
        with self._connection() as conn:
            if subject is None:
                rows = conn.execute(q + " ORDER BY id").fetchall()
            else:
                rows = conn.execute(q + " WHERE subject = %s ORDER BY id", (subject,)).fetchall()
        out = []
        for subj, eps, at, note in rows:
            try:
                extra = json.loads(note) if note else {}
            except ValueError:
                extra = {"note": note}
            out.append({"subject": subj, "epsilon": float(eps), "time": float(at), **extra})
        return out

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
