"""Privacy accounting: per-key budgets under sequential composition.

Modelled on diffprivlib's ``BudgetAccountant`` and OpenDP's privacy filters:
``check()`` before adding noise, ``spend()`` after; a release that would
exceed the budget raises :class:`~peep.core.exceptions.BudgetError` and
nothing is recorded. Keys are free-form strings naming what is protected,
e.g. ``"track:42"``, ``"subject:alice"``, ``"device:cam1"``; each key has its
own budget and its own spend.

Composition is basic sequential composition: the spend of a key is
``(Σε, Σδ)`` over its releases. Spends are stored in a :class:`SpendLedger`
(in memory here, :class:`JsonlLedger` on disk; SQLite/PostgreSQL ledgers live
with the server and implement the same protocol).

Examples
--------
>>> acc = PrivacyAccountant(epsilon_budget=10.0)
>>> _ = acc.spend("track:1", 4.0)
>>> acc.remaining("track:1")
(6.0, 0.0)
>>> acc.spend("track:1", 7.0)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
peep.core.exceptions.BudgetError: ...
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

from peep.core.exceptions import BudgetError
from peep.core.validation import check_real

__all__ = [
    "InMemoryLedger",
    "JsonlLedger",
    "PrivacyAccountant",
    "ReleaseCost",
    "Spend",
    "SpendLedger",
]

_log = logging.getLogger(__name__)

# Budgets are compared with a relative slack of 1e-9 so that, e.g., ten
# spends of 0.1 fit a budget of 1.0 (0.1 is not exactly representable and
# the exact sum of the ten doubles is 1.0000000000000000555). The possible
# overspend is at most a billionth of the budget.
_RTOL: Final = 1e-9


@dataclass(frozen=True, kw_only=True)
class Spend:
    """One recorded release.

    Attributes
    ----------
    key : str
        What was protected (``"track:42"``, ``"subject:alice"``, ...).
    epsilon, delta : float
        The release's privacy cost: ``epsilon`` is the per-vector ε (the
        whole release, what budgets add up).
    time : float
        When it was recorded (seconds since the epoch, from the accountant's clock).
    epsilon_coordinate : float
        The per-coordinate ε of the release (reported next to the per-vector
        one; 0 where it does not apply, e.g. a QBBS answer).
    purpose : str
        ``"identify"``, ``"enroll"``, ... (empty when not a template release).
    message_id : str
        The released message, to link a spend to what was sent.
    note : str
        Free text.
    """

    key: str
    epsilon: float
    delta: float
    time: float
    epsilon_coordinate: float = 0.0
    purpose: str = ""
    message_id: str = ""
    note: str = ""

    @property
    def epsilon_vector(self) -> float:
        """The per-vector ε (the same as :attr:`epsilon`)."""
        return self.epsilon


@dataclass(frozen=True, kw_only=True)
class ReleaseCost:
    """What one release costs the person in it: computed once, read everywhere.

    Attributes
    ----------
    epsilon_vector : float
        Per-vector ε of the template.
    epsilon_coordinate : float
        Per-coordinate ε of the template.
    delta : float
        δ of the template (0 for pure-ε mechanisms).
    soft_epsilon : float
        ε of the soft traits released with it (age, gender), 0 if none.

    Examples
    --------
    >>> c = ReleaseCost(epsilon_vector=16.0, epsilon_coordinate=16.0, soft_epsilon=2.0)
    >>> c.total_vector, c.releases_within(40.0)
    (18.0, 2)
    """

    epsilon_vector: float
    epsilon_coordinate: float
    delta: float = 0.0
    soft_epsilon: float = 0.0

    @classmethod
    def of(cls, mechanism: Any, *, soft_epsilon: float = 0.0) -> ReleaseCost:
        """The cost of one release of a template ``mechanism`` (plus ``soft_epsilon``)."""
        g = mechanism.guarantee
        return cls(
            epsilon_vector=float(g.epsilon_vector),
            epsilon_coordinate=float(g.epsilon_coordinate),
            delta=float(g.delta),
            soft_epsilon=float(soft_epsilon),
        )

    @property
    def total_vector(self) -> float:
        """Per-vector ε charged for the release: the template plus its soft traits."""
        return self.epsilon_vector + self.soft_epsilon

    def releases_within(self, budget: float) -> int:
        """How many such releases fit in a per-vector ``budget`` (with the accountant's slack)."""
        return math.floor(budget / self.total_vector * (1 + _RTOL)) if self.total_vector > 0 else 0


@runtime_checkable
class SpendLedger(Protocol):
    """Storage of spends. Implementations must be safe to call from several threads."""

    def append(self, spend: Spend) -> None:
        """Record ``spend`` durably before returning."""
        ...

    def totals(self, key: str) -> tuple[float, float]:
        """``(Σε, Σδ)`` of the spends recorded for ``key`` (``(0.0, 0.0)`` if none)."""
        ...

    def entries(self, key: str | None = None) -> Sequence[Spend]:
        """Spends in recording order, all or those of ``key``."""
        ...


class InMemoryLedger:
    """Thread-safe in-memory :class:`SpendLedger` (lost at exit).

    Totals are exact sums of the recorded doubles (kept as fractions), rounded
    once when read, so long ledgers do not drift.
    """

    def __init__(self, entries: Iterable[Spend] = ()) -> None:
        self._lock = threading.Lock()
        self._entries: list[Spend] = []
        self._totals: dict[str, tuple[Fraction, Fraction]] = {}
        for spend in entries:
            self._add(spend)

    def _add(self, spend: Spend) -> None:
        eps, delta = self._totals.get(spend.key, (Fraction(0), Fraction(0)))
        self._totals[spend.key] = (eps + Fraction(spend.epsilon), delta + Fraction(spend.delta))
        self._entries.append(spend)

    def append(self, spend: Spend) -> None:
        """Record ``spend``."""
        if not isinstance(spend, Spend):
            raise TypeError(f"spend: expected a Spend, received {type(spend).__name__}")
        with self._lock:
            self._add(spend)

    def totals(self, key: str) -> tuple[float, float]:
        """``(Σε, Σδ)`` for ``key``."""
        with self._lock:
            eps, delta = self._totals.get(key, (Fraction(0), Fraction(0)))
        return float(eps), float(delta)

    def entries(self, key: str | None = None) -> list[Spend]:
        """Spends in recording order, all or those of ``key``."""
        with self._lock:
            if key is None:
                return list(self._entries)
            return [s for s in self._entries if s.key == key]

    def keys(self) -> list[str]:
        """Keys with at least one spend, in first-spend order."""
        with self._lock:
            return list(self._totals)


class JsonlLedger(InMemoryLedger):
    """A :class:`SpendLedger` persisted as one JSON object per line.

    Every :meth:`append` writes one line, flushes and ``fsync``s before
    returning, so a recorded spend survives a crash or power loss; opening
    the file replays it to rebuild the totals. A line is appended with a
    single ``write`` in append mode, which is atomic enough for one process;
    several processes must not share one file (use the server's database
    ledger for that).

    Parameters
    ----------
    path : str or Path
        Created (with its directory entry synced) if missing.

    Raises
    ------
    ValueError
        On open, if a line cannot be parsed (names the file and line). A
        torn final line means a spend may have been released but not fully
        recorded; the ledger refuses to guess its cost, and an operator must
        inspect the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        super().__init__(self._read(self.path))
        self._closed = False
        if not self.path.exists():
            with open(self.path, "a", encoding="utf-8") as fh:
                os.fsync(fh.fileno())
            _fsync_dir(self.path.parent)

    @staticmethod
    def _read(path: Path) -> list[Spend]:
        if not path.exists():
            return []
        spends: list[Spend] = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    if not line.endswith("\n"):
                        raise ValueError("torn (unterminated) last line")
                    obj = json.loads(line)
                    spend = Spend(
                        key=str(obj["key"]),
                        epsilon=float(obj["epsilon"]),
                        delta=float(obj["delta"]),
                        time=float(obj["time"]),
                        epsilon_coordinate=float(obj.get("epsilon_coordinate", 0.0)),
                        purpose=str(obj.get("purpose", "")),
                        message_id=str(obj.get("message_id", "")),
                        note=str(obj.get("note", "")),
                    )
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(
                        f"{path}: line {lineno}: expected a JSON spend record, received {line[:80]!r} ({exc})"
                    ) from exc
                spends.append(spend)
        return spends

    def append(self, spend: Spend) -> None:
        """Write ``spend`` as one line, flush and fsync, then count it."""
        if not isinstance(spend, Spend):
            raise TypeError(f"spend: expected a Spend, received {type(spend).__name__}")
        line = json.dumps(asdict(spend), ensure_ascii=False, allow_nan=False) + "\n"
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: ledger is closed")
            # Opened per append: the fsync dominates the cost anyway, and no
            # file handle outlives the call.
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            self._add(spend)

    def close(self) -> None:
        """Refuse further appends (reads keep working)."""
        with self._lock:
            self._closed = True

    def __enter__(self) -> JsonlLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_dir(directory: Path) -> None:
    # Makes a newly created file's directory entry durable (POSIX); not
    # possible on every platform, and then the file's own fsync must do.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key: expected a str, received {key!r} ({type(key).__name__})")
    if not key:
        raise ValueError("key: expected a non-empty string, received ''")
    return key


def _check_budget(value: Any, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    return check_real(value, name, low=0.0)


class PrivacyAccountant:
    """Per-key privacy budgets with sequential composition.

    Parameters
    ----------
    epsilon_budget : float, default inf
        ε budget of every key without an override.
    delta_budget : float, default 0.0
        δ budget of every key without an override (0 admits only pure-ε
        releases).
    ledger : SpendLedger, optional
        Where spends are recorded; a fresh :class:`InMemoryLedger` by default.
    budgets : mapping of str to (epsilon, delta), optional
        Per-key overrides, e.g. ``{"device:cam1": (1e4, 1e-6)}``.
    clock : callable returning float, default ``time.time``
        Timestamp for :class:`Spend` records (injected so tests can fix it).

    Notes
    -----
    :meth:`spend` checks and records under one lock, so concurrent spends in
    this process can never jointly exceed a budget. Several processes sharing
    one persistent ledger need the ledger itself to serialise check-and-append.
    """

    def __init__(
        self,
        *,
        epsilon_budget: float = math.inf,
        delta_budget: float = 0.0,
        ledger: SpendLedger | None = None,
        budgets: Mapping[str, tuple[float, float]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.epsilon_budget = _check_budget(epsilon_budget, "epsilon_budget")
        self.delta_budget = check_real(delta_budget, "delta_budget", low=0.0, high=1.0)
        if ledger is None:
            ledger = InMemoryLedger()
        elif not isinstance(ledger, SpendLedger):
            raise TypeError(f"ledger: expected a SpendLedger (append/totals/entries), received {type(ledger).__name__}")
        self.ledger: SpendLedger = ledger
        self._budgets: dict[str, tuple[float, float]] = {}
        for key, pair in (budgets or {}).items():
            _check_key(key)
            try:
                eps, delta = pair
            except (TypeError, ValueError) as exc:
                raise TypeError(f"budgets[{key!r}]: expected an (epsilon, delta) pair, received {pair!r}") from exc
            self._budgets[key] = (
                _check_budget(eps, f"budgets[{key!r}] epsilon"),
                check_real(delta, f"budgets[{key!r}] delta", low=0.0, high=1.0),
            )
        if not callable(clock):
            raise TypeError(f"clock: expected a callable returning float, received {clock!r}")
        self._clock = clock
        self._lock = threading.RLock()
        self._listeners: list[Callable[[Spend], None]] = []

    def __repr__(self) -> str:
        return (
            f"PrivacyAccountant(epsilon_budget={self.epsilon_budget!r}, "
            f"delta_budget={self.delta_budget!r}, ledger={type(self.ledger).__name__}, "
            f"budgets={self._budgets!r})"
        )

    # -- queries -------------------------------------------------------------------

    def budget(self, key: str) -> tuple[float, float]:
        """``(ε, δ)`` budget of ``key`` (its override, else the default)."""
        return self._budgets.get(_check_key(key), (self.epsilon_budget, self.delta_budget))

    def spent(self, key: str) -> tuple[float, float]:
        """``(Σε, Σδ)`` spent by ``key`` so far."""
        return self.ledger.totals(_check_key(key))

    def remaining(self, key: str) -> tuple[float, float]:
        """``(ε, δ)`` still available to ``key`` (never negative)."""
        eps_budget, delta_budget = self.budget(key)
        eps_spent, delta_spent = self.spent(key)
        return max(0.0, eps_budget - eps_spent), max(0.0, delta_budget - delta_spent)

    def keys(self) -> list[str]:
        """Keys with at least one recorded spend, in first-spend order."""
        return list(dict.fromkeys(s.key for s in self.ledger.entries()))

    # -- check and spend -------------------------------------------------------------

    @staticmethod
    def _check_cost(epsilon: Any, delta: Any) -> tuple[float, float]:
        return (
            check_real(epsilon, "epsilon", low=0.0),
            check_real(delta, "delta", low=0.0, high=1.0),
        )

    def _check(self, key: str, epsilon: float, delta: float) -> None:
        eps_budget, delta_budget = self.budget(key)
        eps_spent, delta_spent = self.ledger.totals(key)
        over_eps = eps_spent + epsilon > eps_budget * (1.0 + _RTOL)
        over_delta = delta > 0.0 and delta_spent + delta > delta_budget * (1.0 + _RTOL)
        if over_eps or over_delta:
            raise BudgetError(
                f"budget exceeded for key {key!r}: budget ε={eps_budget:g}, δ={delta_budget:g}; "
                f"spent ε={eps_spent:g}, δ={delta_spent:g}; requested ε={epsilon:g}, "
                f"δ={delta:g}; nothing was released or recorded"
            )

    def check(self, key: str, epsilon: float, delta: float = 0.0) -> None:
        """Raise :class:`BudgetError` if releasing ``(epsilon, delta)`` under ``key`` would
        exceed its budget; record nothing either way.

        Call before adding noise; the message names the key, budget, spent and
        requested amounts.
        """
        key = _check_key(key)
        eps, delta = self._check_cost(epsilon, delta)
        with self._lock:
            self._check(key, eps, delta)

    def spend(
        self,
        key: str,
        epsilon: float,
        delta: float = 0.0,
        note: str = "",
        *,
        epsilon_coordinate: float = 0.0,
        purpose: str = "",
        message_id: str = "",
    ) -> Spend:
        """Check, then record the release, atomically; notify listeners.

        ``epsilon`` is the per-vector ε charged to ``key``; ``epsilon_coordinate``,
        ``purpose`` and ``message_id`` are recorded with it (see :class:`Spend`).

        Returns
        -------
        Spend
            The recorded entry.

        Raises
        ------
        BudgetError
            If the budget would be exceeded (nothing recorded).
        """
        key = _check_key(key)
        eps, delta = self._check_cost(epsilon, delta)
        for name, text in (("note", note), ("purpose", purpose), ("message_id", message_id)):
            if not isinstance(text, str):
                raise TypeError(f"{name}: expected a str, received {type(text).__name__}")
        coord = check_real(epsilon_coordinate, "epsilon_coordinate", low=0.0)
        with self._lock:
            self._check(key, eps, delta)
            entry = Spend(
                key=key,
                epsilon=eps,
                delta=delta,
                time=float(self._clock()),
                epsilon_coordinate=coord,
                purpose=purpose,
                message_id=message_id,
                note=note,
            )
            self.ledger.append(entry)
            listeners = list(self._listeners)
        # Outside the lock: a slow or re-entrant listener must not block spends.
        for callback in listeners:
            try:
                callback(entry)
            except Exception:
                # The spend is recorded; a failing observer (metrics) must not
                # turn a completed release into an error.
                _log.exception("privacy accountant listener %r failed", callback)
        return entry

    def on_spend(self, callback: Callable[[Spend], None]) -> Callable[[], None]:
        """Call ``callback(spend)`` after every recorded spend.

        Returns
        -------
        callable
            Unsubscribes the callback.
        """
        if not callable(callback):
            raise TypeError(f"callback: expected a callable, received {callback!r}")
        with self._lock:
            self._listeners.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return unsubscribe
