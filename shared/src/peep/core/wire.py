"""Conversion between numpy arrays and the ``peep.v1`` wire messages.

The one place that builds, parses and validates :class:`PerturbedTemplate`
messages, so edge and server agree on every rule. Validation errors are
:class:`~peep.core.exceptions.WireError` (a ValueError) naming the field;
the server maps them to gRPC ``INVALID_ARGUMENT`` / the MQTT dead-letter
topic with the same text.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import unicodedata
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import ArrayLike, NDArray
from peep.core.exceptions import WireError
from peep.core.mechanisms.registry import mechanism_class, mechanism_classes
from peep.core.topics import ID_PATTERN as ID_PATTERN
from peep.v1 import recognition_pb2, template_pb2

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
#: A site key's public id (:attr:`peep.core.sitekey.SiteKey.key_id`).
KEY_ID_PATTERN = re.compile(r"^sk-[0-9a-f]{16}$")
#: Unicode categories refused anywhere in a subject id: controls (Cc), format characters (Cf: the bidi
#: embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069, the marks U+200E/U+200F and U+061C,
#: zero-width characters, soft hyphen, BOM), surrogates (Cs) and line/paragraph separators (Zl, Zp).
SUBJECT_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

# ---- bounds of the numbers a template carries (docs/WIRE.md, "Bounds on what a template carries")

#: Smallest ε a template may state (its mechanism's and each soft trait's): below it a release is noise
#: (and ε = 1e-300 would overflow every scale computed from it).
MIN_EPSILON = 1e-3
#: Largest template-mechanism ε for kinds whose class sets no smaller ``max_epsilon`` (the edge's
#: ``privacy.epsilon`` bound).
MAX_EPSILON = 1e6
#: Largest soft-trait ε (the edge's ``soft.age_epsilon`` / ``soft.gender_epsilon`` bound).
MAX_SOFT_EPSILON = 100.0
#: The one mechanism each soft trait is released with (``SoftTraitRelease.mechanism``).
SOFT_TRAIT_MECHANISMS: Mapping[str, str] = {
    "age": "bounded-laplace",
    "gender": "randomized-response",
    "height": "bounded-laplace",
    "weight": "bounded-laplace",
}
#: Public domain [lower, upper] of each bounded-Laplace trait (years, cm, kg): generous on purpose (the edge clips
#: age to [0, age_max] with age_max <= 150). Its width is the largest sensitivity a release can have.
SOFT_TRAIT_RANGES: Mapping[str, tuple[float, float]] = {
    "age": (0.0, 150.0),
    "height": (0.0, 300.0),
    "weight": (0.0, 700.0),
}
#: A bounded-Laplace value may leave its domain by this many noise scales (width/ε): a genuine release does so
#: with probability below e^-40/2 ≈ 2e-18.
SOFT_TRAIT_NOISE_SCALES = 40.0
#: Protobuf ``Timestamp``'s valid range, 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z, in seconds.
TIMESTAMP_MIN_SECONDS = -62_135_596_800
TIMESTAMP_MAX_SECONDS = 253_402_300_799


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
    key_id: str = "",
) -> template_pb2.PerturbedTemplate:
    """Build a validated template message.

    Parameters
    ----------
    values : array-like of shape (n_components,)
        The perturbed coefficients (sent as float32).
    key_id : str, optional
        The public id of the site key the values were rotated with (:mod:`peep.core.sitekey`).
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
        subject=check_subject_id(subject, "subject") if subject else "",
        track_id=track_id,
        key_id=key_id,
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
    # np.array reads the repeated field through the sequence protocol: half the time of np.fromiter.
    return np.array(msg.values, dtype=np.float32)


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


#: Length of a device's signature of a template (base64 of a 64-byte Ed25519 signature).
DEVICE_SIGNATURE_CHARS: Final = 88
#: Longest claim signature text carried in a template (base64 of a 64-byte Ed25519 signature is 88).
MAX_CLAIM_SIGNATURE_CHARS: Final = 128


