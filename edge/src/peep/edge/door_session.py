"""A claim at the door, end to end on the device: the best face of the next seconds, a VERIFY release, a decision.

:class:`DoorSession` joins the agent's pipeline (detector, descriptor, mechanism, site key, ledger) to a
:class:`~peep.edge.door.DoorController`:

1. the controller opens a claim (or refuses it: busy, locked out);
2. frames are read for at most ``face_timeout_s``; the largest detected face is kept (size stands for
   quality: the tracker's best frame is the nearest and most frontal one in practice), and reading stops
   early once ``settle_frames`` frames in a row showed no larger one;
3. that face becomes one VERIFY template for the claimed subject, charged to the device's ledger under
   ``door:<the claim's nonce>`` like any release (one release per claim, within ``privacy.track_budget``;
   a key per subject would refuse a person's third claim for ever, and would keep who claimed in the
   ledger), but sent by the verifier in the call, never spooled;
4. the verifier's decision — over gRPC the answer to this call, over MQTT the server's message naming the
   claim's nonce (the template's message id) — is handed to the controller, which opens only for an
   accepted one in time. A verifier that cannot be reached, or an answer that cannot be read, ends the
   claim locked.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from peep.core.imaging import FaceBox, primary_face
from peep.edge.door import Claim, Decision, DoorController, Outcome
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.door")


class VerifierUnavailable(RuntimeError):
    """The server could not be asked (down, unreachable, overloaded): the door stays locked (``unreachable``)."""


class VerifierTimeout(VerifierUnavailable):
    """No answer before the claim's deadline (``timeout``)."""


class VerifierRefused(RuntimeError):
    """The server answered, refusing the claim itself (unknown subject, a template it will not score, a
    device without the right): ``rejected``, counted towards the subject's lock-out."""


class Verifier(Protocol):
    def verify(self, payload: bytes, claim: Claim, timeout_s: float) -> Decision:
        """The server's decision on ``payload`` (a VERIFY template whose message id is ``claim.nonce``).

        Raises :class:`VerifierUnavailable` (or :class:`VerifierTimeout`) when no decision can come, and
        :class:`VerifierRefused` when the server refused the claim itself.
        """
        ...


