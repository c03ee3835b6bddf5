"""QBBS hosted by `peep serve`: the real server over TLS, real face scores from the trained model, erasure.

The soft traits enrolled here are synthetic (made up per subject), not the
LFW people's.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import grpc
import numpy as np
import pytest
from peep.server.cli import main
from peep.server.config import ConfigError, load_config, parse_config
from peep.server.qbbs import HostedQbbs
from peep.server.services import Services
from peep.v1 import qbbs_pb2, qbbs_pb2_grpc, recognition_pb2
from peep_testing.server import (
    ADMIN,
    DEVICE,
    DEVICE_TOKENS,
    auth,
    base_config,
    start_server,
    tls_section,
    to_toml,
)
from peep_testing.server import (
    rpc_error as _code,
)

CAM2 = auth(DEVICE_TOKENS["cam-2"])
EPSILON = 5.0  # per SUM response; one trait value costs the subject 5 (m = 2)
TRAITS = ("age", "gender", "height", "weight")
# Fixed weights (the threshold is still calibrated; the weights it would choose depend on the trained model,
# tests/qbbs/test_odometer.py covers calibrated zeros): face-heavy, as a calibration at this epsilon chooses, so
# the answers' fresh DP noise cannot sink the genuine claim; height and weight have weight 0, so they are
# never queried nor charged.
WEIGHTS = {"face": 0.97, "age": 0.01, "gender": 0.02, "height": 0.0, "weight": 0.0}
USED = tuple(t for t in TRAITS if WEIGHTS[t] > 0)
CAP = 30.0  # two verifications with two used traits (20) and one query (5) fit, a third verification does not


def _qbbs_section(tmp: Any) -> dict[str, Any]:
    return {
        "store_path": str(tmp / "qbbs.sqlite"),
        "ledger_path": str(tmp / "qbbs-spend.jsonl"),
        "epsilon": EPSILON,
        "epsilon_cap": CAP,
        "weights": WEIGHTS,
    }


def _synthetic_traits(k: int) -> dict[str, float]:
    return {"age": 30.0 + 9 * k, "gender": float(k % 2), "height": 160.0 + 6 * k, "weight": 58.0 + 8 * k}


class Hosted:
    """A running TLS server hosting QBBS (``hosted``: what its composition root built, to look at the module)."""

    def __init__(self, srv: Any, hosted: HostedQbbs, cfg: dict[str, Any], subjects: list[str]) -> None:
        self.srv, self.hosted, self.cfg, self.subjects = srv, hosted, cfg, subjects
        self.channel = srv.channel()
        self.qbbs = qbbs_pb2_grpc.QbbsServiceStub(self.channel)
        self.rec = srv.stub()

    @property
    def module(self) -> Any:
        return self.hosted.module

    def enrol(self, subject: str, traits: dict[str, float], metadata: Any = ADMIN) -> Any:
        req = qbbs_pb2.EnrolSoftTraitsRequest(
            subject=subject, traits=[qbbs_pb2.SoftTraitValue(trait=t, value=v) for t, v in traits.items()]
        )
        return self.qbbs.EnrolSoftTraits(req, metadata=metadata, timeout=5)

    def verify(self, template: Any, claimed: str, observed: dict[str, float], metadata: Any = DEVICE) -> Any:
        req = qbbs_pb2.QbbsVerifyRequest(
            template=template,
            claimed_subject=claimed,
            observed=[qbbs_pb2.SoftTraitValue(trait=t, value=v) for t, v in observed.items()],
        )
        return self.qbbs.VerifyFused(req, metadata=metadata, timeout=10)

    def odometer(self, subject: str) -> Any:
        return self.qbbs.GetOdometer(qbbs_pb2.OdometerRequest(subject=subject), metadata=ADMIN, timeout=5)


def _start(tmp_path: Any, pki: Any, keypair: Any, bundle_dir: Any, templates: Any, *, train: bool) -> Hosted:
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}, qbbs=_qbbs_section(tmp_path))
    srv = start_server(cfg, pki, tmp_path)  # the server hosts what its configuration declares: [qbbs]
    assert isinstance(srv.services.qbbs, HostedQbbs)
    subjects = sorted({str(s) for s in templates.subjects})
    h = Hosted(srv, srv.services.qbbs, cfg, subjects)
    if train:
        summary = h.rec.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60)
        assert summary.rejected == 0
        assert h.rec.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
    return h


@pytest.fixture
def hosted(tmp_path, pki, keypair, bundle_dir, templates):
    """Trained server hosting QBBS, every lfw100 subject's (synthetic) soft traits enrolled."""
    h = _start(tmp_path, pki, keypair, bundle_dir, templates, train=True)
    for k, s in enumerate(h.subjects):
        assert h.enrol(s, _synthetic_traits(k)).traits == len(TRAITS)
    yield h
    h.channel.close()
    h.srv.app.stop(0)


