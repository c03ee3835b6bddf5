"""Decide, then forget: what the server keeps of the templates it decides (``[recognition]``).

Identify/verify templates are decided in memory and not written to the database
by default; only the decision and a ledger entry of ids and times are kept, and
the ledger still answers a redelivered template DUPLICATE. ``keep`` widens it
explicitly; every kept category expires by its own stated rule; nothing of a
stranger's template remains in any table.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import subprocess
import time
from typing import Any

import numpy as np
import pytest
from peep.server.recognition.fusion import TrackFusion
from peep.server.recognition.tracks import TrackIdentifier
from peep.server.storage import TemplateRecord
from peep.v1 import recognition_pb2
from peep_testing.server import (
    DEVICE,
    PEEP,
    EventCollector,
    base_config,
    start_server,
    tls_section,
    to_toml,
)

AGE = {"trait": "age", "value": 47.25, "epsilon": 1.0, "mechanism": "bounded-laplace"}


class Keep:
    """Run the session's trained server with another ``recognition.keep`` for one test."""

    def __init__(self, server: Any, keep: str) -> None:
        self.ingestor, self.keep = server.services.ingestor, keep

    def __enter__(self) -> None:
        self.old, self.ingestor.keep = self.ingestor.keep, self.keep

    def __exit__(self, *exc: object) -> None:
        self.ingestor.keep = self.old


def _stored(server: Any, msg: Any) -> TemplateRecord | None:
    return server.services.store.get_template(msg.message_id, device_id=msg.device_id)


def _decisions(server: Any, msg: Any) -> list[Any]:
    return [d for _, d in server.services.store.decisions(limit=100_000) if d.message_id == msg.message_id]


def _subjects(templates: Any) -> tuple[int, int, str]:
    """A test template whose person the model names, another's, and that person's id."""
    i, j = (int(v) for v in templates.test[:2])
    return i, j, str(templates.subjects[i])


def test_identify_and_verify_templates_are_decided_then_forgotten(trained_server, templates):
    stub = trained_server.stub()
    i, _, who = _subjects(templates)
    ident = templates.message(i, soft_traits=[AGE])
    ver = templates.message(i, purpose="verify", subject=who)
    with EventCollector(trained_server, 2) as events:
        for m in (ident, ver):
            assert stub.Ingest(m, metadata=DEVICE, timeout=5).status == recognition_pb2.INGEST_STATUS_ACCEPTED
        got = {e.message_id: e for e in events.wait()}
    assert set(got) == {ident.message_id, ver.message_id}  # decided ...
    assert _stored(trained_server, ident) is None and _stored(trained_server, ver) is None  # ... not kept
    store = trained_server.services.store
    assert store.seen([(m.device_id, m.message_id) for m in (ident, ver)]) == {
        (m.device_id, m.message_id) for m in (ident, ver)
    }
    # the decision is kept, once, as the event said it
    (d,) = _decisions(trained_server, ident)
    assert (d.subject, d.unknown, d.probability) == (got[ident.message_id].subject, got[ident.message_id].unknown,
                                                     pytest.approx(got[ident.message_id].probability))  # fmt: skip
    (v,) = _decisions(trained_server, ver)
    assert v.claimed_subject == who and v.accepted == got[ver.message_id].accepted


def test_the_identify_and_verify_calls_keep_their_decisions_not_their_templates(trained_server, templates):
    stub = trained_server.stub()
    i, _, who = _subjects(templates)
    probe = templates.message(i)
    store = trained_server.services.store
    before = store.count_received(device_id=probe.device_id)
    r = stub.Identify(recognition_pb2.IdentifyRequest(template=probe, top_k=3), metadata=DEVICE, timeout=5)
    v = stub.Verify(recognition_pb2.VerifyRequest(template=probe, claimed_subject=who), metadata=DEVICE, timeout=5)
    assert trained_server.services.ingestor.decisions.flush(5.0)
    got = sorted(_decisions(trained_server, probe), key=lambda d: d.purpose)
    assert [(d.purpose, d.subject, d.claimed_subject) for d in got] == [("identify", r.subject, ""),
                                                                        ("verify", "", who)]  # fmt: skip
    assert got[1].accepted == v.accepted and _stored(trained_server, probe) is None
    # The device released it once: one ledger row (ids, times, ε; no template), whichever calls asked about it,
    # so its ε is counted like an ingested release's (a door's claims are such calls).
    key = (probe.device_id, probe.message_id)
    assert store.seen([key]) == {key} and store.count_received(device_id=probe.device_id) == before + 1


