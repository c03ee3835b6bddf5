"""Several replicas as one backend on the real PostgreSQL.

The model registry in the database (promotion in one transaction, NOTIFY to every
replica, one training at a time across replicas), the QBBS odometer under a row lock,
and recognition events across replicas. Replicas are in-process ``ServerApp``\\ s on one
private PostgreSQL schema, each with its own gRPC port, like separate ``peep serve``\\ s.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any

import grpc
import numpy as np
import pytest
from peep.server.recognition.model_registry import DatabaseModelRegistry, RegistryError
from peep.server.storage.postgres import PostgresStore
from peep.server.storage.sqlite import SqliteStore
from peep.v1 import recognition_pb2
from peep_testing.server import ADMIN, DEVICE, SITE, base_config, start_server, tls_section


def _meta(classes: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "classes": classes,
        "bundle_id": "eb-1",
        "unknown_threshold": 0.3,
        "verify_threshold": 0.6,
        "target_far": 0.01,
        **extra,
    }


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_database_registry_versions_prune_purge(kind, tmp_path, request):
    store = SqliteStore(tmp_path / "r.db") if kind == "sqlite" else PostgresStore(request.getfixturevalue("pg_dsn"))
    try:
        reg = DatabaseModelRegistry(store)
        assert reg.current() is None and reg.pointer_stamp() is None and reg.versions() == []
        scores = {"genuine": np.array([0.9, 0.8]), "impostor": np.array([0.1])}
        v1 = reg.publish(onnx_model=b"onnx-1", meta=_meta(["s1", "s2"]), scores=scores, keep=2)
        assert v1.name == "v000001" and v1.onnx_bytes() == b"onnx-1" and v1.meta["version"] == "v000001"
        np.testing.assert_array_equal(reg.current().scores()["genuine"], [0.9, 0.8])
        stamp = reg.pointer_stamp()
        reg.publish(onnx_model=b"onnx-2", meta=_meta(["s2", "s3"]), keep=2)
        assert reg.pointer_stamp() != stamp and reg.current().scores() == {}
        reg.publish(onnx_model=b"onnx-3", meta=_meta(["s1", "s3"]), keep=2)
        assert reg.versions() == ["v000002", "v000003"]  # keep=2 pruned v000001 in the promoting transaction
        assert reg.current_name() == "v000003" and reg.get("v000002").onnx_bytes() == b"onnx-2"
        assert reg.purge_subject("s2") == ["v000002"] and reg.purge_subject("s1") == []  # never the current one
        assert reg.versions() == ["v000003"]
        with pytest.raises(RegistryError, match="no version v000002"):
            reg.get("v000002")
        with pytest.raises(RegistryError, match="expected a version name"):
            reg.get("../x")
        # a new version after pruning never reuses a number
        assert reg.publish(onnx_model=b"onnx-4", meta=_meta(["s1"]), keep=2).name == "v000004"
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "directory"])
def test_registries_roll_back_to_a_kept_version_and_forward(kind, tmp_path, request):
    from peep.server.recognition.model_registry import ModelRegistry

    store = None
    if kind == "directory":
        reg: Any = ModelRegistry(tmp_path / "models")
    else:
        store = SqliteStore(tmp_path / "r.db") if kind == "sqlite" else PostgresStore(request.getfixturevalue("pg_dsn"))
        reg = DatabaseModelRegistry(store)
    try:
        reg.publish(onnx_model=b"onnx-1", meta=_meta(["s1"]), keep=3)
        reg.publish(onnx_model=b"onnx-2", meta=_meta(["s1", "s2"]), keep=3)
        stamp = reg.pointer_stamp()
        assert reg.make_current("v000001").name == "v000001"
        assert reg.current_name() == "v000001" and reg.current().onnx_bytes() == b"onnx-1"
        assert reg.pointer_stamp() != stamp  # replicas and the recogniser see the change
        assert reg.versions() == ["v000001", "v000002"]  # nothing deleted by a roll-back
        reg.make_current("v000002")
        assert reg.current().onnx_bytes() == b"onnx-2"
        with pytest.raises(RegistryError):
            reg.make_current("v000007")
        assert reg.current_name() == "v000002"
        # a publish after a roll-back takes the next number and serves
        reg.make_current("v000001")
        assert reg.publish(onnx_model=b"onnx-3", meta=_meta(["s1"]), keep=3).name == "v000003"
        assert reg.current_name() == "v000003"
    finally:
        if store is not None:
            store.close()


def test_deployments_in_other_schemas_of_one_database_train_at_the_same_time(pg_dsn, pg_admin):
    """Advisory locks belong to the whole database: keyed by lock alone, a server in another schema (another
    deployment, or another worker of this suite) refused this one's training while it trained."""
    import uuid

    from peep_testing.server import PG_BASE

    other = f"peep_test_{uuid.uuid4().hex[:10]}"
    pg_admin.execute(f"CREATE SCHEMA {other}")
    a = PostgresStore(pg_dsn)
    b = PostgresStore(f"{PG_BASE} options='-c search_path={other}'")
    try:
        with DatabaseModelRegistry(a).training_lease() as held_a, DatabaseModelRegistry(b).training_lease() as held_b:
            assert held_a and held_b
    finally:
        a.close()
        b.close()
        pg_admin.execute(f"DROP SCHEMA {other} CASCADE")


