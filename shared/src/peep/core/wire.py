"""Conversion between numpy arrays and the ``peep.v1`` wire messages.

The one place that builds, parses and validates :class:`PerturbedTemplate`
messages, so edge and server agree on every rule. Validation errors are
:class:`~peep.core.exceptions.WireError` (a ValueError) naming the field;
the server maps them to gRPC ``INVALID_ARGUMENT`` / the MQTT dead-letter
topic with the same text.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import ArrayLike, NDArray
from peep.core.exceptions import WireError
from peep.core.mechanisms.registry import mechanism_class, mechanism_classes
from peep.core.topics import ID_PATTERN as ID_PATTERN
from peep.v1 import template_pb2

PerturbedTemplate = template_pb2.PerturbedTemplate
MechanismInfo = template_pb2.MechanismInfo
SoftTraitRelease = template_pb2.SoftTraitRelease

#: Largest encoded template accepted (nc = 1,024 float32 plus metadata fits).
MAX_TEMPLATE_BYTES = 16_384
#: Largest number of coefficients accepted in one template.
MAX_COMPONENTS = 2_048
# ID_PATTERN (re-exported above) lives with the topic grammar: identifiers become
# MQTT topic levels and database keys, so they can never hold '/', '+' or '#'.
SUBJECT_PATTERN = re.compile(r"^[^\x00-\x1f/+#]{1,128}$")


def _wire_kinds() -> dict[str, int]:
    """Each registered mechanism kind's ``MechanismKind`` enum value (the registry names it)."""
    out: dict[str, int] = {}
    for kind, cls in mechanism_classes().items():
        try:
            out[kind] = int(template_pb2.MechanismKind.Value(cls.wire_name))
        except ValueError:
            raise RuntimeError(
                f"{cls.__name__}.wire_name: {cls.wire_name!r} is not a peep.v1.MechanismKind value; "
                "add it to proto/peep/v1/template.proto and run scripts/gen-proto.sh"
            ) from None
    return out


#: Mechanism kind name -> ``MechanismKind`` enum value, for every registered kind.
MECHANISM_KINDS: Mapping[str, int] = _wire_kinds()
_KIND_NAMES = {v: k for k, v in MECHANISM_KINDS.items()}

PURPOSES: Mapping[str, int] = {
    "enroll": template_pb2.PURPOSE_ENROLL,
    "identify": template_pb2.PURPOSE_IDENTIFY,
    "verify": template_pb2.PURPOSE_VERIFY,
}
_PURPOSE_NAMES = {v: k for k, v in PURPOSES.items()}

SOFT_TRAITS: Mapping[str, int] = {
    "age": template_pb2.SOFT_TRAIT_KIND_AGE,
    "gender": template_pb2.SOFT_TRAIT_KIND_GENDER,
    "height": template_pb2.SOFT_TRAIT_KIND_HEIGHT,
    "weight": template_pb2.SOFT_TRAIT_KIND_WEIGHT,
}
_TRAIT_NAMES = {v: k for k, v in SOFT_TRAITS.items()}


def mechanism_kind_name(kind: int) -> str:
    """``"peep"`` etc. for a ``MechanismKind`` enum value."""
    try:
        return _KIND_NAMES[kind]
    except KeyError:
        raise WireError(
            f"mechanism.kind: expected one of {sorted(MECHANISM_KINDS)}, received enum value {kind}"
        ) from None


def purpose_name(purpose: int) -> str:
    """``"enroll"``, ``"identify"`` or ``"verify"`` for a ``Purpose`` enum value."""
    try:
        return _PURPOSE_NAMES[purpose]
    except KeyError:
        raise WireError(f"purpose: expected one of {sorted(PURPOSES)}, received enum value {purpose}") from None


def trait_name(kind: int) -> str:
    try:
        return _TRAIT_NAMES[kind]
    except KeyError:
        raise WireError(
            f"soft_traits.kind: expected one of {sorted(SOFT_TRAITS)}, received enum value {kind}"
        ) from None


