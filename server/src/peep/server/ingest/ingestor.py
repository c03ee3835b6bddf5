"""Ingest: validate, authorise, de-duplicate, decide, keep only what is stated, publish events.

Shared by the gRPC handlers and the MQTT consumer. Work is batched: a batch
of templates costs one database transaction and one onnxruntime call for the
identify/verify templates in it, which is what lets a 2-core box take
thousands of templates per second.

Decide, then forget: an identify or verify template is decided in memory and
is not written to durable storage unless ``recognition.keep`` asks for it
(``recognised``: people recognised as an enrolled subject; ``all``). What one
batch's transaction writes is the ledger entry of every new message id (ids,
times and the release's ε, no template: it answers a redelivery DUPLICATE
long after the template is gone), the enrolment templates, the decisions, the
kept templates and, on replicas, a track's release for fusion by another
replica (``track_memory``, expiring with the fusion window). Events are
published after the commit (``StreamEvents`` subscribers read them from the
committed log, :mod:`peep.server.ingest.events`), and callers acknowledge
after this returns: an acknowledged template has its decision committed
exactly once.

A device that decides on its own clean projection sends its decision instead of a template (a release whose
``decision`` is set, checked against the signed device model it names by the validator): it takes the same
path -- ledger row (charging its label's ε), de-duplication, acknowledgement -- and becomes the same event and
kept decision, ``decided_on = "device"``, its label mapped back to the subject (or unknown, for a subject
erased since). Only the device that decided may send it (never the administrator's credential), and there is
no template to keep.

A template decided by a call instead (``Identify``, ``Verify``, QBBS
``VerifyFused``: a door's claim) gets the same ledger row, written with the
call's decision off the call's path (:meth:`Ingestor.record_release`), so
every release a device makes is counted, whichever way it came. Each row says
how it came (``grpc`` or ``mqtt``) and whose credential sent it (the device's
own, or the administrator's, who enrols public background faces in a desk's
name).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from peep.core import wire
from peep.core.signing import door_statement, verify_statement, verify_template
from peep.server.ingest.auth import DeviceRegistry, Identity, Undecodable
from peep.server.ingest.events import EventBus, new_event, put_dropping_oldest
from peep.server.ingest.validation import Rejection, TemplateValidator, ValidTemplate
from peep.server.metrics import ServerMetrics
from peep.server.recognition.recogniser import ModelMismatch, ModelUnavailable, Recogniser
from peep.server.recognition.tracks import TrackIdentifier
from peep.server.storage import (
    DecisionRecord,
    IngestBatch,
    LedgerEntry,
    Store,
    TemplateRecord,
    TrackRelease,
)
from peep.v1 import recognition_pb2, template_pb2

__all__ = ["ACCEPTED", "DUPLICATE", "KEEP_CHOICES", "REJECTED", "Ingestor", "Outcome", "PermissionRefused", "Sender"]

log = logging.getLogger(__name__)

#: ``recognition.keep``: which identify/verify templates are written to the database after their decision.
KEEP_CHOICES = ("none", "recognised", "all")

ACCEPTED = recognition_pb2.INGEST_STATUS_ACCEPTED
DUPLICATE = recognition_pb2.INGEST_STATUS_DUPLICATE
REJECTED = recognition_pb2.INGEST_STATUS_REJECTED


class PermissionRefused(Rejection):
    """The sender may not send this template (wrong device or site, or an enrolment without the right)."""


def _background_refused(device_id: str, prefix: str, subject: str) -> PermissionRefused:
    # Background subjects are the class that teaches "unknown": a desk that could add to it could teach
    # the model to call an enrolled person unknown (or a stranger known by starving the class).
    return PermissionRefused(
        "background_not_permitted",
        f"subject: expected a person's id from device {device_id[:64]!r} (subjects starting {prefix!r} form the "
        f"'unknown' class; only an admin enrols them), received {subject[:64]!r}",
    )


def _enrolment_refused(device_id: str) -> PermissionRefused:
    return PermissionRefused(
        "enrolment_not_permitted",
        f"purpose: expected IDENTIFY or VERIFY from device {device_id[:64]!r} (enrolment needs an admin or a "
        "device registered with auth.devices[].enrolment_desk = true), received ENROLL",
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    message_id: str
    status: int
    reason: str = ""
    code: str = ""

    def ack(self) -> recognition_pb2.IngestAck:
        return recognition_pb2.IngestAck(message_id=self.message_id, status=self.status, reason=self.reason)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Decided:
    """One new identify/verify template of a batch and what became of it."""

    index: int  # in the batch
    valid: ValidTemplate
    event: recognition_pb2.RecognitionEvent | None = None  # None: not decided (no model, another bundle)
    recognised_as: str | None = None  # the enrolled subject named (identify) or accepted (verify)


@dataclass(frozen=True, slots=True)
class Sender:
    """Who delivered a template: an authenticated gRPC identity or an MQTT topic."""

    identity: Identity | None = None
    topic_site: str | None = None
    topic_device: str | None = None

    @property
    def transport(self) -> str:
        """``mqtt`` (a topic), ``grpc`` (an identity), or "" (neither: refused by :meth:`Ingestor.authorise`)."""
        if self.topic_device is not None:
            return "mqtt"
        return "grpc" if self.identity is not None else ""

    @property
    def sent_by(self) -> str:
        """``admin`` for the administrator's credential, else ``device`` (its own credential or its topic)."""
        return "admin" if self.identity is not None and self.identity.is_admin else "device"


