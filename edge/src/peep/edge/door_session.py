"""A claim at the door, end to end on the device: the best face of the next seconds, a VERIFY release, a decision.

:class:`DoorSession` joins the agent's pipeline (detector, descriptor, mechanism, site key, ledger) to a
:class:`~peep.edge.door.DoorController`:

1. the controller opens a claim (or refuses it: busy, locked out);
2. frames are read for at most ``face_timeout_s``; the largest detected face is kept (size stands for
   quality: the tracker's best frame is the nearest and most frontal one in practice), and reading stops
   early once ``settle_frames`` frames in a row showed no larger one;
3. that face becomes one VERIFY template for the claimed subject, charged to the device's ledger under
   ``door:<subject>`` like any release, but sent by the verifier in the call, never spooled;
4. the verifier's answer — bound to the claim because it is the answer to this call — is handed to the
   controller, which opens only for an accepted one in time. A verifier that cannot be reached, or an
   answer that cannot be read, ends the claim locked.
"""

from __future__ import annotations

import logging
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
    def verify(self, payload: bytes, subject: str, timeout_s: float) -> tuple[bool, float]:
        """Whether the server accepts the template as ``subject``, and its score; raises VerifierUnavailable."""
        ...


class GrpcVerifier:
    """``RecognitionService.Verify`` over the device's gRPC channel (TLS, its bearer token)."""

    def __init__(self, channel: Any, token: str | None) -> None:
        from peep.v1 import recognition_pb2_grpc

        self._stub = recognition_pb2_grpc.RecognitionServiceStub(channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def verify(self, payload: bytes, subject: str, timeout_s: float) -> tuple[bool, float]:
        import grpc
        from peep.core.wire import decode_template
        from peep.v1 import recognition_pb2

        request = recognition_pb2.VerifyRequest(template=decode_template(payload), claimed_subject=subject)
        try:
            resp = self._stub.Verify(request, metadata=self._metadata, timeout=max(timeout_s, 0.001))
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = f"Verify: {code.name if code else 'error'}: {str(exc.details() or '')[:200]}"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise VerifierTimeout(detail) from None
            if code in _REFUSALS:
                raise VerifierRefused(detail) from None
            raise VerifierUnavailable(detail) from None
        return bool(resp.accepted), float(resp.score)


def _refusal_codes() -> frozenset[Any]:
    import grpc

    c = grpc.StatusCode
    return frozenset({c.INVALID_ARGUMENT, c.NOT_FOUND, c.FAILED_PRECONDITION, c.PERMISSION_DENIED, c.UNAUTHENTICATED})


_REFUSALS = _refusal_codes()


@dataclass
class DoorTiming:
    """Seconds per stage of one claim (the door bench's breakdown)."""

    stages: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds


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
        key = f"door:{subject}"

        def spend(eps: float, coord: float, message_id: str) -> None:
            for k in (self.device_key, key):
                if k is not None:
                    self.accountant.spend(k, eps, p.delta, epsilon_coordinate=coord, purpose="verify",
                                          message_id=message_id)  # fmt: skip

        rel = p.release_face(frame, box, track_id=f"door-{claim.nonce[:12]}", spend=spend, purpose="verify",
                             subject=subject, spool=False)  # fmt: skip
        timing.add("release", time.perf_counter() - t1)
        if rel is None:  # the budget refused it (logged by the pipeline)
            return self.controller.fail(claim, "unreachable", "the device's privacy budget refused the release")
        remaining = claim.deadline - self.clock()
        t2 = time.perf_counter()
        try:
            accepted, score = self.verifier.verify(rel.payload, subject, remaining)
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
        t3 = time.perf_counter()
        outcome = self.controller.decide(Decision(claim.nonce, self.controller.door, subject, accepted, score))
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
