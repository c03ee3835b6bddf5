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
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peep.core.accounting import InMemoryLedger, JsonlLedger, PrivacyAccountant, Spend, SpendLedger
from peep.core.exceptions import BudgetError
from peep.server.qbbs.errors import OdometerExhaustedError

__all__ = ["OdometerReading", "PrivacyOdometer"]

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