def template_digest(msg: template_pb2.PerturbedTemplate) -> str:
    """Hex SHA-256 of ``msg`` as released, its ``device_signature`` left out.

    What a device signs (:func:`peep.core.signing.sign_template`) and what the server's decision on a VERIFY
    names, so that a door can tell the decision on its own template from one on a template someone else
    published under its claim's nonce. Computed on the deterministic serialisation, which both ends produce
    alike from the same fields.
    """
    if msg.device_signature:
        bare = template_pb2.PerturbedTemplate()
        bare.CopyFrom(msg)
        bare.ClearField("device_signature")
        msg = bare
    return hashlib.sha256(msg.SerializeToString(deterministic=True)).hexdigest()


def check_subject_id(value: Any, field: str = "subject") -> str:
    """Return ``value`` in NFC if it is a usable subject id, else raise :class:`WireError` naming ``field``.

    The one rule for subject ids (enrolment labels, verification claims, erasure
    requests): 1-128 characters, none of ``/``, ``+``, ``#`` (subjects appear in
    MQTT payloads, logs and database keys) and no control, format or bidi
    character (Unicode categories Cc, Cf, Cs, Zl, Zp: the embeddings,
    overrides and isolates U+202A-U+202E and U+2066-U+2069, the marks
    U+200E/U+200F, zero-width characters, ...), which could make a label
    display as another one. Such ids are **refused**, never stripped: removing
    characters would silently merge two distinct labels. Callers map the error
    to their own (gRPC ``INVALID_ARGUMENT``, CLI exit code 2, ...).

    The id is **normalised to NFC** (canonical composition: "Zoë" typed as ``o``
    + U+0308 and as U+00EB is one subject); callers use the returned value.
    Compatibility forms (NFKC) are not folded, since that changes text. On the wire
    :func:`validate_template` refuses a subject that is not already NFC
    (:func:`make_template` builds it so): a receiver cannot rewrite a message it
    acknowledges.

    Examples
    --------
    >>> check_subject_id("alice")
    'alice'
    >>> check_subject_id("Zoe\u0308") == "Zo\u00eb"
    True
    >>> check_subject_id("a/b", "--subject")
    Traceback (most recent call last):
    ...
    peep.core.exceptions.WireError: --subject: expected 1-128 characters ..., received 'a/b'
    >>> check_subject_id("bob\u202eevil")
    Traceback (most recent call last):
    ...
    peep.core.exceptions.WireError: subject: expected 1-128 characters ..., received 'bob\u202eevil' (U+202E at index 3)
    """
    expected = (
        f"{field}: expected 1-128 characters without control characters (Unicode Cc, Cf including bidi controls, "
        "Cs, Zl, Zp), '/', '+' or '#'"
    )
    if not isinstance(value, str):
        raise WireError(f"{expected}, received {value!r}"[:300])
    text = unicodedata.normalize("NFC", value) if len(value) <= 4 * 128 else value
    for i, ch in enumerate(text[:129]):
        if unicodedata.category(ch) in SUBJECT_REFUSED_CATEGORIES:
            raise WireError(f"{expected}, received {text[:64]!r} (U+{ord(ch):04X} at index {i})")
    if not SUBJECT_PATTERN.match(text):
        raise WireError(f"{expected}, received {value[:64]!r}")
    return text


