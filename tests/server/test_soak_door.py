"""The soak's door: every claim it was given ends, and the lock is driven only for a claim the server accepted.

The check is fed synthetic histories (the door's logs, the lock's file, the server's rows); the feeder is tried
against a claim socket of this process; one test runs the real ``peep-edge door`` against a trained server.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from peep.lab.bench.soak.door import (
    DoorRun,
    SentClaim,
    ServerDecision,
    SoakDoor,
    check_door_history,
    claim_to_lock,
    claim_to_verdict,
    door_config,
    read_decisions,
    read_door_log,
    read_lock_drives,
    read_releases,
)

T0 = 1_700_000_000.0


def _ts(t: float) -> str:
    ms = round((t % 1) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(t))) + f".{ms:03d}Z"


def _log(path: Path, events: list[tuple[float, str, str, str]]) -> Path:
    """A door log: ``(t, event, nonce, reason)`` as the door's JSON lines, with the prints between them."""
    lines = ["door-1: starting"]
    for t, event, nonce, reason in events:
        doc = {"ts": _ts(t), "level": "info", "logger": "peep.edge.door", "event": event, "door": "door-1",
               "nonce": nonce}  # fmt: skip
        if reason:
            doc["reason"] = reason
        lines.append(json.dumps(doc))
        if event != "door_claim":
            lines.append(f"claim x: {'opened' if event == 'door_opened' else 'locked'}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _sent(seq: int, genuine: bool, pid: int) -> SentClaim:
    return SentClaim(seq, "Alice" if genuine else "Bob", genuine, T0 + 10 * seq, pid)


def _decision(nonce: str, accepted: bool, subject: str = "Alice") -> ServerDecision:
    return ServerDecision(nonce, subject, accepted, T0)


def _history(tmp_path: Path):
    """Two runs of the door: the first killed during claim 2 with claim 3 unread; the second takes 4 and 5."""
    run1 = _log(tmp_path / "door-1.log", [
        (T0 + 0.1, "door_claim", "n0", ""), (T0 + 1.0, "door_opened", "n0", ""),
        (T0 + 10.1, "door_claim", "n1", ""), (T0 + 11.0, "door_refused", "n1", "rejected"),
        (T0 + 20.1, "door_claim", "n2", ""),
    ])  # fmt: skip
    run2 = _log(tmp_path / "door-2.log", [
        (T0 + 40.1, "door_claim", "n4", ""), (T0 + 41.0, "door_opened", "n4", ""),
        (T0 + 50.1, "door_claim", "n5", ""), (T0 + 51.0, "door_refused", "n5", "rejected"),
    ])  # fmt: skip
    runs = [DoorRun(100, run1, T0 - 5, T0 + 25, killed=True), DoorRun(200, run2, T0 + 35, T0 + 60)]
    sent = [_sent(0, True, 100), _sent(1, False, 100), _sent(2, True, 100), _sent(3, False, 100),
            _sent(4, True, 200), _sent(5, False, 200)]  # fmt: skip
    events = {r.pid: read_door_log(r.log) for r in runs}
    decisions = [_decision("n0", True), _decision("n1", False, "Bob"), _decision("n4", True),
                 _decision("n5", False, "Bob")]  # fmt: skip
    return sent, runs, events, decisions


def test_each_claim_is_matched_to_its_run_and_each_drive_to_an_accepted_decision(tmp_path):
    sent, runs, events, decisions = _history(tmp_path)
    got = check_door_history(sent, runs, events, [T0 + 0.95, T0 + 40.95], decisions, releases={"n0", "n1", "n4", "n5"})
    assert {k: got[k] for k in ("claims", "opened", "refused", "unended", "interrupted", "wrong_lock_drives")} == {
        "claims": 6, "opened": 2, "refused": 2, "unended": 0, "interrupted": 2, "wrong_lock_drives": 0}  # fmt: skip
    assert got["refusals"] == {"rejected": 2} and got["refused_without_reason"] == 0
    assert got["genuine"] == {"claims": 3, "opened": 2, "refused": 0}
    assert got["impostor"] == {"claims": 3, "opened": 0, "refused": 2}
    assert got["lock_drives"] == 2 and got["unconfirmed_lock_drives"] == 0 and got["subject_mismatches"] == 0
    assert got["released"] == 4 and got["decided_without_release"] == 0 and got["unknown_decisions"] == 0
    # From the feeder's write (T0 + 10 * seq) to the drive.
    assert claim_to_lock(sent, runs, events, [T0 + 0.95, T0 + 40.95]) == [(T0, pytest.approx(950.0)),
                                                                         (T0 + 40, pytest.approx(950.0))]  # fmt: skip
    # Every claim the server decided, opened or rejected, to the door's answer; the killed ones are not there.
    assert claim_to_verdict(sent, runs, events) == [(T0, pytest.approx(1000.0)), (T0 + 10, pytest.approx(1000.0)),
                                                    (T0 + 40, pytest.approx(1000.0)),
                                                    (T0 + 50, pytest.approx(1000.0))]  # fmt: skip


def test_a_drive_without_an_accepted_decision_is_wrong_unless_the_server_may_have_lost_it(tmp_path):
    sent, runs, events, decisions = _history(tmp_path)
    # The server rejected n1, yet the lock was driven while n1 was in progress (the door logged it refused).
    got = check_door_history(sent, runs, events, [T0 + 10.9], decisions)
    assert got["wrong_lock_drives"] == 1 and got["examples"]["drive_in_refused_claim"] == ["n1"]
    # A drive between claims belongs to no claim.
    got = check_door_history(sent, runs, events, [T0 + 5.0], decisions)
    assert got["wrong_lock_drives"] == 1 and got["unattributed_lock_drives"] == 1
    # The door opened n4 but the server's record says rejected: wrong.
    flipped = [d if d.message_id != "n4" else _decision("n4", False) for d in decisions]
    got = check_door_history(sent, runs, events, [T0 + 40.95], flipped)
    assert got["wrong_lock_drives"] == 1 and got["server_rejected_but_opened"] == 1
    # No server record of n4 at all: wrong, unless a replica or the database died around that claim.
    lost = [d for d in decisions if d.message_id != "n4"]
    got = check_door_history(sent, runs, events, [T0 + 40.95], lost)
    assert got["wrong_lock_drives"] == 1 and got["unconfirmed_lock_drives"] == 1 and got["excused_lock_drives"] == 0
    got = check_door_history(sent, runs, events, [T0 + 40.95], lost, loss_windows=[(T0 + 39, T0 + 42)])
    assert got["wrong_lock_drives"] == 0 and got["excused_lock_drives"] == 1
    # Two drives in one accepted claim: one too many.
    assert check_door_history(sent, runs, events, [T0 + 0.9, T0 + 0.95], decisions)["wrong_lock_drives"] == 1


def test_a_claim_a_living_door_never_ended_is_unended_and_a_stranger_claim_is_counted(tmp_path):
    sent, runs, events, decisions = _history(tmp_path)
    runs[0].killed = False  # the same history, but the first run was stopped, not killed: 2 and 3 never ended
    got = check_door_history(sent, runs, events, [], decisions)
    assert got["unended"] == 2 and got["interrupted"] == 0
    assert got["examples"]["unended"] == ["#2 n2", "#3 (not taken)"]
    # A claim the door took that the feeder never wrote (someone else on the socket), and a decision for it.
    extra = _log(tmp_path / "door-2.log", [
        (T0 + 40.1, "door_claim", "n4", ""), (T0 + 41.0, "door_opened", "n4", ""),
        (T0 + 50.1, "door_claim", "n5", ""), (T0 + 51.0, "door_refused", "n5", "rejected"),
        (T0 + 55.1, "door_refused", "", "throttled"),
    ])  # fmt: skip
    events[200] = read_door_log(extra)
    got = check_door_history(sent, runs, events, [], [*decisions, _decision("zz", True)])
    assert got["unexpected_claims"] == 1 and got["unknown_decisions"] == 1


def test_a_claim_refused_as_it_is_taken_has_a_reason_and_no_nonce(tmp_path):
    log = _log(tmp_path / "door-1.log", [(T0 + 0.1, "door_refused", "", "throttled"),
                                         (T0 + 10.1, "door_claim", "n1", "")])  # fmt: skip
    runs = [DoorRun(7, log, T0 - 1, T0 + 20)]
    got = check_door_history([_sent(0, True, 7), _sent(1, False, 7)], runs, {7: read_door_log(log)}, [], [])
    assert got["refusals"] == {"throttled": 1} and got["unended"] == 1


def test_the_records_are_read_from_the_files_and_tables_each_party_keeps(tmp_path):
    log = tmp_path / "door.log"
    log.write_text('door-1: starting\n{"ts": "2023-11-14T22:13:20.250Z", "event": "door_claim", "nonce": "n0"}\n'
                   '{"ts": "2023-11-14T22:13:21.000Z", "event": "release"}\n{"ts": "2023-11-14T22:13:2')  # fmt: skip
    assert read_door_log(log) == [{"event": "door_claim", "t": T0 + 0.25, "nonce": "n0", "reason": ""}]
    assert read_door_log(tmp_path / "missing.log") == []
    lock = tmp_path / "lock.log"
    lock.write_text(f"lock {T0}\nopen {T0 + 1.5}\nlock {T0 + 2}\nopen garbage\n")
    assert read_lock_drives(lock) == [T0 + 1.5]
    db = sqlite3.connect(tmp_path / "server.db")
    db.execute("CREATE TABLE recognition_events (device_id TEXT, message_id TEXT, purpose TEXT, "
               "claimed_subject TEXT, accepted INTEGER, at REAL)")  # fmt: skip
    db.executemany("INSERT INTO recognition_events VALUES (?, ?, ?, ?, ?, ?)", [
        ("door-1", "n0", "verify", "Alice", 1, T0), ("door-1", "t1", "identify", "", None, T0),
        ("cam-1", "n9", "verify", "Bob", 0, T0)])  # fmt: skip
    assert read_decisions(db, "door-1") == [ServerDecision("n0", "Alice", True, T0)]
    db.close()
    ledger = sqlite3.connect(tmp_path / "ledger.sqlite3")
    ledger.execute("CREATE TABLE spends (key TEXT, message_id TEXT)")
    ledger.executemany("INSERT INTO spends VALUES (?, ?)", [("door:n0", "n0"), ("device", "n0"), ("track:t", "m")])
    ledger.commit()
    ledger.close()
    assert read_releases(tmp_path / "ledger.sqlite3") == {"n0"}
    assert read_releases(tmp_path / "none.sqlite3") == set()


def test_the_doors_configuration_is_valid_and_its_lock_commands_write_the_lock_file(tmp_path):
    from peep.edge.config import EdgeConfig
    from peep.edge.door import build_lock

    lock_log = tmp_path / "with space" / "lock.log"
    lock_log.parent.mkdir()
    cfg = EdgeConfig.model_validate(door_config(
        device_id="door-1", site="s", state_dir=tmp_path / "state", bundle_dir=tmp_path, public_key=tmp_path / "k",
        video=tmp_path / "v.mp4", ca_cert=tmp_path / "ca.pem", port=4443, lock_log=lock_log))  # fmt: skip
    assert cfg.door.enabled and cfg.door.decision == "grpc" and cfg.capture.loop
    assert cfg.door.max_claims_per_minute >= 12 * 10 and cfg.door.lockout_failures >= 1000
    lock = build_lock(cfg.door)
    before = time.time()
    lock.energise()
    lock.release()
    assert read_lock_drives(lock_log) and before <= read_lock_drives(lock_log)[0] <= time.time()
    assert [line.split()[0] for line in lock_log.read_text().splitlines()] == ["open", "lock"]


def _listener(path: Path, got: list[bytes], stop: threading.Event) -> threading.Thread:
    from peep.edge.door_claims import socket_claims

    def serve() -> None:
        for line in socket_claims(path, stop=stop):
            got.append(line)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return t


def test_the_feeder_alternates_genuine_and_impostor_claims_and_finds_a_restarted_door(tmp_path):
    door = SoakDoor(tmp_path, site="s", device_id="door-1", token="t", bundle_dir=tmp_path, public_key=tmp_path,
                    ca_cert=tmp_path, target=("127.0.0.1", 1), enrolled=["Alice", "Bob", "Carol"],
                    people={"Alice": [tmp_path / "a.jpg"]})  # fmt: skip
    got: list[bytes] = []
    stop1 = threading.Event()
    t1 = _listener(door.socket_path, got, stop1)
    door.start_feeder(interval_s=0.05, max_claims=8, duration_s=30)
    deadline = time.monotonic() + 10
    while len(door.sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop1.set()  # the door goes away: its socket is removed, lines meanwhile are undelivered
    t1.join(5)
    stop2 = threading.Event()
    t2 = _listener(door.socket_path, got, stop2)
    door._feeder.join(20)  # type: ignore[union-attr]
    time.sleep(0.3)
    stop2.set()
    t2.join(5)
    assert len(door.sent) + door.undelivered == 8 and len(door.sent) >= 5
    assert all(c.pid == os.getpid() for c in door.sent)
    assert [c.subject for c in door.sent[:3]] == ["Alice", "Bob", "Alice"]
    assert all(c.genuine == (c.subject == "Alice") for c in door.sent)
    assert {c.subject for c in door.sent if not c.genuine} <= {"Bob", "Carol"}
    # Every line the feeder counted as written reached a listener, except those in flight when one stopped.
    assert len(got) <= len(door.sent) and len(got) >= len(door.sent) - 2


def test_a_door_in_a_deep_folder_listens_in_a_short_one_that_close_removes(tmp_path):
    deep = tmp_path.joinpath(*(["a-folder-deep-enough"] * 5))
    assert len(os.fsencode(str(deep / "claims.sock"))) > 100  # past what a socket address holds, with margin
    door = SoakDoor(deep, site="s", device_id="door-1", token="t", bundle_dir=tmp_path, public_key=tmp_path,
                    ca_cert=tmp_path, target=("127.0.0.1", 1), enrolled=["Alice", "Bob"],
                    people={"Alice": [tmp_path / "a.jpg"]})  # fmt: skip
    short = door.socket_path.parent
    assert short != deep and len(os.fsencode(str(door.socket_path))) <= 100 and short.is_dir()
    door.close()
    assert not short.exists()  # nothing of the run is left in the system's temporary folder


# --------------------------------------------------------------------------- against a real door and server


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_real_door_opens_for_the_person_on_camera_and_refuses_impostors(
    trained_server, tmp_path, keypair, bundle_dir, pki, lfw100, data_home
):
    """``peep-edge door`` over gRPC/TLS (through the door's proxy) to a trained server on SQLite: claims every two
    seconds, the door killed after the third and started again; its video shorter than the claims read (it loops)."""
    import numpy as np
    from peep.edge.testing import lfw_people
    from peep_testing.server import DEVICE_TOKENS, SITE

    names = [n.replace(" ", "_") for n in lfw100.target_names]
    top = names[int(np.bincount(lfw100.labels).argmax())]  # the most photos: the best-known face
    enrolled = [top, *[n for n in names if n != top][:2]]
    door = SoakDoor(tmp_path / "door", site=SITE, device_id="cam-2", token=DEVICE_TOKENS["cam-2"],
                    bundle_dir=bundle_dir, public_key=keypair[3], ca_cert=pki.dir / "ca.pem",
                    target=("127.0.0.1", trained_server.port), enrolled=enrolled, people=lfw_people(data_home),
                    privacy={"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e9},
                    video_frames=20)  # fmt: skip
    # The server reports its device's last report within a second: the door's reports are not what is tested.
    trained_server.services.device_reports.min_interval_s = 0.0
    try:
        door.prepare()
        door.start()
        door.start_feeder(interval_s=2.0, max_claims=9, duration_s=90)
        deadline = time.monotonic() + 30
        while len(door.sent) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        door.kill()  # a fault: the feeder finds the next run by itself
        door.start()
        door._feeder.join(90)  # type: ignore[union-attr]
        door.stop(drain_s=30)
    finally:
        door.close()
    trained_server.services.ingestor.decisions.flush(10)
    with sqlite3.connect(trained_server.tmp / "peep.db") as db:
        decisions = read_decisions(db, "cam-2")
    got = door.history(decisions)
    logs = "\n".join(r.log.read_text()[-3000:] for r in door.runs)
    assert got["runs"] == 2 and got["killed"] == 1 and got["claims"] == len(door.sent) >= 6, (got, logs)
    assert got["claims"] + got["undelivered"] == 9 and {c.pid for c in door.sent} == {r.pid for r in door.runs}
    # Every claim ended, or was cut short by the kill (the one in progress and the lines not yet read).
    assert got["unended"] == 0 and got["interrupted"] <= 2, (got, logs)
    assert got["opened"] + got["refused"] + got["interrupted"] == got["claims"]
    assert got["wrong_lock_drives"] == 0 and got["unconfirmed_lock_drives"] == 0, (got, logs)
    impostor, genuine = got["impostor"], got["genuine"]
    assert impostor["opened"] == 0 and got["refusals"].get("rejected", 0) >= impostor["refused"] >= 2, (got, logs)
    assert got["refused_without_reason"] == 0
    # Mostly open: the noise can push a claim below the threshold. None saw no face: the video loops.
    assert genuine["opened"] >= max(2, genuine["claims"] - 2) and "no_face" not in got["refusals"], (got, logs)
    assert got["lock_drives"] == got["opened"] == len(door.claim_to_lock()) and got["subject_mismatches"] == 0
    assert all(0 < ms < 15_000 for _, ms in door.claim_to_lock())
    assert got["opened"] + got["refused"] <= got["released"] <= got["claims"] and len(decisions) <= got["released"]
    assert read_lock_drives(door.lock_log) and door.lock_log.read_text().split()[-2] == "lock"  # locked at the end
