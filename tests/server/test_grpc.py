"""The gRPC API over real TLS sockets: authentication, ingest acks, recognition, bundles, events, health, shutdown."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from peep.core import wire
from peep.v1 import recognition_pb2, recognition_pb2_grpc, template_pb2
from peep_testing.server import (
    ADMIN,
    ADMIN_TOKEN,
    DEVICE,
    DEVICE_TOKENS,
    SITE,
    EventCollector,
    auth,
    base_config,
    start_server,
    tls_section,
)
from peep_testing.server import (
    rpc_error as _code,
)

CAM2 = auth(DEVICE_TOKENS["cam-2"])


# --------------------------------------------------------------------------- authentication


def test_unauthenticated_and_unknown_tokens_are_refused(fresh, templates):
    stub = fresh.stub()
    msg = templates.message(0)
    code, details = _code(stub.Ingest, msg, timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in details
    code, _ = _code(stub.Ingest, msg, metadata=auth("not-a-token"), timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, details = _code(stub.Ingest, msg, metadata=[("authorization", "Basic abc")], timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "expected 'Bearer <token>'" in details
    assert fresh.services.store.count_received() == 0


def test_a_device_may_only_ingest_its_own_templates(fresh, templates):
    stub = fresh.stub()
    code, details = _code(stub.Ingest, templates.message(0, device_id="cam-1"), metadata=CAM2, timeout=5)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == "device_id: expected 'cam-2' (the authenticated device), received 'cam-1'"
    code, details = _code(stub.Ingest, templates.message(0, site="gate"), metadata=DEVICE, timeout=5)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "registered site" in details
    ack = stub.Ingest(templates.message(0), metadata=DEVICE, timeout=5)
    assert ack.status == recognition_pb2.INGEST_STATUS_ACCEPTED
    assert fresh.services.store.count_received() == 1
    assert (
        fresh.services.metrics.value("peep_ingest_rejected_total", {"transport": "grpc", "reason": "wrong_device"}) == 1
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda s, md: s.Train(recognition_pb2.TrainRequest(), metadata=md, timeout=5),
        lambda s, md: s.EraseSubject(recognition_pb2.EraseSubjectRequest(subject="x"), metadata=md, timeout=5),
        lambda s, md: s.EnrolSubject(recognition_pb2.EnrolSubjectRequest(subject="x"), metadata=md, timeout=5),
        lambda s, md: s.PublishBundle(recognition_pb2.BundleFiles(), metadata=md, timeout=5),
    ],
    ids=["Train", "EraseSubject", "EnrolSubject", "PublishBundle"],
)
def test_admin_operations_need_the_admin_credential(fresh, call):
    code, details = _code(call, fresh.stub(), DEVICE)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "expected an admin credential" in details
    code, _ = _code(call, fresh.stub(), None)
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_health_and_reflection_are_open(tmp_path, pki, keypair, bundle_dir):
    # reflection is off by default and needs credentials unless "open" (tests/server/test_grpc_limits.py)
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki), "reflection": "open"})
    srv = start_server(cfg, pki, tmp_path)
    try:
        ch = srv.channel()
        h = health_pb2_grpc.HealthStub(ch)
        assert h.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        req = health_pb2.HealthCheckRequest(service="peep.v1.RecognitionService")
        assert h.Check(req, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        r = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(r.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        names = {s.name for s in resp.list_services_response.service}
        assert {"peep.v1.RecognitionService", "grpc.health.v1.Health"} <= names
    finally:
        srv.app.stop(0)


def test_plaintext_clients_cannot_talk_to_the_tls_port(fresh):
    stub = recognition_pb2_grpc.RecognitionServiceStub(grpc.insecure_channel(f"127.0.0.1:{fresh.port}"))
    code, _ = _code(stub.GetModelStatus, recognition_pb2.ModelStatusRequest(), metadata=DEVICE, timeout=3)
    assert code == grpc.StatusCode.UNAVAILABLE


def test_mtls_certificate_common_name_is_the_device(tmp_path, pki, keypair, bundle_dir, templates):
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki, mtls=True)})
    srv = start_server(cfg, pki, tmp_path)
    try:
        ok = srv.stub(client="cam-1").Ingest(templates.message(0), timeout=5)
        assert ok.status == recognition_pb2.INGEST_STATUS_ACCEPTED
        code, details = _code(srv.stub(client="cam-2").Ingest, templates.message(1), timeout=5)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'cam-2' (the authenticated device)" in details
        code, details = _code(srv.stub(client="cam-unregistered").Ingest, templates.message(1), timeout=5)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "not a registered device" in details
        # a token for another device over cam-1's certificate is refused
        code, details = _code(srv.stub(client="cam-1").Ingest, templates.message(1), metadata=CAM2, timeout=5)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "certificate names 'cam-1'" in details
        # the admin certificate may call admin methods
        st = srv.stub(client="peep-admin").GetModelStatus(recognition_pb2.ModelStatusRequest(), timeout=5)
        assert st.bundle_id == templates.bundle_id
        code, _ = _code(srv.stub(client="cam-1").Train, recognition_pb2.TrainRequest(), timeout=5)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        # no certificate, or one from another CA: the handshake fails
        for kw in ({}, {"rogue": True}):
            code, _ = _code(
                srv.stub(**kw).GetModelStatus, recognition_pb2.ModelStatusRequest(), metadata=DEVICE, timeout=3
            )
            assert code == grpc.StatusCode.UNAVAILABLE
        assert srv.services.store.count_received() == 1
    finally:
        srv.app.stop(0)


# --------------------------------------------------------------------------- ingest


def test_unary_ingest_is_idempotent_and_invalid_input_names_the_field(fresh, templates):
    stub = fresh.stub()
    msg = templates.message(0, purpose="enroll", subject="alice")
    assert stub.Ingest(msg, metadata=DEVICE, timeout=5).status == recognition_pb2.INGEST_STATUS_ACCEPTED
    assert stub.Ingest(msg, metadata=DEVICE, timeout=5).status == recognition_pb2.INGEST_STATUS_DUPLICATE
    bad = templates.message(1)
    del bad.values[5:]
    code, details = _code(stub.Ingest, bad, metadata=DEVICE, timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("values: expected 128 coefficients")
    assert fresh.services.store.count_received() == 1


def test_stream_ingest_acks_every_message(fresh, templates):
    stub = fresh.stub()
    good = [templates.message(int(i)) for i in range(30)]
    bad = templates.message(30)
    bad.bundle_id = "eb-unknown"
    other = templates.message(31, device_id="cam-2")
    msgs = [*good[:10], good[3], bad, other, *good[10:]]
    summary = stub.IngestStream(iter(msgs), metadata=DEVICE, timeout=30)
    assert (summary.accepted, summary.duplicates, summary.rejected) == (30, 1, 2)
    assert [a.message_id for a in summary.acks] == [m.message_id for m in msgs]
    by_id = {a.message_id: a for a in summary.acks}
    assert by_id[bad.message_id].status == recognition_pb2.INGEST_STATUS_REJECTED
    assert by_id[bad.message_id].reason.startswith("bundle_id: expected a bundle published on this server")
    assert "the authenticated device" in by_id[other.message_id].reason
    again = stub.IngestStream(iter(good), metadata=DEVICE, timeout=30)
    assert (again.accepted, again.duplicates) == (0, 30)
    assert fresh.services.store.count_received() == 30


def test_stream_length_is_bounded(tmp_path, pki, keypair, bundle_dir, templates):
    cfg = base_config(
        tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki), "max_stream_messages": 20, "stream_batch": 8}
    )
    srv = start_server(cfg, pki, tmp_path)
    try:
        code, details = _code(
            srv.stub().IngestStream, iter([templates.message(i) for i in range(25)]), metadata=DEVICE, timeout=10
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "20 accepted so far" in details
        assert srv.services.store.count_received() == 20  # what arrived before the limit is kept
    finally:
        srv.app.stop(0)


def test_enrol_subject_inline_and_by_message_id_of_kept_templates(keeping_all, templates):
    stub = keeping_all.stub()
    ids = [stub.Ingest(templates.message(i), metadata=DEVICE, timeout=5).message_id for i in range(3)]
    inline = [templates.message(i, purpose="enroll", subject="carol") for i in range(3, 5)]
    resp = stub.EnrolSubject(
        recognition_pb2.EnrolSubjectRequest(subject="carol", templates=inline, message_ids=ids),
        metadata=ADMIN,
        timeout=5,
    )
    assert resp.templates == 5
    assert keeping_all.services.store.count_templates(subject="carol", purpose="enroll") == 5


def test_enrol_subject_by_message_id_names_forgotten_templates(fresh, templates):
    """recognition.keep = none: an identify template is decided and forgotten, so it cannot be enrolled later."""
    stub = fresh.stub()
    ids = [stub.Ingest(templates.message(i), metadata=DEVICE, timeout=5).message_id for i in range(2)]
    code, details = _code(
        stub.EnrolSubject, recognition_pb2.EnrolSubjectRequest(subject="carol", message_ids=ids), metadata=ADMIN,
        timeout=5,
    )  # fmt: skip
    assert code == grpc.StatusCode.NOT_FOUND
    assert "none is stored" in details and "recognition.keep" in details and "ENROLL templates" in details
    assert fresh.services.store.count_templates(subject="carol") == 0


def test_enrol_subject_refuses_templates_of_another_subject(fresh, templates):
    stub = fresh.stub()
    wrong = templates.message(5, purpose="enroll", subject="dave")
    code, details = _code(
        stub.EnrolSubject,
        recognition_pb2.EnrolSubjectRequest(subject="carol", templates=[wrong]),
        metadata=ADMIN,
        timeout=5,
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "expected purpose ENROLL and subject 'carol'" in details


def test_recognition_before_any_model_is_a_failed_precondition(fresh, templates):
    code, details = _code(
        fresh.stub().Identify,
        recognition_pb2.IdentifyRequest(template=templates.message(0)),
        metadata=DEVICE,
        timeout=5,
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no model has been trained yet" in details


# --------------------------------------------------------------------------- bundles


def test_get_and_publish_bundles(fresh, bundle, keypair, tmp_path):
    stub = fresh.stub()
    files = stub.GetBundle(recognition_pb2.GetBundleRequest(), metadata=DEVICE, timeout=10)
    assert files.bundle_id == bundle.bundle_id
    assert {f.name: f.content for f in files.files} == bundle.files
    code, _ = _code(
        stub.GetBundle, recognition_pb2.GetBundleRequest(bundle_id="eb-missing"), metadata=DEVICE, timeout=5
    )
    assert code == grpc.StatusCode.NOT_FOUND
    tampered = recognition_pb2.BundleFiles()
    tampered.CopyFrom(files)
    for f in tampered.files:
        if f.name == "metadata.json":
            f.content = f.content.replace(b'"n_components": 128', b'"n_components": 127')
    code, details = _code(stub.PublishBundle, tampered, metadata=ADMIN, timeout=10)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "metadata.json" in details
    assert stub.PublishBundle(files, metadata=ADMIN, timeout=10).bundle_id == bundle.bundle_id


# --------------------------------------------------------------------------- recognition on the trained server


@pytest.mark.slow
def test_identify_returns_top_k_with_probabilities(trained_server, templates):
    stub = trained_server.stub()
    i = int(templates.test[0])
    resp = stub.Identify(
        recognition_pb2.IdentifyRequest(template=templates.message(i), top_k=3), metadata=DEVICE, timeout=5
    )
    probs = [c.probability for c in resp.candidates]
    assert len(resp.candidates) == 3 and probs == sorted(probs, reverse=True) and 0 <= probs[-1] <= probs[0] <= 1
    assert resp.model_version == "v000001"
    all5 = stub.Identify(
        recognition_pb2.IdentifyRequest(template=templates.message(i), top_k=50), metadata=DEVICE, timeout=5
    )
    names = {c.subject for c in all5.candidates}
    assert names == set(templates.subjects)  # never the background class
    assert sum(c.probability for c in all5.candidates) <= 1.0 + 1e-6
    assert resp.unknown == (resp.subject == "")


def test_verify_uses_the_far_calibrated_threshold(trained_server, templates):
    stub = trained_server.stub()
    model = trained_server.services.recogniser.model
    accepted_genuine = accepted_impostor = 0
    names = sorted(set(templates.subjects))
    for i in templates.test[:60]:
        msg = templates.message(int(i))
        true = str(templates.subjects[i])
        other = names[(names.index(true) + 1) % len(names)]
        g = stub.Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject=true), metadata=DEVICE, timeout=5)
        x = stub.Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject=other), metadata=DEVICE, timeout=5)
        assert g.threshold == pytest.approx(model.verify_threshold) and g.target_far == pytest.approx(0.01)
        assert g.accepted == (g.score > g.threshold)
        accepted_genuine += g.accepted
        accepted_impostor += x.accepted
    assert accepted_genuine > 2 * accepted_impostor
    assert accepted_impostor <= 3  # ~1 % FAR on 60 impostor claims
    code, details = _code(
        stub.Verify,
        recognition_pb2.VerifyRequest(template=templates.message(0), claimed_subject="nobody"),
        metadata=DEVICE,
        timeout=5,
    )
    assert code == grpc.StatusCode.NOT_FOUND and "enrolled in the serving model" in details
    code, details = _code(
        stub.Verify, recognition_pb2.VerifyRequest(template=templates.message(0)), metadata=DEVICE, timeout=5
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("claimed_subject")


def test_templates_of_another_domain_are_refused(trained_server, templates, bundle, seeded):
    from peep.core.release import TemplateReleaser

    r = TemplateReleaser(bundle, kind="peep", epsilon=8.0, random_state=5)
    v = r.release(np.zeros((1, *bundle.geometry.shape), np.float32) + 0.5)[0]
    msg = wire.make_template(v, device_id="cam-1", site=SITE, bundle_id=bundle.bundle_id, mechanism=r.description)
    code, details = _code(
        trained_server.stub().Identify, recognition_pb2.IdentifyRequest(template=msg), metadata=DEVICE, timeout=5
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(
        "mechanism.kind: expected a mechanism releasing"
    )


def test_model_status(trained_server):
    st = trained_server.stub().GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=DEVICE, timeout=5)
    assert st.model_version == "v000001" and st.n_subjects == 5 and not st.training
    assert 0 < st.unknown_threshold < 1 and 0 < st.verify_threshold < 1 and st.validation_accuracy > 0.7
    assert st.trained_at.seconds > 1_600_000_000


def test_events_stream_to_subscribers(trained_server, templates):
    stub = trained_server.stub()
    with EventCollector(trained_server, 3) as events:
        msgs = [templates.message(int(i), track_id=f"track-{k}") for k, i in enumerate(templates.test[100:102])]
        stub.IngestStream(iter(msgs), metadata=DEVICE, timeout=10)  # ingested identify templates raise events
        verify = templates.message(
            int(templates.test[103]), purpose="verify", subject=str(templates.subjects[templates.test[103]])
        )
        stub.Ingest(verify, metadata=DEVICE, timeout=5)
        got = events.wait()
    assert [e.message_id for e in got] == [m.message_id for m in msgs] + [verify.message_id]
    assert got[0].track_id == "track-0" and got[0].purpose == template_pb2.PURPOSE_IDENTIFY and got[0].model_version
    assert got[2].purpose == template_pb2.PURPOSE_VERIFY and got[2].claimed_subject == verify.subject


def test_a_verify_call_on_an_identify_template_is_published_as_a_verification(trained_server, templates):
    """The Verify RPC's event is a verification (claim, decision) even when the template was released to
    identify: published with the template's purpose it read as an identification naming nobody."""
    stub = trained_server.stub()
    i = int(templates.test[104])
    msg = templates.message(i)  # purpose identify
    claim = str(templates.subjects[i])
    with EventCollector(trained_server, 1) as events:
        r = stub.Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject=claim), metadata=DEVICE, timeout=5)
        got = events.wait()
    (ev,) = got
    assert ev.message_id == msg.message_id and ev.purpose == template_pb2.PURPOSE_VERIFY
    assert ev.claimed_subject == claim and ev.accepted == r.accepted and not ev.subject and not ev.unknown