def validate_template(msg: template_pb2.PerturbedTemplate, *, n_components: int | None = None) -> NDArray[np.float32]:
    """Check the rules every receiver relies on; raise :class:`WireError` naming the field.

    Returns the coefficients (:func:`template_values`), which the check has read anyway.

    Every string and number is bounded here (messages never echo more than 64
    characters of a received string):

    * ids: :data:`ID_PATTERN` (1-128 characters); ``subject``:
      :func:`check_subject_id`, already NFC; ``key_id``: empty or
      :data:`KEY_ID_PATTERN`;
    * ``capture_time``: present, a valid protobuf ``Timestamp`` (seconds within
      0001-01-01..9999-12-31, ``nanos`` in [0, 1e9)); the window around the
      receiver's clock is the receiver's check;
    * ``mechanism.epsilon`` in [:data:`MIN_EPSILON`, the kind's ``max_epsilon``
      or :data:`MAX_EPSILON`]; the other mechanism numbers finite and positive
      (the receiver pins them to what the bundle implies);
    * ``values``: 1-:data:`MAX_COMPONENTS` finite numbers;
    * ``soft_traits``: each kind at most once, its mechanism the one named in
      :data:`SOFT_TRAIT_MECHANISMS`, ε in [:data:`MIN_EPSILON`,
      :data:`MAX_SOFT_EPSILON`], and the value 0 or 1 (randomized response) or
      within the trait's public range (:data:`SOFT_TRAIT_RANGES`) widened by
      :data:`SOFT_TRAIT_NOISE_SCALES` Laplace scales ``width/ε``.

    Context-dependent checks (known bundle, mechanism consistent with the
    bundle, values inside the mechanism's possible range, capture time near
    the receiver's clock, device identity and rights) belong to the receiver,
    which knows the bundle, the clock and the caller.
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
    if msg.key_id and not KEY_ID_PATTERN.match(msg.key_id):
        raise WireError(f"key_id: expected 'sk-' and 16 hex digits or empty, received {msg.key_id[:64]!r}")
    purpose = purpose_name(msg.purpose)
    asked = msg.HasField("decision") and bool(msg.decision.requested_by)  # an opening asked for names nobody
    if purpose in ("enroll", "verify") and not msg.subject and not asked:
        raise WireError(f"subject: expected a subject id for purpose {purpose!r}, received none")
    if msg.subject and check_subject_id(msg.subject, "subject") != msg.subject:
        raise WireError(
            f"subject: expected NFC-normalised text (the form check_subject_id returns), received {msg.subject[:64]!r}"
        )
    check_capture_time(msg)
    if msg.device_signature and (len(msg.device_signature) != DEVICE_SIGNATURE_CHARS
                                 or not msg.device_signature.isascii()):  # fmt: skip
        raise WireError(
            f"device_signature: expected {DEVICE_SIGNATURE_CHARS} base64 characters or none, received "
            f"{len(msg.device_signature)} characters"
        )
    if msg.claim_signature and (
        len(msg.claim_signature) > MAX_CLAIM_SIGNATURE_CHARS or not msg.claim_signature.isascii()
    ):
        raise WireError(
            f"claim_signature: expected at most {MAX_CLAIM_SIGNATURE_CHARS} ASCII characters (base64), "
            f"received {len(msg.claim_signature)} characters"
        )
    if msg.HasField("decision"):
        validate_decision(msg)
        return np.zeros(0, dtype=np.float32)
    if not msg.HasField("mechanism"):
        raise WireError("mechanism: expected the mechanism description, received none")
    info = msg.mechanism
    kind = mechanism_kind_name(info.kind)
    mech_cls = mechanism_class(kind)
    top = min(mech_cls.max_epsilon, MAX_EPSILON)
    if not (MIN_EPSILON <= info.epsilon <= top):  # False for NaN too
        raise WireError(
            f"mechanism.epsilon: expected {MIN_EPSILON:g} <= epsilon <= {top:g} for {kind}, received {info.epsilon:g}"
        )
    for name in ("epsilon_coordinate", "epsilon_vector"):
        v = getattr(info, name)
        if not (math.isfinite(v) and v > 0):
            raise WireError(f"mechanism.{name}: expected a finite number > 0, received {v}")
    if not (math.isfinite(info.delta) and 0.0 <= info.delta < 1.0):
        raise WireError(f"mechanism.delta: expected 0 <= delta < 1, received {info.delta}")
    if mech_cls.takes_delta and info.delta <= 0.0:
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
    check_soft_traits(msg.soft_traits)
    return vals


#: Opaque class ids of a device model (:func:`peep.core.devicemodel.class_id`): 24 lower-case hex digits.
CLASS_ID_PATTERN: Final = re.compile(r"^[0-9a-f]{24}$")
#: The label mechanisms a decision may name.
LABEL_MECHANISMS: Final = ("k-rr",)
#: Who besides a claim at the door may ask a door to open (``decision.requested_by``).
DOOR_REQUESTERS: Final = ("home_assistant",)
#: Most frames a device may say it fused into one decision.
MAX_FRAMES_FUSED: Final = 100_000


def make_decision(
    *,
    device_id: str,
    site: str,
    bundle_id: str,
    key_id: str,
    model_serial: int,
    model_version: str,
    purpose: str,
    label: str = "",
    epsilon_label: float = 0.0,
    labels: int = 0,
    subject: str = "",
    accepted: bool = False,
    frames_fused: int = 1,
    track_id: str = "",
    capture_time: float | None = None,
    message_id: str | None = None,
    requested_by: str = "",
) -> template_pb2.PerturbedTemplate:
    """A validated release carrying a device's decision instead of a template.

    ``purpose = "identify"``: ``label`` is the opaque class id released by k-ary randomized response at
    ``epsilon_label`` over ``labels`` outputs ("" = unknown). ``purpose = "verify"``: a door's access
    record, ``subject`` the claimed subject and ``accepted`` whether the door opened; with ``requested_by``
    (one of :data:`DOOR_REQUESTERS`) a door opened at another's request: no subject and no device model
    (``model_serial`` 0, ``model_version`` "").
    """
    if purpose not in ("identify", "verify"):
        raise WireError(f"purpose: expected 'identify' or 'verify' for a decision, received {purpose!r}")
    msg = template_pb2.PerturbedTemplate(
        message_id=message_id or new_message_id(),
        device_id=device_id,
        site=site,
        bundle_id=bundle_id,
        purpose=PURPOSES[purpose],  # type: ignore[arg-type]
        subject=check_subject_id(subject, "subject") if subject else "",
        track_id=track_id,
        key_id=key_id,
    )
    msg.capture_time.FromNanoseconds(int((time.time() if capture_time is None else capture_time) * 1e9))
    d = msg.decision
    d.model_serial = int(model_serial)
    d.model_version = model_version
    d.frames_fused = int(frames_fused)
    if purpose == "identify":
        d.label = label
        d.label_mechanism = LABEL_MECHANISMS[0]
        d.epsilon_label = float(epsilon_label)
        d.labels = int(labels)
    else:
        d.accepted = bool(accepted)
        d.requested_by = requested_by
    validate_template(msg)
    return msg


def validate_decision(msg: template_pb2.PerturbedTemplate) -> None:
    """The rules of a release that carries a decision (:func:`make_decision`); :class:`WireError` naming the field.

    A decision carries nothing derived from the face but its label: no values, no mechanism of a template,
    no soft trait. An identification's label went through a named label mechanism at a bounded ε; a door's
    access record has no label, only the claimed subject and whether the door opened.
    """
    d = msg.decision
    if len(msg.values) or msg.HasField("mechanism") or len(msg.soft_traits):
        raise WireError("decision: expected no values, mechanism or soft traits beside a decision, received some")
    purpose = purpose_name(msg.purpose)
    if d.requested_by:
        _validate_requested_open(msg)
        return
    if d.model_serial < 1:
        raise WireError(
            f"decision.model_serial: expected the serial of a device model (>= 1), received {d.model_serial}"
        )
    if not ID_PATTERN.match(d.model_version):
        raise WireError(f"decision.model_version: expected a model version, received {d.model_version[:64]!r}")
    if not 1 <= d.frames_fused <= MAX_FRAMES_FUSED:
        raise WireError(f"decision.frames_fused: expected 1-{MAX_FRAMES_FUSED}, received {d.frames_fused}")
    if purpose == "identify":
        if d.label_mechanism not in LABEL_MECHANISMS:
            raise WireError(
                f"decision.label_mechanism: expected one of {', '.join(LABEL_MECHANISMS)} for an identification, "
                f"received {d.label_mechanism[:64]!r}"
            )
        if not (MIN_EPSILON <= d.epsilon_label <= 40.0):
            raise WireError(
                f"decision.epsilon_label: expected {MIN_EPSILON:g} <= ε <= 40, received {d.epsilon_label:g}"
            )
        if not 2 <= d.labels <= 1 << 20:
            raise WireError(f"decision.labels: expected 2-{1 << 20} outputs, received {d.labels}")
        if d.label and not CLASS_ID_PATTERN.match(d.label):
            raise WireError(
                f"decision.label: expected an opaque class id or empty (unknown), received {d.label[:64]!r}"
            )
        if d.accepted:
            raise WireError("decision.accepted: expected false for an identification, received true")
    elif purpose == "verify":
        if d.label or d.label_mechanism or d.epsilon_label or d.labels:
            raise WireError("decision.label: expected no label for a door's access record, received one")
    else:
        raise WireError(f"purpose: expected 'identify' or 'verify' for a decision, received {purpose!r}")


def _validate_requested_open(msg: template_pb2.PerturbedTemplate) -> None:
    """A door opened at another's request: it looked at no face, so it names nobody and no model decided."""
    d = msg.decision
    if d.requested_by not in DOOR_REQUESTERS:
        raise WireError(
            f"decision.requested_by: expected one of {', '.join(DOOR_REQUESTERS)} or '' (a claim at the door), "
            f"received {d.requested_by[:64]!r}"
        )
    if purpose_name(msg.purpose) != "verify":
        raise WireError("decision.requested_by: expected a door's access record (purpose VERIFY), received another")
    if msg.subject:
        raise WireError("subject: expected none in a door's record of an opening it was asked for, received one")
    if d.model_serial or d.model_version or d.label or d.label_mechanism or d.epsilon_label or d.labels:
        raise WireError(
            "decision.model_serial: expected no device model and no label in a door's record of an opening it "
            "was asked for, received some"
        )
    if not d.accepted:
        raise WireError("decision.accepted: expected true (a request the door refused is not sent), received false")


