"""The soak's nemesis: faults on a seeded, printed, repeatable schedule, each healed and its recovery timed.

A fault is injected into the running system (:class:`World`, implemented by the soak's set of real parts),
held for its duration, healed, and then the nemesis waits for the system to recover: to decide again and to
have drained what piled up (:meth:`World.recovered`). Each fault's window and recovery time go to the
:class:`~peep.lab.bench.soak.timeline.Timeline`, on its monotonic clock, which a camera's clock step does
not move.

Faults never overlap in their injection (one is healed before the next starts) but may overlap the recovery
of the one before: what the issue of running for months looks like, and what single-fault tests never try.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from peep.lab.bench.soak.timeline import Timeline

#: Every kind of fault, with what it does (the summary's ``faults[].kind``).
FAULT_KINDS: dict[str, str] = {
    "replica_kill": "SIGKILL of a server replica, restarted after the fault's duration",
    "replica_term": "SIGTERM of a server replica (graceful drain), restarted after the fault's duration",
    "broker_restart": "the MQTT broker stopped, started again after the fault's duration",
    "postgres_fast": "PostgreSQL stopped with a fast shutdown, started again after the fault's duration",
    "postgres_immediate": "PostgreSQL stopped with an immediate shutdown (crash recovery at start)",
    "camera_kill": "a camera process SIGKILLed, started again (its spool must drain)",
    "network_cut": "the path between a camera and the broker or balancer cut, healed after the duration",
    "disk_full": "a camera's state folder filled to its disk limit until its spool hits its bound, then freed",
    "clock_step": "a camera's wall clock stepped forward, then back after the fault's duration",
}


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``kind`` on ``target`` at ``at_s`` (seconds into the run), held ``duration_s``."""

    kind: str
    at_s: float
    duration_s: float
    target: str

    def describe(self) -> str:
        return f"{self.at_s:7.1f} s  {self.kind:<18} {self.target:<10} for {self.duration_s:.0f} s"


class World(Protocol):
    """What the nemesis needs of the running system."""

    def targets(self, kind: str) -> Sequence[str]:
        """The parts a fault of ``kind`` may hit (replica names, camera ids, ...)."""
        ...

    def inject(self, fault: Fault) -> Callable[[], None]:
        """Start ``fault``; return what heals it."""
        ...

    def recovered(self, fault: Fault) -> bool:
        """Whether the system decides again and has drained what ``fault`` piled up."""
        ...