# --------------------------------------------------------------------------- shutdown


def test_graceful_shutdown_drains_in_flight_streams(tmp_path, pki, keypair, bundle_dir, templates):
    srv = start_server(
        base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki), "grace_s": 5.0}), pki, tmp_path
    )
    stub = srv.stub()
    release = threading.Event()
    result: dict = {}

    def slow_messages():
        for i in range(10):
            yield templates.message(i)
        release.wait(10)
        for i in range(10, 20):
            yield templates.message(i)

    def client():
        try:
            result["summary"] = stub.IngestStream(slow_messages(), metadata=DEVICE, timeout=30)
        except grpc.RpcError as e:
            result["error"] = e

    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.5)
    stopper = threading.Thread(target=srv.app.stop)
    stopper.start()
    time.sleep(0.3)
    health = health_pb2_grpc.HealthStub(srv.channel())
    try:
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    except grpc.RpcError as e:  # new connections may already be refused
        assert e.code() == grpc.StatusCode.UNAVAILABLE
    release.set()
    t.join(15)
    stopper.join(15)
    assert "summary" in result, result
    assert result["summary"].accepted == 20  # the in-flight stream finished inside the grace period


def test_admin_token_is_not_a_device(fresh, templates):
    # the admin may ingest on behalf of any device (e.g. imports), a device token may not act as admin
    ack = fresh.stub().Ingest(templates.message(0, device_id="cam-2"), metadata=auth(ADMIN_TOKEN), timeout=5)
    assert ack.status == recognition_pb2.INGEST_STATUS_ACCEPTED
    assert ADMIN != DEVICE