def _pick(h: Hosted, templates: Any, of: str, claimed: str, *, best: bool) -> int:
    """The test template of ``of`` the serving model scores highest (best) or lowest for ``claimed``."""
    idx = np.array([i for i in templates.test if templates.subjects[i] == of])
    _, s = h.srv.services.recogniser.verify_scores(templates.X[idx], [claimed] * idx.size)
    return int(idx[np.argmax(s) if best else np.argmin(s)])


@pytest.mark.slow
def test_fused_verification_uses_the_served_model_and_spends_the_claimed_subjects_epsilon(hosted, templates):
    """Observed traits of positive weight are queried and charged to the claimed subject; those of weight 0 are not."""
    h = hosted
    a, b = h.subjects[0], h.subjects[1]
    traits_a, traits_b = _synthetic_traits(0), _synthetic_traits(1)
    genuine_t = templates.message(_pick(h, templates, a, a, best=True), purpose="verify", subject=a)
    impostor_t = templates.message(_pick(h, templates, b, a, best=False), purpose="verify", subject=a)

    g = h.verify(genuine_t, a, traits_a)
    i = h.verify(impostor_t, a, traits_b)

    # the face score is the serving model's: log P(claimed | template), as RecognitionService.Verify reports it
    for resp, t in ((g, genuine_t), (i, impostor_t)):
        v = h.rec.Verify(recognition_pb2.VerifyRequest(template=t, claimed_subject=a), metadata=DEVICE, timeout=5)
        assert resp.face_score == pytest.approx(math.log(max(v.score, 1e-12)), abs=1e-6)
        # the response lists the traits used; the zero-weight ones are omitted, and the fused score is theirs
        assert [t.trait for t in resp.traits] == list(USED) and all(t.weight > 0 for t in resp.traits)
        face_weight = 1.0 - sum(t.weight for t in resp.traits)
        assert resp.fused_score == pytest.approx(
            face_weight * resp.log_p_genuine_face + sum(t.weight * t.log_likelihood for t in resp.traits)
        )
    assert g.face_score > i.face_score
    assert g.log_p_genuine_face > i.log_p_genuine_face
    assert g.fused_score > i.fused_score
    # the decision is calibrated for target_far on the serving model's validation scores (no threshold configured)
    cal = h.module.calibration()
    assert g.threshold == i.threshold == cal.threshold and cal.model_version == "v000001"
    assert cal.simulated_far <= h.module.config.target_far == 0.01 < cal.simulated_gar
    assert [t.weight for t in g.traits] == pytest.approx([cal.weights[t] for t in USED])
    assert cal.weights["height"] == cal.weights["weight"] == 0
    assert g.accepted and not i.accepted

    # each verification spends the used trait values of the *claimed* subject, and nothing for height and weight
    assert g.epsilon_spent == i.epsilon_spent == pytest.approx(len(USED) * EPSILON)
    assert i.epsilon_total == pytest.approx(2 * len(USED) * EPSILON)
    odo = h.odometer(a)
    assert (odo.epsilon_spent, odo.epsilon_cap, odo.queries) == (pytest.approx(20.0), CAP, 2)
    assert h.odometer(b).epsilon_spent == 0.0
    audit = h.module.audit_log(a)
    assert [e["op"] for e in audit] == ["verify", "verify"] and audit[0]["requester"].startswith("device:cam-1 ")
    assert [e["traits"] for e in audit] == [list(USED)] * 2

    # an admin query fits in the cap; the next verification would pass it and is refused, spending nothing
    q = h.qbbs.Query(qbbs_pb2.QbbsQueryRequest(subject=a, trait="age"), metadata=ADMIN, timeout=5)
    assert q.epsilon_spent == EPSILON and q.epsilon_total == pytest.approx(25.0)
    code, details = _code(h.verify, genuine_t, a, traits_a)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "privacy odometer" in details
    assert h.odometer(a).epsilon_spent == pytest.approx(25.0)
    # a claim observing only zero-weight traits releases nothing, so the exhausted cap does not refuse it
    w = h.verify(genuine_t, a, {"height": traits_a["height"], "weight": traits_a["weight"]})
    assert list(w.traits) == [] and w.epsilon_spent == 0.0 and w.fused_score == pytest.approx(w.log_p_genuine_face)
    assert h.odometer(a).epsilon_spent == pytest.approx(25.0)