class DecisionWriter:
    """Keeps the decisions of the Identify and Verify calls, and their templates' ledger rows, off the calls' path.

    A single-row commit per call would add about half a millisecond to every
    Identify (SQLite, measured); the caller already has its answer, so its
    decision and its template's ledger row (insert-if-absent: a message id the
    ledger holds is not counted twice) are written by this thread within
    ``interval`` seconds (one: with
    a commit every 50 ms the Identify p99 rose by ~0.6 ms on a 2-core box, the
    commits competing with the calls; once a second it was level with no
    writer). A full queue (the database down for long) drops the oldest
    (``dropped``); a crash loses at most what is queued. ``on_written`` is
    called after each commit (the events' reader reads the log then: a
    ``StreamEvents`` subscriber hears of these decisions within ``interval``).
    """

    def __init__(
        self,
        store: Store,
        *,
        max_queue: int = 10_000,
        interval: float = 1.0,
        on_written: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.on_written = on_written
        self.interval = interval
        self.dropped = 0
        self.written = 0
        #: Ledger rows handed to the store (duplicates of rows it held included: those it did not add).
        self.ledgered = 0
        self._queue: queue.Queue[DecisionRecord | LedgerEntry] = queue.Queue(max_queue)
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="peep-decisions", daemon=True)
        self._thread.start()

    def put(self, record: DecisionRecord) -> None:
        self._idle.clear()
        self.dropped += put_dropping_oldest(self._queue, record)

    def put_ledger(self, entry: LedgerEntry) -> None:
        """Queue the ledger row of a template decided outside ingest (see :meth:`Ingestor.record_release`)."""
        self._idle.clear()
        self.dropped += put_dropping_oldest(self._queue, entry)

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            try:
                batch = [self._queue.get(timeout=0.2)]
            except queue.Empty:
                self._idle.set()
                continue
            self._stop.wait(self.interval)  # gather what arrives meanwhile: one commit for many calls
            while len(batch) < 1000:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ledger = [x for x in batch if isinstance(x, LedgerEntry)]
            decisions = [x for x in batch if not isinstance(x, LedgerEntry)]
            if ledger:
                try:
                    self.store.commit_ingest(IngestBatch(ledger))
                    self.ledgered += len(ledger)
                except Exception as exc:  # the callers had their answers; these releases go uncounted
                    self.dropped += len(ledger)
                    log.warning("ledger rows not kept", extra={"n": len(ledger), "error": str(exc)[:200]})
            if decisions:
                try:
                    self.store.add_decisions(decisions)
                    self.written += len(decisions)
                    if self.on_written is not None:
                        self.on_written()
                except Exception as exc:  # the callers had their answers; these decisions are not kept
                    self.dropped += len(decisions)
                    log.warning("decisions not kept", extra={"n": len(decisions), "error": str(exc)[:200]})
            if self._queue.empty():
                self._idle.set()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued is written; False on timeout."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


