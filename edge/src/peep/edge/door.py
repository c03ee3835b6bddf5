"""The door: a claim, a decision bound to it, a lock that stays shut unless that decision opens it.

Fail-secure is the rule everything here follows: the lock is driven open only by :meth:`DoorController.decide`
with an *accepted* decision for the *current* claim, on *this* door, before the claim's deadline. Anything
else — no decision in time, a decision for another claim or another door, a replayed one, one that cannot
be read, a server or broker that cannot be reached — leaves it locked, with the reason logged and counted.
A subject whose claims the server refused ``lockout_failures`` times within ``lockout_window_s`` cannot
claim again until the window has passed (a claim brute force stops there); an outage, a missed deadline or no
face never counts, so a server away cannot lock genuine people out.

What a door may release is bounded like a camera's (:class:`DoorBudget`): at most
``max_claims_per_minute`` claims are taken (a flood of badge reads is refused at once, ``throttled``, not
queued), and ε per hour for the whole door and for each claimed subject; a claim that would pass either is
refused before anything is released. The throttle, the lock-outs and the per-subject spends outlast a restart
(:mod:`peep.edge.door_memory`), as the door's own hourly spend does (the ledger).

Locks (:class:`Lock`): a GPIO output through ``gpiozero`` (:class:`GpioLock`, extra ``peep-edge[door]``),
an MQTT relay in the Tasmota / Shelly / Home Assistant convention (:class:`MqttRelayLock`), or a command
(:class:`CommandLock`). Each is energised for ``open_s`` seconds, then released; closing the controller
releases it too. For relays driven over the network, set the relay's own auto-off (Tasmota ``PulseTime``,
Shelly ``auto_off``) as well: if the link drops while it is open, the relay itself re-locks.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from peep.edge.door_memory import DoorMemory
from peep.edge.errors import MissingExtraError
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.door")
_R = TypeVar("_R")

#: Why a claim did not open the door (the values of ``peep_edge_door_refusals_total{reason}``).
REFUSAL_REASONS = (
    "rejected",  # the face was verified (by the server, or on the device) and the answer was no
    "timeout",  # no decision before the claim's deadline
    "unreachable",  # the server or broker could not be asked
    "malformed",  # a decision that cannot be read
    "mismatch",  # a decision for another claim, another door or another subject
    "replayed",  # a decision for a claim already decided
    "locked_out",  # the subject failed too often lately
    "no_face",  # no usable face appeared in time
    "busy",  # a claim is already waiting for its decision
    "throttled",  # more claims than door.max_claims_per_minute
    "unknown_subject",  # the serving model does not know the claimed subject: nothing was released
    "door_budget",  # the claim would pass the door's ε per hour
    "subject_budget",  # the claim would pass the claimed subject's ε per hour
    "forged",  # a decision or claim check not signed by the server's decision key
    "no_model",  # deciding on the device without a valid device model: the door stays locked
)

#: Subjects whose refusals or spends a door remembers at once (beyond it the oldest is forgotten).
MAX_TRACKED_SUBJECTS = 10_000

#: The only refusals that count towards a subject's lock-out: the server verified the face and said no.
LOCKOUT_REASONS = frozenset({"rejected"})


class Lock(Protocol):
    """What drives the door: energised to open, released to lock."""

    def energise(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class GpioLock:
    """A relay or strike on a GPIO pin (``gpiozero.OutputDevice``; initially released).

    Parameters
    ----------
    pin : int or str
        The pin (BCM number, or a name gpiozero knows).
    active_high : bool
        Whether the relay closes on a high output (most relay boards: False, they are active low).
    pin_factory : gpiozero pin factory, optional
        Tests pass ``gpiozero.pins.mock.MockFactory()``.
    """

    def __init__(self, pin: int | str, *, active_high: bool = True, pin_factory: Any = None) -> None:
        try:
            from gpiozero import OutputDevice  # type: ignore[import-untyped]
        except ImportError:
            raise MissingExtraError(
                [("door.lock", "the gpio lock needs gpiozero: pip install 'peep-edge[door]'")]
            ) from None
        self._device = OutputDevice(pin, active_high=active_high, initial_value=False, pin_factory=pin_factory)

    def energise(self) -> None:
        self._device.on()

    def release(self) -> None:
        self._device.off()

    def close(self) -> None:
        self._device.off()
        self._device.close()


#: Topic and payloads of the MQTT relay conventions (``{name}`` is the relay's topic name or device id).
RELAY_CONVENTIONS: dict[str, tuple[str, str, str]] = {
    "tasmota": ("cmnd/{name}/POWER", "ON", "OFF"),
    "shelly": ("shellies/{name}/relay/0/command", "on", "off"),
}


class MqttRelayLock:
    """A relay switched by MQTT commands (Tasmota, Shelly, or a Home Assistant ``switch`` command topic).

    Parameters
    ----------
    publish : callable
        ``publish(topic, payload)``, raising when the broker cannot take it (the caller's MQTT client).
    topic, payload_on, payload_off : str
        Where and what to send (see :data:`RELAY_CONVENTIONS`).
    """

    def __init__(self, publish: Callable[[str, str], None], *, topic: str, payload_on: str, payload_off: str) -> None:
        self._publish = publish
        self.topic, self.payload_on, self.payload_off = topic, payload_on, payload_off

    def energise(self) -> None:
        self._publish(self.topic, self.payload_on)

    def release(self) -> None:
        self._publish(self.topic, self.payload_off)

    def close(self) -> None:
        self.release()


class CommandLock:
    """A lock driven by commands (argument lists, never a shell), each given ``timeout_s`` to finish."""

    def __init__(self, open_command: Sequence[str], close_command: Sequence[str], *, timeout_s: float = 5.0) -> None:
        if not open_command or not close_command:
            raise ValueError("door.lock: expected an open and a close command (argument lists), received an empty one")
        self.open_command, self.close_command, self.timeout_s = list(open_command), list(close_command), timeout_s

    def _run(self, argv: list[str]) -> None:
        subprocess.run(argv, check=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL, capture_output=True)

    def energise(self) -> None:
        self._run(self.open_command)

    def release(self) -> None:
        self._run(self.close_command)

    def close(self) -> None:
        self.release()


class ReportedLock:
    """A lock that says what it did: ``report("unlocked")`` after it was energised, ``"locked"`` after it was
    released, ``"jammed"`` when driving it raised (then the error goes on, so the controller fails secure).

    ``report`` must not block: it runs on the claim's path to the lock (an MQTT publish is queued, not awaited).
    """

    def __init__(self, lock: Lock, report: Callable[[str], None]) -> None:
        self.lock, self.report = lock, report

    def _drive(self, action: Callable[[], None], state: str) -> None:
        try:
            action()
        except Exception:
            self.report("jammed")
            raise
        self.report(state)

    def energise(self) -> None:
        self._drive(self.lock.energise, "unlocked")

    def release(self) -> None:
        self._drive(self.lock.release, "locked")

    def close(self) -> None:
        self._drive(self.lock.close, "locked")


def build_lock(cfg: Any, *, publish: Callable[[str, str], None] | None = None, pin_factory: Any = None) -> Lock:
    """The lock a :class:`peep.edge.config.DoorConfig` names (``publish`` for an MQTT relay)."""
    if cfg.lock == "gpio":
        return GpioLock(cfg.gpio_pin, active_high=cfg.gpio_active_high, pin_factory=pin_factory)
    if cfg.lock == "command":
        return CommandLock(cfg.open_command, cfg.close_command)
    if publish is None:
        raise ValueError("door.lock: an MQTT relay needs the device's MQTT connection, received none")
    if cfg.relay_convention == "custom":
        topic, on, off = str(cfg.relay_topic), cfg.relay_payload_on, cfg.relay_payload_off
    else:
        tpl, on, off = RELAY_CONVENTIONS[cfg.relay_convention]
        topic = tpl.format(name=cfg.relay_name)
    return MqttRelayLock(publish, topic=topic, payload_on=on, payload_off=off)


@dataclass(frozen=True)
class Claim:
    """One claim at this door: who, a fresh nonce binding the decision to it, and its deadline."""

    subject: str
    nonce: str
    door: str
    made_at: float
    deadline: float


@dataclass(frozen=True)
class Decision:
    """What came back for a claim (over gRPC the Verify answer; over MQTT the server's decision message)."""

    nonce: str
    door: str
    subject: str
    accepted: bool
    score: float = 0.0
    #: Over MQTT, the digest of the template the server decided (:func:`peep.core.wire.template_digest`).
    template_sha256: str = ""


@dataclass
class Outcome:
    """What a claim came to: ``opened`` or not, and why not (one of :data:`REFUSAL_REASONS`)."""

    claim: Claim | None
    opened: bool
    reason: str = ""
    detail: str = ""
    latency_s: float | None = None
    #: Who asked, when not a claim at the door (``home_assistant``); its claim is then None.
    requested_by: str = ""


@dataclass
class _Failures:
    times: deque[float] = field(default_factory=deque)


class DoorController:
    """Claims, decisions and the lock of one door (thread-safe; see the module docstring).

    Parameters
    ----------
    door : str
        This door's id (the device id): a decision naming another door opens nothing.
    lock : Lock
    open_s : float
        Seconds the lock stays energised after an accepted decision.
    decision_timeout_s : float
        Seconds from a claim to its deadline: a decision after it is refused (``timeout``).
    lockout_failures, lockout_window_s
        A subject the server refused this often in the window is refused (``locked_out``) until it passes.
    max_claims_per_minute : int
        Claims taken in any 60 s; more are refused at once (``throttled``).
    clock : callable
        Monotonic seconds (injected in tests).
    on_outcome : callable, optional
        Called with every :class:`Outcome` (the audit log, the console's Live page, metrics).
    memory : DoorMemory, optional
        Where the claims of the last minute and each subject's refusals are kept across restarts (read back
        here), under keyed subject ids; None: in memory only (tests).
    """

    def __init__(
        self,
        door: str,
        lock: Lock,
        *,
        open_s: float = 3.0,
        decision_timeout_s: float = 5.0,
        lockout_failures: int = 5,
        lockout_window_s: float = 300.0,
        max_claims_per_minute: int = 10,
        clock: Callable[[], float] = time.monotonic,
        on_outcome: Callable[[Outcome], None] | None = None,
        memory: DoorMemory | None = None,
    ) -> None:
        if not (0 < open_s <= 60):
            raise ValueError(f"door.open_s: expected 0 < seconds <= 60, received {open_s}")
        if not (0 < decision_timeout_s <= 60):
            raise ValueError(f"door.decision_timeout_s: expected 0 < seconds <= 60, received {decision_timeout_s}")
        if lockout_failures < 1:
            raise ValueError(f"door.lockout_failures: expected >= 1, received {lockout_failures}")
        if max_claims_per_minute < 1:
            raise ValueError(f"door.max_claims_per_minute: expected >= 1, received {max_claims_per_minute}")
        self.max_claims_per_minute = int(max_claims_per_minute)
        self._taken: deque[float] = deque()  # when the claims of the last minute were taken
        self.door, self.lock = door, lock
        self.open_s, self.decision_timeout_s = float(open_s), float(decision_timeout_s)
        self.lockout_failures, self.lockout_window_s = int(lockout_failures), float(lockout_window_s)
        self.clock = clock
        self.on_outcome = on_outcome
        self._lock = threading.Lock()
        self._current: Claim | None = None
        self._decided: deque[str] = deque(maxlen=1024)  # nonces already decided: a replay opens nothing
        self._failures: dict[str, _Failures] = {}
        self._relock: threading.Timer | None = None
        self.refusals: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self.opened = 0
        self.memory = memory
        if memory is not None:  # what the last run remembered, on this run's clock
            now = clock()
            self._taken.extend(now - age for _, age, _ in memory.recent("claim", 60.0))
            for key, age, _ in memory.recent("failure", self.lockout_window_s):
                self._failures.setdefault(key, _Failures()).times.append(now - age)
        self.lock.release()  # whatever state the lock was left in, it starts locked

    # -- claims ---------------------------------------------------------------------------
    # Each public method decides under the lock and reports to the observer after releasing it: an observer
    # that calls back into the controller (or is slow) can neither deadlock nor hold up the next decision.

    def claim(self, subject: str) -> Claim | Outcome:
        """Start a claim for ``subject``: the claim to verify, or the refusal (locked out, busy)."""
        return self._reported(self._claim(subject))

    def fail(self, claim: Claim, reason: str, detail: str = "") -> Outcome:
        """End ``claim`` without a decision (``no_face``, ``unreachable``, ``malformed``...): it stays locked."""
        return self._reported(self._fail(claim, reason, detail))

    def decide(self, decision: Decision | None) -> Outcome:
        """Act on a decision: open only for an accepted one of the current claim, on this door, in time."""
        return self._reported(self._decide(decision))

    def expire(self) -> Outcome | None:
        """Refuse the current claim if its deadline has passed (``timeout``); call it periodically."""
        return self._reported(self._expire())

    def discard(self, reason: str, detail: str = "") -> Outcome:
        """Refuse and count a message that is no decision of the waiting claim (``forged``...); it ends nothing."""
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"reason: expected one of {', '.join(REFUSAL_REASONS)}, received {reason!r}")
        with self._lock:
            outcome = self._refuse(None, reason, detail)
        return self._reported(outcome)

    def open_on_request(self, requested_by: str) -> Outcome:
        """Open for ``open_s`` at the request of another than a claim at the door (Home Assistant's lock).

        Refused while any subject is locked out here (someone failing at the door would walk in on it),
        while a claim waits for its decision (``busy``), and past ``max_claims_per_minute`` (``throttled``):
        a request counts towards the throttle like a claim, so a flood of them is bounded the same way.
        """
        now = self.clock()
        with self._lock:
            if self._current is not None and now <= self._current.deadline:
                outcome = self._refuse(None, "busy", "a claim is waiting for its decision")
            elif self._any_locked_out(now):
                outcome = self._refuse(None, "locked_out", "a subject is locked out at this door")
            else:
                while self._taken and now - self._taken[0] >= 60.0:
                    self._taken.popleft()
                if len(self._taken) >= self.max_claims_per_minute:
                    outcome = self._refuse(None, "throttled", f"{self.max_claims_per_minute} claims within 60 s")
                else:
                    self._taken.append(now)
                    if self.memory is not None:
                        self.memory.record("claim")
                    self._open()
                    self.opened += 1
                    outcome = Outcome(None, True, latency_s=0.0)
            outcome.requested_by = requested_by
        log_event(_log, logging.INFO if outcome.opened else logging.WARNING, "door_request", door=self.door,
                  requested_by=requested_by, opened=outcome.opened, reason=outcome.reason)  # fmt: skip
        return self._reported(outcome)

    def relock(self) -> None:
        """Lock now, before ``open_s`` has passed (a request to lock; locking is always allowed)."""
        with self._lock:
            if self._relock is not None:
                self._relock.cancel()
                self._relock = None
        self._release()

    def _reported(self, result: _R) -> _R:
        if isinstance(result, Outcome):
            self._report(result)
        return result

    def _claim(self, subject: str) -> Claim | Outcome:
        """Start a claim for ``subject``: the claim to verify, or the refusal (locked out, busy)."""
        now = self.clock()
        with self._lock:
            if self._current is not None and now <= self._current.deadline:
                return self._refuse(
                    None, "busy", f"a claim for another subject is waiting until {self._current.deadline:.1f}"
                )
            self._current = None
            while self._taken and now - self._taken[0] >= 60.0:
                self._taken.popleft()
            if len(self._taken) >= self.max_claims_per_minute:
                return self._refuse(
                    Claim(subject, "", self.door, now, now), "throttled",
                    f"{self.max_claims_per_minute} claims within the last 60 s",
                )  # fmt: skip
            self._taken.append(now)
            if self.memory is not None:
                self.memory.record("claim")
            if self._locked_out(subject, now):
                claim = Claim(subject, "", self.door, now, now)
                return self._refuse(claim, "locked_out", f"{self.lockout_failures} failed claims within "
                                    f"{self.lockout_window_s:g} s")  # fmt: skip
            claim = Claim(subject, secrets.token_hex(16), self.door, now, now + self.decision_timeout_s)
            self._current = claim
        log_event(_log, logging.INFO, "door_claim", door=self.door, nonce=claim.nonce)
        return claim

    def _fail(self, claim: Claim, reason: str, detail: str = "") -> Outcome:
        """End ``claim`` without a decision (``no_face``, ``unreachable``, ``malformed``...): it stays locked."""
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"reason: expected one of {', '.join(REFUSAL_REASONS)}, received {reason!r}")
        with self._lock:
            if self._current is not None and self._current.nonce == claim.nonce:
                self._current = None
                self._decided.append(claim.nonce)
            if reason in LOCKOUT_REASONS:
                self._count_failure(claim.subject)
            return self._refuse(claim, reason, detail)

    def _decide(self, decision: Decision | None) -> Outcome:
        """Act on a decision: open only for an accepted one of the current claim, on this door, in time."""
        now = self.clock()
        with self._lock:
            claim = self._current
            if decision is None:
                return self._refuse(claim, "malformed", "a decision that could not be read")
            if decision.nonce in self._decided:
                return self._refuse(claim, "replayed", "a decision for a claim already decided")
            if claim is None or not hmac.compare_digest(decision.nonce, claim.nonce):
                return self._refuse(claim, "mismatch", "a decision for another claim")
            if decision.door != self.door or decision.subject != claim.subject:
                return self._refuse(claim, "mismatch", "a decision for another door or subject")
            self._current = None
            self._decided.append(claim.nonce)
            if now > claim.deadline:
                return self._refuse(claim, "timeout", f"decided {now - claim.made_at:.2f} s after the claim")
            if not decision.accepted:
                self._count_failure(claim.subject)
                return self._refuse(claim, "rejected", f"score {decision.score:.3f}")
            key = self._key(claim.subject)
            if self._failures.pop(key, None) is not None and self.memory is not None:
                self.memory.forget("failure", key)
            self._open()
            outcome = Outcome(claim, True, latency_s=now - claim.made_at)
            self.opened += 1
        log_event(_log, logging.INFO, "door_opened", door=self.door, nonce=claim.nonce,
                  latency_ms=round(1000 * (outcome.latency_s or 0.0), 1))  # fmt: skip
        return outcome

    def _expire(self) -> Outcome | None:
        """Refuse the current claim if its deadline has passed (``timeout``); call it periodically."""
        with self._lock:
            claim = self._current
            if claim is None or self.clock() <= claim.deadline:
                return None
            self._current = None
            self._decided.append(claim.nonce)
            return self._refuse(claim, "timeout", "no decision before the deadline")

    # -- the lock -----------------------------------------------------------------------

    def _open(self) -> None:
        if self._relock is not None:
            self._relock.cancel()
        self.lock.energise()
        self._relock = threading.Timer(self.open_s, self._release)
        self._relock.daemon = True
        self._relock.start()

    def _release(self) -> None:
        try:
            self.lock.release()
        except Exception as exc:  # logged loudly: a lock that cannot be released needs a person
            log_event(_log, logging.ERROR, "door_release_failed", door=self.door, error=str(exc)[:200])

    def close(self) -> None:
        """Release the lock now and stop (the door is left locked)."""
        if self._relock is not None:
            self._relock.cancel()
        self.lock.close()

    # -- bookkeeping ----------------------------------------------------------------------

    def _key(self, subject: str) -> str:
        """The id ``subject``'s refusals are counted under: keyed when they are kept on disk."""
        return subject if self.memory is None else self.memory.subject_key(subject)

    def _any_locked_out(self, now: float) -> bool:
        return any(self._locked_out_key(key, now) for key in list(self._failures))

    def _locked_out(self, subject: str, now: float) -> bool:
        return self._locked_out_key(self._key(subject), now)

    def _locked_out_key(self, key: str, now: float) -> bool:
        f = self._failures.get(key)
        if f is None:
            return False
        while f.times and now - f.times[0] > self.lockout_window_s:
            f.times.popleft()
        return len(f.times) >= self.lockout_failures

    def _count_failure(self, subject: str) -> None:
        key = self._key(subject)
        if self.memory is not None:
            self.memory.record("failure", key)
        self._failures.setdefault(key, _Failures()).times.append(self.clock())
        if len(self._failures) > MAX_TRACKED_SUBJECTS:  # the oldest entry goes: memory stays bounded
            self._failures.pop(next(iter(self._failures)))

    def _refuse(self, claim: Claim | None, reason: str, detail: str) -> Outcome:
        self.refusals[reason] += 1
        outcome = Outcome(claim, False, reason, detail)
        log_event(_log, logging.WARNING, "door_refused", door=self.door, reason=reason, detail=detail[:200],
                  nonce=claim.nonce if claim else "")  # fmt: skip
        return outcome

    def _report(self, outcome: Outcome) -> None:
        if self.on_outcome is not None:
            try:
                self.on_outcome(outcome)
            except Exception as exc:  # a failing observer never opens or blocks the door
                log_event(_log, logging.WARNING, "door_observer_failed", error=str(exc)[:200])