@dataclass(frozen=True, kw_only=True)
class MechanismDescription:
    """What a template says about the mechanism that produced it."""

    kind: str
    epsilon: float
    delta: float
    epsilon_coordinate: float
    epsilon_vector: float
    noise_std: float

    def to_proto(self) -> template_pb2.MechanismInfo:
        if self.kind not in MECHANISM_KINDS:
            raise WireError(f"mechanism.kind: expected one of {sorted(MECHANISM_KINDS)}, received {self.kind!r}")
        return template_pb2.MechanismInfo(
            kind=MECHANISM_KINDS[self.kind],  # type: ignore[arg-type]
            epsilon=self.epsilon,
            delta=self.delta,
            epsilon_coordinate=self.epsilon_coordinate,
            epsilon_vector=self.epsilon_vector,
            noise_std=self.noise_std,
        )

    @classmethod
    def from_proto(cls, info: template_pb2.MechanismInfo) -> MechanismDescription:
        return cls(
            kind=mechanism_kind_name(info.kind),
            epsilon=info.epsilon,
            delta=info.delta,
            epsilon_coordinate=info.epsilon_coordinate,
            epsilon_vector=info.epsilon_vector,
            noise_std=info.noise_std,
        )

    @classmethod
    def of(cls, mechanism: Any) -> MechanismDescription:
        """Describe a :mod:`peep.core.mechanisms` template mechanism."""
        g = mechanism.guarantee
        return cls(
            kind=mechanism.kind,
            epsilon=float(mechanism.epsilon),
            delta=float(getattr(g, "delta", 0.0)),
            epsilon_coordinate=float(g.epsilon_coordinate),
            epsilon_vector=float(g.epsilon_vector),
            noise_std=float(mechanism.noise_std),
        )


def new_message_id() -> str:
    """A fresh random message id (UUID4 hex)."""
    return uuid.uuid4().hex


def make_template(
    values: ArrayLike,
    *,
    device_id: str,
    site: str,
    bundle_id: str,
    mechanism: MechanismDescription,
    purpose: str = "identify",
    subject: str = "",
    track_id: str = "",
    capture_time: float | None = None,
    message_id: str | None = None,
    soft_traits: Iterable[Mapping[str, Any]] = (),
) -> template_pb2.PerturbedTemplate:
    """Build a validated template message.

    Parameters
    ----------
    values : array-like of shape (n_components,)
        The perturbed coefficients (sent as float32).
    capture_time : float, optional
        Unix time in seconds; defaults to now.
    soft_traits : iterable of mappings with keys ``trait``, ``value``, ``epsilon``, ``mechanism``
    """
    if purpose not in PURPOSES:
        raise WireError(f"purpose: expected one of {sorted(PURPOSES)}, received {purpose!r}")
    arr = np.asarray(values, dtype=np.float32).ravel()
    msg = template_pb2.PerturbedTemplate(
        message_id=message_id or new_message_id(),
        device_id=device_id,
        site=site,
        bundle_id=bundle_id,
        mechanism=mechanism.to_proto(),
        purpose=PURPOSES[purpose],  # type: ignore[arg-type]
        subject=subject,
        track_id=track_id,
    )
    msg.capture_time.FromNanoseconds(int((time.time() if capture_time is None else capture_time) * 1e9))
    msg.values.extend(arr.tolist())
    for t in soft_traits:
        trait = str(t["trait"])
        if trait not in SOFT_TRAITS:
            raise WireError(f"soft_traits.trait: expected one of {sorted(SOFT_TRAITS)}, received {trait!r}")
        msg.soft_traits.add(
            kind=SOFT_TRAITS[trait],
            value=float(t["value"]),
            epsilon=float(t["epsilon"]),
            mechanism=str(t.get("mechanism", "")),
        )
    validate_template(msg)
    return msg


def template_values(msg: template_pb2.PerturbedTemplate) -> NDArray[np.float32]:
    """The coefficients as a float32 array of shape (n_components,)."""
    return np.fromiter(msg.values, dtype=np.float32, count=len(msg.values))


def stack_values(msgs: Iterable[template_pb2.PerturbedTemplate]) -> NDArray[np.float32]:
    """Coefficients of several templates, shape (n_templates, n_components)."""
    rows = [template_values(m) for m in msgs]
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    widths = {r.shape[0] for r in rows}
    if len(widths) != 1:
        raise WireError(f"values: expected templates of one dimension, received dimensions {sorted(widths)}")
    return np.vstack(rows)


def encode_template(msg: template_pb2.PerturbedTemplate) -> bytes:
    """Serialise (deterministically, so equal messages give equal bytes)."""
    return msg.SerializeToString(deterministic=True)


