from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st
from peep.core import wire
from peep.core.exceptions import WireError
from peep.v1 import qbbs_pb2, recognition_pb2, template_pb2

MECH = wire.MechanismDescription(
    kind="peep", epsilon=8.0, delta=0.0, epsilon_coordinate=8.0, epsilon_vector=1024.0, noise_std=0.177
)


def _template(values=None, **kw):
    args = dict(device_id="cam-1", site="lobby", bundle_id="eb-0123456789abcdef0123", mechanism=MECH)
    args.update(kw)
    return wire.make_template(np.linspace(0, 1, 128) if values is None else values, **args)


def _reachable_fields(desc, seen=None):
    seen = set() if seen is None else seen
    if desc.full_name in seen:
        return
    seen.add(desc.full_name)
    for f in desc.fields:
        yield desc.full_name, f
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            yield from _reachable_fields(f.message_type, seen)


@pytest.mark.parametrize(
    "message",
    [
        template_pb2.PerturbedTemplate,
        recognition_pb2.IdentifyRequest,
        recognition_pb2.VerifyRequest,
        recognition_pb2.EnrolSubjectRequest,
        recognition_pb2.RecognitionEvent,
        qbbs_pb2.QbbsVerifyRequest,
    ],
)
def test_no_field_can_carry_pixels(message):
    """Everything a device sends about a face: no bytes fields, floats only in values."""
    for owner, field in _reachable_fields(message.DESCRIPTOR):
        assert field.type != FieldDescriptor.TYPE_BYTES, f"{owner}.{field.name} is bytes"
        if field.is_repeated and field.type in (
            FieldDescriptor.TYPE_FLOAT,
            FieldDescriptor.TYPE_DOUBLE,
            FieldDescriptor.TYPE_INT32,
            FieldDescriptor.TYPE_UINT32,
        ):
            # The only numeric array is the coefficient vector, capped far below a face's pixels.
            assert (owner, field.name) == ("peep.v1.PerturbedTemplate", "values")
    assert wire.MAX_COMPONENTS < 62 * 47


def test_roundtrip_preserves_everything():
    vals = np.random.default_rng(1).normal(size=128).astype(np.float32)
    msg = _template(
        vals,
        purpose="enroll",
        subject="alice",
        track_id="t7",
        capture_time=1_700_000_000.5,
        soft_traits=[{"trait": "age", "value": 31.5, "epsilon": 1.0, "mechanism": "bounded-laplace"}],
    )
    data = wire.encode_template(msg)
    back = wire.decode_template(data)
    np.testing.assert_array_equal(wire.template_values(back), vals)
    assert back.subject == "alice" and wire.purpose_name(back.purpose) == "enroll"
    assert wire.MechanismDescription.from_proto(back.mechanism) == MECH
    assert back.capture_time.ToNanoseconds() == 1_700_000_000_500_000_000
    assert wire.trait_name(back.soft_traits[0].kind) == "age"
    assert len(data) < 128 * 4 + 200
    assert wire.encode_template(back) == data


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda m: setattr(m, "device_id", "cam/1"), "device_id"),
        (lambda m: setattr(m, "site", ""), "site"),
        (lambda m: setattr(m, "message_id", "x" * 200), "message_id"),
        (lambda m: setattr(m, "purpose", template_pb2.PURPOSE_VERIFY), "subject: expected a subject id"),
        (lambda m: m.values.__setitem__(3, float("nan")), "values: expected finite numbers, received nan at index 3"),
        (lambda m: m.values.__setitem__(0, float("inf")), "values: expected finite"),
        (lambda m: m.ClearField("values"), "values: expected 1-2048"),
        (lambda m: m.ClearField("mechanism"), "mechanism: expected"),
        (lambda m: setattr(m.mechanism, "epsilon_vector", 0.0), "mechanism.epsilon_vector"),
        (lambda m: setattr(m.mechanism, "kind", 0), "mechanism.kind"),
        (lambda m: setattr(m.mechanism, "delta", 1.5), "mechanism.delta"),
        (lambda m: setattr(m, "purpose", 0), "purpose"),
    ],
)
def test_validation_names_the_field(mutate, match):
    msg = _template()
    mutate(msg)
    with pytest.raises(WireError, match=match):
        wire.validate_template(msg)


def test_dimension_check_against_bundle():
    with pytest.raises(WireError, match="expected 64 coefficients"):
        wire.validate_template(_template(), n_components=64)


def test_decode_rejects_garbage_and_oversize():
    with pytest.raises(WireError, match="parsing failed"):
        wire.decode_template(b"\xff\xff\xff\xff")
    with pytest.raises(WireError, match="at most"):
        wire.decode_template(b"\x00" * (wire.MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(WireError, match="expected bytes"):
        wire.decode_template("text")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_decoding_random_bytes_never_crashes(data):
    try:
        msg = wire.decode_template(data)
    except WireError:
        return
    # Anything accepted satisfies every rule.
    wire.validate_template(msg)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=256))