def test_devices_may_not_call_admin_rpcs_nor_submit_other_devices_templates(hosted, templates):
    h = hosted
    a = h.subjects[0]
    calls = [
        lambda md: h.enrol(a, {"age": 40.0}, metadata=md),
        lambda md: h.qbbs.Query(qbbs_pb2.QbbsQueryRequest(subject=a, trait="age"), metadata=md, timeout=5),
        lambda md: h.qbbs.GetOdometer(qbbs_pb2.OdometerRequest(subject=a), metadata=md, timeout=5),
    ]
    for call in calls:
        code, details = _code(call, DEVICE)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "expected an admin credential" in details
        code, _ = _code(call, None)
        assert code == grpc.StatusCode.UNAUTHENTICATED
    i = _pick(h, templates, a, a, best=True)
    code, _ = _code(h.verify, templates.message(i), a, {"age": 30.0}, metadata=None)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # cam-1 may not submit cam-2's template (the ingest rule); nothing is spent
    foreign = templates.message(i, device_id="cam-2")
    code, details = _code(h.verify, foreign, a, {"age": 30.0}, metadata=DEVICE)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "device_id: expected 'cam-1'" in details
    # the server's template checks apply: an unknown bundle is an invalid argument
    other = templates.message(i)
    other.bundle_id = "eb-not-published"
    code, details = _code(h.verify, other, a, {"age": 30.0}, metadata=DEVICE)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("bundle_id:")
    assert h.odometer(a).epsilon_spent == 0.0
    # cam-2 may submit its own, and an admin anyone's
    assert h.verify(foreign, a, {"age": 30.0}, metadata=CAM2).epsilon_spent == EPSILON
    assert h.verify(foreign, a, {"age": 30.0}, metadata=ADMIN).epsilon_total == 2 * EPSILON


