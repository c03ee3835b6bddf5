"""gRPC ``peep.v1.QbbsService`` over a :class:`~peep.server.qbbs.module.QbbsModule`.

:func:`add_qbbs_servicer` registers it on any ``grpc.Server``: the recognition
server hosts it next to ``RecognitionService``
(:meth:`peep.server.qbbs.hosting.HostedQbbs.add_to`), and so can any other::

    module = QbbsModule(load_qbbs_config("server.toml"), face_scores=recogniser_scores)
    add_qbbs_servicer(server, module, admin_token=token)

Authentication: admin RPCs (EnrolSoftTraits, Query, GetOdometer) need the
admin credential. By default the servicer checks the ``authorization:
Bearer <token>`` metadata against ``admin_token`` in constant time; a server
that authenticates in an interceptor passes ``authorize_admin`` instead (a
callable that aborts the context unless the caller is an admin). With
neither, admin RPCs are refused (``PERMISSION_DENIED``). VerifyFused is open
to any caller the server lets through; it spends the claimed subject's ε, so
the odometer bounds what repeated verifications reveal. Its response's
``threshold`` is the one the decision used: calibrated for the module's
``target_far`` (unless the configuration fixes it). Its ``traits`` lists
exactly the observed traits that were used -- queried, charged and summed
into ``fused_score``, each with its weight (> 0) and log-likelihood; an
observed trait whose weight for the claim is 0 is neither queried nor
charged and is omitted (a listed trait with a placeholder likelihood would
be indistinguishable from a real one: proto3 doubles have no "absent"), so
``fused_score = (1 - Σ weight)·log_p_genuine_face + Σ weight·log_likelihood``
over the list and ``epsilon_spent`` is ``len(traits)`` trait values. A hosting server
narrows it with ``check_template`` (called with each VerifyFused template
after its wire validation: the recognition server applies its ingest checks
there, so a device may only submit its own templates) and names callers in
the spend audit log with ``requester``.

Status codes: :class:`~peep.server.qbbs.errors.QbbsError` and
:class:`~peep.core.exceptions.WireError` → ``INVALID_ARGUMENT``;
:class:`UnknownSubjectError` → ``NOT_FOUND``; :class:`OdometerExhaustedError`
→ ``RESOURCE_EXHAUSTED``; no face recogniser → ``FAILED_PRECONDITION``; all
with the error's text.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import grpc
from peep.core.exceptions import BudgetError, WireError
from peep.core.wire import check_soft_traits, template_values, trait_name, validate_template
from peep.server.qbbs.calibration import ObservationNoise
from peep.server.qbbs.errors import (
    FaceScoreUnavailableError,
    QbbsError,
    UnknownSubjectError,
)
from peep.server.qbbs.module import QbbsModule
from peep.v1 import qbbs_pb2, qbbs_pb2_grpc

__all__ = [
    "QbbsServicer",
    "Requester",
    "TemplateCheck",
    "add_qbbs_servicer",
    "observed_from_template",
    "observed_noise_from_template",
]

log = logging.getLogger(__name__)

AdminAuthorizer = Callable[[grpc.ServicerContext, str], None]
#: ``check(context, template)``: raise WireError/QbbsError for a template the
#: server refuses, or abort the context (e.g. ``PERMISSION_DENIED``).
TemplateCheck = Callable[[grpc.ServicerContext, Any], None]
#: ``requester(context) -> str``: who is asking, for the odometer's audit log.
Requester = Callable[[grpc.ServicerContext], str]


#: Longest trait name a request may carry (configured names are short words).
MAX_TRAIT_NAME = 64
#: Longest status message sent (messages quote at most 64 characters of input anyway).
MAX_DETAILS = 1_000


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message if len(message) <= MAX_DETAILS else message[:MAX_DETAILS] + "... (cut)")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


@contextmanager
def _status(context: grpc.ServicerContext) -> Iterator[None]:
    try:
        yield
    except UnknownSubjectError as exc:
        _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
    except BudgetError as exc:
        _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    except FaceScoreUnavailableError as exc:
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except (QbbsError, WireError) as exc:
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def bearer_token_authorizer(token: str | None = None, *, token_sha256: str | None = None) -> AdminAuthorizer:
    """An :data:`AdminAuthorizer` checking ``authorization: Bearer <token>``.

    Give the token itself or the hex SHA-256 of it (as ``server.toml``'s
    ``auth.admin_token_sha256``); compared in constant time.
    """
    if (token is None) == (token_sha256 is None):
        raise ValueError("admin_token: expected exactly one of the token or its SHA-256")
    if token is not None:
        if not token:
            raise ValueError("admin_token: expected a non-empty secret, received ''")
        token_sha256 = hashlib.sha256(token.encode()).hexdigest()
    assert token_sha256 is not None
    expected = token_sha256.strip().lower()
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise ValueError(f"admin_token_sha256: expected 64 hex digits, received {len(expected)} characters")

    def authorize(context: grpc.ServicerContext, method: str) -> None:
        meta = dict(context.invocation_metadata() or ())
        got = str(meta.get("authorization", ""))
        if not got.startswith("Bearer ") or len(got) <= len("Bearer "):
            _abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method}: admin credential required (metadata 'authorization: Bearer <token>')",
            )
        digest = hashlib.sha256(got[len("Bearer ") :].encode()).hexdigest()
        if not hmac.compare_digest(digest, expected):
            _abort(context, grpc.StatusCode.PERMISSION_DENIED, f"{method}: the credential is not the admin's")

    return authorize


def observed_noise_from_template(
    template: Any, module: QbbsModule
) -> tuple[dict[str, float], dict[str, ObservationNoise]]:
    """Observed traits from a template's on-device ``soft_traits`` releases, with their known noise.

    Returns ``(values, noise)``. The edge perturbs age with bounded Laplace
    (value clipped to [0, ``age_max``], scale ``age_max/ε``; ``age_max`` from
    the QBBS config field ``edge_laplace_bounds``) and gender with randomized
    response; the values are clipped into the declared range. The noise's
    variance widens the matcher and the calibration simulates the mechanism.
    Traits this deployment does not configure are ignored.

    Raises
    ------
    QbbsError
        A release ingest would refuse (:func:`peep.core.wire.check_soft_traits`:
        a trait twice, a mechanism other than its own, ε outside
        [``MIN_EPSILON``, ``MAX_SOFT_EPSILON``], a value outside what its
        mechanism can produce), named by field.
    """
    try:
        check_soft_traits(template.soft_traits)
    except WireError as exc:
        raise QbbsError(str(exc)) from None
    values: dict[str, float] = {}
    noise: dict[str, ObservationNoise] = {}
    cfg = module.config
    for rel in template.soft_traits:
        name = trait_name(rel.kind)
        spec = cfg.traits.get(name)
        if spec is None:
            continue
        values[name] = min(max(float(rel.value), spec.lower), spec.upper)
        if rel.mechanism == "randomized-response":
            noise[name] = ObservationNoise.randomized_response(epsilon=rel.epsilon)
        else:
            bound = cfg.edge_laplace_bounds.get(name, spec.upper)
            noise[name] = ObservationNoise.edge_laplace(bound=bound, epsilon=rel.epsilon)
    return values, noise


def observed_from_template(template: Any, module: QbbsModule) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`observed_noise_from_template` with the noise as its variance: ``(values, extra_variance)``.

    Age: ``2·(age_max/ε)²``; gender: ``p(1 - p)`` with ``p = 1/(1 + e^ε)``.
    """
    values, noise = observed_noise_from_template(template, module)
    return values, {t: n.variance for t, n in noise.items()}