def schedule(
    seed: int,
    duration_s: float,
    targets: Callable[[str], Sequence[str]],
    *,
    quick: bool,
    warmup_s: float,
    kinds: Sequence[str] = tuple(FAULT_KINDS),
    hold_s: tuple[float, float] = (5.0, 20.0),
    settle_s: float = 25.0,
    quiet_s: float = 0.0,
) -> list[Fault]:
    """The run's faults, in time order: every kind once (``quick``), or kinds drawn until the run is full.

    Parameters
    ----------
    seed : int
        The same seed, duration and targets give the same schedule.
    duration_s : float
        The run's length; no fault is injected in its first ``warmup_s``, and each fault's slot leaves
        ``settle_s`` after its heal (the run sees the last recovery).
    targets : callable
        ``targets(kind)``: the parts a kind may hit (:meth:`World.targets`).
    quick : bool
        One fault of each kind, evenly spaced, each held the shortest hold.
    hold_s : (float, float)
        The shortest and longest time a fault is held.
    settle_s : float
        The least time between one fault's heal and the next one's start.
    quiet_s : float
        More time, past ``settle_s``, in which no fault starts: stretches of undisturbed running whose latency
        can be judged against the first quiet minute's (a fault every minute and a half left none to judge).

    Raises
    ------
    ValueError
        An unknown kind, a kind without a target, or a run too short for one fault of each kind.
    """
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"kinds: expected some of {', '.join(FAULT_KINDS)}, received {unknown[0]!r}")
    rng = random.Random(seed)
    lo, hi = hold_s
    longest = lo if quick else hi
    usable = duration_s - warmup_s
    # Each fault has a slot of its own: held at most `longest`, then `settle_s` for its recovery.
    need = longest + settle_s + (0.0 if quick else quiet_s)
    if usable < need * len(kinds):
        raise ValueError(
            f"duration_s: expected at least {warmup_s + need * len(kinds):.0f} s for {len(kinds)} faults after a "
            f"{warmup_s:.0f} s warm-up, received {duration_s:.0f}"
        )
    order = list(kinds)
    if not quick:  # every kind once, then more drawn while the run has room (at most four of each kind)
        extra = min(int(usable // (need if quiet_s else 2 * need)), 4 * len(kinds)) - len(kinds)
        order += [rng.choice(list(kinds)) for _ in range(max(0, extra))]
    rng.shuffle(order)
    slot = usable / len(order)
    faults = []
    for i, kind in enumerate(order):
        options = list(targets(kind))
        if not options:
            raise ValueError(f"targets: expected at least one part for {kind}, received none")
        hold = lo if quick else rng.uniform(lo, hi)
        room = slot - hold - settle_s - (0.0 if quick else quiet_s)
        start = warmup_s + i * slot + (0.0 if quick else rng.uniform(0.0, max(0.0, room)))
        faults.append(Fault(kind, round(start, 1), round(hold, 1), rng.choice(options)))
    return faults


@dataclass
class FaultRecord:
    """What happened to one fault: when it started and ended, and when the system had recovered (timeline s)."""

    kind: str
    target: str
    at_s: float
    ended_s: float | None = None
    recovered_s: float | None = None
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["recovery_s"] = (
            None if self.ended_s is None or self.recovered_s is None else round(self.recovered_s - self.ended_s, 2)
        )
        return out


class Nemesis:
    """Runs a schedule against a :class:`World` in a thread of its own; every wait bounded.

    Parameters
    ----------
    world : World
    timeline : Timeline
        Fault windows are recorded on it, on its clock (``t0`` is the run's start on that clock).
    faults : list of Fault
    t0 : float
        The run's start on the timeline's clock.
    recovery_limit_s : float
        How long a fault's recovery is waited for before it is recorded as not recovered.
    poll_s : float
        How often :meth:`World.recovered` is asked.
    say : callable
        Progress lines (a fault started, healed, recovered).
    """

    def __init__(
        self,
        world: World,
        timeline: Timeline,
        faults: Sequence[Fault],
        *,
        t0: float,
        recovery_limit_s: float = 60.0,
        poll_s: float = 0.5,
        say: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.world, self.timeline, self.faults = world, timeline, list(faults)
        self.t0, self.recovery_limit_s, self.poll_s, self.say = t0, recovery_limit_s, poll_s, say
        self.records: list[FaultRecord] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-nemesis", daemon=True)

    def elapsed(self) -> float:
        return self.timeline.now() - self.t0

    def start(self) -> Nemesis:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop after the fault in hand is healed; True when the thread ended within ``timeout_s``."""
        self._stop.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _wait_until(self, at_s: float) -> bool:
        while not self._stop.is_set():
            left = at_s - self.elapsed()
            if left <= 0:
                return True
            self._stop.wait(min(left, 1.0))
        return False

    def _run(self) -> None:
        for fault in self.faults:
            if not self._wait_until(fault.at_s):
                return
            self._one(fault)

    def _one(self, fault: Fault) -> None:
        rec = FaultRecord(fault.kind, fault.target, round(self.elapsed(), 2))
        self.records.append(rec)
        self.say(f"    fault  {fault.describe()}")
        start = self.timeline.now()
        try:
            heal = self.world.inject(fault)
        except Exception as exc:  # a fault that could not be injected is a finding, not a crash of the run
            rec.error = f"inject: {type(exc).__name__}: {str(exc)[:200]}"
            self.timeline.fault(fault.kind, start, self.timeline.now(), None)
            return
        self._stop.wait(fault.duration_s)  # held even when stopping: a fault is always healed
        try:
            heal()
        except Exception as exc:
            rec.error = f"heal: {type(exc).__name__}: {str(exc)[:200]}"
        end = self.timeline.now()
        rec.ended_s = round(end - self.t0, 2)
        deadline = end + self.recovery_limit_s
        recovered: float | None = None
        while self.timeline.now() < deadline:
            try:
                if self.world.recovered(fault):
                    recovered = self.timeline.now()
                    break
            except Exception as exc:  # asking may fail while the system is still down
                rec.error = rec.error or f"recovered: {type(exc).__name__}: {str(exc)[:200]}"
            # Paced even when stopping (the run wants this fault's answer), and bounded by the deadline.
            threading.Event().wait(self.poll_s)
        rec.recovered_s = None if recovered is None else round(recovered - self.t0, 2)
        self.timeline.fault(fault.kind, start, end, recovered)
        took = "not recovered" if recovered is None else f"recovered in {recovered - end:.1f} s"
        self.say(f"    healed {fault.kind} on {fault.target}: {took}")