def test_any_finite_vector_roundtrips(values):
    msg = _template(np.asarray(values, dtype=np.float32))
    back = wire.decode_template(wire.encode_template(msg))
    np.testing.assert_array_equal(wire.template_values(back), np.asarray(values, dtype=np.float32))


def test_make_template_rejects_unknown_names():
    with pytest.raises(WireError, match="purpose"):
        _template(purpose="watch")
    with pytest.raises(WireError, match="soft_traits.trait"):
        _template(soft_traits=[{"trait": "eye colour", "value": 1, "epsilon": 1}])
    with pytest.raises(WireError, match="mechanism.kind"):
        wire.MechanismDescription(
            kind="none", epsilon=1, delta=0, epsilon_coordinate=1, epsilon_vector=1, noise_std=1
        ).to_proto()


def test_stack_values_requires_one_dimension():
    a, b = _template(np.ones(128)), _template(np.ones(64))
    assert wire.stack_values([a, a]).shape == (2, 128)
    with pytest.raises(WireError, match="one dimension"):
        wire.stack_values([a, b])


@pytest.mark.parametrize("good", ["alice", "background:12", "Zoë Smith", "x" * 128])
def test_check_subject_id_returns_a_good_id(good):
    assert wire.check_subject_id(good) == good


@pytest.mark.parametrize("bad", ["", "a/b", "a+b", "a#b", "tab\there", "x" * 129, None, 7])
@pytest.mark.parametrize("field", ["subject", "--subject", "claimed_subject"])
def test_check_subject_id_names_the_field_the_expectation_and_the_value(bad, field):
    # The one rule every caller (wire, edge enroll, server erase/enrol, QBBS) applies.
    with pytest.raises(WireError, match=rf"^{field}: expected 1-128 characters without control characters") as info:
        wire.check_subject_id(bad, field)
    assert f"received {(bad[:64] if isinstance(bad, str) else bad)!r}" in str(info.value)


# --------------------------------------------------------------------------- capture_time


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda m: m.ClearField("capture_time"), r"^capture_time: expected the capture time, received none"),
        (lambda m: setattr(m.capture_time, "seconds", 2**62), r"^capture_time: expected a timestamp within"),
        (lambda m: setattr(m.capture_time, "seconds", -(2**62)), r"^capture_time: expected a timestamp within"),
        (lambda m: setattr(m.capture_time, "seconds", 253_402_300_800), r"^capture_time: expected a timestamp within"),
        (lambda m: setattr(m.capture_time, "nanos", -1), r"^capture_time.nanos: expected 0-999999999, received -1"),
        (lambda m: setattr(m.capture_time, "nanos", 10**9), r"^capture_time.nanos: expected 0-999999999"),
    ],
)
def test_capture_time_must_be_a_valid_timestamp(mutate, match):
    msg = _template()
    mutate(msg)
    with pytest.raises(WireError, match=match):
        wire.validate_template(msg)


def test_the_extremes_of_the_timestamp_range_are_left_to_the_receivers_clock():
    # Year 1 and year 9999 are valid timestamps: the window around the server's clock refuses them.
    for seconds in (-62_135_596_800, 253_402_300_799):
        msg = _template()
        msg.capture_time.seconds, msg.capture_time.nanos = seconds, 999_999_999
        wire.validate_template(msg)


# --------------------------------------------------------------------------- bounds

AGE = {"trait": "age", "value": 31.5, "epsilon": 1.0, "mechanism": "bounded-laplace"}
GENDER = {"trait": "gender", "value": 1.0, "epsilon": 1.0, "mechanism": "randomized-response"}


def test_genuine_soft_trait_releases_pass():
    _template(soft_traits=[AGE, GENDER])
    _template(soft_traits=[{**AGE, "value": -5000.0}, {**GENDER, "value": 0.0, "epsilon": 100.0}])
    for trait in ("height", "weight"):
        _template(soft_traits=[{"trait": trait, "value": 170.0, "epsilon": 0.5, "mechanism": "bounded-laplace"}])