class DoorBudget:
    """ε a door may release per hour: in all, and for claims of one subject (per-vector ε, soft traits included).

    A camera's releases are bounded per track; a door's claims carry no track, and each would otherwise be
    charged to a key of its own (the claim's nonce), bounded by nothing. Here every release is counted in a
    sliding window of ``window_s``: for the whole door (seeded from the ledger at start, so a restart does not
    reset it) and per claimed subject (kept by a :class:`~peep.edge.door_memory.DoorMemory` under keyed ids, so a
    restart does not reset it either and the disk names no one). A claim is
    checked before anything is released (:meth:`refusal`) and charged once its template is (:meth:`charge`).

    Parameters
    ----------
    door_epsilon, subject_epsilon : float
        Per-vector ε per window for the door and for one subject.
    window_s : float
        The window (an hour).
    clock : callable
        Wall-clock seconds, the ledger's clock (a window survives a restart).
    spent : iterable of (time, epsilon), optional
        The door's releases already recorded (the ledger's entries).
    memory : DoorMemory, optional
        Where each subject's spends are kept across restarts (read back here), under keyed subject ids; None:
        in memory only.
    """

    def __init__(
        self,
        *,
        door_epsilon: float,
        subject_epsilon: float,
        window_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        spent: Sequence[tuple[float, float]] = (),
        memory: DoorMemory | None = None,
    ) -> None:
        for name, v in (("door.epsilon_per_hour", door_epsilon), ("door.subject_epsilon_per_hour", subject_epsilon)):
            if not (v > 0 and v < float("inf")):
                raise ValueError(f"{name}: expected a positive finite per-vector ε, received {v}")
        self.door_epsilon, self.subject_epsilon = float(door_epsilon), float(subject_epsilon)
        self.window_s, self.clock = float(window_s), clock
        now = clock()
        self._door: deque[tuple[float, float]] = deque(sorted((t, e) for t, e in spent if now - t < window_s))
        self._subjects: dict[str, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self.memory = memory
        if memory is not None:
            for key, age, eps in memory.recent("release", window_s):
                self._subjects.setdefault(key, deque()).append((now - age, eps))

    def _key(self, subject: str) -> str:
        return subject if self.memory is None else self.memory.subject_key(subject)

    def _trim(self, q: deque[tuple[float, float]], now: float) -> float:
        while q and now - q[0][0] >= self.window_s:
            q.popleft()
        return sum(e for _, e in q)

    def spent(self, subject: str | None = None) -> float:
        """Per-vector ε released within the window, by the door (or for ``subject``)."""
        with self._lock:
            now = self.clock()
            if subject is None:
                return self._trim(self._door, now)
            q = self._subjects.get(self._key(subject))
            return 0.0 if q is None else self._trim(q, now)

    def refusal(self, subject: str, cost: float) -> tuple[str, str] | None:
        """``(reason, detail)`` if releasing ``cost`` for ``subject`` would pass a budget; None if it fits."""
        door, mine = self.spent(), self.spent(subject)
        if door + cost > self.door_epsilon * (1 + 1e-9):
            return "door_budget", (f"per-vector ε {door:g} of {self.door_epsilon:g} spent in the last "
                                   f"{self.window_s:g} s; a release costs {cost:g}")  # fmt: skip
        if mine + cost > self.subject_epsilon * (1 + 1e-9):
            return "subject_budget", (f"per-vector ε {mine:g} of {self.subject_epsilon:g} spent on this subject's "
                                      f"claims in the last {self.window_s:g} s; a release costs {cost:g}")  # fmt: skip
        return None

    def charge(self, subject: str, cost: float) -> None:
        """Count a release of ``cost`` for ``subject``."""
        key = self._key(subject)
        if self.memory is not None:
            self.memory.record("release", key, cost)
        with self._lock:
            now = self.clock()
            self._door.append((now, cost))
            q = self._subjects.pop(key, None) or deque()
            q.append((now, cost))
            self._subjects[key] = q  # most recent last: the oldest goes first when the map is full
            while len(self._subjects) > MAX_TRACKED_SUBJECTS:
                self._subjects.pop(next(iter(self._subjects)))