def test_a_redelivered_template_is_a_duplicate_after_it_was_forgotten(trained_server, templates):
    stub = trained_server.stub()
    m = templates.message(int(templates.test[2]))
    with EventCollector(trained_server, 1, timeout=3.0) as events:
        assert stub.Ingest(m, metadata=DEVICE, timeout=5).status == recognition_pb2.INGEST_STATUS_ACCEPTED
        assert len(events.wait()) == 1
    assert _stored(trained_server, m) is None  # nothing of it is kept but its ledger entry and its decision
    again = stub.Ingest(m, metadata=DEVICE, timeout=5)
    assert again.status == recognition_pb2.INGEST_STATUS_DUPLICATE
    summary = stub.IngestStream(iter([m, m]), metadata=DEVICE, timeout=5)
    assert (summary.accepted, summary.duplicates) == (0, 2)
    assert len(_decisions(trained_server, m)) == 1  # decided once


def test_keep_recognised_keeps_only_people_recognised_as_enrolled(trained_server, templates):
    stub = trained_server.stub()
    model = trained_server.services.recogniser.model
    strangers = [templates.message(values=v) for v in templates.strangers[:10]]
    known = [templates.message(int(i)) for i in templates.test[3:23]]
    with Keep(trained_server, "recognised"), EventCollector(trained_server, 30) as events:
        for m in (*known, *strangers):
            stub.Ingest(m, metadata=DEVICE, timeout=5)
        got = {e.message_id: e for e in events.wait()}
    named = [m for m in (*known, *strangers) if not got[m.message_id].unknown]
    unknown = [m for m in (*known, *strangers) if got[m.message_id].unknown]
    assert named and unknown, "the test needs both decisions"
    for m in named:
        rec = _stored(trained_server, m)
        assert rec is not None and rec.decided_subject == got[m.message_id].subject
        assert rec.decided_subject in model.class_index
    assert all(_stored(trained_server, m) is None for m in unknown)


def test_keep_all_keeps_strangers_too_and_says_so_at_start(tmp_path, pki, keypair, bundle_dir, caplog):
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}, recognition={"keep": "all"})
    with caplog.at_level(logging.WARNING, logger="peep.server.app"):
        srv = start_server(cfg, pki, tmp_path)
    try:
        assert any("recognition.keep = all" in r.getMessage() for r in caplog.records)
    finally:
        srv.app.stop(0)


def test_kept_templates_expire_and_the_policy_is_enforced_on_what_was_left(trained_server, templates):
    """The retention pass: templates the current keep does not allow go at once (an upgrade from a version
    that stored every template), kept ones after keep_days; decisions after events_days."""
    from dataclasses import replace

    services = trained_server.services
    store = services.store
    now = time.time()
    old = [replace(TemplateRecord.from_message(templates.message(int(i)), templates.X[int(i)], received_at=now),
                   message_id=f"left-{k}") for k, i in enumerate(templates.test[:3])]  # fmt: skip
    old[0] = replace(old[0], decided_subject=str(templates.subjects[templates.test[0]]))
    store.insert_templates(old)
    rc = services.config.recognition
    from peep.server.storage import DecisionRecord

    store.add_decisions([
        DecisionRecord(event_id="too-old-1", at=now - rc.events_days_s - 1, site="lobby", device_id="cam-1",
                       message_id="old-1", track_id="", purpose="identify", subject="", claimed_subject="",
                       unknown=True, accepted=None, probability=0.1, model_version="v000001", releases_fused=1),
    ])  # fmt: skip
    original = rc.keep
    try:
        object.__setattr__(rc, "keep", "recognised")
        out = services.enforce_retention(now=now)
        assert (out["recognised_templates"], out["unknown_templates"]) == (0, 2)  # unknown ones are not allowed
        assert store.get_template("left-0") is not None
        assert out["decisions"] == 1 and not [d for _, d in store.decisions(limit=100_000) if d.event_id == "too-old-1"]
        object.__setattr__(rc, "keep", "all")
        assert services.enforce_retention(now=now)["recognised_templates"] == 0
        store.insert_templates([old[1]])
        old_enough = now + rc.keep_days_s + 1
        out = services.enforce_retention(now=old_enough)  # keep_days later
        assert out["recognised_templates"] >= 1 and out["unknown_templates"] >= 1
        assert store.get_template("left-0") is None and store.get_template("left-1") is None
    finally:
        object.__setattr__(rc, "keep", original)


