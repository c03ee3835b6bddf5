"""Operations: erasure and retention (API and CLI), `peep serve` as a process (SIGTERM), metrics, logs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from peep.core.logs import JsonFormatter, log_event
from peep.server.cli import main
from peep.server.services import NoSuchSubject
from peep.server.storage import TemplateRecord
from peep.server.storage.sqlite import SqliteStore
from peep.v1 import recognition_pb2
from peep_testing.server import (
    ADMIN,
    ADMIN_TOKEN,
    DEVICE,
    PEEP,
    base_config,
    start_server,
    tls_channel,
    tls_section,
    to_toml,
)


@pytest.fixture
def enrolled(tmp_path, pki, keypair, bundle_dir, templates):
    """A TLS server with enrolments and a trained model (its own store and registry)."""
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)})
    srv = start_server(cfg, pki, tmp_path)
    stub = srv.stub()
    stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60)
    stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
    srv.cfg = cfg  # type: ignore[attr-defined]
    yield srv
    srv.app.stop(0)


@pytest.mark.slow
def test_erase_subject_deletes_templates_calls_hooks_and_retrains(enrolled, templates):
    srv, stub = enrolled, enrolled.stub()
    victim = str(templates.subjects[templates.train[0]])
    erased: list[str] = []
    srv.services.add_erasure_hook(lambda s: erased.append(s) or 4)
    # a verify claim for the subject is stored too, and must go as well
    stub.Ingest(templates.message(int(templates.test[0]), purpose="verify", subject=victim), metadata=DEVICE, timeout=5)
    n_before = srv.services.store.count_templates(subject=victim)
    resp = stub.EraseSubject(
        recognition_pb2.EraseSubjectRequest(subject=victim, retrain=True), metadata=ADMIN, timeout=300
    )
    assert resp.templates_deleted == n_before > 0 and resp.soft_traits_deleted == 4 and erased == [victim]
    assert resp.model_version == "v000002"
    assert srv.services.store.count_templates(subject=victim) == 0
    model = srv.services.recogniser.model
    assert victim not in model.classes
    assert srv.services.registry.versions() == ["v000002"]  # the version that knew the subject is gone
    for i in templates.test[:40]:
        r = stub.Identify(
            recognition_pb2.IdentifyRequest(template=templates.message(int(i)), top_k=10), metadata=DEVICE, timeout=5
        )
        assert victim not in {c.subject for c in r.candidates}


@pytest.mark.slow
def test_erasing_a_subject_nothing_holds_is_not_found_and_changes_nothing(enrolled, templates, capsys):
    """Unknown ids are refused without an erasure record or a retrained version (three used to train three
    identical versions, pushing the roll-back ones out); a known subject still retrains, and erased a
    second time it is unknown."""
    srv, stub = enrolled, enrolled.stub()
    services = srv.services

    def erase(subject: str) -> recognition_pb2.EraseSubjectResponse:
        request = recognition_pb2.EraseSubjectRequest(subject=subject, retrain=True)
        return stub.EraseSubject(request, metadata=ADMIN, timeout=300)

    for _ in range(3):
        with pytest.raises(grpc.RpcError) as e:
            erase("nobody-at-all")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "subject: no such subject 'nobody-at-all'" in e.value.details()
    assert services.registry.versions() == ["v000001"] and services.recogniser.model.version == "v000001"
    assert "nobody-at-all" not in services.store.erasures()

    victim = str(templates.subjects[templates.train[0]])
    r = erase(victim)
    assert r.templates_deleted > 0 and r.model_version == "v000002"
    assert services.registry.versions() == ["v000002"]
    with pytest.raises(grpc.RpcError) as e:
        erase(victim)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and repr(victim) in e.value.details()
    assert services.registry.versions() == ["v000002"] and services.recogniser.model.version == "v000002"

    conf = srv.tmp / "server.toml"
    conf.write_text(to_toml(srv.cfg))
    assert main(["erase", "--config", str(conf), "--subject", "nobody-at-all"]) == 1
    assert "peep erase: subject: no such subject 'nobody-at-all'" in capsys.readouterr().err
    assert "nobody-at-all" not in SqliteStore(srv.tmp / "peep.db").erasures()


def test_soft_traits_alone_are_erased_without_retraining(enrolled):
    """A subject only an erasure hook holds: erased (asked through ``holds``, or probed by deleting when the
    hook cannot be asked), with no version trained; an id neither holds is refused with nothing deleted."""
    services = enrolled.services
    asked = {"traits-only": 3}
    legacy = {"legacy-only": 2}
    services.add_erasure_hook(lambda s: asked.pop(s, 0), holds=lambda s: s in asked)
    services.add_erasure_hook(lambda s: legacy.pop(s, 0))
    with pytest.raises(NoSuchSubject, match=r"^subject: no such subject 'nobody-at-all': expected "):
        services.erase_subject("nobody-at-all")
    assert asked and legacy and "nobody-at-all" not in services.store.erasures()
    for subject, n in (("traits-only", 3), ("legacy-only", 2)):
        r = services.erase_subject(subject)
        assert (r.templates_deleted, r.soft_traits_deleted, r.model_version) == (0, n, "v000001"), subject
        assert subject in services.store.erasures()
    assert not asked and not legacy and services.registry.versions() == ["v000001"]


def test_erasure_without_retraining_masks_the_subject_at_once(enrolled, templates):
    stub = enrolled.stub()
    victim = str(templates.subjects[templates.test[0]])
    probe = recognition_pb2.IdentifyRequest(template=templates.message(int(templates.test[0])), top_k=10)
    assert victim in {c.subject for c in stub.Identify(probe, metadata=DEVICE, timeout=5).candidates}
    resp = stub.EraseSubject(
        recognition_pb2.EraseSubjectRequest(subject=victim, retrain=False), metadata=ADMIN, timeout=30
    )
    assert resp.model_version == "v000001"
    r = stub.Identify(probe, metadata=DEVICE, timeout=5)
    scores = {c.subject: c.probability for c in r.candidates}
    assert scores.get(victim, 0.0) == 0.0 and r.subject != victim
    with pytest.raises(grpc.RpcError) as e:  # an erased subject is no longer enrolled: NOT_FOUND, not a score
        stub.Verify(
            recognition_pb2.VerifyRequest(template=probe.template, claimed_subject=victim), metadata=DEVICE, timeout=5
        )
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and victim in e.value.details()


def test_erase_and_retention_from_the_command_line(enrolled, templates, capsys):
    srv = enrolled
    conf = srv.tmp / "server.toml"
    conf.write_text(to_toml(srv.cfg))
    store = srv.services.store
    # identify templates received 40 days ago (kept by an earlier version), and the enrolments of today
    old = [templates.message(int(i)) for i in templates.test[:5]]
    store.insert_templates(
        [TemplateRecord.from_message(m, templates.X[int(i)], received_at=time.time() - 40 * 86400)
         for m, i in zip(old, templates.test[:5], strict=True)]
    )  # fmt: skip
    n_enrol = store.count_templates(purpose="enroll")
    assert main(["retention", "--config", str(conf), "--days", "30"]) == 0
    out = capsys.readouterr().out
    assert "deleted 5 templates older than 30 days" in out
    assert "enrolment templates" in out and "until erased" in out  # and what is kept, per category
    assert all(store.get_template(m.message_id) is None for m in old)
    assert store.count_templates(purpose="enroll") == n_enrol
    assert main(["retention", "--config", str(conf), "--days", "0"]) == 2
    assert "--days: expected a number > 0" in capsys.readouterr().err

    victim = str(templates.subjects[templates.train[0]])
    assert main(["erase", "--config", str(conf), "--subject", victim, "--no-retrain"]) == 0
    out = capsys.readouterr().out
    assert f"subject {victim!r} erased" in out and "templates" in out
    assert store.count_templates(subject=victim) == 0
    assert victim in SqliteStore(srv.tmp / "peep.db").erasures()
    # the running server learns of the erasure made by another process without a restart
    srv.services.recogniser.erasure_interval = 0.0
    srv.services.recogniser.check_interval = 0.0
    i = int(templates.train[0])
    probe = recognition_pb2.IdentifyRequest(template=templates.message(i), top_k=10)
    r = srv.stub().Identify(probe, metadata=DEVICE, timeout=5)
    assert r.subject != victim and {c.subject: c.probability for c in r.candidates}.get(victim, 0.0) == 0.0
    assert main(["erase", "--config", str(conf), "--subject", "a/b"]) == 2


def _admin_sender():
    from peep.server.ingest.auth import Identity
    from peep.server.ingest.ingestor import Sender

    return Sender(identity=Identity(name="admin", is_admin=True))


def test_train_command_reports_usage_errors(tmp_path, capsys):
    bad = tmp_path / "server.toml"
    bad.write_text("[grpc]\nlisten = 'x'\n")
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "grpc.listen:" in err and "bundle: required setting is missing" in err


def test_peep_serve_runs_and_stops_gracefully_on_sigterm(tmp_path, pki, keypair, bundle_dir):
    cfg = base_config(
        tmp_path,
        keypair[3],
        bundle_dir,
        grpc={"tls": tls_section(pki), "grace_s": 2.0},
        metrics={"enabled": True, "listen": "127.0.0.1:0"},
        logging={"format": "json", "level": "info"},
        auth={"admin_token": "env:PEEP_TEST_ADMIN_TOKEN", "admin_token_sha256": None},
    )
    conf = tmp_path / "server.toml"
    conf.write_text(to_toml(cfg))
    env = {**os.environ, "PEEP_TEST_ADMIN_TOKEN": ADMIN_TOKEN}
    p = subprocess.Popen([PEEP, "serve", "--config", str(conf)], stderr=subprocess.PIPE, env=env, text=True)
    assert p.stderr is not None
    lines = []
    try:
        started = None
        deadline = time.monotonic() + 60
        while started is None and time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("{"):
                doc = json.loads(line)
                if doc["event"] == "server started":
                    started = doc
        assert started is not None, "".join(lines)
        assert started["tls"] is True and started["store"] == "sqlite" and started["model_version"] is None
        ch = tls_channel(started["grpc_port"], pki)
        h = health_pb2_grpc.HealthStub(ch)
        assert h.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        from peep.v1 import recognition_pb2_grpc

        st = recognition_pb2_grpc.RecognitionServiceStub(ch).GetModelStatus(
            recognition_pb2.ModelStatusRequest(), metadata=ADMIN, timeout=5
        )
        assert st.bundle_id and not st.model_version
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{started['metrics_port']}/metrics", timeout=5).read().decode()
        )
        assert "peep_model_version 0.0" in metrics and "peep_identify_seconds_bucket" in metrics
        p.send_signal(signal.SIGTERM)
        _, rest = p.communicate(timeout=30)
        lines.append(rest)
        assert p.returncode == 0, "".join(lines)
        docs = [json.loads(x) for x in "".join(lines).splitlines() if x.startswith("{")]
        events = [d["event"] for d in docs]
        assert "signal received" in events and events[-1] == "stopped"
        assert ADMIN_TOKEN not in "".join(lines)  # secrets never logged
        with pytest.raises(grpc.RpcError):
            h.Check(health_pb2.HealthCheckRequest(), timeout=2)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_serve_refuses_a_missing_secret_with_exit_code_2(tmp_path, keypair, bundle_dir):
    cfg = base_config(
        tmp_path, keypair[3], bundle_dir, auth={"allow_insecure": True, "admin_token": "env:PEEP_NOT_SET_ANYWHERE"}
    )
    conf = tmp_path / "server.toml"
    conf.write_text(to_toml(cfg))
    r = subprocess.run([PEEP, "serve", "--config", str(conf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "auth.admin_token: expected the environment variable PEEP_NOT_SET_ANYWHERE" in r.stderr


def test_json_logs_carry_extra_fields():
    rec = logging.LogRecord("peep.server", logging.INFO, __file__, 1, "model promoted", (), None)
    rec.version = "v000002"
    doc = json.loads(JsonFormatter().format(rec))
    assert (
        doc["event"] == "model promoted"
        and doc["version"] == "v000002"
        and doc["level"] == "info"
        and doc["ts"].endswith("Z")
    )


def test_edge_and_server_records_share_one_schema_and_fields_never_overwrite_it():
    # log_event (the edge's style) and extra={...} (the server's) give the same keys.
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("peep.test.schema")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log_event(log, logging.INFO, "release", track="t-1", event="spoof", level="x")
        log.info("model promoted", extra={"version": "v1", "logger": "spoof"})
    finally:
        log.removeHandler(handler)
    a, b = (json.loads(JsonFormatter().format(r)) for r in records)
    assert a["event"] == "release" and a["track"] == "t-1" and a["level"] == "info" and a["logger"] == log.name
    assert a["field_event"] == "spoof" and a["field_level"] == "x"
    assert b["event"] == "model promoted" and b["version"] == "v1" and b["field_logger"] == "spoof"
    assert set(a) >= {"ts", "level", "logger", "event"} and set(b) >= {"ts", "level", "logger", "event"}