def test_one_training_at_a_time_across_replicas(pg_dsn):
    a, b = PostgresStore(pg_dsn), PostgresStore(pg_dsn)
    try:
        ra, rb = DatabaseModelRegistry(a), DatabaseModelRegistry(b)
        with ra.training_lease() as held_a:
            assert held_a
            with rb.training_lease() as held_b:
                assert not held_b  # another replica trains: refused at once, not queued
        with rb.training_lease() as held_b:
            assert held_b  # released with the block
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- three replicas


def _replica_config(tmp, keypair, bundle_dir, pki, pg_dsn, name):
    d = tmp / name
    d.mkdir()
    return base_config(
        d,
        keypair[3],
        bundle_dir,
        grpc={"tls": tls_section(pki)},
        storage={"backend": "postgres", "dsn": pg_dsn, "pool_size": 4},
        # A unique id: its connections are told apart in pg_stat_activity (application_name peep-server-<id>).
        cluster={"check_interval_s": 2.0, "replica_id": f"{name}-{uuid.uuid4().hex[:8]}"},
    )


@pytest.fixture
def replicas(tmp_path, pki, keypair, bundle_dir, pg_dsn):
    started: list[Any] = []

    def start(name: str) -> Any:
        srv = start_server(_replica_config(tmp_path, keypair, bundle_dir, pki, pg_dsn, name), pki, tmp_path)
        assert srv.services.watcher is not None and srv.services.watcher.wait_listening(10)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.app.stop(0)


def _versions(stub: Any, probe: Any) -> str:
    """The serving version's name ("" while the replica has none: its NOTIFY may still be on the way)."""
    try:
        resp = stub.Identify(recognition_pb2.IdentifyRequest(template=probe, top_k=1), metadata=DEVICE, timeout=5)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
            return ""
        raise
    return str(resp.model_version)


