"""Hypothesis-fuzzed ingest over real gRPC (TLS): the server stays up, stores nothing invalid, answers right."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peep.core import wire
from peep.v1 import recognition_pb2, template_pb2
from peep_testing.server import DEVICE, DEVICE_TOKENS, auth

FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def target(trained_server, templates):
    ch = trained_server.channel()
    raw = ch.unary_unary("/peep.v1.RecognitionService/Ingest", request_serializer=None, response_deserializer=None)
    from peep.v1 import recognition_pb2_grpc

    return {
        "srv": trained_server,
        "stub": recognition_pb2_grpc.RecognitionServiceStub(ch),
        "raw": raw,
        "health": health_pb2_grpc.HealthStub(ch),
        "base": templates.message(int(templates.test[0])),
        "count": trained_server.services.store.count_received(),
    }


def _assert_alive_and_unchanged(t) -> None:
    assert (
        t["health"].Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    )
    assert t["srv"].services.store.count_received() == t["count"]


def _status(call, *a, **kw) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call(*a, **kw)
    return e.value.code()


bad_floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e30, -1e30, 3.4e38])


@st.composite
def broken_templates(draw, base: template_pb2.PerturbedTemplate):
    """A valid template with one or more things broken (never a valid one)."""
    msg = template_pb2.PerturbedTemplate()
    msg.CopyFrom(base)
    msg.message_id = wire.new_message_id()
    kind = draw(
        st.sampled_from(["dimension", "nonfinite", "huge", "bundle", "mechanism", "ids", "oversize", "purpose"])
    )
    if kind == "dimension":
        n = draw(st.integers(0, 400).filter(lambda n: n != 128))
        del msg.values[:]
        msg.values.extend(draw(st.lists(st.floats(-1, 1, width=32), min_size=n, max_size=n)))
    elif kind == "nonfinite":
        for _ in range(draw(st.integers(1, 5))):
            msg.values[draw(st.integers(0, 127))] = draw(bad_floats)
    elif kind == "huge":
        big = float(np.float32(3e38))
        msg.values[draw(st.integers(0, 127))] = draw(st.floats(1e4, big, width=32) | st.floats(-big, -1e4, width=32))
    elif kind == "bundle":
        msg.bundle_id = draw(st.text(min_size=0, max_size=40) | st.sampled_from(["eb-00000000000000000000", ""]))
    elif kind == "mechanism":
        field = draw(st.sampled_from(["epsilon", "epsilon_coordinate", "epsilon_vector", "noise_std", "delta", "kind"]))
        if field == "kind":
            msg.mechanism.kind = draw(st.integers(0, 9).filter(lambda k: k != base.mechanism.kind))
        else:
            value = draw(st.floats(allow_nan=True, allow_infinity=True))
            if math.isclose(value, getattr(base.mechanism, field), rel_tol=1e-3):
                value = -1.0
            setattr(msg.mechanism, field, value)
    elif kind == "ids":
        field = draw(st.sampled_from(["message_id", "site", "track_id", "subject"]))
        value = draw(st.text(min_size=1, max_size=300).filter(lambda v: not wire.ID_PATTERN.match(v)))
        if field == "subject":
            msg.purpose = template_pb2.PURPOSE_ENROLL
            value = value if not wire.SUBJECT_PATTERN.match(value) else "a/b"
        setattr(msg, field, value)
    elif kind == "oversize":
        msg.values.extend([0.5] * draw(st.integers(4100, 6000)))
    else:
        msg.purpose = template_pb2.PURPOSE_VERIFY  # verify without a claimed subject
        msg.subject = ""
    return msg


def test_random_bytes_are_invalid_argument(target):
    @FUZZ
    @given(payload=st.binary(max_size=20_000))
    def check(payload):
        code = _status(target["raw"], payload, metadata=DEVICE, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT

    check()
    _assert_alive_and_unchanged(target)


@pytest.mark.slow
def test_broken_templates_are_invalid_argument(target):
    @FUZZ
    @given(data=st.data())
    def check(data):
        msg = data.draw(broken_templates(target["base"]))
        assert _status(target["stub"].Ingest, msg, metadata=DEVICE, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT
        req = recognition_pb2.IdentifyRequest(template=msg)
        assert _status(target["stub"].Identify, req, metadata=DEVICE, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT

    check()
    _assert_alive_and_unchanged(target)


def test_other_devices_templates_are_permission_denied(target):
    @settings(max_examples=40, deadline=None)
    @given(device=st.from_regex(wire.ID_PATTERN, fullmatch=True).filter(lambda d: d != "cam-2"))
    def check(device):
        msg = template_pb2.PerturbedTemplate()
        msg.CopyFrom(target["base"])
        msg.device_id = device
        msg.message_id = wire.new_message_id()
        code = _status(target["stub"].Ingest, msg, metadata=auth(DEVICE_TOKENS["cam-2"]), timeout=5)
        assert code == grpc.StatusCode.PERMISSION_DENIED

    check()
    _assert_alive_and_unchanged(target)


@pytest.mark.slow
def test_streams_of_broken_templates_reject_each_message(target):
    @settings(max_examples=25, deadline=None)
    @given(data=st.data(), n=st.integers(1, 30))
    def check(data, n):
        msgs = [data.draw(broken_templates(target["base"])) for _ in range(n)]
        summary = target["stub"].IngestStream(iter(msgs), metadata=DEVICE, timeout=10)
        assert summary.rejected == n and summary.accepted == 0
        assert all(a.status == recognition_pb2.INGEST_STATUS_REJECTED and a.reason for a in summary.acks)

    check()
    _assert_alive_and_unchanged(target)


def test_undecodable_messages_inside_a_stream_are_rejected(target):
    raw = (
        target["srv"]
        .channel()
        .stream_unary(
            "/peep.v1.RecognitionService/IngestStream",
            request_serializer=None,
            response_deserializer=recognition_pb2.IngestSummary.FromString,
        )
    )
    summary = raw(iter([b"\xff\xff\xff\xff", b"\x0a\x05hello"]), metadata=DEVICE, timeout=5)
    assert summary.rejected == 2
    assert summary.acks[0].reason.startswith("payload: expected a serialised protobuf message")
    _assert_alive_and_unchanged(target)


def test_every_stored_template_is_valid(target):
    """Re-validate the whole store: nothing the fuzzers sent slipped in."""
    srv = target["srv"]
    store = srv.services.store
    es = store.enrolment_set(target["base"].bundle_id, ["peep-raw"])
    assert np.all(np.isfinite(es.values)) and es.values.shape[1] == 128
    assert len(es) + store.count_templates(purpose="identify") + store.count_templates(purpose="verify") == (
        store.count_templates()
    )
    # and of what the fuzzers sent, nothing was kept: identify/verify templates are decided, then forgotten
    assert store.count_templates(purpose="identify") + store.count_templates(purpose="verify") == 0
