"""The soak's other users keep histories the checker can trust: the decisions read before retention deletes
them, the ε the console shows, and everything of the cameras' releases found anywhere in the database."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from peep.lab.bench.soak.actors import DecisionLog, device_row_text, shown_epsilon
from peep.lab.bench.soak.nemesis import Fault
from peep.lab.bench.soak.world import SoakWorld


def _events_table(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE recognition_events (id BIGINT PRIMARY KEY, event_id TEXT, device_id TEXT, "
                  "message_id TEXT, model_version TEXT, purpose TEXT DEFAULT 'identify', "
                  "claimed_subject TEXT DEFAULT '', accepted INTEGER, at DOUBLE PRECISION DEFAULT 0)")  # fmt: skip


def _insert(dsn: str, *rows: tuple[object, ...]) -> None:
    """Rows of (id, event_id, device_id, message_id, model_version[, purpose, claimed_subject, accepted, at])."""
    import psycopg

    names = ["id", "event_id", "device_id", "message_id", "model_version", "purpose", "claimed_subject", "accepted",
             "at"]  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as c:
        for r in rows:
            cols, marks = ", ".join(names[: len(r)]), ", ".join(["%s"] * len(r))
            c.execute(f"INSERT INTO recognition_events ({cols}) VALUES ({marks})", r)


def test_the_decision_log_keeps_rows_retention_deleted_and_those_committed_out_of_id_order(pg_dsn):
    import psycopg

    _events_table(pg_dsn)
    log = DecisionLog(pg_dsn, overlap=100)
    _insert(pg_dsn, (1, "e1", "cam-1", "m1", "v1"), (3, "e3", "cam-2", "m3", "v1"))
    log.read_now()
    # id 2 commits after id 3 was read (two replicas' transactions); then retention deletes 1 and 2
    _insert(pg_dsn, (2, "e2", "cam-1", "m2", "v2"))
    log.read_now()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DELETE FROM recognition_events WHERE id < 3")
    log.read_now()
    assert log.committed() == [(1, "e1"), (2, "e2"), (3, "e3")]
    assert sorted(log.decided()) == [("cam-1", "m1"), ("cam-1", "m2"), ("cam-2", "m3")]
    assert log.by_model() == {"v1": 2, "v2": 1}
    # a door's Verify decisions are kept with their claim and verdict
    _insert(pg_dsn, (4, "e4", "door-1", "nonce-1", "v2", "verify", "Ann", 1, 12.5))
    log.read_now()
    assert log.verify_decisions("door-1") == [("nonce-1", "Ann", True, 12.5)] and log.verify_decisions("cam-1") == []


def test_a_recovery_is_a_decision_committed_after_the_heal_even_as_retention_deletes_more(pg_dsn, tmp_path):
    import psycopg

    _events_table(pg_dsn)
    world = SoakWorld(tmp_path, seed=0, data_home=None, say=lambda _m: None)
    world.pg = SimpleNamespace(dsn=pg_dsn)  # type: ignore[assignment]
    world.cameras = {"cam-1": SimpleNamespace(queued=lambda: 0, alive=lambda: True)}  # type: ignore[dict-item]
    _insert(pg_dsn, *[(i, f"e{i}", "cam-1", f"m{i}", "v1") for i in range(1, 6)])
    fault = Fault(at_s=0.0, kind="network_cut", target="cam-1", duration_s=1.0)
    assert not world.recovered(fault)  # the first ask after the heal marks where the system stood
    # A sweep removes three decisions made after an earlier fault as one new decision commits: fewer are kept.
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DELETE FROM recognition_events WHERE id <= 3")
    _insert(pg_dsn, (6, "e6", "cam-1", "m6", "v1"))
    assert world.recovered(fault)
    world.cameras["cam-1"].queued = lambda: 5  # type: ignore[union-attr]  # a backlog left in its spool
    assert not world.recovered(fault)


def test_a_read_that_fails_is_kept_as_an_error_and_the_loop_goes_on():
    log = DecisionLog("host=127.0.0.1 port=1 dbname=none connect_timeout=1", interval_s=0.05).start()
    deadline = time.monotonic() + 10
    while len(log.errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.stop(5.0)
    assert len(log.errors) >= 2 and "OperationalError" in log.errors[0]


def test_the_epsilon_the_devices_page_shows_is_read_per_row():
    html = """<table><tr>
      <td>cam-1</td><td>soak</td><td class="eps-total">12,345.5<br><small>soft traits 2</small></td></tr>
      <tr><td>cam-2</td><td>x</td><td class="eps-total">16</td></tr>
      <tr><td>cam-3</td><td>x</td><td class="eps-total">3,104<br><small class="eps-reported">spent by the device
      (its report): 3,152 over 197 releases; the difference was refused here or is still on its way</small></td></tr>
      <tr><td>desk-1</td><td>no releases yet</td></tr></table>"""
    assert shown_epsilon(html) == {"cam-1": 12345.5, "cam-2": 16.0, "cam-3": 3152.0}
    # a mismatch is reported with the row as text, bounded
    assert device_row_text(html, "cam-3").startswith("x 3,104 spent by the device (its report): 3,152 over 197")
    assert len(device_row_text(html, "cam-3", limit=20)) == 20 and device_row_text(html, "cam-9") == ""


def _camera(tmp: Path, device: str, messages: list[str]) -> SimpleNamespace:
    state = tmp / device
    state.mkdir()
    with sqlite3.connect(state / "ledger.sqlite3") as db:
        db.execute("CREATE TABLE spends (key TEXT, epsilon REAL, message_id TEXT)")
        db.executemany("INSERT INTO spends VALUES (?, ?, ?)", [("track:1", 16.0, m) for m in messages])
    return SimpleNamespace(state_dir=state)


def test_every_table_is_read_for_the_cameras_releases(pg_dsn, tmp_path):
    import psycopg

    world = SoakWorld(tmp_path, seed=0, data_home=None, say=lambda _m: None)
    world.cameras = {"cam-1": _camera(tmp_path, "cam-1", ["m1", "m2", "m3"])}  # type: ignore[dict-item]
    world.pg = SimpleNamespace(dsn=pg_dsn)  # type: ignore[assignment]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE ingest_ledger (device_id TEXT, message_id TEXT)")
        c.execute("CREATE TABLE templates (message_id TEXT, subject TEXT, vals BYTEA)")
        c.execute("CREATE TABLE track_memory (message_id TEXT, expires_at DOUBLE PRECISION)")
        c.execute("CREATE TABLE model_versions (version INTEGER)")
        c.execute("INSERT INTO ingest_ledger VALUES ('cam-1', 'm1'), ('cam-1', 'm2')")
        c.execute("INSERT INTO templates VALUES ('m2', '', ''), ('e1', 'Someone', '')")
        c.execute("INSERT INTO track_memory VALUES ('m3', %s), ('m1', %s)", (time.time() + 60, time.time() - 60))
    assert world.ledger_epsilon() == {"cam-1": 48.0} and world.ledger_releases() == {"cam-1": 3}
    got = world.kept_of_cameras()
    assert got["released"] == 3
    assert got["found_in"] == {"ingest_ledger": 2, "templates": 1, "track_memory": 1}
    assert got["kept"] == 2 and got["kept_in"] == {"templates": 1, "track_memory": 1}
    assert got["track_memory_within_expiry"] == 1


def test_the_desk_is_checked_against_its_own_ledger_and_an_input_refusal_is_not_a_failure(pg_dsn, tmp_path):
    import psycopg
    from peep.lab.bench.soak.actors import Enrolment, EnrolmentDesk

    ledger = tmp_path / "ledger.sqlite3"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE spends (key TEXT, epsilon REAL, message_id TEXT)")
        rows = [("subject:Ann", "a1"), ("subject:Ann", "a2"), ("subject:Bo", "b1"), ("subject:Bo", "b2"),
                ("subject:Cy", "c1"), ("subject:Dee", "d1")]  # fmt: skip
        db.executemany("INSERT INTO spends VALUES (?, 16.0, ?)", rows)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE templates (subject TEXT, purpose TEXT)")
        c.cursor().executemany("INSERT INTO templates VALUES (%s, 'enroll')", [("Ann",), ("Ann",), ("Bo",), ("Cy",),
                                                                               ("Dee",)])  # fmt: skip
    desk = EnrolmentDesk(tmp_path / "desk.toml", {}, [], count=2, interval_s=1.0, clock=lambda: 0.0,
                         log=tmp_path / "desk.log")  # fmt: skip
    desk.enrolments = [
        Enrolment("Ann", 2, 1.0, rc=0),
        Enrolment("Bo", 2, 2.0, rc=0),  # released two, one stored: lost on the way
        Enrolment("Cy", 2, 3.0, rc=1, said="peep-edge enroll: error: --source: only 1 of --count 2 templates"),
        Enrolment("Dee", 2, 4.0, rc=1, said="peep-edge enroll: error: 2 enrolment templates released but not all"),
    ]
    got = desk.check(pg_dsn, ledger)
    assert got["templates_released"] == 6 and got["templates_stored"] == 5 and got["mismatched"] == ["Bo"]
    assert [r["subject"] for r in got["refused_input"]] == ["Cy"] and [r["subject"] for r in got["failed"]] == ["Dee"]


def test_the_desk_enrols_at_a_lower_cpu_priority_than_the_cameras_it_shares_the_rig_with(tmp_path, monkeypatch):
    import os

    from peep.lab.bench.soak import actors

    fake = tmp_path / "peep-edge"
    fake.write_text("#!/bin/sh\nnice\n")  # prints the niceness it runs at
    fake.chmod(0o755)
    monkeypatch.setattr(actors, "PEEP_EDGE", str(fake))
    base = os.nice(0)
    said = {}
    for niceness in (10, 0):
        desk = actors.EnrolmentDesk(tmp_path / "desk.toml", {}, [("Ann", tmp_path)], count=2, interval_s=1.0,
                                    clock=lambda: 0.0, log=tmp_path / "desk.log", niceness=niceness)  # fmt: skip
        desk.step()
        said[niceness] = desk.enrolments[0].said
    assert said == {10: str(min(19, base + 10)), 0: str(base)}
    with pytest.raises(ValueError, match="niceness: expected 0..19, got 20"):
        actors.EnrolmentDesk(tmp_path / "d.toml", {}, [], count=1, interval_s=1.0, clock=lambda: 0.0,
                             log=tmp_path / "d.log", niceness=20)  # fmt: skip


def test_the_operator_stopped_then_stepped_loads_the_final_devices_page_afresh(tmp_path):
    # The runner stops the operator's loop, then loads Devices once more for the ε it shows as the run ends:
    # that load must not go to the closed connection (it failed, and the check read an older page).
    import httpx
    from peep.lab.bench.soak.actors import ConsoleOperator
    from peep.lab.bench.soak.timeline import Timeline

    served = {"devices": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in ("/login", "/password") and request.method == "GET":
            return httpx.Response(200, text='<input name="csrf" value="t">')
        if path == "/login":
            return httpx.Response(303, headers={"location": "/live"})
        if path == "/devices":
            served["devices"] += 1
            return httpx.Response(200, text=f"devices page {served['devices']}")
        return httpx.Response(200, text="live")

    class Operator(ConsoleOperator):
        def _new_client(self) -> httpx.Client:
            return httpx.Client(base_url="https://console.test", transport=httpx.MockTransport(handler))

    op = Operator("https://console.test", tmp_path / "ca.pem", "op", "pw", interval_s=60.0, clock=time.monotonic,
                  timeline=Timeline())  # fmt: skip
    op.start()  # its loop loads Live and Devices once, then waits a minute
    deadline = time.monotonic() + 10
    while len(op.loads) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert op.stop()
    assert op.last_devices == "devices page 1"
    op.step()
    op.close()
    assert op.last_devices == "devices page 2"
    assert [x.status for x in op.loads] == [200, 200, 200, 200]
    assert op.logins == 2
