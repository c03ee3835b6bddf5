"""The demo's devices, each in a process of its own, as on its own hardware.

A camera or an enrolment desk runs the real edge agent (:class:`peep.edge.agent.Agent`) in a spawned
process: dlib holds the GIL while it describes a face, so agents sharing the demo's process took turns
on one core. Each process reports on one queue what the demo needs and nothing more: per release, the
message id, the frame and the track (with the payload, which the demo's verification claims replay), per
enrolled subject one tick, and at the end the agent's suppression count or the error that stopped it.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# How long a device may stay silent before the demo checks that its process is still alive.
_POLL_S = 0.5


@dataclass
class DeviceJob:
    """What one device process runs.

    ``kind`` is ``"camera"`` (``work`` = ``{"config": ..., "video": path}``), ``"desk"`` (``work`` =
    ``{"subjects": [{"subject": ..., "config": ..., "source": folder, "count": n}, ...]}``) or ``"door"``
    (``work`` = ``{"config": ..., "video": path, "claims": [{"subject", "start", "stop", "genuine"}, ...]}``, see
    :func:`run_door`); configurations are :class:`peep.edge.config.EdgeConfig` dictionaries, ``environ`` holds
    the device's token; ``log_file`` is the run's ``demo.log`` (None: stderr).
    """

    device_id: str
    kind: str
    environ: dict[str, str]
    work: dict[str, Any] = field(default_factory=dict)
    log_file: str | None = None


def _suppressed(agent: Any) -> float:
    total = 0.0
    for metric in agent.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "peep_edge_suppressed_total":
                total += sample.value
    return total


def _device_main(job: DeviceJob, out: Any) -> None:
    """A device process: run ``job``, then say ``done`` (or ``error``) on ``out``."""
    from peep.edge.agent import Agent
    from peep.edge.capture import VideoSource
    from peep.edge.config import EdgeConfig
    from peep.edge.logs import setup_logging

    if job.log_file:
        from peep.lab.demo.logfile import route_logs

        route_logs(Path(job.log_file))
    else:
        setup_logging(level="warning", fmt="text")
    try:
        if job.kind == "camera":

            def on_release(rel: Any, frame: Any) -> None:
                box = [rel.box.x, rel.box.y, rel.box.w, rel.box.h] if rel.box is not None else None
                out.put(("release", job.device_id, (rel.message_id, frame.index, rel.track_id, rel.payload, box)))

            agent = Agent(EdgeConfig.model_validate(job.work["config"]), environ=job.environ, on_release=on_release)
            agent.run(source=VideoSource(job.work["video"], kind="file"))
            out.put(("done", job.device_id, {"suppressed": _suppressed(agent)}))
        elif job.kind == "desk":
            for item in job.work["subjects"]:
                agent = Agent(EdgeConfig.model_validate(item["config"]), environ=job.environ)
                agent.enroll(subject=item["subject"], source=item["source"], count=item["count"], timeout_s=60.0)
                out.put(("enrolled", job.device_id, item["subject"]))
            out.put(("done", job.device_id, {}))
        elif job.kind == "door":
            out.put(("done", job.device_id, run_door(job)))
        else:
            raise ValueError(f"device job kind: expected 'camera', 'desk' or 'door', received {job.kind!r}")
    except BaseException as exc:  # reported to the demo, which names the device
        out.put(("error", job.device_id, f"{type(exc).__name__}: {exc}"))


class FrameWindow:
    """Frames ``start <= index < stop`` of a video read once, front to back (one claim's stretch)."""

    def __init__(self, source: Any) -> None:
        self.source, self._held = source, None
        self.start, self.stop = 0, 0

    def read(self) -> Any:
        while True:
            frame, self._held = (self._held, None) if self._held is not None else (self.source.read(), None)
            if frame is None or frame.index >= self.stop:
                self._held = frame  # the next claim's
                return None
            if frame.index >= self.start:
                return frame


@dataclass
class _Door:
    """A demo door while it runs: what :func:`run_door`'s steps share.

    ``agent`` is the door's :class:`peep.edge.agent.Agent`, ``pins`` gpiozero's mock factory holding the lock's
    pin, ``ctl`` the :class:`peep.edge.door.DoorController` in use (the fail-secure checks swap in a fresh one),
    ``channel`` the gRPC channel to the server, ``frames`` the door camera's video and ``window`` the claims'
    reader over it; ``session`` is the :class:`peep.edge.door_session.DoorSession` once opened.
    """

    job: DeviceJob
    cfg: Any
    agent: Any
    pipeline: Any
    pins: Any
    ctl: Any
    channel: Any
    frames: Any
    window: FrameWindow
    on_device: bool
    session: Any = None
    pin: int = 17

    def openings(self) -> int:
        """How often the lock's pin went from unpowered to powered."""
        states = [s.state for s in self.pins.pin(self.pin).states]
        return sum(1 for a, b in itertools.pairwise(states) if b and not a)

    def controller(self) -> Any:
        """A :class:`peep.edge.door.DoorController` on the door's pin, configured as the door is."""
        from peep.edge.door import DoorController, GpioLock

        d = self.cfg.door
        return DoorController(self.job.device_id, GpioLock(self.pin, active_high=True, pin_factory=self.pins),
                              open_s=d.open_s, decision_timeout_s=d.decision_timeout_s,
                              lockout_failures=d.lockout_failures, lockout_window_s=d.lockout_window_s,
                              max_claims_per_minute=d.max_claims_per_minute)  # fmt: skip

    def replay(self, claim: dict[str, Any], handle: Callable[[Callable[[], Any]], Any]) -> Any:
        """``handle(read)`` on ``claim``'s stretch of the video, from a reader of its own (the claims' reader has
        passed it)."""
        from peep.edge.capture import VideoSource

        again = VideoSource(self.job.work["video"], kind="file")
        w = FrameWindow(again)
        w.start, w.stop = claim["start"], claim["stop"]
        try:
            return handle(w.read)
        finally:
            again.close()


class _Checks:
    """The fail-secure checks as they run: each must give its expected reason without driving the pin."""

    def __init__(self, door: _Door) -> None:
        self.door = door
        self.rows: list[dict[str, Any]] = []

    def check(self, name: str, expect: str, run: Callable[[], str]) -> None:
        before = self.door.openings()
        reason = run()
        self.rows.append({"check": name, "reason": reason, "held": reason == expect and self.door.openings() == before})


def run_door(job: DeviceJob) -> dict[str, Any]:
    """A door in the demo: the real door path (:class:`peep.edge.door_session.DoorSession`) on the door camera's
    video, each claim during its person's appearance, the server's gRPC Verify deciding, the lock a GPIO pin of
    gpiozero's mock factory. Then the fail-secure checks: ways a decision can go wrong, each of which must leave
    the pin unpowered.

    Returns
    -------
    dict
        ``claims``: per claim ``{"subject", "genuine", "opened", "reason", "face_to_lock_ms", "stages_ms"}``
        (never a template); ``pin_openings``: how often the pin was driven; ``fail_secure``: per check
        ``{"check", "reason", "held"}``.
    """
    door = _open_door(job)
    try:
        door.session = _door_session(door)
        rows, last_accepted = _door_claims(door)
        checks = _fail_secure(door, last_accepted)
    finally:
        _close_door(door)
    return {"claims": rows, "pin_openings": door.openings(), "fail_secure": checks}


def _open_door(job: DeviceJob) -> _Door:
    """The door's agent, lock and controller, its channel to the server and its video; on a door deciding on the
    device, once its model is held (RuntimeError after 60 s without)."""
    from gpiozero.pins.mock import MockFactory  # type: ignore[import-untyped]
    from peep.edge.agent import Agent
    from peep.edge.capture import VideoSource
    from peep.edge.config import EdgeConfig
    from peep.edge.transport.grpc import make_channel

    cfg = EdgeConfig.model_validate(job.work["config"])
    agent = Agent(cfg, environ=job.environ)
    pins = MockFactory()
    pipeline = agent.open()
    agent.start_transports()  # its reports: the door's ε on the server's Devices and Privacy views
    frames = VideoSource(job.work["video"], kind="file")
    door = _Door(job=job, cfg=cfg, agent=agent, pipeline=pipeline, pins=pins, ctl=None,
                 channel=make_channel(cfg.grpc), frames=frames, window=FrameWindow(frames),
                 on_device=cfg.door.decision == "device")  # fmt: skip
    door.ctl = door.controller()
    if door.on_device:  # the door's model comes over gRPC with its transports; no claim before it is held
        deadline = time.monotonic() + 60.0
        while agent.decisions.decider() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if agent.decisions.decider() is None:
            raise RuntimeError(f"the door got no device model in 60 s: {agent.decisions.problem}")
    return door


def _door_session(door: _Door) -> Any:
    """The door path: the agent's pipeline and accountant, the controller, and the server's Verify or the
    device's own decisions."""
    from peep.edge.door import DoorBudget
    from peep.edge.door_session import DoorSession, GrpcVerifier

    d, agent, work = door.cfg.door, door.agent, door.job.work
    budget = DoorBudget(door_epsilon=d.epsilon_per_hour, subject_epsilon=d.subject_epsilon_per_hour)
    return DoorSession(door.pipeline, agent.accountant, door.ctl,
                       None if door.on_device else GrpcVerifier(door.channel, agent.grpc_token),  # type: ignore[arg-type]
                       face_timeout_s=work.get("face_timeout_s", 3.0), settle_frames=work.get("settle_frames", 3),
                       budget=budget, decisions=agent.decisions if door.on_device else None)  # fmt: skip


def _door_claims(door: _Door) -> tuple[list[dict[str, Any]], Any]:
    """Each claim during its stretch of the video: one row per claim, and the last accepted decision (None if
    no claim opened the door), which the fail-secure checks replay."""
    from peep.edge.door import Decision

    session, rows = door.session, []
    last_accepted: Decision | None = None
    for c in door.job.work["claims"]:
        door.window.start, door.window.stop = c["start"], c["stop"]
        out = session.handle(c["subject"], door.window.read)
        st = session.last_timing.stages
        # From the chosen face to the lock: its detection, the release, the server's answer, the pin (on the
        # device: the projection, the score, the pin).
        face_to_lock = (st.get("total_after_face", 0.0) if door.on_device
                        else st.get("release", 0.0) + st.get("verify", 0.0) + st.get("actuate", 0.0))  # fmt: skip
        rows.append({"subject": c["subject"], "genuine": bool(c["genuine"]), "opened": out.opened,
                     "reason": out.reason, "face_to_lock_ms": 1000 * face_to_lock if "verify" in st else None,
                     "stages_ms": {k: round(1000 * v, 2) for k, v in st.items()}})  # fmt: skip
        if out.opened and out.claim is not None:
            last_accepted = Decision(out.claim.nonce, door.job.device_id, out.claim.subject, True, 1.0)
        if out.opened:
            # The next person comes to a locked door. A claim decided within open_s of this one (30 ms now that
            # the descriptor runs on onnxruntime, against open_s 50 ms) would energise a lock still open: one
            # powered stretch for two openings, and the pin's record would count one.
            deadline = time.monotonic() + door.cfg.door.open_s + 2.0
            while door.pins.pin(door.pin).state and time.monotonic() < deadline:
                time.sleep(0.005)
    return rows, last_accepted


def _fail_secure(door: _Door, last_accepted: Any) -> list[dict[str, Any]]:
    """The fail-secure checks, in order; per check ``{"check", "reason", "held"}``."""
    checks = _Checks(door)
    _check_decisions(door, checks, last_accepted)
    first = door.job.work["claims"][0] if door.job.work["claims"] else None
    if first is not None:
        _check_unknown_subject(door, checks, first)
        if door.on_device:
            _check_without_model(door, checks, first)
        else:
            _check_server_out_of_reach(door, checks, first)
    _check_lockout(door, checks)
    return checks.rows


def _check_decisions(door: _Door, checks: _Checks, last_accepted: Any) -> None:
    """Decisions that must not open: a replay, one for another claim, door or subject, one that cannot be read."""
    import secrets

    from peep.edge.door import Claim, Decision

    if last_accepted is not None:  # on the controller that decided it
        ctl = door.ctl
        checks.check("a replayed accepted decision", "replayed", lambda: ctl.decide(last_accepted).reason)
    # The other checks on a fresh controller of the same pin: the claims' failures must not lock them out.
    door.ctl.close()
    door.ctl = door.session.controller = door.controller()

    def decided(decision_of: Any) -> str:
        claim = door.ctl.claim(f"check-{len(checks.rows)}")
        assert isinstance(claim, Claim)
        reason = str(door.ctl.decide(decision_of(claim)).reason)
        door.ctl.fail(claim, "mismatch", "ended by the demo's check")  # the claim still waits: end it
        return reason

    checks.check("an accepted decision for another claim", "mismatch",
                 lambda: decided(lambda c: Decision(secrets.token_hex(16), c.door, c.subject, True)))  # fmt: skip
    checks.check("an accepted decision for another door", "mismatch",
                 lambda: decided(lambda c: Decision(c.nonce, "another-door", c.subject, True)))  # fmt: skip
    checks.check("an accepted decision for another subject", "mismatch",
                 lambda: decided(lambda c: Decision(c.nonce, c.door, "someone-else", True)))  # fmt: skip
    checks.check("a decision that cannot be read", "malformed", lambda: decided(lambda c: None))


def _check_unknown_subject(door: _Door, checks: _Checks, first: dict[str, Any]) -> None:
    """A badge for nobody enrolled (a made-up id): refused on the server's word before any release."""
    import secrets

    session = door.session
    ledger = session.accountant.ledger

    def made_up() -> str:
        before = len(ledger.entries())
        out = door.replay(first, lambda read: session.handle(f"made-up-{secrets.token_hex(4)}", read))
        released = len(ledger.entries()) - before
        return str(out.reason) if released == 0 else f"{out.reason}, {released} released"

    checks.check("a claim for a subject nobody enrolled", "unknown_subject", made_up)


def _check_without_model(door: _Door, checks: _Checks, first: dict[str, Any]) -> None:
    """Deciding on the device, the door never waits for the server; without a valid model it stays locked."""
    from peep.edge.decide import DecisionSource, ModelStore

    session, held = door.session, door.agent.model_store

    def without_model(clock_ahead_s: float) -> str:
        store = ModelStore(held.root, held.public_key, bundle_id=held.bundle_id, key_id=held.key_id,
                           clock=lambda: time.time() + clock_ahead_s)  # fmt: skip
        if clock_ahead_s == 0.0:
            store.root = held.root / "none"  # an empty folder: no model at all
        store.load()
        saved = session.decisions
        session.decisions = DecisionSource(store, domain=saved.domain, site_key=saved.site_key,
                                           epsilon_label=None)  # fmt: skip
        try:
            return str(door.replay(first, lambda read: session.handle(first["subject"], read).reason))
        finally:
            session.decisions = saved

    checks.check("no device model", "no_model", lambda: without_model(0.0))
    checks.check("an expired device model", "no_model", lambda: without_model(365 * 86400.0))


def _check_server_out_of_reach(door: _Door, checks: _Checks, first: dict[str, Any]) -> None:
    """The real path with the server out of reach, and with a deadline no answer can meet (the first claim's
    stretch of video again)."""
    from peep.edge.door_session import GrpcVerifier
    from peep.edge.transport.grpc import make_channel

    session = door.session
    dead = make_channel(door.cfg.grpc.model_copy(update={"target": "localhost:1"}))

    def claim_again(verifier: Any, timeout_s: float) -> str:
        saved = (session.verifier, door.ctl.decision_timeout_s)
        session.verifier, door.ctl.decision_timeout_s = verifier, timeout_s
        try:
            return str(door.replay(first, lambda read: session.handle(first["subject"], read).reason))
        finally:
            session.verifier, door.ctl.decision_timeout_s = saved

    checks.check("the server unreachable", "unreachable", lambda: claim_again(GrpcVerifier(dead, None), 5.0))
    checks.check("no answer before the deadline", "timeout",
                 lambda: claim_again(GrpcVerifier(door.channel, door.agent.grpc_token), 0.001))  # fmt: skip
    dead.close()


def _check_lockout(door: _Door, checks: _Checks) -> None:
    """A claim brute force: a subject refused ``lockout_failures`` times in the window cannot claim again."""
    from peep.edge.door import Claim, Decision

    ctl, target = door.ctl, "lockout-probe"
    for _ in range(door.cfg.door.lockout_failures):
        c = ctl.claim(target)
        assert isinstance(c, Claim)
        ctl.decide(Decision(c.nonce, c.door, c.subject, False))
    checks.check("a claim after repeated refusals (lock-out)", "locked_out",
                 lambda: getattr(ctl.claim(target), "reason", "a claim was opened"))  # fmt: skip


def _close_door(door: _Door) -> None:
    """The controller in use (its lock unpowered), the video, the channel and the agent, without draining."""
    door.ctl.close()
    door.frames.close()
    door.channel.close()
    door.agent.shutdown(drain_timeout=0)


def run_devices(jobs: list[DeviceJob], on_message: Callable[[str, str, Any], None]) -> dict[str, dict[str, Any]]:
    """Run every job in its own spawned process; ``on_message(kind, device_id, value)`` as they report.

    Returns
    -------
    dict
        Per device: ``{"ok": bool, "error": str | None, **what its ``done`` message carried}``. A process
        that dies without a word (killed, crashed in native code) is reported with its exit code.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = {j.device_id: ctx.Process(target=_device_main, args=(j, out), name=f"peep-demo-{j.device_id}", daemon=True)
             for j in jobs}  # fmt: skip
    result: dict[str, dict[str, Any]] = {}
    for p in procs.values():
        p.start()
    try:
        while len(result) < len(procs):
            try:
                kind, device, value = out.get(timeout=_POLL_S)
            except queue.Empty:
                for device, p in procs.items():
                    if device not in result and not p.is_alive():
                        # Its last words may still be in the pipe: one more look before calling it dead.
                        try:
                            kind, device2, value = out.get(timeout=_POLL_S)
                        except queue.Empty:
                            result[device] = {"ok": False, "error": f"the device process exited with code {p.exitcode}"}
                            continue
                        _record(result, kind, device2, value, on_message)
                continue
            _record(result, kind, device, value, on_message)
    finally:
        for p in procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        out.close()
    return result


def _record(
    result: dict[str, dict[str, Any]], kind: str, device: str, value: Any, on_message: Callable[[str, str, Any], None]
) -> None:
    if kind == "done":
        result[device] = {"ok": True, "error": None, **value}
    elif kind == "error":
        result[device] = {"ok": False, "error": value}
    else:
        on_message(kind, device, value)
