"""Hooks for modules hosted in the server (QBBS): extra servicers behind the same auth, face scores, erasure."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
from peep.server.config import parse_config
from peep.server.ingest.auth import authorize_admin, current_identity
from peep.server.recognition.recogniser import ModelMismatch, ServingFaceScores
from peep.v1 import qbbs_pb2, qbbs_pb2_grpc
from peep_testing.server import ADMIN, DEVICE, base_config, start_server, tls_section


class _Qbbs(qbbs_pb2_grpc.QbbsServiceServicer):
    """A minimal QbbsService: enough to see authentication and the identity reach a hosted servicer."""

    def __init__(self) -> None:
        self.callers: list[str] = []

    def Query(self, request, context):
        authorize_admin(context, "Query")
        self.callers.append(current_identity().name)
        return qbbs_pb2.QbbsQueryResponse(subject=request.subject, trait=request.trait, value=1.0)

    def VerifyFused(self, request, context):
        ident = current_identity()
        self.callers.append(ident.name)
        return qbbs_pb2.QbbsVerifyResponse(accepted=False, face_score=0.0)


def test_extra_servicers_run_behind_the_same_authentication(tmp_path, pki, keypair, bundle_dir, templates):
    svc = _Qbbs()
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)})
    srv = start_server(
        cfg,
        pki,
        tmp_path,
        extra_servicers=[lambda server: qbbs_pb2_grpc.add_QbbsServiceServicer_to_server(svc, server)],
    )
    try:
        stub = qbbs_pb2_grpc.QbbsServiceStub(srv.channel())
        q = qbbs_pb2.QbbsQueryRequest(subject="alice", trait="age")
        assert stub.Query(q, metadata=ADMIN, timeout=5).value == 1.0
        with pytest.raises(grpc.RpcError) as e:
            stub.Query(q, metadata=DEVICE, timeout=5)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as e:
            stub.Query(q, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        v = qbbs_pb2.QbbsVerifyRequest(template=templates.message(0), claimed_subject="alice")
        stub.VerifyFused(v, metadata=DEVICE, timeout=5)
        assert svc.callers == ["admin", "cam-1"]
    finally:
        srv.app.stop(0)


def test_serving_face_scores_follow_the_recogniser(trained_server, templates, bundle):
    rec = trained_server.services.recogniser
    faces = ServingFaceScores(rec)
    assert faces.model_version == rec.model.version
    i = int(templates.test[0])
    claimed = str(templates.subjects[i])
    msg = templates.message(i)
    s = faces.face_score(claimed, templates.X[i], template=msg)
    assert s == pytest.approx(math.log(rec.verify_score(templates.X[i], claimed)))
    with pytest.raises(KeyError):
        faces.face_score("nobody", templates.X[i])
    other = templates.message(i)
    other.bundle_id = "eb-other"
    with pytest.raises(ModelMismatch):  # a ValueError: QBBS maps it to INVALID_ARGUMENT
        faces.face_score(claimed, templates.X[i], template=other)
    genuine, impostor = faces.validation_scores()
    g_raw, i_raw = rec.validation_scores()
    np.testing.assert_allclose(genuine, np.log(np.maximum(g_raw, 1e-12)))
    assert impostor.size == i_raw.size > genuine.size > 0
    assert np.median(genuine) > np.median(impostor)


def test_server_toml_may_carry_the_qbbs_section():
    cfg = parse_config({"bundle": {"public_key": "/k.pub"}, "auth": {"allow_insecure": True}, "qbbs": {"epsilon": 1.0}})
    assert cfg.qbbs == {"epsilon": 1.0}
