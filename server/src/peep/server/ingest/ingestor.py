"""Ingest: validate, authorise, store (idempotently), recognise, publish events.

Shared by the gRPC handlers and the MQTT consumer. Work is batched: a batch
of templates costs one database transaction and one onnxruntime call for the
identify/verify templates in it, which is what lets a 2-core box take
thousands of templates per second.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from peep.server.ingest.auth import DeviceRegistry, Identity, Undecodable
from peep.server.ingest.events import EventBus, new_event
from peep.server.ingest.validation import Rejection, TemplateValidator, ValidTemplate
from peep.server.metrics import ServerMetrics
from peep.server.recognition.fusion import TrackFusion
from peep.server.recognition.recogniser import ModelMismatch, ModelUnavailable, Recogniser
from peep.server.storage import Store, TemplateRecord
from peep.v1 import recognition_pb2, template_pb2

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class Sender:
    """Who delivered a template: an authenticated gRPC identity or an MQTT topic."""

    identity: Identity | None = None
    topic_site: str | None = None
    topic_device: str | None = None


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
    fusion : TrackFusion or None
        A track's releases decided together; None: each release alone.
    background_prefix : str
        Subjects with this prefix form the "unknown" class: only an admin
        may enrol templates under them (``training.background_prefix``).
    recall_tracks : bool
        Look a track's earlier release up in the store when this process
        does not remember one (replicas share the database but not their
        memory: another replica may have taken it). Clustered servers only.
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
        fusion: TrackFusion | None = None,
        background_prefix: str = "background:",
        recall_tracks: bool = False,
    ) -> None:
        self.store = store
        self.validator = validator
        self.recogniser = recogniser
        self.events = events
        self.metrics = metrics
        self.devices = devices
        self.require_registered_device = require_registered_device
        self.clock = clock
        #: A track's releases decided together (recognition/fusion.py); None: each release alone.
        self.fusion = fusion
        self.background_prefix = background_prefix
        self.recall_tracks = recall_tracks

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
            return
        raise PermissionRefused("unauthenticated", "sender: expected an authenticated device")

    def _is_background(self, subject: str) -> bool:
        return bool(self.background_prefix) and subject.startswith(self.background_prefix)

    def check(self, msg: template_pb2.PerturbedTemplate, sender: Sender) -> ValidTemplate:
        """Validate then authorise (validation first: its message names the malformed field)."""
        valid = self.validator.validate(msg)
        self.authorise(msg, sender)
        return valid

    # ------------------------------------------------------------ ingest

    def ingest(
        self,
        msgs: Sequence[template_pb2.PerturbedTemplate],
        transport: str,
        senders: Sequence[Sender] | Sender,
        *,
        recognise: bool = True,
    ) -> list[Outcome]:
        """Ingest a batch; one outcome per message, in order."""
        n = len(msgs)
        outcomes: list[Outcome | None] = [None] * n
        valid: list[ValidTemplate] = []
        where: list[int] = []
        rejected: Counter[str] = Counter()
        for i, msg in enumerate(msgs):
            sender = senders if isinstance(senders, Sender) else senders[i]
            if isinstance(msg, Undecodable):
                rejected["malformed"] += 1
                outcomes[i] = Outcome("", REJECTED, str(msg), "malformed")
                continue
            try:
                v = self.check(msg, sender)
            except Rejection as exc:
                rejected[exc.reason] += 1
                outcomes[i] = Outcome(msg.message_id[:128], REJECTED, str(exc), exc.reason)
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
        """Insert validated templates (one transaction); recognise the new identify/verify ones."""
        if not valid:
            return []
        now = self.clock()
        records = [TemplateRecord.from_message(v.message, v.values, received_at=now) for v in valid]
        stored = self.store.insert_templates(records)
        if recognise:
            todo = [v for v, new in zip(valid, stored, strict=True) if new and v.purpose in ("identify", "verify")]
            if todo:
                self.recognise(todo)
        return stored

    def recognise(self, valid: Sequence[ValidTemplate]) -> None:
        """Identify/verify ingested templates in one batch and publish events."""
        try:
            model = self.recogniser.require_model()
        except ModelUnavailable:
            return
        ok = []
        for v in valid:
            try:
                self.recogniser.check_compatible(v.message.bundle_id, v.kind)
            except ModelMismatch:
                continue
            ok.append(v)
        if not ok:
            return
        X = np.stack([v.values for v in ok])
        ident = [i for i, v in enumerate(ok) if v.purpose == "identify"]
        ver = [i for i, v in enumerate(ok) if v.purpose == "verify"]
        if ident:
            if self.fusion is not None:
                keys = [
                    (ok[i].message.site, ok[i].message.device_id, ok[i].message.track_id)
                    if ok[i].message.track_id
                    else None
                    for i in ident
                ]
                recall = None
                if self.recall_tracks:
                    recall = self._recaller([ok[i].message for i in ident], model.n_components)
                results = self.recogniser.identify_tracks(X[ident], keys, self.fusion, model=model, recall=recall)
            else:
                results = self.recogniser.identify_batch(X[ident], top_k=1, model=model)
            for i, r in zip(ident, results, strict=True):
                self._event(
                    ok[i],
                    subject=r.subject,
                    unknown=r.unknown,
                    probability=r.probability,
                    model_version=r.model_version,
                    releases_fused=r.releases_fused,
                )
        if ver:
            m, scores = self.recogniser.verify_scores(X[ver], [ok[i].message.subject for i in ver], model=model)
            for i, s in zip(ver, scores, strict=True):
                msg = ok[i].message
                self._event(
                    ok[i],
                    claimed_subject=msg.subject,
                    accepted=bool(s > m.verify_threshold),
                    probability=float(s),
                    model_version=m.version,
                )

    def _recaller(
        self, msgs: list[template_pb2.PerturbedTemplate], n_components: int
    ) -> Callable[[list[int]], dict[int, np.ndarray]]:
        """``recall(rows)``: for each row, the values of its track's latest earlier release in the store."""

        def recall(rows: list[int]) -> dict[int, np.ndarray]:
            assert self.fusion is not None
            asked = [msgs[i] for i in rows]
            batch = {(m.device_id, m.message_id) for m in msgs}
            try:
                found = self.store.track_releases(
                    [(m.device_id, m.track_id) for m in asked], since=self.clock() - self.fusion.ttl_s
                )
            except Exception as exc:  # the database: decide on each release alone rather than fail it
                log.warning("track recall failed; deciding alone", extra={"error": str(exc)[:200]})
                return {}
            by_track: dict[tuple[str, str], list[tuple[str, str, str, str, str, float, int, bytes]]] = {}
            for r in found:
                by_track.setdefault((r[0], r[1]), []).append(r)
            out: dict[int, np.ndarray] = {}
            for i, m in zip(rows, asked, strict=True):
                at = m.capture_time.seconds + m.capture_time.nanos * 1e-9
                earlier = [
                    r
                    for r in by_track.get((m.device_id, m.track_id), [])
                    if (r[0], r[2]) not in batch and r[3] == m.site and r[4] == m.bundle_id
                    and r[6] == n_components and r[5] < at
                ]  # fmt: skip
                if earlier:
                    out[i] = np.frombuffer(max(earlier, key=lambda r: r[5])[7], dtype=np.float32)
            return out

        return recall

    def _event(self, v: ValidTemplate, *, purpose: int | None = None, **fields: object) -> None:
        """Publish the recognition of ``v``; ``purpose``: what was done, when not the template's own purpose."""
        msg = v.message
        ev = new_event(
            site=msg.site,
            device_id=msg.device_id,
            message_id=msg.message_id,
            track_id=msg.track_id,
            purpose=msg.purpose if purpose is None else purpose,
            **fields,
        )
        self.events.publish(ev)
        self.metrics.events.labels(v.purpose).inc()