def check_capture_time(msg: template_pb2.PerturbedTemplate) -> float:
    """The template's capture time (Unix seconds) if it is a valid ``Timestamp``, else :class:`WireError`.

    Examples
    --------
    >>> msg = PerturbedTemplate()
    >>> msg.capture_time.seconds = 2**62
    >>> check_capture_time(msg)
    Traceback (most recent call last):
    ...
    peep.core.exceptions.WireError: capture_time: expected a timestamp within 0001-01-01..9999-12-31 ...
    """
    if not msg.HasField("capture_time"):
        raise WireError("capture_time: expected the capture time, received none")
    ts = msg.capture_time
    if not (TIMESTAMP_MIN_SECONDS <= ts.seconds <= TIMESTAMP_MAX_SECONDS):
        raise WireError(
            "capture_time: expected a timestamp within 0001-01-01..9999-12-31 (seconds "
            f"{TIMESTAMP_MIN_SECONDS}..{TIMESTAMP_MAX_SECONDS}), received seconds={ts.seconds}"
        )
    if not (0 <= ts.nanos < 1_000_000_000):
        raise WireError(f"capture_time.nanos: expected 0-999999999, received {ts.nanos}")
    return ts.seconds + ts.nanos * 1e-9


def soft_trait_value_range(trait: str, epsilon: float) -> tuple[float, float]:
    """Where a genuine bounded-Laplace release of ``trait`` at ``epsilon`` lies (see :data:`SOFT_TRAIT_RANGES`).

    Examples
    --------
    >>> soft_trait_value_range("age", 1.0)
    (-6000.0, 6150.0)
    """
    lo, hi = SOFT_TRAIT_RANGES[trait]
    margin = SOFT_TRAIT_NOISE_SCALES * (hi - lo) / epsilon
    return lo - margin, hi + margin