class Ingestor:
    """Validate and store templates; recognise identify/verify ones.

    Parameters
    ----------
    store : Store
    validator : TemplateValidator
    recogniser : Recogniser
    events : EventBus
    metrics : ServerMetrics
    devices : DeviceRegistry
    require_registered_device : bool
        MQTT: refuse devices missing from the registry (when it lists any).
    clock : callable
        Unix time (injected for tests).
    tracks : TrackIdentifier or None
        Identifies the identify templates, a track's releases together where it fuses them (it owns the
        fusion memory, and on replicas the shared one); None: each release alone.
    background_prefix : str
        Subjects with this prefix form the "unknown" class: only an admin
        may enrol templates under them (``training.background_prefix``).
    keep : {"none", "recognised", "all"}
        Identify/verify templates written to ``templates`` after their decision
        (``recognition.keep``).
    origin : str
        This replica's id, kept with each decision ("" for a single server).
    claim_key : Ed25519PublicKey or None
        The public half of the server's decision key (``mqtt.decision_signing_key``): a door's VERIFY over
        MQTT must carry the server's signed answer to its claim check for that nonce (``claim_signature``),
        so that any replica can tell a claim this door asked from a nonce made up or read off the broker.
    """

    def __init__(
        self,
        store: Store,
        validator: TemplateValidator,
        recogniser: Recogniser,
        events: EventBus,
        metrics: ServerMetrics,
        devices: DeviceRegistry,
        *,
        require_registered_device: bool = True,
        clock: Callable[[], float] = time.time,
        tracks: TrackIdentifier | None = None,
        background_prefix: str = "background:",
        keep: str = "none",
        origin: str = "",
        claim_key: Any = None,
    ) -> None:
        if keep not in KEEP_CHOICES:
            raise ValueError(f"keep: expected one of {', '.join(KEEP_CHOICES)}, received {keep!r}")
        self.store = store
        self.validator = validator
        self.recogniser = recogniser
        self.events = events
        self.metrics = metrics
        self.devices = devices
        self.require_registered_device = require_registered_device
        self.clock = clock
        self.tracks = tracks if tracks is not None else TrackIdentifier(recogniser, None)
        self.background_prefix = background_prefix
        self.keep = keep
        self.origin = origin
        self.claim_key = claim_key
        #: The Identify and Verify calls' decisions, kept off their path.
        self.decisions = DecisionWriter(store, on_written=events.committed)

    # ------------------------------------------------------------ checks

    def authorise(self, msg: template_pb2.PerturbedTemplate, sender: Sender) -> None:
        """Raise :class:`PermissionRefused` unless ``sender`` may send ``msg``.

        A device sends only its own templates (device id, registered site); an
        ENROLL template needs the enrolment right: an admin, or a registered
        device with ``enrolment_desk = true`` (over MQTT the topic's device must
        be such a device, whatever ``require_registered_device`` says); an
        ENROLL template for a background subject needs an admin.
        """
        ident = sender.identity
        enrol = msg.purpose == template_pb2.PURPOSE_ENROLL
        if ident is not None:
            if ident.is_admin and msg.HasField("decision"):
                # A decision is a device's own statement of what it decided (a camera's label, a door's access
                # record): the administrator's credential, which may send templates in a desk's name, may not
                # make one up in a device's name.
                raise PermissionRefused(
                    "decision_not_from_device",
                    f"decision: expected the decision of the device that made it, sent with that device's own "
                    f"credential, received one for {msg.device_id[:64]!r} sent with the admin credential",
                )
            if ident.is_admin:
                return
            if msg.device_id != ident.name:
                raise PermissionRefused(
                    "wrong_device",
                    f"device_id: expected {ident.name!r} (the authenticated device), received {msg.device_id[:64]!r}",
                )
            if ident.site is not None and msg.site != ident.site:
                raise PermissionRefused(
                    "wrong_site",
                    f"site: expected {ident.site!r} (device {ident.name}'s registered site), "
                    f"received {msg.site[:64]!r}",
                )
            if enrol and not ident.may_enrol:
                raise _enrolment_refused(ident.name)
            if enrol and self._is_background(msg.subject):
                raise _background_refused(ident.name, self.background_prefix, msg.subject)
            return
        if sender.topic_device is not None:
            if msg.device_id != sender.topic_device or msg.site != sender.topic_site:
                raise PermissionRefused(
                    "topic_mismatch",
                    f"device_id/site: expected {sender.topic_site}/{sender.topic_device} (the topic), received "
                    f"{msg.site[:64]}/{msg.device_id[:64]}",
                )
            if self.require_registered_device and len(self.devices):
                if not self.devices.is_registered(msg.device_id):
                    raise PermissionRefused(
                        "unknown_device", f"device_id: expected a registered device, received {msg.device_id[:64]!r}"
                    )
                site = self.devices.site_of(msg.device_id)
                if site is not None and msg.site != site:
                    raise PermissionRefused(
                        "wrong_site",
                        f"site: expected {site!r} (device {msg.device_id}'s registered site), "
                        f"received {msg.site[:64]!r}",
                    )
            if enrol and not self.devices.is_enrolment_desk(msg.device_id):
                raise _enrolment_refused(msg.device_id)
            if enrol and self._is_background(msg.subject):
                raise _background_refused(msg.device_id, self.background_prefix, msg.subject)
            self._authenticate(msg)
            return
        raise PermissionRefused("unauthenticated", "sender: expected an authenticated device")

    def _authenticate(self, msg: template_pb2.PerturbedTemplate) -> None:
        """What arrived on a device's MQTT topic came from that device (a broker may let anyone publish there).

        A device with a registered signing key signs every template; a door's VERIFY (its face for a claim)
        always needs that signature and the server's own signed answer to the claim check for its nonce.
        """
        door_verify = msg.purpose == template_pb2.PURPOSE_VERIFY and not msg.HasField("decision")
        key = self.devices.signing_key(msg.device_id)
        if key is None:
            if door_verify or self.devices.require_signatures:
                why = "a VERIFY over MQTT" if door_verify else "auth.require_device_signatures"
                raise PermissionRefused(
                    "unsigned",
                    f"device_signature: {why} needs the device's registered key (auth.devices[].signing_key), "
                    f"and {msg.device_id[:64]!r} has none",
                )
            return
        if not msg.device_signature:
            raise PermissionRefused(
                "unsigned", f"device_signature: expected the signature of device {msg.device_id[:64]!r}, received none"
            )
        if not verify_template(key, msg):
            raise PermissionRefused(
                "bad_signature",
                f"device_signature: not the signature of device {msg.device_id[:64]!r} on this template",
            )
        if door_verify:
            question = door_statement(
                "claim_check", site=msg.site, device_id=msg.device_id, nonce=msg.message_id, subject=msg.subject,
                verdict=True,
            )  # fmt: skip
            asked = self.claim_key is not None and verify_statement(self.claim_key, question, msg.claim_signature)
            if not asked:
                why = "" if self.claim_key is not None else " (this server has no mqtt.decision_signing_key)"
                raise PermissionRefused(
                    "unasked_claim",
                    "claim_signature: expected the server's answer to this door's claim check for this nonce and "
                    f"subject{why}",
                )

    def _is_background(self, subject: str) -> bool:
        return bool(self.background_prefix) and subject.startswith(self.background_prefix)

    def check(self, msg: template_pb2.PerturbedTemplate, sender: Sender) -> ValidTemplate:
        """Validate then authorise (validation first: its message names the malformed field).

        The template returned records how it arrived (``transport``, ``sent_by``): its ledger row keeps that,
        so the console tells a device's own releases from what the administrator sent in its name.
        """
        valid = self.validator.validate(msg)
        self.authorise(msg, sender)
        return replace(valid, transport=sender.transport, sent_by=sender.sent_by)

    # ------------------------------------------------------------ ingest

    def ingest(
        self,
        msgs: Sequence[bytes | template_pb2.PerturbedTemplate | Undecodable],
        transport: str,
        senders: Sequence[Sender] | Sender,
        *,
        recognise: bool = True,
    ) -> list[Outcome]:
        """Ingest a batch; one outcome per message, in order.

        Parameters
        ----------
        msgs : sequence of bytes, PerturbedTemplate or Undecodable, length n
            Raw payloads as they arrived (MQTT: decoded here, size-bounded, then validated), or messages a
            transport's framing already parsed (gRPC; :class:`Undecodable` where that parse failed).
        transport : str
            ``mqtt`` or ``grpc``, for the metrics.
        senders : Sender or sequence of n Sender
            Who delivered each (one for the whole batch, as on a gRPC stream).

        Returns
        -------
        list of n Outcome
            Accepted, duplicate, or rejected with the reason's code and text.
        """
        n = len(msgs)
        outcomes: list[Outcome | None] = [None] * n
        valid: list[ValidTemplate] = []
        where: list[int] = []
        rejected: Counter[str] = Counter()
        for i, item in enumerate(msgs):
            sender = senders if isinstance(senders, Sender) else senders[i]
            if isinstance(item, Undecodable):
                rejected["malformed"] += 1
                outcomes[i] = Outcome("", REJECTED, str(item), "malformed")
                continue
            msg: template_pb2.PerturbedTemplate | None = None
            try:
                msg = self.validator.decode(bytes(item)) if isinstance(item, bytes | bytearray | memoryview) else item
                v = self.check(msg, sender)
            except Rejection as exc:
                rejected[exc.reason] += 1
                outcomes[i] = Outcome("" if msg is None else msg.message_id[:128], REJECTED, str(exc), exc.reason)
                continue
            valid.append(v)
            where.append(i)
        stored = self.store_valid(valid, recognise=recognise)
        accepted = 0
        for i, v, new in zip(where, valid, stored, strict=True):
            outcomes[i] = Outcome(v.message.message_id, ACCEPTED if new else DUPLICATE)
            accepted += new
        self.metrics.count_ingest(transport, accepted, len(valid) - accepted, dict(rejected))
        return [o for o in outcomes if o is not None]

    def store_valid(self, valid: Sequence[ValidTemplate], *, recognise: bool = True) -> list[bool]:
        """Take validated templates in one transaction; True per template taken now, False per duplicate.

        A template whose ``(device_id, message_id)`` the ledger holds (or that
        the batch repeats) is a duplicate: it is neither decided nor written
        again. The new identify/verify ones are decided in memory before the
        commit (``recognise``), their decisions committed with the ledger
        entries and published after it.
        """
        if not valid:
            return []
        now = self.clock()
        ledger = [
            LedgerEntry.from_message(v.message, received_at=now, transport=v.transport, sent_by=v.sent_by)
            for v in valid
        ]
        known = self.store.seen([e.key for e in ledger])
        fresh: list[int] = []
        taken: set[tuple[str, str]] = set()
        for i, e in enumerate(ledger):
            if e.key not in known and e.key not in taken:
                taken.add(e.key)
                fresh.append(i)
        templates = [
            TemplateRecord.from_message(valid[i].message, valid[i].values, received_at=now)
            for i in fresh
            if valid[i].purpose == "enroll"
        ]
        decided = [_Decided(i, valid[i]) for i in fresh if valid[i].purpose in ("identify", "verify")]
        if recognise and decided:
            self._decide([d for d in decided if not d.valid.is_decision])
        for d in decided:
            if d.valid.is_decision:  # made by the device: recorded whatever `recognise` says
                self._device_decision(d)
        decisions = [DecisionRecord.from_event(d.event, origin=self.origin) for d in decided if d.event is not None]
        kept = [
            TemplateRecord.from_message(
                d.valid.message, d.valid.values, received_at=now, decided_subject=d.recognised_as
            )
            for d in decided
            if self._keeps(d)
        ]
        tracks: list[TrackRelease] = []
        if recognise and self.tracks.shared:  # replicas only: a single server's own memory is complete
            remembered = [d.valid for d in decided if d.valid.purpose == "identify" and not d.valid.is_decision]
            tracks = self.tracks.memory_rows([v.message for v in remembered], [v.values for v in remembered], now)
        new = self.store.commit_ingest(IngestBatch(ledger, [*templates, *kept], decisions, tracks))
        published = 0
        for d in decided:
            if d.event is not None and new[d.index]:
                self._publish(d.event, d.valid.purpose)
                published += 1
        if published:
            self.events.committed()
        return new

    def _keeps(self, d: _Decided) -> bool:
        if d.valid.is_decision:
            return False  # a decision has no template to keep
        if self.keep == "all":
            return True
        return self.keep == "recognised" and d.recognised_as is not None

    def _decide(self, decided: Sequence[_Decided]) -> None:
        """Fill in each template's decision (its event and whom it recognised); undecided without a model."""
        try:
            model = self.recogniser.require_model()
        except ModelUnavailable:
            return
        ok: list[_Decided] = []
        for d in decided:
            try:
                self.recogniser.check_compatible(d.valid.message.bundle_id, d.valid.kind, key_id=d.valid.message.key_id)
            except ModelMismatch as exc:
                # Left undecided (no event), counted so an operator sees e.g. a camera still on an old key.
                self.metrics.undecided.labels(exc.field).inc()
                continue
            ok.append(d)
        if not ok:
            return
        X = np.stack([d.valid.values for d in ok])
        ident = [i for i, d in enumerate(ok) if d.valid.purpose == "identify"]
        ver = [i for i, d in enumerate(ok) if d.valid.purpose == "verify"]
        if ident:
            results = self.tracks.identify(X[ident], [ok[i].valid.message for i in ident], model)
            for i, r in zip(ident, results, strict=True):
                ok[i].recognised_as = None if r.unknown else r.subject
                ok[i].event = self.decision_event(
                    ok[i].valid,
                    subject=r.subject,
                    unknown=r.unknown,
                    probability=r.probability,
                    model_version=r.model_version,
                    releases_fused=r.releases_fused,
                )
        if ver:
            verdicts = self.recogniser.verify_batch(X[ver], [ok[i].valid.message.subject for i in ver], model=model)
            for i, v in zip(ver, verdicts, strict=True):
                msg = ok[i].valid.message
                ok[i].recognised_as = msg.subject if v.accepted else None
                ok[i].event = self.decision_event(
                    ok[i].valid,
                    claimed_subject=msg.subject,
                    accepted=v.accepted,
                    probability=v.score,
                    model_version=v.model_version,
                )

    def _device_decision(self, d: _Decided) -> None:
        """The event of a device's decision: its label's subject (unknown if erased since), or a door's record."""
        v = d.valid
        msg, issued, dec = v.message, v.device_model, v.message.decision
        if issued is None:  # opened at another's request (decision.requested_by): it names nobody
            d.event = self.decision_event(
                v, accepted=True, probability=0.0, decided_on="device", requested_by=dec.requested_by
            )
            return
        fields: dict[str, Any] = {
            "model_version": issued.model_version,
            "decided_on": "device",
            "epsilon_label": float(dec.epsilon_label),
            "model_serial": int(issued.serial),
        }
        if v.purpose == "identify":
            subject = v.label_subject
            if subject:
                erased = self.recogniser.erased_at(subject)
                if erased is not None and erased >= issued.trained_at:
                    subject = ""  # erased since the model was trained: the label names nobody now
            d.recognised_as = subject or None
            d.event = self.decision_event(
                v, subject=subject, unknown=not subject, probability=0.0, releases_fused=1, **fields
            )
        else:
            d.recognised_as = msg.subject if dec.accepted else None
            d.event = self.decision_event(
                v, claimed_subject=msg.subject, accepted=bool(dec.accepted), probability=0.0, **fields
            )

    def decision_event(
        self, v: ValidTemplate, *, purpose: int | None = None, **fields: object
    ) -> recognition_pb2.RecognitionEvent:
        """The event of a decision on ``v``; ``purpose``: what was done, when not the template's own purpose.

        It carries ids, the decision, its probability and the model version: never a template value or a
        soft trait, and for an unknown identification no subject.
        """
        msg = v.message
        fields.setdefault("decided_on", "server")
        if msg.purpose == template_pb2.PURPOSE_VERIFY and fields["decided_on"] == "server" and purpose is None:
            # The door acts only on the decision on its own template: the event names which one was decided.
            fields.setdefault("template_sha256", wire.template_digest(msg))
        return new_event(
            site=msg.site,
            device_id=msg.device_id,
            message_id=msg.message_id,
            track_id=msg.track_id,
            purpose=msg.purpose if purpose is None else purpose,
            **fields,
        )

    def _publish(self, ev: recognition_pb2.RecognitionEvent, purpose: str) -> None:
        self.events.publish(ev)
        self.metrics.events.labels(purpose).inc()

    def record_release(self, v: ValidTemplate) -> None:
        """Count a template decided outside ingest (the Identify, Verify and VerifyFused calls) in the ledger.

        Its ledger row (ids, times, ε, how it arrived; never its values) is queued with the calls' decisions
        and written within :attr:`DecisionWriter.interval`, off the call's path, so that a door's VERIFY
        release is counted on the console like any camera's. Idempotent: a ``(device_id, message_id)`` the
        ledger holds (a camera's template verified again against a claim, a retried call) adds nothing.
        """
        self.decisions.put_ledger(
            LedgerEntry.from_message(v.message, received_at=self.clock(), transport=v.transport, sent_by=v.sent_by)
        )

    def record_decision(self, v: ValidTemplate, *, purpose: int | None = None, **fields: object) -> None:
        """Keep and publish a decision made outside ingest (the Identify call; ``v`` is not kept)."""
        ev = self.decision_event(v, purpose=purpose, **fields)
        self.decisions.put(DecisionRecord.from_event(ev, origin=self.origin))
        self._publish(ev, v.purpose)

    def keep_decision_now(self, v: ValidTemplate, *, purpose: int | None = None, **fields: object) -> None:
        """Write a decision, and its template's ledger row, before the caller hears it; then publish it.

        For the Verify call: a door drives its lock on the answer, so the decision that opened it is in the
        database before the answer leaves (the queued writer would lose it to a crash within its interval, or
        to the database being away). Raises what the store raises; the call then fails and the door stays
        locked.
        """
        ev = self.decision_event(v, purpose=purpose, **fields)
        msg = v.message
        row = LedgerEntry.from_message(msg, received_at=self.clock(), transport=v.transport, sent_by=v.sent_by)
        self.store.commit_ingest(IngestBatch([row]))
        self.store.add_decisions([DecisionRecord.from_event(ev, origin=self.origin)])
        if self.decisions.on_written is not None:
            self.decisions.on_written()  # the events' reader: a StreamEvents subscriber hears of it now
        self._publish(ev, v.purpose)

    def close(self) -> None:
        """Write the queued decisions (before the store closes)."""
        self.decisions.close()