def _wait(pred: Any, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def _events_reach_every_replica(stubs: list[Any], templates: Any) -> None:
    """A StreamEvents subscriber on B gets the recognitions made on A and C, in order; another site's gets none."""
    got: list[Any] = []
    other: list[Any] = []
    on_b = stubs[1].StreamEvents(recognition_pb2.StreamEventsRequest(site=SITE), metadata=DEVICE, timeout=30)
    elsewhere = stubs[1].StreamEvents(recognition_pb2.StreamEventsRequest(site="annex"), metadata=ADMIN, timeout=30)

    def read(stream: Any, into: list[Any], n: int) -> None:
        try:
            for ev in stream:
                if ev.track_id:  # not the probes identified just before
                    into.append(ev)
                if len(into) >= n:
                    break
        except Exception:
            pass  # cancelled

    readers = [
        threading.Thread(target=read, args=(on_b, got, 8), daemon=True),
        threading.Thread(target=read, args=(elsewhere, other, 1), daemon=True),
    ]
    for t in readers:
        t.start()
    time.sleep(0.5)  # both streams subscribed
    rows = templates.test[200:208]
    msgs = [templates.message(int(i), track_id=f"t{k}") for k, i in enumerate(rows)]
    stubs[0].IngestStream(iter(msgs[:4]), metadata=DEVICE, timeout=10)  # recognised on A
    stubs[2].IngestStream(iter(msgs[4:]), metadata=DEVICE, timeout=10)  # then on C
    readers[0].join(10)
    on_b.cancel()
    elsewhere.cancel()
    assert [e.message_id for e in got] == [m.message_id for m in msgs]  # all, in order
    assert all(e.site == SITE and e.model_version == "v000001" for e in got)
    assert other == []  # site isolation holds across replicas


def _a_track_is_fused_across_replicas(a: Any, c: Any, templates: Any) -> None:
    """A track's first release taken by A, its second by C (as a shared MQTT subscription may deal them): C finds
    the first in the database and decides from both, as one replica would from its memory."""
    from peep_testing.server import EventCollector

    i, j = (int(v) for v in templates.test[120:122])
    first = templates.message(i, track_id="across-1")
    time.sleep(0.01)  # a later capture
    second = templates.message(j, track_id="across-1")
    with EventCollector(c, 2, message_ids={first.message_id, second.message_id}) as events:
        assert a.stub().Ingest(first, metadata=DEVICE, timeout=5).status == recognition_pb2.INGEST_STATUS_ACCEPTED
        assert c.stub().Ingest(second, metadata=DEVICE, timeout=5).status == recognition_pb2.INGEST_STATUS_ACCEPTED
        got = {e.message_id: e.releases_fused for e in events.wait()}
    assert got == {first.message_id: 1, second.message_id: 2}


@pytest.mark.slow
def test_promotion_and_erasure_reach_every_replica(replicas, templates):
    a, b, c = replicas("a"), replicas("b"), replicas("c")
    stubs = [a.stub(), b.stub(), c.stub()]
    probe = templates.message(int(templates.test[0]))
    summary = stubs[0].IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60)
    assert summary.rejected == 0
    assert b.services.recogniser.model is None
    resp = stubs[0].Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
    assert resp.model_version == "v000001"
    # B and C swap to the promoted version on the NOTIFY, well within 5 s
    elapsed = _wait(lambda: all(_versions(s, probe) == "v000001" for s in stubs), 5.0)
    assert elapsed < 5.0
    _events_reach_every_replica(stubs, templates)
    _a_track_is_fused_across_replicas(a, c, templates)
    # a replica started later serves it from the database
    d = replicas("d")
    assert _versions(d.stub(), probe) == "v000001"
    # training through B while A trains: one replica at a time
    with a.services.registry.training_lease() as held:
        assert held
        assert b.services.trainer.start_background() is False
    # erase through C: A, B and D stop naming the subject within 5 s, and the templates are gone
    victim = str(templates.subjects[templates.test[0]])
    probes = [templates.message(int(i)) for i in templates.test if templates.subjects[i] == victim][:5]
    req = [recognition_pb2.IdentifyRequest(template=p, top_k=10) for p in probes]

    def named(stub: Any) -> bool:
        for r in req:
            out = stub.Identify(r, metadata=DEVICE, timeout=5)
            if out.subject == victim or any(x.subject == victim and x.probability > 0 for x in out.candidates):
                return True
        return False

    assert named(stubs[0])
    others = [stubs[0], stubs[1], d.stub()]
    done: dict[str, Any] = {}
    t0 = time.monotonic()
    eraser = threading.Thread(
        target=lambda: done.setdefault(
            "r",
            stubs[2].EraseSubject(
                recognition_pb2.EraseSubjectRequest(subject=victim, retrain=True), metadata=ADMIN, timeout=300
            ),
        )
    )
    eraser.start()
    _wait(lambda: not any(named(s) for s in others), 5.0)
    masked_s = time.monotonic() - t0
    assert a.services.store.count_templates(subject=victim) == 0
    eraser.join(300)
    assert done["r"].model_version == "v000002"
    _wait(lambda: all(_versions(s, probe) == "v000002" for s in [*stubs, d.stub()]), 5.0)
    assert "v000001" not in a.services.registry.versions()  # the version that knew the subject is gone
    assert not any(named(s) for s in [*stubs, d.stub()])
    print(f"promotion to serving {elapsed:.2f} s, erasure masked everywhere {masked_s:.2f} s")


# --------------------------------------------------------------------------- QBBS odometer across replicas

PEOPLE = {
    "erin": {"age": 63.0, "gender": 0.0, "height": 162.0, "weight": 70.0},
    "bob": {"age": 52.0, "gender": 1.0, "height": 181.5, "weight": 92.0},
    "carol": {"age": 27.0, "gender": 0.0, "height": 159.0, "weight": 55.5},
}


