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
        from peep.server.demo.logfile import route_logs

        route_logs(Path(job.log_file))
    else:
        setup_logging(level="warning", fmt="text")
    try:
        if job.kind == "camera":

            def on_release(rel: Any, frame: Any) -> None:
                out.put(("release", job.device_id, (rel.message_id, frame.index, rel.track_id, rel.payload)))

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
    import secrets

    from gpiozero.pins.mock import MockFactory  # type: ignore[import-untyped]
    from peep.edge.agent import Agent
    from peep.edge.capture import VideoSource
    from peep.edge.config import EdgeConfig
    from peep.edge.door import Claim, Decision, DoorBudget, DoorController, GpioLock
    from peep.edge.door_session import DoorSession, GrpcVerifier
    from peep.edge.transport.grpc import make_channel

    cfg = EdgeConfig.model_validate(job.work["config"])
    agent = Agent(cfg, environ=job.environ)
    pins = MockFactory()
    pipeline = agent.open()
    agent.start_transports()  # its reports: the door's ε on the server's Devices and Privacy views
    pin = 17

    def openings() -> int:
        states = [s.state for s in pins.pin(pin).states]
        return sum(1 for a, b in itertools.pairwise(states) if b and not a)

    d = cfg.door
    ctl = DoorController(job.device_id, GpioLock(pin, active_high=True, pin_factory=pins), open_s=d.open_s,
                         decision_timeout_s=d.decision_timeout_s, lockout_failures=d.lockout_failures,
                         lockout_window_s=d.lockout_window_s,
                         max_claims_per_minute=d.max_claims_per_minute)  # fmt: skip
    budget = DoorBudget(door_epsilon=d.epsilon_per_hour, subject_epsilon=d.subject_epsilon_per_hour)
    channel = make_channel(cfg.grpc)
    frames = VideoSource(job.work["video"], kind="file")
    window = FrameWindow(frames)
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    on_device = d.decision == "device"
    if on_device:  # the door's model comes over gRPC with its transports; no claim before it is held
        deadline = time.monotonic() + 60.0
        while agent.decisions.decider() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if agent.decisions.decider() is None:
            raise RuntimeError(f"the door got no device model in 60 s: {agent.decisions.problem}")
    try:
        session = DoorSession(pipeline, agent.accountant, ctl,
                              None if on_device else GrpcVerifier(channel, agent.grpc_token),  # type: ignore[arg-type]
                              face_timeout_s=job.work.get("face_timeout_s", 3.0),
                              settle_frames=job.work.get("settle_frames", 3), budget=budget,
                              decisions=agent.decisions if on_device else None)  # fmt: skip
        last_accepted: Decision | None = None
        for c in job.work["claims"]:
            window.start, window.stop = c["start"], c["stop"]
            out = session.handle(c["subject"], window.read)
            st = session.last_timing.stages
            # From the chosen face to the lock: its detection, the release, the server's answer, the pin (on the
            # device: the projection, the score, the pin).
            face_to_lock = (st.get("total_after_face", 0.0) if on_device
                            else st.get("release", 0.0) + st.get("verify", 0.0) + st.get("actuate", 0.0))  # fmt: skip
            rows.append({"subject": c["subject"], "genuine": bool(c["genuine"]), "opened": out.opened,
                         "reason": out.reason, "face_to_lock_ms": 1000 * face_to_lock if "verify" in st else None,
                         "stages_ms": {k: round(1000 * v, 2) for k, v in st.items()}})  # fmt: skip
            if out.opened and out.claim is not None:
                last_accepted = Decision(out.claim.nonce, job.device_id, out.claim.subject, True, 1.0)

        def check(name: str, expect: str, run: Any) -> None:
            before = openings()
            reason = run()
            checks.append({"check": name, "reason": reason, "held": reason == expect and openings() == before})

        if last_accepted is not None:  # on the controller that decided it
            check("a replayed accepted decision", "replayed", lambda: ctl.decide(last_accepted).reason)
        # The other checks on a fresh controller of the same pin: the claims' failures must not lock them out.
        ctl.close()
        ctl = DoorController(job.device_id, GpioLock(pin, active_high=True, pin_factory=pins), open_s=d.open_s,
                             decision_timeout_s=d.decision_timeout_s, lockout_failures=d.lockout_failures,
                             lockout_window_s=d.lockout_window_s,
                             max_claims_per_minute=d.max_claims_per_minute)  # fmt: skip
        session.controller = ctl

        def decided(decision_of: Any) -> str:
            claim = ctl.claim(f"check-{len(checks)}")
            assert isinstance(claim, Claim)
            reason = ctl.decide(decision_of(claim)).reason
            ctl.fail(claim, "mismatch", "ended by the demo's check")  # the claim still waits: end it
            return reason

        check("an accepted decision for another claim", "mismatch",
              lambda: decided(lambda c: Decision(secrets.token_hex(16), c.door, c.subject, True)))  # fmt: skip
        check("an accepted decision for another door", "mismatch",
              lambda: decided(lambda c: Decision(c.nonce, "another-door", c.subject, True)))  # fmt: skip
        check("an accepted decision for another subject", "mismatch",
              lambda: decided(lambda c: Decision(c.nonce, c.door, "someone-else", True)))  # fmt: skip
        check("a decision that cannot be read", "malformed", lambda: decided(lambda c: None))
        # A badge for nobody enrolled (a made-up id): refused on the server's word before any release.
        first_claim = job.work["claims"][0] if job.work["claims"] else None
        if first_claim is not None:
            ledger = session.accountant.ledger

            def made_up() -> str:
                again = VideoSource(job.work["video"], kind="file")
                w = FrameWindow(again)
                w.start, w.stop = first_claim["start"], first_claim["stop"]
                before = len(ledger.entries())
                try:
                    out = session.handle(f"made-up-{secrets.token_hex(4)}", w.read)
                finally:
                    again.close()
                released = len(ledger.entries()) - before
                return out.reason if released == 0 else f"{out.reason}, {released} released"

            check("a claim for a subject nobody enrolled", "unknown_subject", made_up)
        first = job.work["claims"][0] if job.work["claims"] else None
        if first is not None and on_device:
            # Deciding on the device, the door never waits for the server; without a valid model it stays locked.
            from peep.edge.decide import DecisionSource, ModelStore

            held = agent.model_store

            def without_model(clock_ahead_s: float) -> str:
                store = ModelStore(held.root, held.public_key, bundle_id=held.bundle_id, key_id=held.key_id,
                                   clock=lambda: time.time() + clock_ahead_s)  # fmt: skip
                if clock_ahead_s == 0.0:
                    store.root = held.root / "none"  # an empty folder: no model at all
                store.load()
                saved = session.decisions
                session.decisions = DecisionSource(store, domain=saved.domain, site_key=saved.site_key,
                                                   epsilon_label=None)  # fmt: skip
                again = VideoSource(job.work["video"], kind="file")
                w = FrameWindow(again)
                w.start, w.stop = first["start"], first["stop"]
                try:
                    return session.handle(first["subject"], w.read).reason
                finally:
                    session.decisions = saved
                    again.close()

            check("no device model", "no_model", lambda: without_model(0.0))
            check("an expired device model", "no_model", lambda: without_model(365 * 86400.0))
        # The real path with the server out of reach, and with a deadline no answer can meet.
        if first is not None and not on_device:  # the first claim's stretch of video again, from a reader of its own
            dead = make_channel(cfg.grpc.model_copy(update={"target": "localhost:1"}))

            def claim_again(verifier: Any, timeout_s: float) -> str:
                again = VideoSource(job.work["video"], kind="file")
                w = FrameWindow(again)
                w.start, w.stop = first["start"], first["stop"]
                saved = (session.verifier, ctl.decision_timeout_s)
                session.verifier, ctl.decision_timeout_s = verifier, timeout_s
                try:
                    return session.handle(first["subject"], w.read).reason
                finally:
                    session.verifier, ctl.decision_timeout_s = saved
                    again.close()

            check("the server unreachable", "unreachable", lambda: claim_again(GrpcVerifier(dead, None), 5.0))
            check("no answer before the deadline", "timeout",
                  lambda: claim_again(GrpcVerifier(channel, agent.grpc_token), 0.001))  # fmt: skip
            dead.close()
        # A claim brute force: a subject refused lockout_failures times in the window cannot claim again.
        target = "lockout-probe"
        for _ in range(d.lockout_failures):
            c = ctl.claim(target)
            assert isinstance(c, Claim)
            ctl.decide(Decision(c.nonce, c.door, c.subject, False))
        check("a claim after repeated refusals (lock-out)", "locked_out",
              lambda: getattr(ctl.claim(target), "reason", "a claim was opened"))  # fmt: skip
    finally:
        ctl.close()
        frames.close()
        channel.close()
        agent.shutdown(drain_timeout=0)
    return {"claims": rows, "pin_openings": openings(), "fail_secure": checks}


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