def _trait(name: str, field: str) -> str:
    """A request's trait name, bounded before it is looked up or quoted (QbbsError naming ``field``)."""
    if len(name) > MAX_TRAIT_NAME:
        raise QbbsError(
            f"{field}: expected a trait name of at most {MAX_TRAIT_NAME} characters, "
            f"received {name[:MAX_TRAIT_NAME]!r}... ({len(name)} characters)"
        )
    return name


class QbbsServicer(qbbs_pb2_grpc.QbbsServiceServicer):
    """The QbbsService RPCs (see proto/peep/v1/qbbs.proto)."""

    def __init__(
        self,
        module: QbbsModule,
        *,
        authorize_admin: AdminAuthorizer | None = None,
        admin_token: str | None = None,
        admin_token_sha256: str | None = None,
        check_template: TemplateCheck | None = None,
        requester: Requester | None = None,
    ) -> None:
        given = sum(x is not None for x in (authorize_admin, admin_token, admin_token_sha256))
        if given > 1:
            raise ValueError("authorize_admin/admin_token/admin_token_sha256: expected at most one, received several")
        self.module = module
        if admin_token is not None or admin_token_sha256 is not None:
            authorize_admin = bearer_token_authorizer(admin_token, token_sha256=admin_token_sha256)
        self._authorize = authorize_admin
        self._check_template = check_template
        self._requester: Requester = requester if requester is not None else (lambda context: str(context.peer()))

    def _admin(self, context: grpc.ServicerContext, method: str) -> None:
        if self._authorize is None:
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method}: admin RPCs are disabled (no admin credential configured on the server)",
            )
        self._authorize(context, method)

    def EnrolSoftTraits(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._admin(context, "EnrolSoftTraits")
        with _status(context):
            traits: dict[str, float] = {}
            for i, t in enumerate(request.traits):
                _trait(t.trait, f"traits[{i}].trait")
                if t.trait in traits:
                    raise QbbsError(f"traits: expected each trait once, received {t.trait!r} twice")
                traits[t.trait] = t.value
            n = self.module.enrol(request.subject, traits)
        log.info("qbbs: enrolled %d soft traits for %r (by %s)", n, request.subject, self._requester(context))
        return qbbs_pb2.EnrolSoftTraitsResponse(subject=request.subject, traits=n)

    def Query(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._admin(context, "Query")
        with _status(context):
            r = self.module.query(request.subject, _trait(request.trait, "trait"), requester=self._requester(context))
        return qbbs_pb2.QbbsQueryResponse(
            subject=r.subject,
            trait=r.trait,
            value=r.value,
            epsilon_spent=r.epsilon_spent,
            epsilon_total=r.epsilon_total,
        )

    def VerifyFused(self, request: Any, context: grpc.ServicerContext) -> Any:
        with _status(context):
            if request.claimed_subject:  # bounded before anything else is done with the request
                from peep.core.wire import check_subject_id

                check_subject_id(request.claimed_subject, "claimed_subject")
            for i, t in enumerate(request.observed):
                _trait(t.trait, f"observed[{i}].trait")
            if not request.HasField("template"):
                raise QbbsError("template: expected a perturbed face template, received none")
            validate_template(request.template)
            if self._check_template is not None:
                self._check_template(context, request.template)
            claimed = request.claimed_subject or request.template.subject
            if request.template.subject and request.claimed_subject and request.template.subject != claimed:
                raise QbbsError(
                    f"claimed_subject: expected the template's own claim {request.template.subject!r}, "
                    f"received {request.claimed_subject!r}"
                )
            observed, noise = observed_noise_from_template(request.template, self.module)
            seen: set[str] = set()
            for t in request.observed:
                if t.trait in seen:
                    raise QbbsError(f"observed: expected each trait once, received {t.trait!r} twice")
                seen.add(t.trait)
                observed[t.trait] = t.value  # the request's own values take precedence
                noise.pop(t.trait, None)
            r = self.module.verify_template(
                claimed_subject=claimed,
                values=template_values(request.template),
                observed=observed,
                observed_noise=noise,
                template=request.template,
                requester=self._requester(context),
            )
        return qbbs_pb2.QbbsVerifyResponse(
            accepted=r.accepted,
            fused_score=r.fused_score,
            threshold=r.threshold,
            face_score=r.face_score,
            log_p_genuine_face=r.log_p_genuine_face,
            traits=[
                qbbs_pb2.TraitScore(trait=t.trait, log_likelihood=t.log_likelihood, weight=t.weight) for t in r.traits
            ],
            epsilon_spent=r.epsilon_spent,
            epsilon_total=r.epsilon_total,
        )

    def GetOdometer(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._admin(context, "GetOdometer")
        with _status(context):
            reading = self.module.odometer(request.subject)
        return qbbs_pb2.OdometerResponse(
            subject=reading.subject,
            epsilon_spent=reading.epsilon_spent,
            epsilon_cap=reading.epsilon_cap,
            queries=reading.releases,
        )


def add_qbbs_servicer(
    server: grpc.Server,
    module: QbbsModule,
    *,
    authorize_admin: AdminAuthorizer | None = None,
    admin_token: str | None = None,
    admin_token_sha256: str | None = None,
    check_template: TemplateCheck | None = None,
    requester: Requester | None = None,
) -> QbbsServicer:
    """Register ``QbbsService`` for ``module`` on ``server``; returns the servicer.

    Give at most one of ``authorize_admin`` (the server's own check),
    ``admin_token`` or ``admin_token_sha256``; with none, admin RPCs are
    refused. ``check_template`` and ``requester``: see the module docstring.
    Pass the face-score provider to the module
    (``QbbsModule(..., face_scores=RecogniserFaceScores(fitted))`` or
    :meth:`QbbsModule.set_face_scores`).
    """
    servicer = QbbsServicer(
        module,
        authorize_admin=authorize_admin,
        admin_token=admin_token,
        admin_token_sha256=admin_token_sha256,
        check_template=check_template,
        requester=requester,
    )
    qbbs_pb2_grpc.add_QbbsServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    return servicer
