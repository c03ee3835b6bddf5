"""gRPC QbbsService over a real loopback socket (and in-process errors)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
from peep.core.wire import MechanismDescription, make_template
from peep.server.qbbs import ObservationNoise, QbbsConfig, QbbsModule, StaticFaceScores
from peep.server.qbbs.service import add_qbbs_servicer, observed_from_template
from peep.v1 import qbbs_pb2, qbbs_pb2_grpc

TOKEN = "s3cret-admin-token"
ADMIN = (("authorization", f"Bearer {TOKEN}"),)
MECH = MechanismDescription(
    kind="peep", epsilon=8.0, delta=0.0, epsilon_coordinate=8.0, epsilon_vector=32.0, noise_std=0.18
)


def _template(subject: str = "bob", soft: tuple[dict[str, Any], ...] = ()) -> Any:
    return make_template(
        np.linspace(0, 1, 4),
        device_id="cam1",
        site="lobby",
        bundle_id="b0123",
        mechanism=MECH,
        purpose="verify",
        subject=subject,
        soft_traits=soft,
    )


def _face(subject: str, values: np.ndarray) -> float:
    assert values.shape == (4,) and values.dtype == np.float32
    return {"bob": -0.1, "alice": -6.0}[subject]


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[Any, QbbsModule]]:
    cfg = QbbsConfig(
        epsilon=1.0,
        epsilon_cap=6.0,
        weights={"face": 0.6, "age": 0.1, "gender": 0.1, "height": 0.1, "weight": 0.1},
        store_path=tmp_path / "t.sqlite",
        ledger_path=tmp_path / "l.jsonl",
    )
    faces = StaticFaceScores(_face, genuine=[0.0, -0.2, -0.5, -1.0], impostor=[-4.0, -5.0, -6.0, -8.0])
    module = QbbsModule(cfg, face_scores=faces)
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    add_qbbs_servicer(server, module, admin_token=TOKEN)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield qbbs_pb2_grpc.QbbsServiceStub(channel), module
    finally:
        channel.close()
        server.stop(None).wait()
        module.close()


def _enrol(stub: Any, subject: str, **traits: float) -> Any:
    req = qbbs_pb2.EnrolSoftTraitsRequest(
        subject=subject, traits=[qbbs_pb2.SoftTraitValue(trait=k, value=v) for k, v in traits.items()]
    )
    return stub.EnrolSoftTraits(req, metadata=ADMIN, timeout=5)


def test_admin_rpcs_need_the_admin_credential(served):
    stub, _ = served
    req = qbbs_pb2.EnrolSoftTraitsRequest(subject="bob", traits=[qbbs_pb2.SoftTraitValue(trait="age", value=40)])
    with pytest.raises(grpc.RpcError) as err:
        stub.EnrolSoftTraits(req, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        stub.Query(
            qbbs_pb2.QbbsQueryRequest(subject="bob", trait="age"),
            metadata=(("authorization", "Bearer wrong"),),
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        stub.GetOdometer(qbbs_pb2.OdometerRequest(subject="bob"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_enrol_query_odometer_over_a_socket(served):
    stub, _ = served
    assert _enrol(stub, "bob", age=52, gender=1, height=181.5, weight=92).traits == 4
    _enrol(stub, "alice", age=34, gender=0, height=168, weight=61)
    r = stub.Query(qbbs_pb2.QbbsQueryRequest(subject="bob", trait="height"), metadata=ADMIN, timeout=5)
    assert (r.subject, r.trait, r.epsilon_spent, r.epsilon_total) == ("bob", "height", 1.0, 1.0)
    assert math.isfinite(r.value)
    odo = stub.GetOdometer(qbbs_pb2.OdometerRequest(subject="bob"), metadata=ADMIN, timeout=5)
    assert (odo.epsilon_spent, odo.epsilon_cap, odo.queries) == (1.0, 6.0, 1)


def test_errors_map_to_status_codes_with_the_message(served):
    stub, _ = served
    _enrol(stub, "bob", age=52)
    cases = [
        (lambda: _enrol(stub, "bob", shoe_size=41), grpc.StatusCode.INVALID_ARGUMENT, "shoe_size"),
        (lambda: _enrol(stub, "bob", age=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "finite"),
        (lambda: _enrol(stub, "bob", height=300), grpc.StatusCode.INVALID_ARGUMENT, "declared range"),
        (
            lambda: stub.Query(qbbs_pb2.QbbsQueryRequest(subject="zed", trait="age"), metadata=ADMIN, timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "zed",
        ),
    ]
    for call, code, text in cases:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code
        assert text in err.value.details()


def test_verify_fused_over_a_socket_and_the_odometer_cap(served):
    stub, module = served
    _enrol(stub, "bob", age=52, gender=1, height=181.5, weight=92)
    req = qbbs_pb2.QbbsVerifyRequest(
        template=_template("bob"),
        claimed_subject="bob",
        observed=[
            qbbs_pb2.SoftTraitValue(trait="height", value=180.0),
            qbbs_pb2.SoftTraitValue(trait="weight", value=90.0),
        ],
    )
    r = stub.VerifyFused(req, timeout=5)
    assert r.face_score == -0.1
    assert [t.trait for t in r.traits] == ["height", "weight"]
    # configured weights 0.6 / 0.1 / 0.1 renormalised over the face and the two observed traits
    assert [t.weight for t in r.traits] == pytest.approx([0.125, 0.125])
    assert r.epsilon_spent == 2.0 and r.epsilon_total == 2.0
    # the threshold is the one calibrated for claims observing height and weight
    assert r.threshold == module.calibration(["height", "weight"]).threshold
    assert r.accepted == (r.fused_score >= r.threshold)
    assert r.log_p_genuine_face == pytest.approx(float(module.face_model().log_posterior([-0.1])[0]))
    stub.VerifyFused(req, timeout=5)
    stub.VerifyFused(req, timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        stub.VerifyFused(req, timeout=5)  # would reach ε = 8 > cap 6
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cap" in err.value.details()
    assert module.odometer("bob").epsilon_spent == 6.0


def test_verify_fused_rejects_bad_requests(served):
    stub, _ = served
    _enrol(stub, "bob", age=52)
    bad = [
        qbbs_pb2.QbbsVerifyRequest(claimed_subject="bob"),
        qbbs_pb2.QbbsVerifyRequest(template=_template("bob"), claimed_subject="alice"),
        qbbs_pb2.QbbsVerifyRequest(
            template=_template("bob"),
            observed=[qbbs_pb2.SoftTraitValue(trait="age", value=50), qbbs_pb2.SoftTraitValue(trait="age", value=51)],
        ),
        qbbs_pb2.QbbsVerifyRequest(
            template=_template("bob"), observed=[qbbs_pb2.SoftTraitValue(trait="eye_colour", value=1)]
        ),
    ]
    for req in bad:
        with pytest.raises(grpc.RpcError) as err:
            stub.VerifyFused(req, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, req


def test_observed_traits_can_come_from_the_templates_edge_releases(served):
    stub, module = served
    _enrol(stub, "bob", age=52, gender=1)
    soft = (
        {"trait": "age", "value": 140.0, "epsilon": 2.0, "mechanism": "bounded-laplace"},
        {"trait": "gender", "value": 1.0, "epsilon": 3.0, "mechanism": "randomized-response"},
    )
    tmpl = _template("bob", soft)
    values, extra = observed_from_template(tmpl, module)
    assert values == {"age": 90.0, "gender": 1.0}  # clipped into the declared range
    assert extra["age"] == pytest.approx(2 * (100.0 / 2.0) ** 2)
    p = 1 / (1 + math.exp(3.0))
    assert extra["gender"] == pytest.approx(p * (1 - p))
    r = stub.VerifyFused(qbbs_pb2.QbbsVerifyRequest(template=tmpl), timeout=5)
    assert [t.trait for t in r.traits] == ["age", "gender"]
    assert r.epsilon_spent == 2.0
    # the decision is calibrated for the edge's mechanisms, not only their variances
    cal = module.calibration_
    assert cal is not None and r.threshold == cal.threshold and cal.observed == ("age", "gender")
    assert cal.noise["age"] == ObservationNoise.edge_laplace(bound=100.0, epsilon=2.0)
    assert cal.noise["gender"] == ObservationNoise.randomized_response(epsilon=3.0)


def test_admin_check_by_token_digest_or_by_the_servers_authorizer(tmp_path):
    import hashlib

    module = QbbsModule(QbbsConfig())
    calls: list[str] = []

    def server_check(context: Any, method: str) -> None:
        calls.append(method)
        if dict(context.invocation_metadata()).get("x-role") != "admin":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not an admin")

    for kwargs, good, bad in [
        ({"admin_token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}, ADMIN, (("authorization", "Bearer x"),)),
        ({"authorize_admin": server_check}, (("x-role", "admin"),), (("x-role", "user"),)),
    ]:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        add_qbbs_servicer(server, module, **kwargs)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = qbbs_pb2_grpc.QbbsServiceStub(channel)
                assert stub.GetOdometer(qbbs_pb2.OdometerRequest(subject="bob"), metadata=good, timeout=5).queries == 0
                with pytest.raises(grpc.RpcError) as err:
                    stub.GetOdometer(qbbs_pb2.OdometerRequest(subject="bob"), metadata=bad, timeout=5)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        finally:
            server.stop(None).wait()
    assert calls == ["GetOdometer", "GetOdometer"]
    with pytest.raises(ValueError, match="at most one"):
        add_qbbs_servicer(
            grpc.server(ThreadPoolExecutor(max_workers=1)), module, admin_token="a", authorize_admin=server_check
        )
    module.close()


def test_without_a_face_recogniser_verification_is_a_failed_precondition(tmp_path):
    module = QbbsModule(QbbsConfig())
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    add_qbbs_servicer(server, module)  # and no admin credential: admin RPCs disabled
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = qbbs_pb2_grpc.QbbsServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.VerifyFused(qbbs_pb2.QbbsVerifyRequest(template=_template("bob")), timeout=5)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.RpcError) as err:
                stub.GetOdometer(qbbs_pb2.OdometerRequest(subject="bob"), metadata=ADMIN, timeout=5)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "disabled" in err.value.details()
    finally:
        server.stop(None).wait()
        module.close()


def _with_traits(*traits: dict[str, Any]) -> Any:
    """A verify template whose soft traits were written by a sender that bypassed make_template."""
    from peep.core.wire import SOFT_TRAITS

    tmpl = _template("bob")
    for t in traits:
        tmpl.soft_traits.add(kind=SOFT_TRAITS[t["trait"]], value=t["value"], epsilon=t["epsilon"],
                             mechanism=t["mechanism"])  # fmt: skip
    return tmpl


UNBOUNDED = [
    ({"trait": "age", "value": 1e300, "epsilon": 1.0, "mechanism": "bounded-laplace"}, "soft_traits[0].value"),
    ({"trait": "age", "value": 40.0, "epsilon": 1e-300, "mechanism": "x" * 5000}, "soft_traits[0].mechanism"),
    ({"trait": "age", "value": 40.0, "epsilon": 1e-300, "mechanism": "bounded-laplace"}, "soft_traits[0].epsilon"),
    ({"trait": "gender", "value": 0.5, "epsilon": 1.0, "mechanism": "randomized-response"}, "soft_traits[0].value"),
    ({"trait": "height", "value": 170.0, "epsilon": 1.0, "mechanism": "randomized-response"}, "soft_traits[0].mech"),
]


@pytest.mark.parametrize(("trait", "field"), UNBOUNDED)
def test_the_module_refuses_the_soft_traits_ingest_refuses(served, trait, field):
    # The same bounds as ingest (peep.core.wire.check_soft_traits): over the socket and for direct callers.
    from peep.server.qbbs.errors import QbbsError

    stub, module = served
    _enrol(stub, "bob", age=52, gender=1)
    tmpl = _with_traits(trait)
    with pytest.raises(grpc.RpcError) as err:
        stub.VerifyFused(qbbs_pb2.QbbsVerifyRequest(template=tmpl), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field) and len(err.value.details()) < 300
    with pytest.raises(QbbsError, match=rf"^{field.replace('[', '.').replace(']', '.')}"):
        observed_from_template(tmpl, module)
    assert module.odometer("bob").epsilon_spent == 0.0