@pytest.mark.parametrize(
    ("trait", "match"),
    [
        ({**AGE, "value": 1e300}, r"^soft_traits\[0\]\.value: expected age within \[-6000, 6150\] "),
        ({**AGE, "value": -1e300}, r"^soft_traits\[0\]\.value: expected age within"),
        ({**AGE, "value": 1e6, "epsilon": 2.0}, r"^soft_traits\[0\]\.value: expected age within \[-3000, 3150\]"),
        ({"trait": "height", "value": 1e9, "epsilon": 1.0, "mechanism": "bounded-laplace"}, r"expected height within"),
        ({"trait": "weight", "value": -1e9, "epsilon": 1.0, "mechanism": "bounded-laplace"}, r"expected weight within"),
        ({**GENDER, "value": 0.5}, r"^soft_traits\[0\]\.value: expected 0 or 1 \(randomized response\), received 0.5"),
        ({**GENDER, "value": 2.0}, r"expected 0 or 1"),
        ({**AGE, "epsilon": 1e-300}, r"^soft_traits\[0\]\.epsilon: expected 0.001 <= epsilon <= 100, received 1e-300"),
        ({**AGE, "epsilon": 0.0}, r"^soft_traits\[0\]\.epsilon: expected"),
        ({**AGE, "epsilon": 101.0}, r"^soft_traits\[0\]\.epsilon: expected"),
        ({**AGE, "epsilon": float("nan")}, r"^soft_traits\[0\]\.epsilon: expected"),
        ({**AGE, "value": float("inf")}, r"^soft_traits\[0\]\.value: expected a finite number"),
        ({**AGE, "mechanism": "x" * 5000}, r"^soft_traits\[0\]\.mechanism: expected 'bounded-laplace' for age, "),
        ({**AGE, "mechanism": ""}, r"^soft_traits\[0\]\.mechanism: expected 'bounded-laplace' for age"),
        ({**AGE, "mechanism": "randomized-response"}, r"expected 'bounded-laplace' for age"),
        ({**GENDER, "mechanism": "bounded-laplace"}, r"expected 'randomized-response' for gender"),
    ],
)
def test_soft_traits_are_bounded_and_named(trait, match):
    msg = _template()
    msg.soft_traits.add(
        kind=wire.SOFT_TRAITS[trait["trait"]],
        value=trait["value"],
        epsilon=trait["epsilon"],
        mechanism=trait["mechanism"],
    )
    with pytest.raises(WireError, match=match) as info:
        wire.validate_template(msg)
    assert len(str(info.value)) < 300  # never echoes an unbounded string


def test_each_soft_trait_at_most_once():
    with pytest.raises(WireError, match=r"^soft_traits\[1\]\.kind: expected each trait at most once, received 'age'"):
        _template(soft_traits=[AGE, AGE])


@pytest.mark.parametrize(
    ("kind", "epsilon", "match"),
    [
        ("peep", 1e-300, r"^mechanism.epsilon: expected 0.001 <= epsilon <= 1e\+06 for peep, received 1e-300"),
        ("peep", 2e6, r"^mechanism.epsilon: expected 0.001 <= epsilon <= 1e\+06 for peep"),
        ("privunit", 600.0, r"^mechanism.epsilon: expected 0.001 <= epsilon <= 500 for privunit, received 600"),
    ],
)
def test_template_epsilon_within_the_registry_limits(kind, epsilon, match):
    msg = _template()
    msg.mechanism.kind = wire.MECHANISM_KINDS[kind]
    msg.mechanism.epsilon = epsilon
    with pytest.raises(WireError, match=match):
        wire.validate_template(msg)


# --------------------------------------------------------------------------- subject ids

BIDI_AND_CONTROLS = [
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f",
    "\u200b", "\u200d", "\ufeff", "\u00ad", "\u061c", "\x7f", "\x85", "\u2028", "\u2029", "\x00", "\n",
]  # fmt: skip


@pytest.mark.parametrize("char", BIDI_AND_CONTROLS)
def test_check_subject_id_refuses_control_format_and_bidi_characters(char):
    with pytest.raises(WireError, match=rf"^subject: expected .* received .*U\+{ord(char):04X}"):
        wire.check_subject_id(f"alice{char}evil")


def test_subject_ids_are_nfc_normalised_at_entry_and_refused_otherwise_on_the_wire():
    nfd = "Zoe\u0308"  # "Zoë" decomposed
    assert wire.check_subject_id(nfd) == "Zo\u00eb"
    msg = _template(purpose="enroll", subject=nfd)
    assert msg.subject == "Zo\u00eb"  # make_template normalises
    msg.subject = nfd  # a foreign sender that did not
    with pytest.raises(WireError, match=r"^subject: expected NFC-normalised text"):
        wire.validate_template(msg)


def test_sql_looking_subjects_are_just_text():
    # Parameters are always bound; such an id is an ordinary label, not a query.
    assert wire.check_subject_id("' OR 1=1 --") == "' OR 1=1 --"


def test_key_id_is_carried_and_bounded():
    msg = _template(key_id="sk-0123456789abcdef")
    assert wire.decode_template(wire.encode_template(msg)).key_id == "sk-0123456789abcdef"
    assert _template().key_id == ""
    for bad in ("sk-0123456789ABCDEF", "sk-0123", "0123456789abcdef", "sk-0123456789abcdef0", "x" * 500):
        msg = _template()
        msg.key_id = bad
        with pytest.raises(WireError, match=r"key_id: expected 'sk-' and 16 hex digits or empty") as info:
            wire.validate_template(msg)
        assert len(str(info.value)) < 200