@pytest.mark.slow
def test_erasure_removes_the_soft_traits_and_the_retrained_model_refits_p_genuine(hosted, templates, caplog):
    h = hosted
    caplog.set_level(logging.INFO, logger="peep.server.qbbs.hosting")
    caplog.set_level(logging.INFO, logger="peep.server.qbbs.module")
    a, b = h.subjects[0], h.subjects[1]
    first = h.verify(templates.message(_pick(h, templates, a, a, best=True)), a, {"gender": 0.0})
    before = h.module.face_model()
    # the promotion calibrated the all-traits shape eagerly; this claim's shape on first use
    shapes = {c.observed: c for c in h.module.calibrations_}
    assert set(shapes) == {TRAITS, ("gender",)}
    calibrated = shapes[("gender",)]
    assert first.threshold == calibrated.threshold and calibrated.model_version == "v000001"
    assert before.n_genuine_ == h.srv.services.recogniser.model.genuine.size

    resp = h.rec.EraseSubject(recognition_pb2.EraseSubjectRequest(subject=a, retrain=True), metadata=ADMIN, timeout=300)
    assert resp.soft_traits_deleted == len(TRAITS) and resp.model_version == "v000002"
    code, details = _code(h.qbbs.Query, qbbs_pb2.QbbsQueryRequest(subject=a, trait="age"), metadata=ADMIN, timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND and repr(a) in details
    code, _ = _code(h.verify, templates.message(_pick(h, templates, b, b, best=True)), a, {"age": 30.0})
    assert code == grpc.StatusCode.NOT_FOUND
    # the spend ledger is the audit log: it outlives the traits (a re-enrolled id gets no fresh budget)
    assert h.odometer(a).epsilon_spent == EPSILON

    # the promotion refitted the Parzen densities at once, on the new model's validation scores (4 people now)
    refits = [r for r in caplog.records if r.getMessage().startswith("QBBS: P(genuine | face score) refitted")]
    assert [r.model_version for r in refits] == ["v000002"]
    model = h.srv.services.recogniser.model
    after = h.module.face_model()
    assert after is not before
    assert (after.n_genuine_, after.n_impostor_) == (model.genuine.size, model.impostor.size)
    assert after.n_impostor_ < before.n_impostor_
    # ... and recalibrated the fused threshold of every claim shape in use, on the new model's scores
    shapes = {c.observed: c for c in h.module.calibrations_}
    assert set(shapes) == {TRAITS, ("gender",)}
    assert {c.model_version for c in shapes.values()} == {"v000002"}
    recalibrated = shapes[("gender",)]
    assert recalibrated.threshold != calibrated.threshold
    logged = [r for r in caplog.records if r.getMessage().startswith("QBBS: fused threshold calibrated")]
    assert sorted((r.calibration["model_version"], tuple(r.calibration["observed"])) for r in logged) == sorted(
        [("v000001", ("gender",)), ("v000002", ("gender",)), ("v000002", TRAITS)]
    )
    assert h.verify(templates.message(_pick(h, templates, b, b, best=True)), b, {"gender": 1.0}).threshold == (
        recalibrated.threshold
    )
    assert h.qbbs.Query(qbbs_pb2.QbbsQueryRequest(subject=b, trait="age"), metadata=ADMIN, timeout=5).value


def test_peep_erase_from_another_process_removes_soft_traits_the_server_holds(hosted, capsys):
    h = hosted
    b = h.subjects[1]
    conf = h.srv.tmp / "server.toml"
    conf.write_text(to_toml(h.cfg))
    assert main(["erase", "--config", str(conf), "--subject", b, "--no-retrain"]) == 0
    assert f"{len(TRAITS)} soft traits (1 soft-trait store(s))" in capsys.readouterr().out
    code, _ = _code(h.qbbs.Query, qbbs_pb2.QbbsQueryRequest(subject=b, trait="age"), metadata=ADMIN, timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND


def test_verify_fused_before_any_model_is_a_failed_precondition(tmp_path, pki, keypair, bundle_dir, templates):
    h = _start(tmp_path, pki, keypair, bundle_dir, templates, train=False)
    try:
        a = h.subjects[0]
        h.enrol(a, _synthetic_traits(0))
        code, details = _code(h.verify, templates.message(0), a, {"age": 30.0})
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "no model has been trained yet" in details
        assert h.odometer(a).epsilon_spent == 0.0
    finally:
        h.channel.close()
        h.srv.app.stop(0)


def test_qbbs_request_strings_are_bounded_where_they_enter(tmp_path, pki, keypair, bundle_dir, templates):
    """A 1 MB claim, subject or trait name: INVALID_ARGUMENT naming the field, quoting at most 64 characters."""
    h = _start(tmp_path, pki, keypair, bundle_dir, templates, train=False)
    huge = "q" * (1024 * 1024)
    try:
        a = h.subjects[0]
        h.enrol(a, _synthetic_traits(0))
        calls = {
            # the claim is checked before the template (there is no model: that would be FAILED_PRECONDITION)
            "claimed_subject": lambda: h.verify(templates.message(0), huge, {"age": 30.0}),
            "observed[0].trait": lambda: h.verify(templates.message(0), a, {huge: 30.0}),
            "traits[0].trait": lambda: h.enrol(a, {huge: 1.0}),
            "subject": lambda: h.enrol(huge, {"age": 30.0}),
            "trait": lambda: h.qbbs.Query(qbbs_pb2.QbbsQueryRequest(subject=a, trait=huge), metadata=ADMIN, timeout=5),
            "subject ": lambda: h.odometer(huge),
        }
        for field, call in calls.items():
            code, details = _code(call)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field.strip() + ":"), details[:200]
            assert len(details) < 400
        assert h.odometer(a).epsilon_spent == 0.0
    finally:
        h.channel.close()
        h.srv.app.stop(0)


# --------------------------------------------------------------------------- configuration


def _services(tmp_path: Any, keypair: Any, **sections: Any) -> Services:
    cfg = base_config(tmp_path, keypair[3], None, auth={"allow_insecure": True}, **sections)
    return Services(parse_config(cfg), host_qbbs=True)  # as `peep serve` and `peep erase` build them


def test_without_a_qbbs_table_nothing_is_hosted(tmp_path, keypair):
    s = _services(tmp_path, keypair)
    try:
        assert s.qbbs is None and s.n_erasure_hooks == 0
    finally:
        s.close()
    assert not list(tmp_path.glob("qbbs*"))


def test_only_a_process_that_asks_hosts_qbbs(tmp_path, keypair):
    """A one-shot command that neither serves nor erases (``peep train``) does not open the soft-trait store."""
    cfg = base_config(tmp_path, keypair[3], None, auth={"allow_insecure": True}, qbbs=_qbbs_section(tmp_path))
    s = Services(parse_config(cfg))
    try:
        assert s.qbbs is None and s.n_erasure_hooks == 0
    finally:
        s.close()
    assert not list(tmp_path.glob("qbbs*"))


def test_the_hosted_module_needs_its_files(tmp_path, keypair):
    with pytest.raises(ConfigError, match="qbbs.ledger_path: expected a file path"):
        _services(tmp_path, keypair, qbbs={"store_path": str(tmp_path / "q.sqlite")})
    assert not (tmp_path / "peep.db").exists()  # checked before anything was opened


def test_the_qbbs_table_is_validated_and_its_paths_resolved_with_server_toml(tmp_path, keypair):
    with pytest.raises(ConfigError, match=r"qbbs\.epsilon_cap: .*, received -1"):
        parse_config(base_config(tmp_path, keypair[3], None, auth={"allow_insecure": True}, qbbs={"epsilon_cap": -1}))
    bad_population = {"population": {"male_fraction": 1.5}}
    with pytest.raises(ConfigError, match=r"qbbs\.population\.male_fraction: .*, received 1\.5"):
        parse_config(base_config(tmp_path, keypair[3], None, auth={"allow_insecure": True}, qbbs=bad_population))
    cfg = base_config(tmp_path, keypair[3], None, auth={"allow_insecure": True}, qbbs=_qbbs_section(tmp_path))
    cfg["qbbs"].update(store_path="state/qbbs.sqlite", ledger_path="state/spend.jsonl")
    cfg["qbbs"]["population"] = {"male_fraction": 1.0, "impostor_model": "same-gender"}  # a nested TOML table
    conf = tmp_path / "etc" / "server.toml"
    conf.parent.mkdir()
    conf.write_text(to_toml(cfg))
    loaded = load_config(conf)
    assert loaded.qbbs["store_path"] == str(conf.parent / "state" / "qbbs.sqlite")
    s = Services(loaded, host_qbbs=True)
    try:
        assert s.qbbs is not None and s.n_erasure_hooks == 1
        population = s.qbbs.module.config.population
        assert (population.male_fraction, population.impostor_model) == (1.0, "same-gender")
        s.qbbs.module.enrol("alice", {"age": 40.0})
    finally:
        s.close()
    assert (conf.parent / "state" / "qbbs.sqlite").is_file() and (conf.parent / "state" / "spend.jsonl").is_file()


def test_a_door_fusing_soft_traits_is_decided_by_verify_fused_and_charges_the_claimed_subject(hosted, templates):
    """``door.fuse_soft_traits``: the door's verifier asks QBBS, on the template's own soft-trait releases."""
    import time

    from peep.core.wire import encode_template
    from peep.edge.door import Claim
    from peep.edge.door_session import GrpcVerifier

    h = hosted
    a = h.subjects[0]
    nonce = "d" * 32
    age = {"trait": "age", "value": _synthetic_traits(0)["age"], "epsilon": 1.0, "mechanism": "bounded-laplace"}
    msg = templates.message(_pick(h, templates, a, a, best=True), purpose="verify", subject=a, message_id=nonce,
                            track_id="door-dddddddddddd", soft_traits=[age])  # fmt: skip
    claim = Claim(a, nonce, "cam-1", time.monotonic(), time.monotonic() + 10)
    before = h.odometer(a).epsilon_spent
    fused = GrpcVerifier(h.channel, DEVICE_TOKENS["cam-1"], fused=True).verify(encode_template(msg), claim, 10.0)
    face = GrpcVerifier(h.channel, DEVICE_TOKENS["cam-1"]).verify(encode_template(msg), claim, 10.0)
    assert (fused.nonce, fused.door, fused.subject) == (nonce, "cam-1", a)  # bound to the claim by the call
    assert fused.accepted and face.accepted  # the subject's best-scoring held-out template
    assert fused.score != face.score  # a fused score, not the face's probability
    assert h.odometer(a).epsilon_spent == pytest.approx(before + EPSILON)  # age (weight > 0) queried, charged


def test_a_doors_fused_claim_is_one_release_in_the_ingest_ledger_however_often_it_is_asked(hosted, templates):
    """``VerifyFused`` decides the template in memory and keeps none of it, but the door released it: one ledger row
    (ids, times, its ε and its soft traits'), by gRPC, from the door's own credential; the same template verified
    again (``Verify``, a retried ``VerifyFused``) is the same release, not another."""
    import secrets
    import sqlite3

    h = hosted
    a = h.subjects[0]
    nonce = secrets.token_hex(16)
    age = {"trait": "age", "value": _synthetic_traits(0)["age"], "epsilon": 1.0, "mechanism": "bounded-laplace"}
    msg = templates.message(_pick(h, templates, a, a, best=True), purpose="verify", subject=a, message_id=nonce,
                            track_id=f"door-{nonce[:12]}", soft_traits=[age])  # fmt: skip
    before = h.srv.services.store.count_received(device_id="cam-1")
    h.verify(msg, a, {})
    h.verify(msg, a, {})
    h.rec.Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject=a), metadata=DEVICE, timeout=5)
    assert h.srv.services.ingestor.decisions.flush()
    assert h.srv.services.store.count_received(device_id="cam-1") == before + 1
    con = sqlite3.connect(h.cfg["storage"]["path"])
    try:
        row = con.execute(
            "SELECT purpose, epsilon_vector, epsilon_traits, transport, sent_by FROM ingest_ledger "
            "WHERE device_id = 'cam-1' AND message_id = ?",
            (nonce,),
        ).fetchone()
        kept = con.execute("SELECT COUNT(*) FROM templates WHERE message_id = ?", (nonce,)).fetchone()
    finally:
        con.close()
    assert row == ("verify", pytest.approx(msg.mechanism.epsilon_vector), pytest.approx(1.0), "grpc", "device")
    assert kept == (0,)  # decided, then forgotten