# --------------------------------------------------------------------------- a door's claim check


def test_check_claim_says_whether_the_serving_model_knows_a_subject_and_nothing_more(trained_server, templates):
    stub = trained_server.stub()
    version = trained_server.services.recogniser.model.version
    enrolled = str(templates.subjects[0])
    for subject, known in ((enrolled, True), ("Nobody_Enrolled", False), ("background:1", False)):
        r = stub.CheckClaim(recognition_pb2.CheckClaimRequest(claimed_subject=subject), metadata=CAM2, timeout=5)
        assert (r.known, r.model_version) == (known, version), subject
    code, details = _code(stub.CheckClaim, recognition_pb2.CheckClaimRequest(claimed_subject="bad\x1b[2Jid"),
                          metadata=CAM2, timeout=5)  # fmt: skip
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("claimed_subject")
    assert "\x1b" not in details  # never echoed
    code, _ = _code(stub.CheckClaim, recognition_pb2.CheckClaimRequest(claimed_subject=enrolled), timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_check_claim_is_rate_limited_per_device(trained_server):
    """A device cannot list the enrolled people by asking at wire speed: a burst, then a few a second."""
    stub = trained_server.stub()
    checker = trained_server.services.claim_checks
    codes = []
    for i in range(int(checker.burst) + 10):
        try:
            stub.CheckClaim(recognition_pb2.CheckClaimRequest(claimed_subject=f"Guess_{i}"), metadata=CAM2, timeout=5)
            codes.append("ok")
        except grpc.RpcError as exc:
            codes.append(exc.code().name)
            assert "claim checks: expected at most" in exc.details()
    assert codes.count("RESOURCE_EXHAUSTED") >= 5 and codes[0] == "ok", codes
    time.sleep(1.0)  # the bucket refills
    stub.CheckClaim(recognition_pb2.CheckClaimRequest(claimed_subject="Guess_again"), metadata=CAM2, timeout=5)


def test_a_verify_decision_is_in_the_database_before_its_answer_or_there_is_no_answer(trained_server, templates,
                                                                                   monkeypatch):  # fmt: skip
    """A door drives its lock on Verify's answer: the decision is written first (not by the queued writer a
    second later), and when the database cannot take it the call fails UNAVAILABLE, so the door stays locked."""
    from peep.server.storage.interface import StoreError

    stub, store = trained_server.stub(), trained_server.services.store
    i = int(templates.test[0])
    msg = templates.message(i)
    writer = trained_server.services.ingestor.decisions
    monkeypatch.setattr(writer, "put", lambda _r: pytest.fail("Verify's decision went to the queued writer"))
    last = store.last_decision_id()
    v = stub.Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject=str(templates.subjects[i])),
                    metadata=DEVICE, timeout=5)  # fmt: skip
    kept = [d for _, d in store.decisions(since_id=last) if d.message_id == msg.message_id]
    assert len(kept) == 1 and kept[0].accepted == v.accepted and kept[0].claimed_subject == str(templates.subjects[i])

    def away(_records: object) -> None:
        raise StoreError("storage.dsn 'postgresql://peep:hunter2@db': could not connect to PostgreSQL")

    monkeypatch.setattr(store, "add_decisions", away)
    code, details = _code(stub.Verify, recognition_pb2.VerifyRequest(template=templates.message(i),
                          claimed_subject=str(templates.subjects[i])), metadata=DEVICE, timeout=5)  # fmt: skip
    assert code == grpc.StatusCode.UNAVAILABLE and "could not be kept" in details and "hunter2" not in details


def test_a_call_whose_database_is_away_answers_unavailable_not_internal(trained_server, monkeypatch):
    """PostgreSQL restarting under a call (the soak's training run met one): UNAVAILABLE, call again; never
    INTERNAL, and never the driver's text (it can name the DSN)."""
    from peep.server.storage.interface import StoreError

    def away(*_a: object, **_k: object) -> object:
        raise StoreError("storage.dsn 'postgresql://peep:hunter2@db': could not connect to PostgreSQL")

    monkeypatch.setattr(trained_server.services, "erase_subject", away)
    erase = recognition_pb2.EraseSubjectRequest(subject="nobody-at-all")
    code, details = _code(trained_server.stub().EraseSubject, erase, metadata=ADMIN, timeout=5)
    assert code == grpc.StatusCode.UNAVAILABLE and "call again" in details and "hunter2" not in details

    def bug(*_a: object, **_k: object) -> object:
        raise KeyError("a bug, not an outage")

    monkeypatch.setattr(trained_server.services, "erase_subject", bug)
    code, _ = _code(trained_server.stub().EraseSubject, erase, metadata=ADMIN, timeout=5)
    assert code == grpc.StatusCode.INTERNAL