class GrpcVerifier:
    """``RecognitionService.Verify`` over the device's gRPC channel (TLS, its bearer token).

    The answer is bound to the claim because it is the answer to this call on this channel. ``fused``: the
    QBBS module's ``VerifyFused`` instead, the face fused with the soft traits the template carries (the
    device's own LDP age and gender releases); the server charges the trait queries to the claimed subject's
    odometer.
    """

    def __init__(self, channel: Any, token: str | None, *, fused: bool = False) -> None:
        from peep.v1 import qbbs_pb2_grpc, recognition_pb2_grpc

        self.fused = fused
        self._stub = recognition_pb2_grpc.RecognitionServiceStub(channel)  # type: ignore[no-untyped-call]
        self._qbbs = qbbs_pb2_grpc.QbbsServiceStub(channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def verify(self, payload: bytes, claim: Claim, timeout_s: float) -> Decision:
        import grpc
        from peep.core.wire import decode_template
        from peep.v1 import qbbs_pb2, recognition_pb2

        template = decode_template(payload)
        timeout = max(timeout_s, 0.001)
        try:
            if self.fused:
                fused = self._qbbs.VerifyFused(
                    qbbs_pb2.QbbsVerifyRequest(template=template, claimed_subject=claim.subject),
                    metadata=self._metadata, timeout=timeout,
                )  # fmt: skip
                return Decision(claim.nonce, claim.door, claim.subject, bool(fused.accepted), float(fused.fused_score))
            request = recognition_pb2.VerifyRequest(template=template, claimed_subject=claim.subject)
            resp = self._stub.Verify(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = f"Verify: {code.name if code else 'error'}: {str(exc.details() or '')[:200]}"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise VerifierTimeout(detail) from None
            if code in _REFUSALS:
                raise VerifierRefused(detail) from None
            raise VerifierUnavailable(detail) from None
        return Decision(claim.nonce, claim.door, claim.subject, bool(resp.accepted), float(resp.score))


#: Longest id a decision read from the broker may carry (the wire's message and subject ids are shorter).
_MAX_DECISION_ID = 256


def decision_from_event(event: Any) -> Decision | None:
    """The decision in a verify event of the device's events topic (the server's JSON); None if unreadable.

    Every field is checked for its type and bounded: a message that is not exactly a decision opens nothing.
    """
    if not isinstance(event, dict):
        return None
    nonce, door, subject = event.get("message_id"), event.get("device_id"), event.get("claimed_subject")
    accepted, score = event.get("accepted"), event.get("probability", 0.0)
    if not all(isinstance(v, str) and 0 < len(v) <= _MAX_DECISION_ID for v in (nonce, door, subject)):
        return None
    if not isinstance(accepted, bool) or isinstance(score, bool) or not isinstance(score, (int, float)):
        return None
    if not math.isfinite(score):
        return None
    return Decision(str(nonce), str(door), str(subject), accepted, float(score))


class MqttVerifier:
    """Decisions over MQTT: the template on the device's templates topic, the answer on its events topic.

    The broker's ACL (deploy/mosquitto/acl) lets only the server write a device's events topic, and the claim's
    nonce is the VERIFY template's message id, which the server's decision names. The verifier hands back
    only a decision naming the waiting claim's nonce, door and subject; every other message on the topic
    while the door is in use (a decision for another claim or door, a replayed or unreadable one) goes to the
    controller, which refuses and counts it without ending the waiting claim. Identification events (the
    device's camera work) are not decisions and are ignored.

    Parameters
    ----------
    link : MqttLink
        The device's connection; route its ``on_event`` to :meth:`on_event`.
    controller : DoorController
    """

    def __init__(self, link: Any, controller: DoorController) -> None:
        self._link, self.controller = link, controller
        self._cv = threading.Condition()
        self._waiting: Claim | None = None
        self._answer: Decision | None = None

    def on_event(self, event: Any) -> None:
        """One message of the events topic (paho's network thread)."""
        if isinstance(event, dict) and event.get("purpose") in ("identify", "unspecified"):
            return
        decision = decision_from_event(event)
        with self._cv:
            w = self._waiting
            if (
                decision is not None and w is not None and self._answer is None
                and hmac.compare_digest(decision.nonce, w.nonce) and decision.door == w.door
                and decision.subject == w.subject
            ):  # fmt: skip
                self._answer = decision
                self._cv.notify_all()
                return
        self.controller.decide(decision)

    def verify(self, payload: bytes, claim: Claim, timeout_s: float) -> Decision:
        import paho.mqtt.client as mqtt

        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._waiting, self._answer = claim, None
        try:
            if not self._link.connected.is_set():
                raise VerifierUnavailable("the MQTT broker is not connected")
            info = self._link.client.publish(self._link.templates_topic, payload, qos=1, retain=False)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise VerifierUnavailable(f"the MQTT client refused the template: {mqtt.error_string(info.rc)}")
            try:
                info.wait_for_publish(max(deadline - time.monotonic(), 0.001))
            except (RuntimeError, ValueError) as exc:
                raise VerifierUnavailable(f"the MQTT broker dropped the template: {exc}") from None
            if not info.is_published():
                raise VerifierUnavailable("the MQTT broker did not acknowledge the template before the deadline")
            with self._cv:
                while self._answer is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise VerifierTimeout("no decision on the events topic before the deadline")
                    self._cv.wait(remaining)
                return self._answer
        finally:
            with self._cv:
                self._waiting = None


def _refusal_codes() -> frozenset[Any]:
    import grpc

    c = grpc.StatusCode
    return frozenset({c.INVALID_ARGUMENT, c.NOT_FOUND, c.FAILED_PRECONDITION, c.PERMISSION_DENIED, c.UNAUTHENTICATED})


_REFUSALS = _refusal_codes()


@dataclass
class DoorTiming:
    """Seconds per stage of one claim (the door bench's breakdown).

    ``stages``: ``capture`` and ``detect`` (every frame looked at for the best face), ``release`` (of which
    ``descriptor`` — the face's projection, with its descriptor network where the bundle has one —
    ``perturb`` and ``encode``: the template built, its ε spent, encoded), ``verify`` (the decision's round
    trip), ``actuate`` (the lock), ``total_after_face`` and ``claim_to_lock``. ``marks``: ``time.monotonic()``
    at ``verify_start`` and ``verify_end`` (one clock for every process of a machine, so a server's own
    timestamps can split the round trip).
    """

    stages: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds


#: The pipeline's timer stages a release goes through, and their names in a claim's :class:`DoorTiming`.
_RELEASE_STAGES = {"project": "descriptor", "perturb": "perturb", "spool": "encode"}


class DoorSession:
    """One door on one device (see the module docstring).

    Parameters
    ----------
    pipeline : FramePipeline
        The agent's open pipeline (``Agent.open()``), with its ledger's accountant.
    accountant : PrivacyAccountant
    controller : DoorController
    verifier : Verifier
    face_timeout_s : float
        How long to look for a face after a claim.
    settle_frames : int
        Stop looking once this many frames in a row showed no larger face.
    device_key : str, optional
        The accountant's device-wide key, charged too when the device has a budget.
    """

    def __init__(
        self,
        pipeline: Any,
        accountant: Any,
        controller: DoorController,
        verifier: Verifier,
        *,
        face_timeout_s: float = 3.0,
        settle_frames: int = 5,
        device_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pipeline, self.accountant, self.controller, self.verifier = pipeline, accountant, controller, verifier
        self.face_timeout_s, self.settle_frames, self.device_key, self.clock = (
            face_timeout_s,
            settle_frames,
            device_key,
            clock,
        )
        self.last_timing = DoorTiming()

    def handle(self, subject: str, read_frame: Callable[[], Any]) -> Outcome:
        """Run one claim for ``subject``, reading frames with ``read_frame()`` (None: the source ended)."""
        timing = DoorTiming()
        self.last_timing = timing
        claim = self.controller.claim(subject)
        if not isinstance(claim, Claim):
            return claim
        t0 = time.perf_counter()
        best = self._best_face(read_frame, timing)
        if best is None:
            return self.controller.fail(claim, "no_face", f"no face within {self.face_timeout_s:g} s")
        frame, box = best
        t1 = time.perf_counter()
        p = self.pipeline
        key = f"door:{claim.nonce[:16]}"

        def spend(eps: float, coord: float, message_id: str) -> None:
            for k in (self.device_key, key):
                if k is not None:
                    self.accountant.spend(k, eps, p.delta, epsilon_coordinate=coord, purpose="verify",
                                          message_id=message_id)  # fmt: skip

        # The claim's nonce is the template's id: the server's decision names it (over MQTT, the only binding).
        before = {k: p.timer.seconds.get(k, 0.0) for k in _RELEASE_STAGES}
        rel = p.release_face(frame, box, track_id=f"door-{claim.nonce[:12]}", spend=spend, purpose="verify",
                             subject=subject, spool=False, message_id=claim.nonce)  # fmt: skip
        timing.add("release", time.perf_counter() - t1)
        for k, name in _RELEASE_STAGES.items():
            timing.add(name, p.timer.seconds.get(k, 0.0) - before[k])
        if rel is None:  # the budget refused it (logged by the pipeline)
            return self.controller.fail(claim, "unreachable", "the device's privacy budget refused the release")
        remaining = claim.deadline - self.clock()
        t2 = time.perf_counter()
        timing.marks["verify_start"] = time.monotonic()
        try:
            decision = self.verifier.verify(rel.payload, claim, remaining)
        except VerifierTimeout as exc:
            timing.add("verify", time.perf_counter() - t2)
            return self.controller.fail(claim, "timeout", str(exc))
        except VerifierUnavailable as exc:
            timing.add("verify", time.perf_counter() - t2)
            return self.controller.fail(claim, "unreachable", str(exc))
        except VerifierRefused as exc:
            timing.add("verify", time.perf_counter() - t2)
            return self.controller.fail(claim, "rejected", str(exc))
        except (ValueError, TypeError) as exc:
            timing.add("verify", time.perf_counter() - t2)
            return self.controller.fail(claim, "malformed", str(exc)[:200])
        timing.add("verify", time.perf_counter() - t2)
        timing.marks["verify_end"] = time.monotonic()
        t3 = time.perf_counter()
        outcome = self.controller.decide(decision)
        timing.add("actuate", time.perf_counter() - t3)
        timing.add("total_after_face", time.perf_counter() - t1)
        timing.add("claim_to_lock", time.perf_counter() - t0)
        log_event(_log, logging.INFO, "door_decided", door=self.controller.door, opened=outcome.opened,
                  reason=outcome.reason, message_id=rel.message_id)  # fmt: skip
        return outcome

    def _best_face(self, read_frame: Callable[[], Any], timing: DoorTiming) -> tuple[Any, FaceBox] | None:
        deadline = self.clock() + self.face_timeout_s
        best: tuple[Any, FaceBox] | None = None
        calm = 0
        while self.clock() < deadline and calm < self.settle_frames:
            t = time.perf_counter()
            frame = read_frame()
            timing.add("capture", time.perf_counter() - t)
            if frame is None:
                break
            t = time.perf_counter()
            box = primary_face(self.pipeline.detector.detect(frame.image), frame.image.shape)
            timing.add("detect", time.perf_counter() - t)
            if box is not None and (best is None or box.w * box.h > best[1].w * best[1].h):
                best, calm = (frame, box), 0
            elif best is not None:
                calm += 1
        return best


@dataclass
class DoorRig:
    """A door opened from a device's configuration: its session, controller and connections (see :func:`open_door`)."""

    session: DoorSession
    controller: DoorController
    link: Any = None
    channel: Any = None

    def close(self) -> None:
        """Lock the door, then close its connections (the agent is the caller's)."""
        self.controller.close()
        if self.channel is not None:
            self.channel.close()
        if self.link is not None:
            self.link.stop()


def open_door(
    agent: Any,
    *,
    pin_factory: Any = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    face_timeout_s: float = 3.0,
    settle_frames: int = 5,
    connect_timeout_s: float | None = None,
) -> DoorRig:
    """The door of ``agent``'s ``[door]`` section: its lock, controller, verifier and session.

    Over ``door.decision = "grpc"`` a channel to the server; over ``"mqtt"`` (or for an MQTT relay lock) a
    connection of its own to the broker (its own client id: the device's ``run`` may hold the usual one; no
    status or last will). A broker not reachable yet is no error: claims end ``unreachable`` until it is.

    Parameters
    ----------
    agent : Agent
        The device's agent (opened here).
    pin_factory : gpiozero pin factory, optional
        For a GPIO lock (tests and the demo: ``MockFactory()``).
    on_outcome : callable, optional
        Every outcome, including decisions refused while no claim of theirs waits.
    """
    from peep.edge.door import build_lock

    cfg = agent.cfg
    pipeline = agent.open()
    link = channel = None
    publish = None
    holder: list[MqttVerifier] = []
    if cfg.door.lock == "mqtt-relay" or cfg.door.decision == "mqtt":
        from peep.edge.transport.mqtt import MqttLink

        link = MqttLink(cfg.mqtt, client_id=f"{cfg.mqtt_client_id}-door", site=cfg.device.site,
                        device_id=cfg.device.id, password=agent.mqtt_password, publish_status=False,
                        on_event=lambda ev: holder[0].on_event(ev) if holder else None)  # fmt: skip
        link.start()
        link.wait_connected(cfg.mqtt.connect_timeout_s if connect_timeout_s is None else connect_timeout_s)
        mqtt_link = link

        def publish(topic: str, payload: str) -> None:
            info = mqtt_link.client.publish(topic, payload, qos=1)
            info.wait_for_publish(5.0)
            if not info.is_published():
                raise RuntimeError(f"the broker did not take {topic}")

    d = cfg.door
    controller = DoorController(cfg.device.id, build_lock(d, publish=publish, pin_factory=pin_factory),
                                open_s=d.open_s, decision_timeout_s=d.decision_timeout_s,
                                lockout_failures=d.lockout_failures, lockout_window_s=d.lockout_window_s,
                                on_outcome=on_outcome)  # fmt: skip
    verifier: Verifier
    if d.decision == "mqtt":
        verifier = MqttVerifier(link, controller)
        holder.append(verifier)
    else:
        from peep.edge.transport.grpc import make_channel

        channel = make_channel(cfg.grpc)
        verifier = GrpcVerifier(channel, agent.grpc_token, fused=d.fuse_soft_traits)
    session = DoorSession(pipeline, agent.accountant, controller, verifier, face_timeout_s=face_timeout_s,
                          settle_frames=settle_frames, device_key=agent.device_key)  # fmt: skip
    return DoorRig(session, controller, link, channel)


# --------------------------------------------------------------------------- claim sources

#: Longest line a claim source reads (a badge number or a subject id is far shorter): the rest is dropped.
MAX_CLAIM_LINE = 256


def read_claims(lines: Any) -> Any:
    """Subject ids from a line source (a keyboard-wedge reader, a serial port, stdin, a socket's stream).

    Each line is one claim: stripped, bounded to :data:`MAX_CLAIM_LINE` characters, checked as a subject id
    (NFC, no control or bidi characters); a malformed line is logged by its length, never echoed, and skipped.
    """
    from peep.core.exceptions import WireError
    from peep.core.wire import check_subject_id

    for raw in lines:
        line = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))[:MAX_CLAIM_LINE].strip()
        if not line:
            continue
        try:
            yield check_subject_id(line, "claim")
        except WireError:
            log_event(_log, logging.WARNING, "door_claim_malformed", length=len(line))


def socket_claims(path: str | os.PathLike[str], *, stop: threading.Event | None = None) -> Any:
    """Lines from a local (Unix) socket at ``path``: an access controller connects and writes one claim a line.

    The socket is created owner and group only (mode 0660: give the controller's user the door's group);
    connections are served one after another; a line longer than :data:`MAX_CLAIM_LINE` bytes is dropped.
    A file already at ``path`` is refused unless it is a stale socket.
    """
    import socket
    import stat

    p = os.fspath(path)
    if os.path.lexists(p):
        if not stat.S_ISSOCK(os.lstat(p).st_mode):
            raise FileExistsError(f"--claims: {p[:200]} exists and is not a socket")
        os.unlink(p)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)
    try:
        server.bind(p)
    finally:
        os.umask(old)
    server.listen(4)
    server.settimeout(0.5)
    try:
        while stop is None or not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                yield from _lines(conn, stop)
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _lines(conn: Any, stop: threading.Event | None) -> Any:
    """Lines of one connection; a line longer than :data:`MAX_CLAIM_LINE` bytes is dropped whole (logged)."""
    conn.settimeout(0.5)  # a connection left open and silent must not keep a stopping door waiting
    buf, dropping = b"", False
    while stop is None or not stop.is_set():
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if dropping or len(line) > MAX_CLAIM_LINE:
                log_event(_log, logging.WARNING, "door_claim_malformed", length=len(line), reason="too long")
            else:
                yield line
            dropping = False
        if len(buf) > MAX_CLAIM_LINE:  # no end of line within the bound: this line is dropped
            buf, dropping = b"", True


def serve_claims(session: DoorSession, claims: Any, read_frame: Callable[[], Any],
                 on_outcome: Callable[[Outcome], None] | None = None) -> int:  # fmt: skip
    """Handle every claim of ``claims`` in turn (a claim waits for the previous one); returns how many opened."""
    opened = 0
    for subject in read_claims(claims):
        outcome = session.handle(subject, read_frame)
        opened += int(outcome.opened)
        if on_outcome is not None:
            on_outcome(outcome)
    return opened
