"""Ingest validation: everything a template must satisfy before it is stored.

:func:`peep.core.wire.decode_template` / :func:`~peep.core.wire.validate_template`
check the message on its own (ids, sizes, finite values, mechanism fields).
The server adds what needs context:

known bundle
    ``bundle_id`` names a bundle this server published (verified with the
    deployer's key); a descriptor bundle (``dlib-resnet``) must name a
    network whose model files the server trusts (``[bundle]
    trusted_descriptor_models``), else ``untrusted_network``.
dimension
    ``len(values)`` equals the bundle's ``nc``.
mechanism consistent with the bundle
    The server rebuilds the mechanism from the bundle's public bounds and the
    template's ``kind``, ``epsilon`` and ``delta``
    (:func:`peep.core.release.mechanism_for_bounds`) and requires the stated
    ``delta`` (0 for the pure-ε kinds), ``epsilon_coordinate``,
    ``epsilon_vector`` and ``noise_std`` to match it
    (relative tolerance 1e-3, which absorbs the sampler's grid inflation of
    ~1e-6..1e-4). A device cannot claim a stronger guarantee than the noise
    it applied implies.
plausible values
    Each coordinate must lie within the mechanism's
    :meth:`~peep.core.mechanisms.TemplateMechanism.plausible_range` with
    ``plausibility_sigmas`` (default 40): its domain box (``[0, 1]`` for
    ``peep``/``laplace-vector``, ``[lo_j, hi_j]`` for ``peep-raw``,
    ``[-R, R]`` for ``gaussian-l2``, ``[-R1, R1]`` for ``laplace-l1``) widened
    by that many noise standard deviations. A genuine release falls outside with probability below
    ``exp(-40·√2) ≈ 3e-25`` per coordinate (Laplace; smaller for Gaussian
    noise), so only forged or corrupted vectors are refused.
capture time near the server's clock
    ``capture_time`` (a valid timestamp, checked by the core) lies at most
    ``max_clock_skew_s`` (default 300 s: devices run NTP; this absorbs a
    real-time clock that drifted before it synchronised) ahead of the server's
    clock and at most ``max_age_s`` (default 30 days) behind it
    (``[ingest]`` in ``server.toml``). The edge's store-and-forward spool keeps
    templates until they are acknowledged, without an age limit (enrolment
    templates are never dropped), so the window is what bounds how long an
    outage may last before its backlog is refused (``capture_time_too_old``,
    dead-lettered on the device like every refusal); widen ``max_age_s`` for
    sites that may stay offline longer. Refused: year 9999, year 1, an unset
    time (1970) and anything outside the ``Timestamp`` range.
size limits
    At most :data:`peep.core.wire.MAX_TEMPLATE_BYTES` bytes, at most
    :data:`MAX_SOFT_TRAITS` soft traits; every string and number bounded by
    :func:`peep.core.wire.validate_template` (its docstring lists the bounds).
a device's decision instead of a template
    A release whose ``decision`` is set (:func:`peep.core.wire.validate_decision`: no values, no mechanism, a
    named label mechanism at a bounded ε) names the signed device model that made it. It must be one this
    server issued (``unknown_model_serial``) and did not withdraw (``withdrawn_model``: its site key was
    retired), made from the version it says (``model_mismatch``), for the bundle and site key the release
    carries (``model_mismatch``), not expired before the capture (``expired_model``), from a version the
    server still keeps (``unknown_model_version``: its label could not be read), and an identification's
    label must be one of that model's class ids or empty (``unknown_label``). A door's access record names
    the claimed subject (``invalid_subject``).

Every refusal is a :class:`Rejection` (a :class:`~peep.core.exceptions.WireError`)
with a short ``reason`` code for metrics/dead letters and a message naming the
field, the expectation and the value.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core import wire
from peep.core.bundle import ProjectionBundle
from peep.core.exceptions import WireError
from peep.core.release import mechanism_for_bounds
from peep.server.bundles.catalog import BundleCatalog
from peep.server.storage import ACCESS_RECORD
from peep.v1 import template_pb2

__all__ = ["Rejection", "TemplateValidator", "ValidTemplate"]

MAX_SOFT_TRAITS = 16
_REL_TOL = 1e-3
#: Default window around the server's clock a ``capture_time`` must fall in (``[ingest]`` in server.toml).
DEFAULT_MAX_CLOCK_SKEW_S = 300.0
DEFAULT_MAX_AGE_S = 30 * 86400.0


class Rejection(WireError):
    """A template refused at ingest; ``reason`` is a short code (metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def reason_for(exc: WireError) -> str:
    """Reason code for a core :class:`WireError` (bounded set: one per field)."""
    if isinstance(exc, Rejection):
        return exc.reason
    text = str(exc)
    field = text.split(":", 1)[0]
    if field == "payload":
        return "too_large" if "at most" in text else "malformed"
    if field == "values":
        if "finite" in text:
            return "non_finite"
        if "nc" in text or "coefficients" in text:
            return "wrong_dimension"
    root = field.split(".", 1)[0].split("[", 1)[0]
    if root in {f.name for f in template_pb2.PerturbedTemplate.DESCRIPTOR.fields}:
        return f"invalid_{root}"
    return "invalid"


@dataclass(frozen=True)
class _Domain:
    lower: NDArray[np.float32]
    upper: NDArray[np.float32]
    delta: float
    epsilon_coordinate: float
    epsilon_vector: float
    noise_std: float


@dataclass(frozen=True, slots=True)
class ValidTemplate:
    """A template that passed every check (and, once authorised, how it arrived: ``transport``, ``sent_by``)."""

    message: template_pb2.PerturbedTemplate
    values: NDArray[np.float32]
    bundle: ProjectionBundle
    kind: str
    purpose: str
    #: ``grpc`` or ``mqtt``; "" until :meth:`~peep.server.ingest.ingestor.Ingestor.check` authorised its sender.
    transport: str = ""
    #: ``device`` or ``admin`` (whose credential sent it); "" until authorised.
    sent_by: str = ""
    #: A device's decision (``message.decision`` set): the device model that made it (an
    #: :class:`~peep.server.storage.devicemodels.IssuedModel`) and, for an identification, the subject its label
    #: stands for ("" for unknown). None for a template.
    device_model: Any = None
    label_subject: str = ""

    @property
    def is_decision(self) -> bool:
        """Whether this release carries a device's decision instead of a template."""
        return self.message.HasField("decision")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=0.0)