def check_soft_traits(traits: Iterable[template_pb2.SoftTraitRelease]) -> None:
    """Check a template's soft-trait releases (see :func:`validate_template`); :class:`WireError` names the field.

    Receivers that read soft traits (the server's store, the QBBS module) can rely on every value being
    finite and plausible for its kind, mechanism and ε.
    """
    seen: set[str] = set()
    for i, t in enumerate(traits):
        try:
            name = trait_name(t.kind)
        except WireError:
            raise WireError(
                f"soft_traits[{i}].kind: expected one of {sorted(SOFT_TRAITS)}, received enum value {t.kind}"
            ) from None
        if name in seen:
            raise WireError(f"soft_traits[{i}].kind: expected each trait at most once, received {name!r} again")
        seen.add(name)
        mechanism = SOFT_TRAIT_MECHANISMS[name]
        if t.mechanism != mechanism:
            more = f" ({len(t.mechanism)} characters)" if len(t.mechanism) > 32 else ""
            raise WireError(
                f"soft_traits[{i}].mechanism: expected {mechanism!r} for {name}, received {t.mechanism[:32]!r}{more}"
            )
        if not (MIN_EPSILON <= t.epsilon <= MAX_SOFT_EPSILON):  # False for NaN too
            raise WireError(
                f"soft_traits[{i}].epsilon: expected {MIN_EPSILON:g} <= epsilon <= {MAX_SOFT_EPSILON:g}, "
                f"received {t.epsilon:g}"
            )
        if not math.isfinite(t.value):
            raise WireError(f"soft_traits[{i}].value: expected a finite number, received {t.value}")
        if mechanism == "randomized-response":
            if t.value not in (0.0, 1.0):
                raise WireError(f"soft_traits[{i}].value: expected 0 or 1 (randomized response), received {t.value:g}")
            continue
        lo, hi = soft_trait_value_range(name, t.epsilon)
        if not (lo <= t.value <= hi):
            raise WireError(
                f"soft_traits[{i}].value: expected {name} within [{lo:g}, {hi:g}] (its public range "
                f"{list(SOFT_TRAIT_RANGES[name])} ± {SOFT_TRAIT_NOISE_SCALES:g} Laplace scales at epsilon="
                f"{t.epsilon:g}), received {t.value:g}"
            )