def test_events_of_unknown_decisions_name_nobody(trained_server, templates):
    msgs = [templates.message(values=v, soft_traits=[AGE]) for v in templates.strangers[10:30]]
    with EventCollector(trained_server, len(msgs)) as events:
        trained_server.stub().IngestStream(iter(msgs), metadata=DEVICE, timeout=10)
        unknown = [ev for ev in events.wait() if ev.unknown]
    assert unknown, "the test needs an unknown decision"
    for ev in unknown:
        assert ev.subject == "" and ev.claimed_subject == ""
        (d,) = [d for _, d in trained_server.services.store.decisions(limit=100_000) if d.event_id == ev.event_id]
        assert d.unknown and d.subject == "" and d.claimed_subject == ""


def test_nothing_of_a_strangers_template_is_in_any_table(trained_server, templates):
    """Every table, every column: no stranger's template values or soft-trait values anywhere; what names
    the stranger's message id is only the ledger (ids, times, ε) and the decision."""
    values = [np.asarray(v, dtype=np.float32) for v in templates.strangers[30:40]]
    msgs = [templates.message(values=v, soft_traits=[AGE], track_id=f"bystander-{k}") for k, v in enumerate(values)]
    with EventCollector(trained_server, len(msgs)) as events:
        trained_server.stub().IngestStream(iter(msgs), metadata=DEVICE, timeout=10)
        events.wait()
    path = trained_server.services.config.storage.path
    ids = {m.message_id for m in msgs}
    blobs = [v.astype("<f4").tobytes() for v in values]
    where: dict[str, set[str]] = {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert {"templates", "ingest_ledger", "recognition_events", "track_memory"} <= set(tables)
        for table in tables:
            for row in conn.execute(f"SELECT * FROM {table}"):
                for cell in row:
                    if isinstance(cell, bytes):
                        assert not any(b in cell for b in blobs), f"{table} holds a stranger's template"
                    elif isinstance(cell, str):
                        assert "47.25" not in cell, f"{table} holds a stranger's soft trait"
                        if cell in ids:
                            where.setdefault(table, set()).add(cell)
                    elif isinstance(cell, float):
                        assert cell != pytest.approx(47.25), f"{table} holds a stranger's soft trait"
    assert set(where) == {"ingest_ledger", "recognition_events"} and all(v == ids for v in where.values())


def test_a_track_is_fused_within_its_window_and_forgotten_after_it(trained_server, templates):
    """The fused decision uses the previous release within the window; after it, nothing of the track
    remains in memory or in track_memory (an injected clock for the memory, a later `now` for the table)."""
    services = trained_server.services
    ingestor = services.ingestor
    clock = [1000.0]
    single = ingestor.tracks
    # As on a replica: the release is also remembered in track_memory.
    ingestor.tracks = TrackIdentifier(single.recogniser, TrackFusion(ttl_s=30.0, clock=lambda: clock[0]),
                                      memory=services.store)  # fmt: skip
    try:
        stub = trained_server.stub()
        i, j = (int(v) for v in templates.test[140:142])
        first, second = templates.message(i, track_id="window-1"), templates.message(j, track_id="window-1")
        late = templates.message(i, track_id="window-1")
        with EventCollector(trained_server, 3) as events:
            stub.Ingest(first, metadata=DEVICE, timeout=5)
            clock[0] += 29.0
            stub.Ingest(second, metadata=DEVICE, timeout=5)
            assert len(ingestor.tracks.fusion) == 1
            assert services.store.track_memory([(DEVICE_ID, "window-1")], now=time.time())
            clock[0] += 31.0  # past the window: the memory sweep forgets the track, here and in track_memory
            assert services.sweep_fusion_memory(now=time.time() + 31.0) == 1 + 2
            assert len(ingestor.tracks.fusion) == 0
            assert services.store.track_memory([(DEVICE_ID, "window-1")], now=0.0) == []
            ingestor.tracks.memory = None
            stub.Ingest(late, metadata=DEVICE, timeout=5)
            got = {e.message_id: e.releases_fused for e in events.wait()}
    finally:
        ingestor.tracks = single
    assert got == {first.message_id: 1, second.message_id: 2, late.message_id: 1}
    assert all(_stored(trained_server, m) is None for m in (first, second, late))


DEVICE_ID = "cam-1"


def test_the_running_server_sweeps_fusion_memory_within_a_second_of_the_window(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    """A real server with a 1 s window: a track's release is gone from memory about a second after it."""
    services = trained_server.services
    fusion = services.ingestor.tracks.fusion
    short = TrackFusion(ttl_s=1.0)
    services.ingestor.tracks.fusion = short
    from peep.server.app import ServerApp

    app = ServerApp.__new__(ServerApp)  # only its sweep loop, on the trained server's services
    app.services, app.config = (
        services,
        services.config.model_copy(
            update={"training": services.config.training.model_copy(update={"track_fusion_s": 1.0})}
        ),
    )
    import threading

    app._stopping = threading.Event()
    sweeper = threading.Thread(target=app._sweep_loop, daemon=True)
    sweeper.start()
    try:
        trained_server.stub().Ingest(templates.message(int(templates.test[150]), track_id="sweep-1"), metadata=DEVICE,
                                     timeout=5)  # fmt: skip
        assert len(short) == 1
        deadline = time.monotonic() + 3.0
        while len(short) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(short) == 0
    finally:
        app._stopping.set()
        sweeper.join(5)
        services.ingestor.tracks.fusion = fusion


@pytest.mark.slow
def test_retention_command_purges_recognition_templates_and_reports_what_is_kept(
    tmp_path, keypair, bundle_dir, templates
):
    from peep.server.storage.sqlite import SqliteStore

    cfg = base_config(tmp_path, keypair[3], bundle_dir, recognition={"keep": "all"})
    cfg["auth"]["allow_insecure"] = True
    conf = tmp_path / "server.toml"
    conf.write_text(to_toml(cfg))
    store = SqliteStore(tmp_path / "peep.db")
    now = time.time()
    rows = [TemplateRecord.from_message(templates.message(int(i)), templates.X[int(i)], received_at=now)
            for i in templates.test[:4]]  # fmt: skip
    enrol = [
        TemplateRecord.from_message(templates.message(int(i), purpose="enroll", subject="alice"), templates.X[int(i)],
                                    received_at=now)
        for i in templates.train[:2]
    ]  # fmt: skip
    from dataclasses import replace

    rows[0] = replace(rows[0], decided_subject="alice")
    store.insert_templates([*rows, *enrol])
    store.close()
    r = subprocess.run([PEEP, "retention", "--config", str(conf)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "recognised templates 0, unknown templates 0" in r.stdout  # keep = all allows them (for keep_days)
    r = subprocess.run([PEEP, "retention", "--config", str(conf), "--purge-recognition"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "recognised templates 1, unknown templates 3" in r.stdout
    assert re.search(r"enrolment templates \(consented\) +2  until erased", r.stdout), r.stdout
    assert re.search(r"everyone else \(strangers\) +0  \d+ days", r.stdout), r.stdout  # keep = all: keep_days
    store = SqliteStore(tmp_path / "peep.db")
    try:
        k = store.kept_counts("background:")
        assert (k.enrolment, k.recognised, k.unknown) == (2, 0, 0)
    finally:
        store.close()
    r = subprocess.run([PEEP, "retention", "--config", str(conf), "--include-enrolment"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "--include-enrolment: expected --days N" in r.stderr


def test_erasure_deletes_the_decisions_that_name_the_subject(trained_server, templates, tmp_path):
    """Through the admin API: a kept decision naming the subject goes with the subject."""
    from peep.server.storage import DecisionRecord

    store = trained_server.services.store
    store.add_decisions([
        DecisionRecord(event_id="erase-me-1", at=time.time(), site="lobby", device_id="cam-1", message_id="e1",
                       track_id="", purpose="identify", subject="nobody-real-1", claimed_subject="", unknown=False,
                       accepted=None, probability=0.9, model_version="v000001", releases_fused=1),
    ])  # fmt: skip
    r = trained_server.services.erase_subject("nobody-real-1", retrain=False)
    assert r.decisions_deleted == 1
    assert not [d for _, d in store.decisions(limit=100_000) if d.subject == "nobody-real-1"]