def test_concurrent_fused_verifications_over_three_replicas_never_overspend(pg_dsn):
    from concurrent.futures import ThreadPoolExecutor

    from peep.server.qbbs import OdometerExhaustedError, QbbsConfig, QbbsModule, StaticFaceScores

    migrated = PostgresStore(pg_dsn, pool_size=1)  # the server's migrations create the odometer's tables
    cfg = QbbsConfig.model_validate(
        {
            "epsilon": 1.0,
            "epsilon_cap": 200.0,  # 4 traits x 1.0 per verification: 50 verifications
            "threshold": 0.0,
            "weights": {"face": 0.6, "age": 0.1, "gender": 0.1, "height": 0.1, "weight": 0.1},
        }
    )
    faces = StaticFaceScores({"erin": -0.1}, genuine=[-0.1, -0.3, -0.2], impostor=[-5.0, -6.0, -4.0])
    modules = [QbbsModule(cfg, face_scores=faces, connect=migrated.connect) for _ in range(3)]
    try:
        for name, traits in PEOPLE.items():
            modules[0].enrol(name, traits)
        assert modules[2].n_subjects() == 3 and modules[1].enrolled_traits("erin") == sorted(PEOPLE["erin"])
        observed = {"age": 60.0, "gender": 0.0, "height": 163.0, "weight": 72.0}

        def verify(i: int) -> Any:
            try:
                return modules[i % 3].verify(claimed_subject="erin", face_score=-0.1, observed=observed)
            except OdometerExhaustedError:
                return None

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(verify, range(200)))
        seconds = time.monotonic() - t0
        released = [r for r in results if r is not None]
        assert len(released) == 50, len(released)
        assert all(r.epsilon_spent == 4.0 for r in released)
        for m in modules:
            reading = m.odometer("erin")
            assert (reading.epsilon_spent, reading.releases) == (200.0, 50)
        log = modules[1].audit_log("erin")
        assert len(log) == 50 and sum(e["epsilon"] for e in log) == 200.0
        assert {e["op"] for e in log} == {"verify"}
        assert modules[0].odometer("bob").epsilon_spent == 0.0
        # erasure through one replica removes the soft traits all read; the spend history stays
        assert modules[2].erase("erin") == 4
        assert modules[0].enrolled_traits("erin") == [] and modules[0].odometer("erin").epsilon_spent == 200.0
        print(f"200 verifications over 3 replicas: {len(released)} released in {seconds:.2f} s")
    finally:
        for m in modules:
            m.close()
        migrated.close()


@pytest.mark.slow
def test_a_replica_whose_database_connections_are_cut_streams_every_event_once_in_order(replicas, templates, pg_dsn):
    """B's connections (its pool and its LISTEN) are terminated again and again for 4 s while A decides: B's
    subscriber still receives every one of A's events, once, in commit order, once B reads the log again."""
    import psycopg

    a, b = replicas("a"), replicas("b")
    stub_a, stub_b = a.stub(), b.stub()
    assert stub_a.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
    version = stub_a.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version
    probe = templates.message(int(templates.test[0]))
    _wait(lambda: _versions(stub_b, probe) == version, 10)
    app_b = f"peep-server-{b.services.config.cluster.replica_id}"

    got: list[Any] = []
    # Counted before the call: gRPC starts a server-streaming call at once, so B may take the subscriber
    # before the reader thread runs (read after the call, it was sometimes already counted: never "more").
    before = b.services.events.n_subscribers
    stream = stub_b.StreamEvents(recognition_pb2.StreamEventsRequest(site=SITE), metadata=ADMIN, timeout=120)

    def read() -> None:
        try:
            for ev in stream:
                if ev.track_id.startswith("cut-"):
                    got.append(ev)
        except grpc.RpcError:
            pass  # cancelled at the end

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    _wait(lambda: b.services.events.n_subscribers > before, 5)

    cut = {"terminated": 0, "until": time.monotonic() + 4.0}
    sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s"

    def cut_b() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while time.monotonic() < cut["until"]:
                cut["terminated"] += int(conn.execute(sql, (app_b,)).fetchone()[0])
                time.sleep(0.05)

    cutter = threading.Thread(target=cut_b)
    rows = templates.test[200:250]
    msgs = [templates.message(int(i), track_id=f"cut-{k:03d}") for k, i in enumerate(rows)]
    cutter.start()
    for k in range(0, len(msgs), 5):  # ten commits on A spread over the cut and just after it
        assert stub_a.IngestStream(iter(msgs[k : k + 5]), metadata=DEVICE, timeout=10).accepted == 5
        time.sleep(0.5)
    cutter.join()
    failures_during_cut = b.services.events.read_failures
    _wait(lambda: len(got) >= len(msgs), 20)
    time.sleep(1.0)  # a duplicate would show now
    stream.cancel()
    reader.join(5)
    print(
        f"\nB's connections terminated {cut['terminated']} times in 4 s; B's reads failed {failures_during_cut} "
        f"times; its subscriber got {len(got)} of {len(msgs)}"
    )
    assert cut["terminated"] >= 2  # its pool and its LISTEN connection, at least
    assert [e.message_id for e in got] == [m.message_id for m in msgs]  # every one, once, in order
    assert all(y.seq > x.seq for x, y in itertools.pairwise(got))