def device_model_message(files: Mapping[str, bytes], serial: int) -> recognition_pb2.DeviceModelFiles:
    """A signed device model's files (:mod:`peep.core.devicemodel`) as the message that carries them."""
    msg = recognition_pb2.DeviceModelFiles(serial=int(serial))
    for name in sorted(files):
        msg.files.add(name=name, content=files[name])
    return msg


def device_model_files(msg: recognition_pb2.DeviceModelFiles, *, max_bytes: int) -> dict[str, bytes]:
    """The files of a received device model message; :class:`WireError` for duplicates, bad names or size."""
    out: dict[str, bytes] = {}
    total = 0
    for f in msg.files:
        if not ID_PATTERN.match(f.name) or f.name in out:
            raise WireError(f"files.name: expected distinct file names, received {f.name[:64]!r}")
        total += len(f.content)
        if total > max_bytes:
            raise WireError(f"files: expected at most {max_bytes} bytes in all, received more")
        out[f.name] = bytes(f.content)
    return out


def decode_device_model(data: bytes, *, max_bytes: int) -> tuple[int, dict[str, bytes]]:
    """``(serial, files)`` of an encoded :class:`DeviceModelFiles` (an MQTT payload); :class:`WireError` if not one."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) > max_bytes + 4096:
        raise WireError(f"payload: expected a device model of at most {max_bytes} bytes")
    msg = recognition_pb2.DeviceModelFiles()
    try:
        msg.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise WireError(f"payload: expected a serialised peep.v1.DeviceModelFiles, parsing failed ({exc})") from exc
    return int(msg.serial), device_model_files(msg, max_bytes=max_bytes)