class TemplateValidator:
    """Validate templates against the bundles a :class:`BundleCatalog` knows.

    Parameters
    ----------
    bundles : BundleCatalog
    plausibility_sigmas : float
        Allowed excursion beyond the mechanism's domain, in noise standard deviations.
    max_clock_skew_s, max_age_s : float
        ``capture_time`` may be at most this far ahead of / behind ``clock()``.
    clock : callable
        Unix time (injected for tests).
    """

    def __init__(
        self,
        bundles: BundleCatalog,
        *,
        plausibility_sigmas: float = 40.0,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bundles = bundles
        self.plausibility_sigmas = float(plausibility_sigmas)
        self.max_clock_skew_s = float(max_clock_skew_s)
        self.max_age_s = float(max_age_s)
        self.clock = clock
        #: The device models decisions are checked against (:class:`~peep.server.recognition.devicemodels.DeviceModels`,
        #: set by the services once they exist); None: decisions are refused.
        self.device_models: Any = None
        self._domains: OrderedDict[tuple[str, str, float, float], _Domain | str] = OrderedDict()
        self._lock = threading.Lock()

    def decode(self, payload: bytes) -> template_pb2.PerturbedTemplate:
        """Parse bytes (size-limited) without the contextual checks."""
        try:
            return wire.decode_template(payload, validate=False)
        except WireError as exc:
            raise Rejection(reason_for(exc), str(exc)) from None

    def validate(self, msg: template_pb2.PerturbedTemplate) -> ValidTemplate:
        """Run every check; return the template with its values, or raise :class:`Rejection`."""
        if msg.ByteSize() > wire.MAX_TEMPLATE_BYTES:
            raise Rejection(
                "too_large", f"payload: expected at most {wire.MAX_TEMPLATE_BYTES} bytes, received {msg.ByteSize()}"
            )
        if len(msg.soft_traits) > MAX_SOFT_TRAITS:
            raise Rejection(
                "invalid_soft_traits",
                f"soft_traits: expected at most {MAX_SOFT_TRAITS} traits, received {len(msg.soft_traits)}",
            )
        try:
            values = wire.validate_template(msg)
        except WireError as exc:
            raise Rejection(reason_for(exc), str(exc)) from None
        self._check_capture_time(msg)
        bundle = self.bundles.get(msg.bundle_id)
        if bundle is None:
            raise Rejection(
                "unknown_bundle", f"bundle_id: expected a bundle published on this server, received {msg.bundle_id!r}"
            )
        untrusted = self.bundles.untrusted(bundle)
        if untrusted is not None:
            raise Rejection("untrusted_network", f"bundle {bundle.bundle_id}: {untrusted}")
        if msg.HasField("decision"):
            return self._validate_decision(msg, bundle)
        nc = bundle.n_components
        if len(msg.values) != nc:
            raise Rejection(
                "wrong_dimension",
                f"values: expected {nc} coefficients (the nc of bundle {bundle.bundle_id}), received {len(msg.values)}",
            )
        kind = wire.mechanism_kind_name(msg.mechanism.kind)
        domain = self._domain(bundle, kind, msg.mechanism)
        m = msg.mechanism
        for name, stated, expected in (
            ("delta", m.delta, domain.delta),
            ("epsilon_coordinate", m.epsilon_coordinate, domain.epsilon_coordinate),
            ("epsilon_vector", m.epsilon_vector, domain.epsilon_vector),
            ("noise_std", m.noise_std, domain.noise_std),
        ):
            if not _close(stated, expected):
                raise Rejection(
                    "mechanism_mismatch",
                    f"mechanism.{name}: expected {expected:.6g} for {kind} at epsilon={m.epsilon:g} with bundle "
                    f"{bundle.bundle_id}, received {stated:.6g}",
                )
        bad = (values < domain.lower) | (values > domain.upper)
        if bad.any():
            j = int(np.argmax(bad))
            raise Rejection(
                "implausible_values",
                f"values[{j}]: expected within [{domain.lower[j]:.6g}, {domain.upper[j]:.6g}] (the {kind} domain "
                f"± {self.plausibility_sigmas:g} noise std), received {values[j]:.6g}",
            )
        return ValidTemplate(
            message=msg, values=values, bundle=bundle, kind=kind, purpose=wire.purpose_name(msg.purpose)
        )

    def _validate_decision(self, msg: template_pb2.PerturbedTemplate, bundle: ProjectionBundle) -> ValidTemplate:
        """The checks of a device's decision against the model it names (the module docstring's last rule)."""
        d = msg.decision
        purpose = wire.purpose_name(msg.purpose)
        if d.requested_by:  # a door opened at Home Assistant's request: no face, no model (wire checked the rest)
            return ValidTemplate(
                message=msg, values=np.zeros(0, dtype=np.float32), bundle=bundle, kind=ACCESS_RECORD, purpose=purpose
            )
        models = self.device_models
        issued = models.get(int(d.model_serial)) if models is not None else None
        if issued is None:
            raise Rejection(
                "unknown_model_serial",
                f"decision.model_serial: expected a device model this server issued, received {d.model_serial}",
            )
        serial = issued.serial
        if issued.withdrawn:
            raise Rejection(
                "withdrawn_model",
                f"decision.model_serial: device model {serial} was withdrawn (site key {issued.key_id or 'none'} "
                "was retired): expected a decision of a model in use, received one of that model",
            )
        if d.model_version != issued.model_version:
            raise Rejection(
                "model_mismatch",
                f"decision.model_version: expected {issued.model_version} (what device model {serial} was made "
                f"from), received {d.model_version[:64]!r}",
            )
        if msg.bundle_id != issued.bundle_id:
            raise Rejection(
                "model_mismatch",
                f"bundle_id: expected {issued.bundle_id} (device model {serial}'s bundle), received {msg.bundle_id!r}",
            )
        if msg.key_id != issued.key_id:
            raise Rejection(
                "model_mismatch",
                f"key_id: expected {issued.key_id or 'none'} (device model {serial}'s site key), received "
                f"{msg.key_id[:64] or 'none'}",
            )
        captured = msg.capture_time.seconds
        if captured > issued.expires_at + self.max_clock_skew_s:
            raise Rejection(
                "expired_model",
                f"decision.model_serial: device model {serial} expired at {_iso(int(issued.expires_at))}, expected "
                f"a decision made before, received one captured at {_iso(captured)}",
            )
        subject = ""
        if purpose == "identify":
            labels = models.label_map(issued.model_version)
            if labels is None:
                raise Rejection(
                    "unknown_model_version",
                    f"decision.model_version: {issued.model_version} is no longer kept on this server (pruned, or "
                    "deleted by an erasure), so its labels cannot be read: the device needs a newer model",
                )
            if d.label:
                if d.label not in labels.subjects:
                    raise Rejection(
                        "unknown_label",
                        f"decision.label: expected one of the class ids of device model {serial} or '' (unknown), "
                        f"received {d.label[:64]!r}",
                    )
                subject = labels.subjects[d.label]
        elif not msg.subject:
            raise Rejection(
                "invalid_subject", "subject: expected the claimed subject of a door's access record, received none"
            )
        return ValidTemplate(
            message=msg,
            values=np.zeros(0, dtype=np.float32),
            bundle=bundle,
            kind=d.label_mechanism or ACCESS_RECORD,
            purpose=purpose,
            device_model=issued,
            label_subject=subject,
        )

    def _check_capture_time(self, msg: template_pb2.PerturbedTemplate) -> None:
        # seconds alone decide (nanos < 1 s cannot move a whole-second window meaningfully), in integers:
        # a float of year-9999 seconds would be exact too, but integers cannot overflow a datetime.
        seconds = msg.capture_time.seconds
        now = self.clock()
        if seconds > now + self.max_clock_skew_s:
            raise Rejection(
                "capture_time_future",
                f"capture_time: expected at most {self.max_clock_skew_s:.0f} s ahead of the server clock "
                f"(ingest.max_clock_skew_s), received {_iso(seconds)} ({seconds - now:.0f} s ahead)",
            )
        if seconds < now - self.max_age_s:
            raise Rejection(
                "capture_time_too_old",
                f"capture_time: expected at most {self.max_age_s:.0f} s before the server clock (ingest.max_age_s), "
                f"received {_iso(seconds)} ({now - seconds:.0f} s before)",
            )

    def _domain(self, bundle: ProjectionBundle, kind: str, m: template_pb2.MechanismInfo) -> _Domain:
        key = (bundle.bundle_id, kind, float(m.epsilon), float(m.delta))
        with self._lock:
            hit = self._domains.get(key)
            if hit is not None:
                self._domains.move_to_end(key)
        if hit is None:
            hit = self._build_domain(bundle, kind, m)
            with self._lock:
                self._domains[key] = hit
                while len(self._domains) > 256:
                    self._domains.popitem(last=False)
        if isinstance(hit, str):
            raise Rejection("mechanism_mismatch", hit)
        return hit

    def _build_domain(self, bundle: ProjectionBundle, kind: str, m: template_pb2.MechanismInfo) -> _Domain | str:
        try:
            bundle.check_mechanism(kind)
            mech = mechanism_for_bounds(bundle.bounds, kind=kind, epsilon=m.epsilon, delta=m.delta)
        except (ValueError, TypeError, OverflowError) as exc:
            return (
                f"mechanism: {kind} with epsilon={m.epsilon:g}, delta={m.delta:g} is not a valid mechanism "
                f"for bundle {bundle.bundle_id} ({exc})"
            )
        lower, upper = mech.plausible_range(self.plausibility_sigmas)
        g = mech.guarantee
        with np.errstate(over="ignore"):
            lower32, upper32 = lower.astype(np.float32), upper.astype(np.float32)
        return _Domain(
            lower=lower32,
            upper=upper32,
            delta=float(g.delta),
            epsilon_coordinate=float(g.epsilon_coordinate),
            epsilon_vector=float(g.epsilon_vector),
            noise_std=float(mech.noise_std),
        )


def _iso(seconds: int) -> str:
    """UTC ISO-8601 of a valid ``Timestamp``'s seconds (0001-01-01..9999-12-31)."""
    d = datetime(1970, 1, 1) + timedelta(seconds=seconds)
    return d.isoformat(timespec="seconds") + "Z"
