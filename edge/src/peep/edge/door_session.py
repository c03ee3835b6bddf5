"""A claim at the door, end to end on the device: the best face of the next seconds, a VERIFY release, a decision.

:class:`DoorSession` joins the agent's pipeline (detector, descriptor, mechanism, site key, ledger) to a
:class:`~peep.edge.door.DoorController`:

1. the controller opens a claim (or refuses it: busy, throttled, locked out);
2. the claim must fit the door's ε per hour, in all and for the claimed subject (:class:`DoorBudget`), and
   the server is asked, without a template, whether its serving model knows the subject (``CheckClaim``
   over gRPC, the ``claims`` topic over MQTT). A made-up id, a budget spent or a server that cannot be
   asked ends the claim here: nothing of the face at the door is released;
3. frames are read for at most ``face_timeout_s``; the largest detected face is kept (size stands for
   quality: the tracker's best frame is the nearest and most frontal one in practice), and reading stops
   early once ``settle_frames`` frames in a row showed no larger one;
4. that face becomes one VERIFY template for the claimed subject, charged to the device's ledger under
   ``door:<the claim's nonce>`` like any release (and to the hourly budgets), but sent by the verifier in
   the call, never spooled;
5. the verifier's decision — over gRPC the answer to this call, over MQTT the server's signed message naming
   the claim's nonce (the template's message id) — is handed to the controller, which opens only for an
   accepted one in time. A verifier that cannot be reached, or an answer that cannot be read, ends the
   claim locked.

A stop (SIGTERM) ends every wait — for a claim on any source (:mod:`peep.edge.door_claims`), for a face, for an
answer — within a fraction of a second, the claim in progress locked.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from peep.core.imaging import FaceBox, primary_face
from peep.edge.door import Claim, Decision, DoorBudget, DoorController, Outcome
from peep.edge.door_memory import DoorMemory
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.door")


class VerifierUnavailable(RuntimeError):
    """The server could not be asked (down, unreachable, overloaded): the door stays locked (``unreachable``)."""


class VerifierTimeout(VerifierUnavailable):
    """No answer before the claim's deadline (``timeout``)."""


class VerifierRefused(RuntimeError):
    """The server answered, refusing the claim itself (unknown subject, a template it will not score, a
    device without the right): ``rejected`` after a release, ``unknown_subject`` on a claim check."""


class DoorStopping(VerifierUnavailable):
    """The door is stopping (SIGTERM): the waiting claim ends locked."""


class Verifier(Protocol):
    def check_claim(self, claim: Claim, timeout_s: float) -> bool:
        """Whether the server's serving model knows ``claim.subject``, asked with no template.

        Raises :class:`VerifierUnavailable` when no answer can come and :class:`VerifierRefused` when the server
        refused the question itself.
        """
        ...

    def verify(self, payload: bytes, claim: Claim, timeout_s: float) -> Decision:
        """The server's decision on ``payload`` (a VERIFY template whose message id is ``claim.nonce``).

        Raises :class:`VerifierUnavailable` (or :class:`VerifierTimeout`) when no decision can come, and
        :class:`VerifierRefused` when the server refused the claim itself.
        """
        ...

    def claim_ticket(self, claim: Claim) -> str:
        """What the template for ``claim`` carries to show the server it asked (``claim_signature``; "" for none)."""
        ...


#: Longest wait for a claim check: a server that does not answer in this time is treated as away.
CHECK_TIMEOUT_S = 3.0