def decode_template(data: bytes, *, validate: bool = True) -> template_pb2.PerturbedTemplate:
    """Parse and (by default) validate an encoded template.

    Raises
    ------
    WireError
        The bytes are too large, not a ``PerturbedTemplate``, or fail
        :func:`validate_template`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"payload: expected bytes, received {type(data).__name__}")
    if len(data) > MAX_TEMPLATE_BYTES:
        raise WireError(f"payload: expected at most {MAX_TEMPLATE_BYTES} bytes, received {len(data)}")
    msg = template_pb2.PerturbedTemplate()
    try:
        msg.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise WireError(f"payload: expected a serialised peep.v1.PerturbedTemplate, parsing failed ({exc})") from exc
    if validate:
        validate_template(msg)
    return msg


def check_subject_id(value: Any, field: str = "subject") -> str:
    """Return ``value`` if it is a usable subject id, else raise :class:`WireError` naming ``field``.

    The one rule for subject ids (enrolment labels, verification claims, erasure
    requests): 1-128 characters, no control characters and none of ``/``, ``+``,
    ``#`` (subjects appear in MQTT payloads, logs and database keys). Callers map
    the error to their own (gRPC ``INVALID_ARGUMENT``, CLI exit code 2, ...).

    Examples
    --------
    >>> check_subject_id("alice")
    'alice'
    >>> check_subject_id("a/b", "--subject")
    Traceback (most recent call last):
    ...
    peep.core.exceptions.WireError: --subject: expected 1-128 characters ..., received 'a/b'
    """
    if not isinstance(value, str) or not SUBJECT_PATTERN.match(value):
        shown = value[:64] if isinstance(value, str) else value
        raise WireError(
            f"{field}: expected 1-128 characters without control characters, '/', '+' or '#', received {shown!r}"
        )
    return value


def validate_template(msg: template_pb2.PerturbedTemplate, *, n_components: int | None = None) -> None:
    """Check the rules every receiver relies on; raise :class:`WireError` naming the field.

    Context-dependent checks (known bundle, mechanism consistent with the
    bundle, values inside the mechanism's possible range, device identity)
    belong to the receiver, which knows the bundle and the caller.
    """
    if not ID_PATTERN.match(msg.message_id):
        raise WireError(f"message_id: expected 1-128 characters [A-Za-z0-9_.:@-], received {msg.message_id[:64]!r}")
    if not ID_PATTERN.match(msg.device_id):
        raise WireError(f"device_id: expected 1-128 characters [A-Za-z0-9_.:@-], received {msg.device_id[:64]!r}")
    if not ID_PATTERN.match(msg.site):
        raise WireError(f"site: expected 1-128 characters [A-Za-z0-9_.:@-], received {msg.site[:64]!r}")
    if not ID_PATTERN.match(msg.bundle_id):
        raise WireError(f"bundle_id: expected a bundle id, received {msg.bundle_id[:64]!r}")
    if msg.track_id and not ID_PATTERN.match(msg.track_id):
        raise WireError(f"track_id: expected 1-128 characters [A-Za-z0-9_.:@-], received {msg.track_id[:64]!r}")
    purpose = purpose_name(msg.purpose)
    if purpose in ("enroll", "verify") and not msg.subject:
        raise WireError(f"subject: expected a subject id for purpose {purpose!r}, received none")
    if msg.subject:
        check_subject_id(msg.subject, "subject")
    if not msg.HasField("mechanism"):
        raise WireError("mechanism: expected the mechanism description, received none")
    info = msg.mechanism
    kind = mechanism_kind_name(info.kind)
    for name in ("epsilon", "epsilon_coordinate", "epsilon_vector"):
        v = getattr(info, name)
        if not (math.isfinite(v) and v > 0):
            raise WireError(f"mechanism.{name}: expected a finite number > 0, received {v}")
    if not (math.isfinite(info.delta) and 0.0 <= info.delta < 1.0):
        raise WireError(f"mechanism.delta: expected 0 <= delta < 1, received {info.delta}")
    if mechanism_class(kind).takes_delta and info.delta <= 0.0:
        raise WireError(f"mechanism.delta: expected delta > 0 for {kind}, received {info.delta}")
    if not (math.isfinite(info.noise_std) and info.noise_std >= 0):
        raise WireError(f"mechanism.noise_std: expected a finite number >= 0, received {info.noise_std}")
    n = len(msg.values)
    if n == 0 or n > MAX_COMPONENTS:
        raise WireError(f"values: expected 1-{MAX_COMPONENTS} coefficients, received {n}")
    if n_components is not None and n != n_components:
        raise WireError(f"values: expected {n_components} coefficients (the bundle's nc), received {n}")
    vals = template_values(msg)
    if not np.all(np.isfinite(vals)):
        idx = int(np.argmax(~np.isfinite(vals)))
        raise WireError(f"values: expected finite numbers, received {vals[idx]} at index {idx}")
    for i, t in enumerate(msg.soft_traits):
        trait_name(t.kind)
        if not math.isfinite(t.value):
            raise WireError(f"soft_traits[{i}].value: expected a finite number, received {t.value}")
        if not (math.isfinite(t.epsilon) and t.epsilon > 0):
            raise WireError(f"soft_traits[{i}].epsilon: expected a finite number > 0, received {t.epsilon}")
