"""The log of decisions as the source of recognition events (peep.server.ingest.events).

A subscriber hears of a decision only once it is committed, with its row id as ``seq``; it may start after a
seq it had; one that falls behind re-reads from the database rather than losing events. On the real
databases (SQLite, PostgreSQL) with the real store; the replicas' version (a cut database connection) is in
test_cluster.py, the balancer's in test_cluster_balancer.py.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import grpc
import pytest
from peep.server.ingest.events import EventBus
from peep.server.storage import DecisionRecord
from peep.server.storage.postgres import PostgresStore
from peep.server.storage.sqlite import SqliteStore
from peep.v1 import recognition_pb2, template_pb2


def _decision(i: int, *, site: str = "hq", device: str = "cam-1") -> DecisionRecord:
    return DecisionRecord(
        event_id=uuid.uuid4().hex, at=1_700_000_000.0 + i, site=site, device_id=device, message_id=f"m-{i:05d}",
        track_id="", purpose="identify", subject=f"s{i % 3}", claimed_subject="", unknown=False, accepted=None,
        probability=0.5, model_version="v000001", releases_fused=1,
    )  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "e.db")
    else:
        s = PostgresStore(request.getfixturevalue("pg_dsn"))
    yield s
    s.close()


@pytest.fixture
def bus(store):
    b = EventBus(store.decisions, store.last_decision_id, queue_size=8, check_interval=0.2).start()
    yield b
    b.close()


def _commit(store, bus, decisions) -> None:
    store.add_decisions(decisions)
    bus.committed()


def _take(sub, n: int, timeout: float = 10.0) -> list:
    out = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        ev = sub.get(timeout=0.2)
        if ev is not None:
            out.append(ev)
    return out


def test_a_subscriber_gets_what_is_committed_after_it_once_in_order_with_the_row_id_as_seq(store, bus):
    _commit(store, bus, [_decision(i) for i in range(3)])  # before: not for a subscriber from now on
    sub = bus.subscribe("")
    _commit(store, bus, [_decision(i) for i in range(3, 8)])
    got = _take(sub, 5)
    assert [e.message_id for e in got] == [f"m-{i:05d}" for i in range(3, 8)]
    rows = dict((r.message_id, seq) for seq, r in store.decisions(since_id=0))
    assert [e.seq for e in got] == [rows[e.message_id] for e in got]
    assert all(b.seq > a.seq for a, b in itertools.pairwise(got))
    assert got[0].subject == "s0" and got[0].time.seconds == 1_700_000_003 and got[0].model_version == "v000001"
    assert got[0].purpose == template_pb2.PURPOSE_IDENTIFY
    assert sub.get(timeout=0.5) is None  # nothing twice


def test_a_subscriber_resuming_after_a_seq_gets_the_kept_ones_then_the_new_ones(store, bus):
    _commit(store, bus, [_decision(i) for i in range(20)])
    rows = store.decisions(since_id=0)
    after = rows[4][0]  # had the first five
    sub = bus.subscribe("", after_seq=after)
    _commit(store, bus, [_decision(i) for i in range(20, 25)])
    got = _take(sub, 20)
    assert [e.message_id for e in got] == [f"m-{i:05d}" for i in range(5, 25)]  # 15 kept (> queue of 8), 5 new
    assert sub.reread == 1
    assert sub.get(timeout=0.5) is None


def test_a_subscriber_that_falls_behind_its_queue_rereads_and_loses_nothing(store, bus):
    sub = bus.subscribe("")
    for k in range(10):  # 50 events while it reads none: its queue of 8 overflows
        _commit(store, bus, [_decision(5 * k + i) for i in range(5)])
    assert _wait(lambda: sub.dropped > 0, 5)
    got = _take(sub, 50)
    assert [e.message_id for e in got] == [f"m-{i:05d}" for i in range(50)]
    assert sub.reread >= 1
    assert sub.get(timeout=0.5) is None


def test_filters_hold_when_reading_back(store, bus):
    _commit(store, bus, [_decision(0)])
    start = store.last_decision_id()
    _commit(store, bus, [_decision(i, site="hq" if i % 2 else "annex", device=f"cam-{i % 3}") for i in range(1, 13)])
    sub = bus.subscribe("hq", device_id="cam-1", after_seq=start)
    got = _take(sub, 12, timeout=2)
    assert [e.message_id for e in got] == [f"m-{i:05d}" for i in range(1, 13) if i % 2 and i % 3 == 1]


def test_the_reader_reads_on_after_the_database_failed(store):
    """A read that fails (the database gone for a while) is retried from the same seq: nothing skipped."""
    fail = {"n": 3}

    def flaky(**kw):
        if fail["n"]:
            fail["n"] -= 1
            raise OSError("connection to the database lost")
        return store.decisions(**kw)

    b = EventBus(flaky, store.last_decision_id, check_interval=0.2).start()
    try:
        sub = b.subscribe("")
        _commit(store, b, [_decision(i) for i in range(6)])
        got = _take(sub, 6)
        assert [e.message_id for e in got] == [f"m-{i:05d}" for i in range(6)]
        assert b.read_failures == 3
    finally:
        b.close()


def test_a_decision_committed_elsewhere_arrives_without_being_told(store, bus):
    """No wake-up (another process committed, its notification missed): the periodic read finds it."""
    sub = bus.subscribe("")
    store.add_decisions([_decision(1)])  # no bus.committed()
    got = _take(sub, 1, timeout=3)
    assert [e.message_id for e in got] == ["m-00001"]


def test_origin_filter_streams_only_this_replicas_decisions(store):
    b = EventBus(store.decisions, store.last_decision_id, origin="a", check_interval=0.2).start()
    try:
        sub = b.subscribe("")
        mine = [_with_origin(i, "a") for i in range(3)]
        theirs = [_with_origin(i, "b") for i in range(3, 6)]
        _commit(store, b, theirs + mine)
        got = _take(sub, 3)
        assert [e.message_id for e in got] == [f"m-{i:05d}" for i in range(3)]
        assert sub.get(timeout=0.5) is None
    finally:
        b.close()


def _with_origin(i: int, origin: str) -> DecisionRecord:
    import dataclasses

    return dataclasses.replace(_decision(i), origin=origin)


def _wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- over gRPC


@pytest.mark.slow
def test_stream_events_resumes_over_grpc_and_refuses_a_seq_it_never_gave(trained_server, templates):
    from peep_testing.server import ADMIN, DEVICE, SITE

    stub = trained_server.stub()
    msgs = [templates.message(int(i), track_id=f"resume-{k}") for k, i in enumerate(templates.test[300:306])]
    first: list = []
    before = trained_server.services.events.n_subscribers
    call = stub.StreamEvents(recognition_pb2.StreamEventsRequest(site=SITE), metadata=ADMIN, timeout=20)

    def read() -> None:
        try:
            for ev in call:
                first.append(ev)
        except grpc.RpcError:
            pass  # cancelled below

    reader = threading.Thread(target=read)
    reader.start()
    assert _wait(lambda: trained_server.services.events.n_subscribers > before, 5)
    assert stub.IngestStream(iter(msgs[:3]), metadata=DEVICE, timeout=10).accepted == 3
    assert _wait(lambda: {m.message_id for m in msgs[:3]} <= {e.message_id for e in first}, 10)
    call.cancel()
    reader.join(5)
    mine = [e for e in first if e.message_id in {m.message_id for m in msgs}]
    last = mine[-1].seq
    assert stub.IngestStream(iter(msgs[3:]), metadata=DEVICE, timeout=10).accepted == 3  # while disconnected
    again = stub.StreamEvents(
        recognition_pb2.StreamEventsRequest(site=SITE, after_seq=last), metadata=ADMIN, timeout=20
    )
    resumed = []
    for ev in again:
        resumed.append(ev)
        if ev.message_id == msgs[-1].message_id:
            break
    again.cancel()
    assert [e.message_id for e in resumed if e.message_id in {m.message_id for m in msgs}] == [
        m.message_id for m in msgs[3:]
    ]
    assert all(e.seq > last for e in resumed)
    with pytest.raises(grpc.RpcError) as err:
        ahead = trained_server.services.store.last_decision_id() + 1000
        next(iter(stub.StreamEvents(
            recognition_pb2.StreamEventsRequest(site=SITE, after_seq=ahead), metadata=ADMIN, timeout=5
        )))  # fmt: skip
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "after_seq: expected at most" in err.value.details() and str(ahead) in err.value.details()


# --------------------------------------------------------------------------- peep events


@pytest.mark.slow
def test_peep_events_prints_each_event_with_its_seq_and_resumes_after_one(trained_server, templates, tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from peep_testing.server import ADMIN_TOKEN, DEVICE, SITE

    peep = shutil.which("peep", path=str(Path(sys.executable).parent))
    ca = tmp_path / "ca.pem"
    ca.write_bytes(trained_server.pki.ca_pem)
    token = tmp_path / "admin.token"
    token.write_text(ADMIN_TOKEN + "\n")
    base = [peep, "events", "--server", f"localhost:{trained_server.port}", "--ca", str(ca), "--site", SITE]
    msgs = [templates.message(int(i), track_id=f"cli-{k}") for k, i in enumerate(templates.test[320:323])]
    trained_server.services.ingestor.decisions.flush()
    before = trained_server.services.events.n_subscribers
    proc = subprocess.Popen([*base, "--token-file", str(token), "--count", "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert _wait(lambda: trained_server.services.events.n_subscribers > before, 20), "peep events did not call"
        assert trained_server.stub().IngestStream(iter(msgs), metadata=DEVICE, timeout=10).accepted == 3
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    lines = [json.loads(x) for x in out.splitlines()]
    assert [d["message_id"] for d in lines] == [m.message_id for m in msgs]
    assert lines[0]["seq"] < lines[1]["seq"] < lines[2]["seq"] and lines[0]["site"] == SITE
    # An earlier run's seq: the two after it, read back from the database.
    again = subprocess.run([*base, "--token-file", str(token), "--after-seq", str(lines[0]["seq"]), "--count", "2"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert [json.loads(x)["seq"] for x in again.stdout.splitlines()] == [lines[1]["seq"], lines[2]["seq"]]
    # A wrong token ends it (calling again would not help); a missing file is a usage error naming the option.
    token.write_text("not-the-token\n")
    bad = subprocess.run([*base, "--token-file", str(token)], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr
    missing = subprocess.run(
        [*base, "--token-file", str(tmp_path / "nope")], capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 2 and "--token-file: expected a readable file" in missing.stderr


def test_stream_events_with_the_database_away_is_unavailable_and_the_server_serves_on(trained_server, monkeypatch):
    from peep_testing.server import ADMIN, SITE

    def gone() -> int:
        raise OSError("connection to server at 10.0.0.9 failed: password=hunter2")

    stub = trained_server.stub()
    monkeypatch.setattr(trained_server.services.events, "_last_id", gone)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.StreamEvents(recognition_pb2.StreamEventsRequest(site=SITE, after_seq=1), metadata=ADMIN,
                                    timeout=5)))  # fmt: skip
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "database did not answer" in err.value.details() and "hunter2" not in err.value.details()
    monkeypatch.undo()
    status = stub.GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=ADMIN, timeout=5)
    assert status.model_version


def test_the_oldest_kept_seq_comes_back_from_the_store_after_retention(store):
    store.add_decisions([_decision(i) for i in range(6)])
    ids = [seq for seq, _ in store.decisions(since_id=0)]
    assert store.first_decision_id() == ids[0] and store.last_decision_id() == ids[-1]
    assert store.delete_decisions_before(1_700_000_003.0) == 3  # the first three are past retention
    assert store.first_decision_id() == ids[3]


def test_a_resume_past_what_the_server_keeps_is_told_so(trained_server, templates, monkeypatch):
    """A client back after longer than recognition.events_days: the server says its oldest kept seq, and the
    follower reports the stretch it may have missed (rather than implying nothing happened)."""
    from peep.server.transport.follow import EventFollower
    from peep_testing.server import ADMIN, DEVICE, SITE

    stub = trained_server.stub()
    # Six decisions of this test's own, so that the seqs it resumes from exist whichever of the module's
    # tests ran before it (--fast leaves the slow ones out).
    msgs = [templates.message(int(templates.test[330 + k]), track_id=f"gap-{k}") for k in range(6)]
    msg = msgs[-1]
    trained_server.services.ingestor.decisions.flush()  # an earlier call's decision, committed before this one
    assert stub.IngestStream(iter(msgs), metadata=DEVICE, timeout=10).accepted == len(msgs)
    last = trained_server.services.store.last_decision_id()
    kept = {"oldest": last - 1}  # as if retention had deleted everything before the newest two
    monkeypatch.setattr(trained_server.services.events, "_first_id", lambda: kept["oldest"])
    gaps: list = []
    after = last - 5
    follower = EventFollower(
        lambda: stub, site=SITE, metadata=ADMIN, after_seq=after, on_gap=lambda a, o: gaps.append((a, o))
    )
    got = []
    for ev in follower:
        got.append(ev)
        if ev.message_id == msg.message_id:
            break
    follower.stop()
    assert gaps == [(after, last - 1)] and follower.gaps == gaps
    # Resuming from a seq the server still keeps after: nothing reported.
    follower = EventFollower(lambda: stub, site=SITE, metadata=ADMIN, after_seq=last - 1)
    first = next(iter(follower))
    follower.stop()
    assert (first.seq, first.message_id) == (last, msg.message_id) and follower.gaps == []