class GrpcVerifier:
    """``RecognitionService.Verify`` over the device's gRPC channel (TLS, its bearer token).

    The answer is bound to the claim because it is the answer to this call on this channel. ``fused``: the
    QBBS module's ``VerifyFused`` instead, the face fused with the soft traits the template carries (the
    device's own LDP age and gender releases); the server charges the trait queries to the claimed subject's
    odometer. The claim check is ``CheckClaim``, waiting for the channel to be ready (a server just back is
    asked, not written off). Every call is cancelled when ``stop`` is set.
    """

    def __init__(self, channel: Any, token: str | None, *, fused: bool = False,
                 stop: threading.Event | None = None) -> None:  # fmt: skip
        from peep.v1 import qbbs_pb2_grpc, recognition_pb2_grpc

        self.fused = fused
        self.stop = stop
        self._stub = recognition_pb2_grpc.RecognitionServiceStub(channel)  # type: ignore[no-untyped-call]
        self._qbbs = qbbs_pb2_grpc.QbbsServiceStub(channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def _call(self, name: str, method: Any, request: Any, timeout_s: float, *, wait_for_ready: bool = False) -> Any:
        """``method(request)`` within ``timeout_s``, cancelled when ``stop`` is set; errors as Verifier errors."""
        import grpc

        future = method.future(request, metadata=self._metadata, timeout=max(timeout_s, 0.001),
                               wait_for_ready=wait_for_ready)  # fmt: skip
        try:
            while True:
                if self.stop is not None and self.stop.is_set():
                    future.cancel()
                    raise DoorStopping(f"{name}: the door is stopping")
                try:
                    return future.result(timeout=0.2)
                except grpc.FutureTimeoutError:
                    continue
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = f"{name}: {code.name if code else 'error'}: {str(exc.details() or '')[:200]}"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise VerifierTimeout(detail) from None
            if code in _REFUSALS:
                raise VerifierRefused(detail) from None
            raise VerifierUnavailable(detail) from None
        except grpc.FutureCancelledError:
            raise DoorStopping(f"{name}: cancelled, the door is stopping") from None

    def claim_ticket(self, claim: Claim) -> str:
        return ""  # the call's channel says who asked

    def check_claim(self, claim: Claim, timeout_s: float) -> bool:
        from peep.v1 import recognition_pb2

        request = recognition_pb2.CheckClaimRequest(claimed_subject=claim.subject)
        try:
            return bool(self._call("CheckClaim", self._stub.CheckClaim, request, timeout_s, wait_for_ready=True).known)
        except VerifierTimeout as exc:  # asked, nothing came back: the server is away, not slow to decide
            raise VerifierUnavailable(str(exc)) from None

    def verify(self, payload: bytes, claim: Claim, timeout_s: float) -> Decision:
        from peep.core.wire import decode_template
        from peep.v1 import qbbs_pb2, recognition_pb2

        template = decode_template(payload)
        if self.fused:
            fused = self._call("VerifyFused", self._qbbs.VerifyFused,
                               qbbs_pb2.QbbsVerifyRequest(template=template, claimed_subject=claim.subject),
                               timeout_s)  # fmt: skip
            return Decision(claim.nonce, claim.door, claim.subject, bool(fused.accepted), float(fused.fused_score))
        request = recognition_pb2.VerifyRequest(template=template, claimed_subject=claim.subject)
        resp = self._call("Verify", self._stub.Verify, request, timeout_s)
        return Decision(claim.nonce, claim.door, claim.subject, bool(resp.accepted), float(resp.score))


#: Longest id a decision read from the broker may carry (the wire's message and subject ids are shorter).
_MAX_DECISION_ID = 256


def decision_from_event(event: Any) -> Decision | None:
    """The decision in a verify event of the device's events topic (the server's JSON); None if unreadable.

    Every field is checked for its type and bounded: a message that is not exactly a decision opens nothing.
    Its signature is checked apart (:meth:`MqttVerifier.on_event`).
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
    digest = event.get("template_sha256", "")
    if not isinstance(digest, str) or len(digest) > 64:
        return None
    return Decision(str(nonce), str(door), str(subject), accepted, float(score), template_sha256=digest)


@dataclass(frozen=True)
class _CheckAnswer:
    nonce: str
    door: str
    subject: str
    known: bool
    signature: str = ""


def _claim_check_from_event(event: dict[str, Any]) -> _CheckAnswer | None:
    nonce, door, subject, known = (event.get(k) for k in ("nonce", "device_id", "claimed_subject", "known"))
    if not all(isinstance(v, str) and 0 < len(v) <= _MAX_DECISION_ID for v in (nonce, door, subject)):
        return None
    if not isinstance(known, bool):
        return None
    signature = event.get("signature")
    return _CheckAnswer(str(nonce), str(door), str(subject), known, signature if isinstance(signature, str) else "")


class MqttVerifier:
    """Decisions over MQTT: the template on the device's templates topic, the answer on its events topic.

    Four things bind an answer to the claim: the claim's nonce (the VERIFY template's message id, which the
    server's decision names), the digest of the template the server decided (which must be the door's own:
    a template someone else published under the nonce, a recorded face of the claimed subject say, gets a
    decision that names another digest, and the door's own fresh noise cannot be predicted, so a decision
    naming it was made after the door sent it), the broker's ACL (deploy/mosquitto/acl: only the server writes
    a device's events topic), and the server's signature (:mod:`peep.core.signing`, checked against
    ``public_key``), which a client without the server's key cannot produce whatever the broker lets through.
    The verifier hands back only a signed decision naming the waiting claim's nonce, door, subject and
    template; a signed decision on another template of the waiting claim is ``mismatch`` and ends nothing;
    every other message on the topic while the door is in use (unsigned or wrongly signed: ``forged``; for
    another claim or door, replayed, or unreadable) goes to the controller, which refuses and counts it
    without ending the waiting claim.
    Identification events (the device's camera work) are not decisions and are ignored.

    The claim check goes to the device's ``claims`` topic as ``{"nonce", "claimed_subject"}``; its signed
    answer (``kind = "claim_check"``) comes back on the events topic.

    Parameters
    ----------
    link : MqttLink
        The device's connection; route its ``on_event`` to :meth:`on_event`.
    controller : DoorController
    public_key : Ed25519PublicKey
        The server's decision key (``door.decision_public_key``).
    site : str
        This door's site (part of what the server signs).
    stop : threading.Event, optional
        Set when the door stops: a waiting claim ends at once.
    """

    def __init__(self, link: Any, controller: DoorController, *, public_key: Any, site: str,
                 stop: threading.Event | None = None) -> None:  # fmt: skip
        self._link, self.controller = link, controller
        self.public_key, self.site, self.stop = public_key, site, stop
        self._cv = threading.Condition()
        self._waiting: Claim | None = None
        self._waiting_digest = ""
        self._answer: Decision | None = None
        self._checking: Claim | None = None
        self._check_answer: _CheckAnswer | None = None
        self._ticket: tuple[str, str] = ("", "")  # (nonce, the server's signature on its "known" answer)

    def _signed(self, kind: Any, *, door: str, nonce: str, subject: str, verdict: bool, signature: Any,
                template_sha256: str = "") -> bool:  # fmt: skip
        from peep.core.signing import door_statement, verify_statement

        try:
            statement = door_statement(kind, site=self.site, device_id=door, nonce=nonce, subject=subject,
                                       verdict=verdict, template_sha256=template_sha256)  # fmt: skip
        except (TypeError, ValueError):
            return False
        return verify_statement(self.public_key, statement, signature)

    def on_event(self, event: Any) -> None:
        """One message of the events topic (paho's network thread)."""
        if isinstance(event, dict) and event.get("purpose") in ("identify", "unspecified"):
            return
        if isinstance(event, dict) and event.get("kind") == "claim_check":
            self._on_claim_check(event)
            return
        decision = decision_from_event(event)
        if decision is not None and not self._signed(
            "verify", door=decision.door, nonce=decision.nonce, subject=decision.subject, verdict=decision.accepted,
            signature=event.get("signature") if isinstance(event, dict) else None,
            template_sha256=decision.template_sha256,
        ):  # fmt: skip
            self.controller.discard("forged", "a decision not signed by the server's decision key")
            return
        with self._cv:
            w = self._waiting
            if (
                decision is not None and w is not None and self._answer is None
                and hmac.compare_digest(decision.nonce, w.nonce) and decision.door == w.door
                and decision.subject == w.subject
            ):  # fmt: skip
                if not hmac.compare_digest(decision.template_sha256, self._waiting_digest):
                    # Signed and for this claim, but on a template this door did not send (published by
                    # someone else under the nonce): the waiting claim goes on, and no failure is counted.
                    mismatch = True
                else:
                    self._answer = decision
                    self._cv.notify_all()
                    return
            else:
                mismatch = False
        if mismatch:
            self.controller.discard("mismatch", "a decision on a template this door did not send")
            return
        self.controller.decide(decision)

    def _on_claim_check(self, event: dict[str, Any]) -> None:
        answer = _claim_check_from_event(event)
        if answer is None:
            self.controller.discard("malformed", "a claim check answer that cannot be read")
            return
        if not self._signed("claim_check", door=answer.door, nonce=answer.nonce, subject=answer.subject,
                            verdict=answer.known, signature=event.get("signature")):  # fmt: skip
            self.controller.discard("forged", "a claim check answer not signed by the server's decision key")
            return
        with self._cv:
            c = self._checking
            if (
                c is not None and self._check_answer is None and hmac.compare_digest(answer.nonce, c.nonce)
                and answer.door == c.door and answer.subject == c.subject
            ):  # fmt: skip
                self._check_answer = answer
                self._cv.notify_all()
        # An answer for no waiting check (late, or another claim's) decides nothing: dropped.

    def _publish(self, topic: str, payload: bytes, deadline: float, what: str, *, qos: int = 1) -> None:
        import paho.mqtt.client as mqtt

        if not self._link.connected.is_set():
            raise VerifierUnavailable("the MQTT broker is not connected")
        info = self._link.client.publish(topic, payload, qos=qos, retain=False)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise VerifierUnavailable(f"the MQTT client refused the {what}: {mqtt.error_string(info.rc)}")
        try:
            info.wait_for_publish(max(deadline - time.monotonic(), 0.001))
        except (RuntimeError, ValueError) as exc:
            raise VerifierUnavailable(f"the MQTT broker dropped the {what}: {exc}") from None
        if not info.is_published():
            raise VerifierUnavailable(f"the MQTT broker did not acknowledge the {what} before the deadline")

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        """Wait (holding ``_cv``) until ``ready()``; a stop or the deadline ends the wait with an error."""
        while not ready():
            if self.stop is not None and self.stop.is_set():
                raise DoorStopping("the door is stopping")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VerifierTimeout(f"no {what} on the events topic before the deadline")
            self._cv.wait(min(remaining, 0.2))

    def check_claim(self, claim: Claim, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._checking, self._check_answer = claim, None
        try:
            question = json.dumps({"nonce": claim.nonce, "claimed_subject": claim.subject}).encode()
            # QoS 0: the answer is the acknowledgement. With QoS 1 the broker's PUBACK and the server's answer
            # reached the door back to back, and Nagle's algorithm held the answer for the door's delayed ACK
            # (about 40 ms more per claim, measured).
            self._publish(self._link.topics.claims(self.site, claim.door), question, deadline, "claim check", qos=0)
            with self._cv:
                try:
                    self._wait(lambda: self._check_answer is not None, deadline, "answer to the claim check")
                except VerifierTimeout as exc:  # nobody answered: the server is away
                    raise VerifierUnavailable(str(exc)) from None
                assert self._check_answer is not None
                answer = self._check_answer
                self._ticket = (claim.nonce, answer.signature if answer.known else "")
                return answer.known
        finally:
            with self._cv:
                self._checking = None

    def claim_ticket(self, claim: Claim) -> str:
        with self._cv:
            nonce, signature = self._ticket
        return signature if nonce and hmac.compare_digest(nonce, claim.nonce) else ""

    def verify(self, payload: bytes, claim: Claim, timeout_s: float) -> Decision:
        from peep.core.wire import decode_template, template_digest

        deadline = time.monotonic() + timeout_s
        digest = template_digest(decode_template(payload, validate=False))
        with self._cv:
            self._waiting, self._waiting_digest, self._answer = claim, digest, None
        try:
            self._publish(self._link.templates_topic, payload, deadline, "template")
            with self._cv:
                self._wait(lambda: self._answer is not None, deadline, "decision")
                assert self._answer is not None
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
    budget : DoorBudget, optional
        The door's ε per hour, in all and per claimed subject; None: only the ledger's own budgets apply.
    stop : threading.Event, optional
        Set when the door stops (SIGTERM): a claim in progress ends at once, locked.
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
        budget: DoorBudget | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        decisions: Any = None,
    ) -> None:
        self.pipeline, self.accountant, self.controller, self.verifier = pipeline, accountant, controller, verifier
        self.face_timeout_s, self.settle_frames, self.device_key, self.clock = (
            face_timeout_s,
            settle_frames,
            device_key,
            clock,
        )
        self.budget, self.stop = budget, stop
        #: Deciding on the device (peep.edge.decide.DecisionSource): no template, no round trip.
        self.decisions = decisions
        self.last_timing = DoorTiming()

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def handle(self, subject: str, read_frame: Callable[[], Any]) -> Outcome:
        """Run one claim for ``subject``, reading frames with ``read_frame()`` (None: the source ended).

        Nothing is released for a claim refused before its face is taken: throttled, locked out, over a budget,
        for a subject the server does not know, or while the server cannot be asked.
        """
        timing = DoorTiming()
        self.last_timing = timing
        claim = self.controller.claim(subject)
        if not isinstance(claim, Claim):
            return claim
        if self.decisions is not None:
            return self._decide_on_device(claim, read_frame, timing)
        t0 = time.perf_counter()
        p = self.pipeline
        cost = float(p.release_cost)
        if self.budget is not None:
            over = self.budget.refusal(subject, cost)
            if over is not None:
                coord = float(p.epsilon_coordinate)
                return self.controller.fail(claim, over[0], f"{over[1]} (per-coordinate ε {coord:g} a release); "
                                            "nothing was released")  # fmt: skip
        try:
            known = self.verifier.check_claim(claim, min(max(claim.deadline - self.clock(), 0.001), CHECK_TIMEOUT_S))
        except VerifierUnavailable as exc:
            late = self.clock() >= claim.deadline  # the claim's own deadline passed: a timeout, not an outage
            return self.controller.fail(claim, "timeout" if late else "unreachable", f"{exc}; nothing was released")
        except VerifierRefused as exc:
            return self.controller.fail(claim, "unknown_subject", f"{exc}; nothing was released")
        timing.add("check", time.perf_counter() - t0)
        if not known:
            why = "the serving model does not know the claimed subject; nothing was released"
            return self.controller.fail(claim, "unknown_subject", why)
        best = self._best_face(read_frame, timing)
        if self._stopping():
            return self.controller.fail(claim, "unreachable", "the door is stopping; nothing was released")
        if best is None:
            return self.controller.fail(claim, "no_face", f"no face within {self.face_timeout_s:g} s")
        if self.clock() >= claim.deadline:  # no decision could come in time: releasing would buy nothing
            return self.controller.fail(claim, "timeout", "the claim's deadline passed before its face was taken; "
                                        "nothing was released")  # fmt: skip
        frame, box = best
        t1 = time.perf_counter()
        key = f"door:{claim.nonce[:16]}"

        def spend(eps: float, coord: float, message_id: str) -> None:
            for k in (self.device_key, key):
                if k is not None:
                    self.accountant.spend(k, eps, p.delta, epsilon_coordinate=coord, purpose="verify",
                                          message_id=message_id)  # fmt: skip
            if self.budget is not None:
                self.budget.charge(subject, eps)

        # The claim's nonce is the template's id: the server's decision names it (over MQTT, the only binding).
        before = {k: p.timer.seconds.get(k, 0.0) for k in _RELEASE_STAGES}
        rel = p.release_face(frame, box, track_id=f"door-{claim.nonce[:12]}", spend=spend, purpose="verify",
                             subject=subject, spool=False, message_id=claim.nonce,
                             claim_signature=self.verifier.claim_ticket(claim))  # fmt: skip
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

    def _decide_on_device(self, claim: Claim, read_frame: Callable[[], Any], timing: DoorTiming) -> Outcome:
        """A claim decided here, with the device model on the face's clean projection; the record spooled.

        Nothing of the face leaves the door. What is sent, when the server can be reached, is the door's access
        record: the claimed subject and whether the door opened (its own action, seen by anyone at the door).
        """
        t0 = time.perf_counter()
        decider = self.decisions.decider()
        if decider is None:
            return self.controller.fail(claim, "no_model", f"{self.decisions.problem}; the door stays locked")
        if not decider.knows(claim.subject):
            return self.controller.fail(claim, "unknown_subject", "the device model does not know the claimed "
                                        "subject (or they were erased); nothing was looked at")  # fmt: skip
        best = self._best_face(read_frame, timing)
        if self._stopping():
            return self.controller.fail(claim, "unreachable", "the door is stopping")
        if best is None:
            return self.controller.fail(claim, "no_face", f"no face within {self.face_timeout_s:g} s")
        frame, box = best
        t1 = time.perf_counter()
        projection = self.pipeline.project_face(frame, box)
        timing.add("project", time.perf_counter() - t1)
        t2 = time.perf_counter()
        verdict = decider.verify(projection[None, :], claim.subject)
        timing.add("verify", time.perf_counter() - t2)
        t3 = time.perf_counter()
        outcome = self.controller.decide(Decision(nonce=claim.nonce, door=self.controller.door,
                                                  subject=claim.subject, accepted=verdict.accepted,
                                                  score=verdict.score))  # fmt: skip
        timing.add("actuate", time.perf_counter() - t3)
        timing.add("total_after_face", time.perf_counter() - t1)
        timing.add("claim_to_lock", time.perf_counter() - t0)
        self._spool_record(claim, outcome.opened, decider)
        log_event(_log, logging.INFO, "door_decided", door=self.controller.door, opened=outcome.opened,
                  reason=outcome.reason, decided_on="device", model_serial=decider.model.serial)  # fmt: skip
        return outcome

    def _spool_record(self, claim: Claim, opened: bool, decider: Any) -> None:
        """Store-and-forward the access record (sent like a template when the server is there)."""
        from peep.core.wire import make_decision

        p = self.pipeline
        msg = make_decision(device_id=p.device_id, site=p.site, bundle_id=p.releaser.bundle_id,
                            key_id=p.releaser.key_id, model_serial=decider.model.serial,
                            model_version=decider.model.model_version, purpose="verify", subject=claim.subject,
                            accepted=opened, track_id=f"door-{claim.nonce[:12]}", capture_time=p.clock(),
                            message_id=claim.nonce)  # fmt: skip
        try:
            p.spool.put(message_id=msg.message_id, purpose="verify", payload=p.encode(msg))
        except Exception as exc:  # a full disk must not change what the door did; the record is lost, and said so
            log_event(_log, logging.ERROR, "door_record_not_spooled", door=self.controller.door,
                      error=str(exc)[:200])  # fmt: skip

    def on_lock_command(self, payload: bytes) -> Outcome | None:
        """Home Assistant's lock said ``UNLOCK`` or ``OPEN`` (open, when the controller allows) or ``LOCK``.

        An opening is sent as an access record naming nobody, with who asked (``decision.requested_by``): no
        face was looked at and nothing is released, so it costs no ε. Anything else is logged and ignored.
        """
        command = payload.decode("ascii", "replace").strip().upper()
        if command == "LOCK":
            self.controller.relock()
            return None
        if command not in ("UNLOCK", "OPEN"):
            log_event(_log, logging.WARNING, "door_command_unreadable", door=self.controller.door,
                      command=command[:32])  # fmt: skip
            return None
        outcome = self.controller.open_on_request("home_assistant")
        if outcome.opened:
            from peep.core.wire import make_decision

            p = self.pipeline
            msg = make_decision(device_id=p.device_id, site=p.site, bundle_id=p.releaser.bundle_id,
                                key_id=p.releaser.key_id, model_serial=0, model_version="", purpose="verify",
                                accepted=True, requested_by="home_assistant", capture_time=p.clock())  # fmt: skip
            msg.track_id = f"door-{msg.message_id[:12]}"
            try:
                p.spool.put(message_id=msg.message_id, purpose="verify", payload=p.encode(msg))
            except Exception as exc:  # the door opened: the record is lost, and said so
                log_event(_log, logging.ERROR, "door_record_not_spooled", door=self.controller.door,
                          error=str(exc)[:200])  # fmt: skip
        return outcome

    def _best_face(self, read_frame: Callable[[], Any], timing: DoorTiming) -> tuple[Any, FaceBox] | None:
        deadline = self.clock() + self.face_timeout_s
        best: tuple[Any, FaceBox] | None = None
        calm = 0
        while self.clock() < deadline and calm < self.settle_frames and not self._stopping():
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
        """Lock the door, then close its connections and its state file (the agent is the caller's)."""
        self.controller.close()
        if self.channel is not None:
            self.channel.close()
        if self.link is not None:
            self.link.stop()
        if self.controller.memory is not None:
            self.controller.memory.close()


def open_door(
    agent: Any,
    *,
    pin_factory: Any = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    face_timeout_s: float = 3.0,
    settle_frames: int = 5,
    connect_timeout_s: float | None = None,
) -> DoorRig:
    """The door of ``agent``'s ``[door]`` section: its lock, controller, budget, verifier and session.

    Over ``door.decision = "grpc"`` a channel to the server (reconnecting within a second of the server's
    return); over ``"mqtt"`` (or for an MQTT relay lock) a connection of its own to the broker (its own client
    id: the device's ``run`` may hold the usual one; no status or last will). A broker not reachable yet is no
    error: claims end ``unreachable`` until it is. A door deciding over MQTT on a broker without TLS or
    credentials (``door.insecure_broker``) says so in its log at every start and in its report.

    Parameters
    ----------
    agent : Agent
        The device's agent (opened here); its ``stop_event`` ends a claim in progress.
    pin_factory : gpiozero pin factory, optional
        For a GPIO lock (tests and the demo: ``MockFactory()``).
    on_outcome : callable, optional
        Every outcome, including decisions refused while no claim of theirs waits.

    Raises
    ------
    ConfigError
        When one release costs more than ``door.epsilon_per_hour`` or ``door.subject_epsilon_per_hour`` allows
        (the door could never open), or the decision key cannot be read.
    """
    from peep.edge.door import ReportedLock, build_lock

    cfg = agent.cfg
    d = cfg.door
    pipeline = agent.open()  # its prepare() checked the door's budgets and read its decision key
    public_key = agent.door_decision_key
    if d.decision == "mqtt":
        weak = cfg.broker_weaknesses()
        if weak:
            agent.insecure_broker = True
            log_event(_log, logging.WARNING, "door_insecure_broker", door=cfg.device.id, host=cfg.mqtt.host,
                      weaknesses=weak, detail="door.insecure_broker = true: a client on this broker can read every "
                      "claim and write to the events topic; only the server's signature stands between it and the "
                      "lock")  # fmt: skip
    link = channel = None
    publish = None
    holder: list[MqttVerifier] = []
    sessions: list[DoorSession] = []  # the session, made below, for the lock commands the link hands on
    if d.lock == "mqtt-relay" or d.decision == "mqtt" or d.report_lock:
        from peep.edge.transport.mqtt import MqttLink

        link = MqttLink(cfg.mqtt, client_id=f"{cfg.mqtt_client_id}-door", site=cfg.device.site,
                        device_id=cfg.device.id, password=agent.mqtt_password, publish_status=d.report_lock,
                        on_event=lambda ev: holder[0].on_event(ev) if holder else None,
                        subscribe_events=d.decision == "mqtt",
                        on_lock_command=(lambda payload: sessions[0].on_lock_command(payload) if sessions else None)
                        if d.home_assistant_open else None)  # fmt: skip
        link.start()
        link.wait_connected(cfg.mqtt.connect_timeout_s if connect_timeout_s is None else connect_timeout_s)
        mqtt_link = link

        def publish(topic: str, payload: str) -> None:
            info = mqtt_link.client.publish(topic, payload, qos=1)
            info.wait_for_publish(5.0)
            if not info.is_published():
                raise RuntimeError(f"the broker did not take {topic}")

    window_s = 3600.0
    memory = DoorMemory(cfg.door_memory_path, keep_s=max(window_s, d.lockout_window_s, 60.0))
    lock = build_lock(d, publish=publish, pin_factory=pin_factory)
    if d.report_lock and link is not None:
        lock_topic, reporting = link.topics.device(cfg.device.site, cfg.device.id, "lock"), link
        lock = ReportedLock(lock, lambda state: reporting.client.publish(lock_topic, state, qos=1, retain=True))
    controller = DoorController(cfg.device.id, lock,
                                open_s=d.open_s, decision_timeout_s=d.decision_timeout_s,
                                lockout_failures=d.lockout_failures, lockout_window_s=d.lockout_window_s,
                                max_claims_per_minute=d.max_claims_per_minute, on_outcome=on_outcome,
                                memory=memory)  # fmt: skip
    ledger = agent.accountant.ledger
    since = time.time() - window_s  # the ledger's clock: the window survives a restart
    if hasattr(ledger, "recent"):
        spent = ledger.recent("door:", since)
    else:
        spent = [(e.time, e.epsilon) for e in ledger.entries() if e.key.startswith("door:") and e.time >= since]
    budget = DoorBudget(door_epsilon=d.epsilon_per_hour, subject_epsilon=d.subject_epsilon_per_hour,
                        window_s=window_s, spent=spent, memory=memory)  # fmt: skip
    stop = getattr(agent, "stop_event", None)
    verifier: Verifier | None
    if d.decision == "device":
        verifier = None  # the device decides; the access records go out through the agent's spool
    elif d.decision == "mqtt":
        verifier = MqttVerifier(link, controller, public_key=public_key, site=cfg.device.site, stop=stop)
        holder.append(verifier)
    else:
        from peep.edge.transport.grpc import make_channel

        channel = make_channel(cfg.grpc, reconnect_max_s=1.0)
        verifier = GrpcVerifier(channel, agent.grpc_token, fused=d.fuse_soft_traits, stop=stop)
    session = DoorSession(pipeline, agent.accountant, controller, verifier, face_timeout_s=face_timeout_s,  # type: ignore[arg-type]
                          settle_frames=settle_frames, device_key=agent.device_key, budget=budget,
                          stop=stop, decisions=agent.decisions if d.decision == "device" else None)  # fmt: skip
    sessions.append(session)
    return DoorRig(session, controller, link, channel)
