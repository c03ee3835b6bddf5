"""The gRPC API (``peep.v1.RecognitionService``) and :func:`create_server`.

Status codes: invalid input -> ``INVALID_ARGUMENT`` with the validation
message (it names the field, the expectation and the value); missing or bad
credentials -> ``UNAUTHENTICATED``; a device sending another device's
template, or a device calling an admin method -> ``PERMISSION_DENIED``; no
model yet, or a template of another bundle/domain than the model's ->
``FAILED_PRECONDITION``; a training already running -> ``ABORTED``; a claimed
subject the serving model does not know, an unknown bundle, or no device model
for a bundle and site key -> ``NOT_FOUND``; over a stream limit or a device
call's rate (claim checks, reports, device models) -> ``RESOURCE_EXHAUSTED``; a
``StreamEvents`` resuming after a seq the server never gave ->
``OUT_OF_RANGE``.
Handlers never let an exception escape as ``UNKNOWN``: anything unexpected is
logged and answered ``INTERNAL``, and the server keeps serving.

Every request field is bounded where it enters, before any other work
(identifiers by :data:`~peep.core.wire.ID_PATTERN`, subjects by
:func:`~peep.core.wire.check_subject_id`, counts by configured limits), and an
error message quotes at most 64 characters of what it received.

Streaming RPCs run on threads of their own within per-caller and global
limits and end when idle (:mod:`peep.server.transport.limits`), so open
streams cannot starve unary calls. ``StreamEvents`` shows a device only the
events of its registered site (``grpc.device_events``); an admin sees all.
Its events come from the database's log of decisions, each with its ``seq``:
a client that lost its stream (its replica gone behind a balancer) calls
again with ``after_seq`` and receives what it missed, once, in order.

``IngestStream`` commits every ``grpc.stream_batch`` templates in one
transaction and acknowledges each message id in the summary (ACCEPTED,
DUPLICATE, or REJECTED with the reason). Acks are final only once the summary
arrives: a client that loses the stream resends, and ingest is idempotent.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from functools import wraps
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from peep.core.exceptions import BundleError
from peep.core.wire import ID_PATTERN, check_subject_id
from peep.server import startup
from peep.server.bundles.catalog import bundle_files_message, files_from_message
from peep.server.config import ServerConfig
from peep.server.errors import quote
from peep.server.ingest.auth import HEALTH_PREFIXES, REFLECTION_PREFIXES, AuthInterceptor, current_identity
from peep.server.ingest.events import OLDEST_SEQ_KEY, SeqAhead
from peep.server.ingest.ingestor import REJECTED, PermissionRefused, Sender
from peep.server.ingest.reports import ReportTooFrequent
from peep.server.ingest.validation import Rejection
from peep.server.rates import CallsTooFrequent
from peep.server.recognition.claims import ClaimChecksTooFrequent
from peep.server.recognition.devicemodels import NoDeviceModel, check_model_request
from peep.server.recognition.presets import PRESETS, TrainingError
from peep.server.recognition.recogniser import ModelMismatch, ModelUnavailable
from peep.server.recognition.trainer import TrainingBusy
from peep.server.services import NoSuchSubject, Services
from peep.server.storage import template_keys
from peep.server.storage.interface import is_database_outage
from peep.server.transport.limits import StreamLimiter, server_options
from peep.v1 import qbbs_pb2, recognition_pb2, recognition_pb2_grpc, template_pb2

__all__ = ["create_server"]

log = logging.getLogger(__name__)

SERVICE_NAME = "peep.v1.RecognitionService"
F = TypeVar("F", bound=Callable[..., Any])
#: Longest status message sent (a safety net: messages quote at most 64 characters of input anyway).
MAX_DETAILS = 1_000
#: Files a published bundle may have, and their names.
MAX_BUNDLE_FILES = 16
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ID_EXPECTATION = "1-128 characters [A-Za-z0-9_.:@-] starting with a letter or digit"


class NotFound(Exception):
    """What the request names does not exist (a claimed subject, a bundle): ``NOT_FOUND``."""


def _details(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "... (cut)"


def _guard(fn: F) -> F:
    """Map exceptions to status codes; never leak a traceback to the client."""

    @wraps(fn)
    def wrapper(self: RecognitionServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except PermissionRefused as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, _details(exc))
        except (ModelUnavailable, ModelMismatch) as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, _details(exc))
        except TrainingBusy as exc:
            context.abort(grpc.StatusCode.ABORTED, _details(exc))
        except (ReportTooFrequent, ClaimChecksTooFrequent, CallsTooFrequent) as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _details(exc))
        except (NotFound, NoDeviceModel) as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, _details(exc))
        except (Rejection, BundleError, TrainingError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _details(exc))
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError" or context.code() is not None:
                raise
            if is_database_outage(exc):  # restarting or away: the caller may call again (the text stays here)
                log.warning("handler: the database did not answer", extra={"method": fn.__name__,
                                                                           "error": str(exc)[:200]})  # fmt: skip
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              f"{fn.__name__}: the server's database did not answer; call again")  # fmt: skip
            log.exception("handler failed", extra={"method": fn.__name__})
            context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error ({type(exc).__name__})")

    return wrapper  # type: ignore[return-value]


class RecognitionServicer(recognition_pb2_grpc.RecognitionServiceServicer):
    """Implementation of every RecognitionService RPC on :class:`Services`."""

    def __init__(self, services: Services, *, stopping: Callable[[], bool] = lambda: False) -> None:
        self.s = services
        self.cfg = services.config.grpc
        self._stopping = stopping

    def _sender(self) -> Sender:
        return Sender(identity=current_identity())

    # ------------------------------------------------------------ ingest

    @_guard
    def Ingest(
        self, request: template_pb2.PerturbedTemplate, context: grpc.ServicerContext
    ) -> recognition_pb2.IngestAck:
        sender = self._sender()
        try:
            valid = self.s.ingestor.check(request, sender)
        except Rejection as exc:
            self.s.metrics.count_ingest("grpc", 0, 0, {exc.reason: 1})
            raise
        new = self.s.ingestor.store_valid([valid])[0]
        self.s.metrics.count_ingest("grpc", int(new), int(not new), {})
        status = recognition_pb2.INGEST_STATUS_ACCEPTED if new else recognition_pb2.INGEST_STATUS_DUPLICATE
        return recognition_pb2.IngestAck(message_id=request.message_id, status=status)

    @_guard
    def IngestStream(
        self, request_iterator: Iterator[template_pb2.PerturbedTemplate], context: grpc.ServicerContext
    ) -> recognition_pb2.IngestSummary:
        sender = self._sender()
        summary = recognition_pb2.IngestSummary()
        batch: list[template_pb2.PerturbedTemplate] = []
        n = 0

        def flush() -> None:
            if not batch:
                return
            for o in self.s.ingestor.ingest(batch, "grpc", sender):
                summary.acks.append(o.ack())
                if o.status == REJECTED:
                    summary.rejected += 1
                elif o.status == recognition_pb2.INGEST_STATUS_DUPLICATE:
                    summary.duplicates += 1
                else:
                    summary.accepted += 1
            batch.clear()

        for msg in request_iterator:
            n += 1
            if n > self.cfg.max_stream_messages:
                flush()
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"stream: expected at most {self.cfg.max_stream_messages} templates per IngestStream call; "
                    f"{summary.accepted} accepted so far (resend the rest on a new stream; ingest is idempotent)",
                )
            batch.append(msg)
            if len(batch) >= self.cfg.stream_batch:
                flush()
        flush()
        return summary

    # ------------------------------------------------------------ recognition

    def _valid(self, template: template_pb2.PerturbedTemplate, context: grpc.ServicerContext) -> Any:
        if not template.ByteSize():
            raise Rejection("missing_template", "template: expected a PerturbedTemplate, received none")
        if template.HasField("decision"):
            raise Rejection(
                "decision_not_a_query",
                "template: expected a perturbed template to decide on, received a device's decision (send it with "
                "Ingest or IngestStream)",
            )
        valid = self.s.ingestor.check(template, self._sender())
        # Counted like an ingested release (a door's claim is one), whether or not it can be decided below.
        self.s.ingestor.record_release(valid)
        self.s.recogniser.check_compatible(template.bundle_id, valid.kind, key_id=template.key_id)
        return valid

    @_guard
    def Identify(
        self, request: recognition_pb2.IdentifyRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.IdentifyResponse:
        t0 = time.perf_counter()
        valid = self._valid(request.template, context)
        top_k = request.top_k or 5
        if top_k > 1000:
            raise ValueError(f"top_k: expected at most 1000, received {top_k}")
        r = self.s.recogniser.identify(valid.values, top_k=top_k)
        resp = recognition_pb2.IdentifyResponse(subject=r.subject, unknown=r.unknown, model_version=r.model_version)
        for name, p in r.candidates:
            resp.candidates.add(subject=name, probability=p)
        self.s.metrics.identify_latency.observe(time.perf_counter() - t0)
        # The decision is kept and published; the template is not kept (decide, then forget).
        self.s.ingestor.record_decision(
            valid,
            subject=r.subject,
            unknown=r.unknown,
            probability=r.probability,
            model_version=r.model_version,
            releases_fused=1,  # the Identify call decides on this template alone
        )
        return resp

    @_guard
    def Verify(
        self, request: recognition_pb2.VerifyRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.VerifyResponse:
        # The claim is bounded before anything else is done with the request.
        if request.claimed_subject:
            claimed = check_subject_id(request.claimed_subject, "claimed_subject")
        elif request.template.subject:
            claimed = check_subject_id(request.template.subject, "template.subject")
        else:
            raise ValueError("claimed_subject: expected the subject being claimed, received none")
        valid = self._valid(request.template, context)
        m = self.s.recogniser.require_model()
        if claimed not in m.class_index or self.s.recogniser.is_masked(claimed, m):
            raise NotFound(
                f"claimed_subject: expected a subject enrolled in the serving model {m.version}, received {claimed!r}"
            )
        v = self.s.recogniser.verify(valid.values, claimed)
        # A verification, whatever purpose the template was released for (a camera's identify template
        # may be checked against a claim): the claim and the decision are kept, the template is not. Kept
        # before the answer: a door acts on it, and an access decision nobody recorded is not answered.
        try:
            self.s.ingestor.keep_decision_now(
                valid,
                purpose=template_pb2.PURPOSE_VERIFY,
                claimed_subject=claimed,
                accepted=v.accepted,
                probability=v.score,
                model_version=v.model_version,
            )
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("Verify: the decision could not be kept", extra={"error": str(exc)[:200]})
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "Verify: the server's database did not answer, so the decision could not be kept; call again",
            )
        return recognition_pb2.VerifyResponse(
            accepted=v.accepted,
            score=v.score,
            threshold=v.threshold,
            target_far=v.target_far,
            model_version=v.model_version,
        )

    @_guard
    def CheckClaim(
        self, request: recognition_pb2.CheckClaimRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.CheckClaimResponse:
        claimed = check_subject_id(request.claimed_subject, "claimed_subject")
        identity = current_identity()
        answer = self.s.claim_checks.check(identity.name if identity is not None else "", claimed)
        return recognition_pb2.CheckClaimResponse(known=answer.known, model_version=answer.model_version)

    @_guard
    def ReportDevice(
        self, request: recognition_pb2.DeviceReportRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.DeviceReportAck:
        at = self.s.device_reports.accept(current_identity(), request.device_id, request.site, request.report)
        return recognition_pb2.DeviceReportAck(received_at=at)

    @_guard
    def GetDeviceModel(
        self, request: recognition_pb2.GetDeviceModelRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.DeviceModelFiles:
        # Any registered device (a camera or a door deciding itself) and admins: the interceptor authenticated
        # the caller. Bounded before the rate is spent, so a malformed ask costs the caller its answer only.
        check_model_request(request.bundle_id, request.key_id)
        identity = current_identity()
        self.s.device_model_requests.admit(identity.name if identity is not None else "")
        # The class key turns a badge's subject into its column, so whoever holds it can test names: it goes
        # to the doors registered as such and to admins, never to cameras or over the broker's model topic.
        doorkeeper = identity is not None and (identity.is_admin or self.s.devices.is_door(identity.name))
        payload = self.s.device_models.answer(request.bundle_id, request.key_id, int(request.have_serial),
                                              with_class_key=doorkeeper)  # fmt: skip
        return recognition_pb2.DeviceModelFiles.FromString(payload)

    # ------------------------------------------------------------ admin

    @_guard
    def EnrolSubject(
        self, request: recognition_pb2.EnrolSubjectRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.EnrolSubjectResponse:
        from peep.core.wire import check_subject_id

        n_items = len(request.templates) + len(request.message_ids)
        if n_items > self.cfg.max_stream_messages:
            raise ValueError(
                f"templates, message_ids: expected at most {self.cfg.max_stream_messages} together "
                f"(grpc.max_stream_messages), received {n_items}"
            )
        subject = check_subject_id(request.subject, "subject")  # WireError -> INVALID_ARGUMENT (_guard)
        for i, t in enumerate(request.templates):
            if t.purpose != template_pb2.PURPOSE_ENROLL or t.subject != subject:
                raise ValueError(
                    f"templates[{i}]: expected purpose ENROLL and subject {subject!r}, received purpose {t.purpose} "
                    f"and subject {t.subject[:64]!r}"
                )
        keys = template_keys(self.s.store, request.message_ids)  # (device_id, message_id): unique per device
        if request.message_ids and not keys:
            keep = self.s.config.recognition.keep
            raise NotFound(
                f"message_ids: expected stored templates, received {len(request.message_ids)} id(s) of which none is "
                f"stored (identify and verify templates are decided, then forgotten unless recognition.keep keeps "
                f"them; it is {keep!r}): send the person's ENROLL templates instead"
            )
        if request.templates:
            outcomes = self.s.ingestor.ingest(list(request.templates), "grpc", self._sender(), recognise=False)
            bad = [o for o in outcomes if o.status == REJECTED]
            if bad:
                raise Rejection(bad[0].code, f"templates[{outcomes.index(bad[0])}]: {bad[0].reason}")
            keys.extend((t.device_id, o.message_id) for t, o in zip(request.templates, outcomes, strict=True))
        n = self.s.store.relabel(keys, subject) if keys else 0
        return recognition_pb2.EnrolSubjectResponse(subject=subject, templates=n)

    @_guard
    def Train(
        self, request: recognition_pb2.TrainRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.TrainResponse:
        preset = request.preset or None
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, received {quote(preset)}")
        if request.background:
            started = self.s.trainer.start_background(preset)
            if not started:
                raise TrainingBusy("a training run is already in progress; poll GetModelStatus")
            m = self.s.recogniser.model
            return recognition_pb2.TrainResponse(model_version=m.version if m else "", started=True)
        r = self.s.trainer.train(preset)
        return recognition_pb2.TrainResponse(
            model_version=r.version,
            started=True,
            validation_accuracy=r.validation_accuracy,
            n_templates=r.n_templates,
            n_subjects=r.n_subjects,
        )

    @_guard
    def GetModelStatus(
        self, request: recognition_pb2.ModelStatusRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.ModelStatus:
        m = self.s.recogniser.model
        st = recognition_pb2.ModelStatus(
            training=self.s.trainer.training,
            training_progress=self.s.trainer.progress if self.s.trainer.training else 0.0,
        )
        if m is not None:
            st.model_version = m.version
            st.trained_at.FromNanoseconds(int(m.trained_at * 1e9))
            st.n_subjects = m.n_subjects
            st.n_templates = int(m.meta.get("n_templates", 0))
            st.validation_accuracy = float(m.meta.get("metrics", {}).get("validation_accuracy", 0.0))
            st.unknown_threshold = m.unknown_threshold
            st.verify_threshold = m.verify_threshold
            st.bundle_id = m.bundle_id
        else:
            b = self.s.bundles.current()
            st.bundle_id = b.bundle_id if b else ""
        dm = self.s.device_models.status()
        if dm["newest"] is not None:
            st.device_model_serial = dm["newest"].serial
        st.device_models_status = (dm["disabled_reason"] or dm["last_error"] or "")[:MAX_DETAILS]
        return st

    @_guard
    def EraseSubject(
        self, request: recognition_pb2.EraseSubjectRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.EraseSubjectResponse:
        subject = check_subject_id(request.subject, "subject")
        try:
            r = self.s.erase_subject(subject, retrain=request.retrain)
        except NoSuchSubject as exc:
            raise NotFound(str(exc)) from None
        return recognition_pb2.EraseSubjectResponse(
            templates_deleted=r.templates_deleted,
            soft_traits_deleted=r.soft_traits_deleted,
            model_version=r.model_version,
        )

    # ------------------------------------------------------------ bundles

    @_guard
    def GetBundle(
        self, request: recognition_pb2.GetBundleRequest, context: grpc.ServicerContext
    ) -> recognition_pb2.BundleFiles:
        if request.bundle_id and not ID_PATTERN.match(request.bundle_id):
            raise ValueError(
                f"bundle_id: expected '' (the current bundle) or a bundle id of {_ID_EXPECTATION}, "
                f"received {quote(request.bundle_id)}"
            )
        b = self.s.bundles.get(request.bundle_id) if request.bundle_id else self.s.bundles.current()
        if b is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"bundle_id: expected a published bundle, received {request.bundle_id!r}"
                if request.bundle_id
                else "no bundle published yet",
            )
            return recognition_pb2.BundleFiles()  # not reached: abort raises
        return bundle_files_message(b)

    @_guard
    def PublishBundle(
        self, request: recognition_pb2.BundleFiles, context: grpc.ServicerContext
    ) -> recognition_pb2.PublishBundleResponse:
        if request.bundle_id and not ID_PATTERN.match(request.bundle_id):
            raise ValueError(
                f"bundle_id: expected '' or a bundle id of {_ID_EXPECTATION}, received {quote(request.bundle_id)}"
            )
        if len(request.files) > MAX_BUNDLE_FILES:
            raise ValueError(f"files: expected at most {MAX_BUNDLE_FILES} files, received {len(request.files)}")
        for i, f in enumerate(request.files):
            if not _FILE_NAME.match(f.name):
                raise ValueError(
                    f"files[{i}].name: expected a file name of 1-128 characters [A-Za-z0-9_.-] starting with a letter "
                    f"or digit, received {quote(f.name)}"
                )
        b = self.s.bundles.publish(files_from_message(request))
        if request.bundle_id and request.bundle_id != b.bundle_id:
            log.warning("published bundle id differs from the request's", extra={"bundle_id": b.bundle_id})
        return recognition_pb2.PublishBundleResponse(bundle_id=b.bundle_id)

    # ------------------------------------------------------------ events

    @_guard
    def StreamEvents(
        self, request: recognition_pb2.StreamEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[recognition_pb2.RecognitionEvent]:
        site, device_id = self._event_scope(request.site)  # checked here, before the stream starts
        after = int(request.after_seq)
        try:
            oldest = self.s.events.first_seq() if after else 0  # before subscribing: a failure leaves nothing open
            sub = self.s.events.subscribe(site, device_id=device_id, after_seq=after)
        except SeqAhead as exc:
            context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"{exc}; resume from the last seq this server sent, or 0 for events from now on",
            )
        except Exception as exc:  # the database (StoreError, or the driver's own error mid-query)
            # The details stay in the log: a driver's message can name hosts, a DSN its password.
            log.warning("StreamEvents: the database did not answer", extra={"error": str(exc)[:200]})
            context.abort(grpc.StatusCode.UNAVAILABLE, "StreamEvents: the server's database did not answer; call again")
        if after:
            # What a resuming client needs to tell "nothing happened" from "it was deleted meanwhile".
            context.send_initial_metadata(((OLDEST_SEQ_KEY, str(oldest)),))
        context.add_callback(sub.close)
        return self._events(sub, context)

    def _event_scope(self, site: str) -> tuple[str, str]:
        """``(site, device_id)`` filter of the events the caller may see (``""`` = any).

        An admin sees every site (or the one asked for). A device sees what
        ``grpc.device_events`` allows: its registered site's events (``site``;
        a device registered without a site sees its own), only its own
        (``device``), or nothing (``none``: PERMISSION_DENIED). Asking for
        another site than its own is PERMISSION_DENIED.
        """
        if site and not ID_PATTERN.match(site):
            raise ValueError(f"site: expected '' or a site id of {_ID_EXPECTATION}, received {quote(site)}")
        ident = current_identity()
        if ident is not None and ident.is_admin:
            return site, ""
        if ident is None or self.cfg.device_events == "none":
            who = "no credentials" if ident is None else f"device {ident.name!r}"
            raise PermissionRefused(
                "events_not_permitted",
                f"StreamEvents: expected an admin credential (grpc.device_events = "
                f"{self.cfg.device_events!r}), received {who}",
            )
        if site and ident.site is not None and site != ident.site:
            raise PermissionRefused(
                "wrong_site",
                f"site: expected '' or {ident.site!r} (the site device {ident.name!r} is registered to), "
                f"received {site!r}",
            )
        if self.cfg.device_events == "site" and ident.site is not None:
            return ident.site, ""
        return site, ident.name

    def _events(self, sub: Any, context: grpc.ServicerContext) -> Iterator[recognition_pb2.RecognitionEvent]:
        try:
            while context.is_active() and not sub.closed and not self._stopping():
                ev = sub.get(timeout=0.25)
                if ev is not None:
                    yield ev
        finally:
            sub.close()


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    # The files pass the checks --validate-config runs (ConfigError naming the key otherwise).
    material = startup.grpc_tls_material(config)
    if material is None:
        return None
    key, cert, ca = material
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def create_server(
    config: ServerConfig,
    services: Services,
    *,
    extra_servicers: Sequence[Callable[[grpc.Server], None]] = (),
    stopping: Callable[[], bool] = lambda: False,
) -> tuple[grpc.Server, int]:
    """Build (not start) the gRPC server; returns ``(server, bound port)``.

    Registers RecognitionService, health checking (``grpc.health.v1``; the
    overall status and ``peep.v1.RecognitionService`` SERVING), ``QbbsService``
    when the services host QBBS (``services.qbbs``) and, when
    ``grpc.reflection`` is not ``off``, reflection. ``extra_servicers`` are
    callables that add more services; they run behind the same interceptors. The health
    servicer is ``server.peep_health`` (call ``enter_graceful_shutdown()`` on
    it at stop), the stream limiter ``server.peep_streams``.
    """
    g = config.grpc
    limiter = StreamLimiter.from_config(services.devices, g, services.metrics)
    public = HEALTH_PREFIXES + (REFLECTION_PREFIXES if g.reflection == "open" else ())
    server = grpc.server(
        # What the limiter does not move to its own threads (unary calls on reader threads, streams on theirs).
        futures.ThreadPoolExecutor(max_workers=g.max_workers, thread_name_prefix="peep-grpc"),
        # Outermost first: streams go to the limiter's own threads and budgets, then authentication.
        interceptors=[
            limiter,
            AuthInterceptor(services.devices, public_prefixes=public, contacts=services.device_contacts),
        ],
        maximum_concurrent_rpcs=g.max_concurrent_streams,
        options=server_options(g),
    )
    recognition_pb2_grpc.add_RecognitionServiceServicer_to_server(  # type: ignore[no-untyped-call]
        RecognitionServicer(services, stopping=stopping), server
    )
    # A blocking Watch runs on the stream threads within the stream limits. The non-blocking one
    # deadlocks enter_graceful_shutdown() when a watcher closes during its broadcast (the server's
    # event thread waits for the servicer's lock, which the broadcast holds while waiting for it).
    health_servicer = health.HealthServicer(experimental_non_blocking=False)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if services.qbbs is not None:
        services.qbbs.add_to(server)
    for add in extra_servicers:
        add(server)
    if g.reflection != "off":
        names = [
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        if services.qbbs is not None:
            names.append(qbbs_pb2.DESCRIPTOR.services_by_name["QbbsService"].full_name)
        reflection.enable_server_reflection(names, server)
    creds = server_credentials(config)
    port = server.add_secure_port(g.listen, creds) if creds is not None else server.add_insecure_port(g.listen)
    if port == 0:
        raise OSError(f"grpc.listen: could not bind {g.listen}")
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    server.peep_health = health_servicer
    server.peep_streams = limiter
    return server, port
