"""The SQLite spool: durable, ordered, bounded with the documented drop policy."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.errors import SpoolFullError
from peep.edge.spool import Spool


def put(spool: Spool, n: int, purpose: str = "identify", prefix: str = "m") -> list[str]:
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    for mid in ids:
        spool.put(message_id=mid, purpose=purpose, payload=mid.encode() * 3)
    return ids


def test_fifo_per_destination_and_ack_removes_only_that_destination(tmp_path):
    with Spool(tmp_path / "s.db", destinations=["mqtt", "grpc"]) as spool:
        ids = put(spool, 5)
        assert [it.message_id for it in spool.peek("mqtt", 10)] == ids
        assert spool.ack("mqtt", ids[:2]) == 2
        assert [it.message_id for it in spool.peek("mqtt", 10)] == ids[2:]
        assert [it.message_id for it in spool.peek("grpc", 10)] == ids
        assert (spool.depth("mqtt"), spool.depth("grpc"), spool.depth()) == (3, 5, 8)
        first = spool.peek("mqtt", 1)[0]
        assert [it.message_id for it in spool.peek("mqtt", 10, after_seq=first.seq)] == ids[3:]


def test_survives_reopen_in_wal_mode(tmp_path):
    path = tmp_path / "s.db"
    spool = Spool(path, destinations=["mqtt"])
    ids = put(spool, 4)
    spool.ack("mqtt", ids[:1])
    spool.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Spool(path, destinations=["mqtt"]) as again:
        items = again.peek("mqtt", 10)
    assert [it.message_id for it in items] == ids[1:]
    assert items[0].payload == ids[1].encode() * 3


def test_full_queue_drops_oldest_identify_first_and_never_enrolment(tmp_path):
    dropped: list[tuple[str, str, str]] = []
    with Spool(tmp_path / "s.db", destinations=["mqtt"], max_messages=4, on_drop=lambda *a: dropped.append(a)) as spool:
        enrol = put(spool, 2, "enroll", "e")
        ident = put(spool, 2, "identify", "i")
        spool.put(message_id="new1", purpose="identify", payload=b"x")
        assert dropped == [("mqtt", "identify", ident[0])]
        spool.put(message_id="new2", purpose="enroll", payload=b"x")
        assert dropped[-1] == ("mqtt", "identify", ident[1])
        assert [it.message_id for it in spool.peek("mqtt", 10)] == [*enrol, "new1", "new2"]
        # Now: e0, e1, new1 (identify), new2 (enrol). One more enrolment evicts new1.
        spool.put(message_id="new3", purpose="enroll", payload=b"x")
        assert dropped[-1] == ("mqtt", "identify", "new1")
        # Only enrolment templates left: a new identify template is the one dropped ...
        spool.put(message_id="late", purpose="identify", payload=b"x")
        assert dropped[-1] == ("mqtt", "identify", "late")
        # ... and a new enrolment template is refused loudly, nothing written.
        with pytest.raises(SpoolFullError, match="enrolment templates are never dropped"):
            spool.put(message_id="e-over", purpose="enroll", payload=b"x")
        assert spool.depth("mqtt") == 4
        assert all(it.purpose == "enroll" for it in spool.peek("mqtt", 10))


def test_dead_letter_keeps_rejected_templates_for_inspection(tmp_path):
    with Spool(tmp_path / "s.db", destinations=["grpc"]) as spool:
        ids = put(spool, 3)
        assert spool.dead_letter("grpc", ids[1], "values: expected 128 coefficients")
        assert not spool.dead_letter("grpc", "unknown", "x")
        assert [it.message_id for it in spool.peek("grpc", 10)] == [ids[0], ids[2]]
        dead = spool.dead("grpc")
        assert [(d["message_id"], d["reason"]) for d in dead] == [(ids[1], "values: expected 128 coefficients")]


def test_concurrent_writer_and_reader_lose_nothing(tmp_path):
    with Spool(tmp_path / "s.db", destinations=["mqtt"], synchronous="normal") as spool:
        n = 300
        received: list[str] = []

        def reader() -> None:
            while len(received) < n:
                items = spool.peek("mqtt", 50)
                if not items:
                    spool.wait(0.05)
                    continue
                received.extend(it.message_id for it in items)
                spool.ack("mqtt", [it.message_id for it in items])

        t = threading.Thread(target=reader)
        t.start()
        ids = put(spool, n)
        t.join(20)
        assert received == ids
        assert spool.depth() == 0


def test_rejects_oversized_payloads(tmp_path):
    with Spool(tmp_path / "s.db", destinations=["mqtt"]) as spool, pytest.raises(ValueError, match="payload"):
        spool.put(message_id="big", purpose="identify", payload=b"x" * 20_000)


# --------------------------------------------------------------------------- what the device keeps


def file_bytes(path: Path) -> bytes:
    """The database file and its WAL as they are on disk (the -shm holds page numbers only)."""
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def canary(tag: str) -> bytes:
    """A byte pattern that can only come from one template's payload."""
    return f"<<canary-{tag}-{uuid.uuid4().hex}>>".encode()


def put_canaries(spool: Spool, tags: list[str], size: int = 600) -> dict[str, bytes]:
    marks = {tag: canary(tag) for tag in tags}
    for tag, mark in marks.items():
        spool.put(message_id=tag, purpose="identify", payload=mark.ljust(size, b"."))
    return marks


@pytest.fixture(params=["build default", "build default off"])
def secure_delete_default(request, monkeypatch):
    """Debian's SQLite turns secure_delete on by default, python.org's and most others do not:
    the spool must not depend on it, so every connection can also start with it off."""
    if request.param == "build default off":
        real = sqlite3.connect

        def connect(*args, **kwargs):
            db = real(*args, **kwargs)
            db.execute("PRAGMA secure_delete=OFF")
            return db

        monkeypatch.setattr(sqlite3, "connect", connect)
    return request.param


@pytest.mark.parametrize("size", [600, 9000])  # in the leaf page / on overflow pages
def test_acknowledged_templates_leave_the_database_file_and_the_wal(tmp_path, secure_delete_default, size):
    path = tmp_path / "s.db"
    with Spool(path, destinations=["mqtt", "grpc"], checkpoint_interval_s=0) as spool:
        marks = put_canaries(spool, ["a", "b", "c"], size)
        on_disk = file_bytes(path)
        assert all(m in on_disk for m in marks.values()), "the check must be able to see a payload"
        spool.ack("mqtt", list(marks))
        assert all(m in file_bytes(path) for m in marks.values()), "still waiting for grpc"
        spool.ack("grpc", list(marks))
        on_disk = file_bytes(path)
        assert [tag for tag, m in marks.items() if m in on_disk] == []
        assert Path(f"{path}-wal").stat().st_size == 0, "the outbox ran empty: WAL checkpointed and truncated"


def test_a_burst_of_acks_pays_for_one_checkpoint_per_interval_and_housekeep_does_the_rest(tmp_path):
    path = tmp_path / "s.db"
    with Spool(path, destinations=["mqtt"], checkpoint_interval_s=3600) as spool:  # opening checkpointed
        marks = put_canaries(spool, ["a"])
        spool.ack("mqtt", ["a"])
        assert marks["a"] in file_bytes(path), "too soon after the last checkpoint: left for housekeep"
        spool.housekeep()
        assert marks["a"] not in file_bytes(path)


def test_housekeep_removes_delivered_templates_while_others_still_wait(tmp_path, secure_delete_default):
    path = tmp_path / "s.db"
    with Spool(path, destinations=["mqtt"]) as spool:
        marks = put_canaries(spool, ["sent1", "sent2", "waiting"])
        spool.ack("mqtt", ["sent1", "sent2"])
        # The outbox is not empty, so ack left the WAL alone: the old page images are still there.
        assert marks["sent1"] in file_bytes(path)
        spool.housekeep()
        on_disk = file_bytes(path)
        assert marks["sent1"] not in on_disk and marks["sent2"] not in on_disk
        assert marks["waiting"] in on_disk
        assert [it.message_id for it in spool.peek("mqtt", 10)] == ["waiting"]
        # Nothing deleted since: the next round has nothing to checkpoint.
        assert spool.housekeep() == 0


def test_dropped_templates_leave_the_files_too(tmp_path):
    path = tmp_path / "s.db"
    with Spool(path, destinations=["mqtt"], max_messages=2) as spool:
        marks = put_canaries(spool, ["old", "mid", "new"])  # "old" dropped by the bound
        spool.housekeep()
        on_disk = file_bytes(path)
        assert marks["old"] not in on_disk and marks["mid"] in on_disk and marks["new"] in on_disk


CRASH = """
import os, signal, sys
from peep.edge.spool import Spool
spool = Spool(sys.argv[1], destinations=["mqtt"])
for tag in sys.argv[3:]:
    spool.put(message_id=tag, purpose="identify", payload=(tag + ":" + sys.argv[2]).encode().ljust(600, b"."))
if sys.argv[2] == "after-ack":
    spool.ack("mqtt", sys.argv[3:4])  # others wait, so no checkpoint: the WAL still holds the first one
os.kill(os.getpid(), signal.SIGKILL)
"""


def crash(path: Path, when: str, tags: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", CRASH, str(path), when, *tags], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def test_a_crash_between_the_receivers_ack_and_the_delete_keeps_the_template_for_a_resend(tmp_path):
    path = tmp_path / "s.db"
    crash(path, "before-ack", ["t1", "t2"])
    with Spool(path, destinations=["mqtt"], checkpoint_interval_s=0) as spool:
        assert [it.message_id for it in spool.peek("mqtt", 10)] == ["t1", "t2"]
        # The resend is answered DUPLICATE (or PUBACKed): the transports ack it like any other.
        assert spool.ack("mqtt", ["t1", "t2"]) == 2
        assert spool.ack("mqtt", ["t1"]) == 0, "a second ack for a row already gone is harmless"
        assert b"t1:before-ack" not in file_bytes(path)


def test_a_crash_after_the_delete_leaves_no_bytes_once_reopened(tmp_path):
    path = tmp_path / "s.db"
    crash(path, "after-ack", ["gone", "kept"])
    assert b"gone:after-ack" in file_bytes(path), "the killed process left the deleted row's page in its WAL"
    with Spool(path, destinations=["mqtt"]) as spool:
        on_disk = file_bytes(path)
        assert b"gone:after-ack" not in on_disk and b"kept:after-ack" in on_disk
        assert [it.message_id for it in spool.peek("mqtt", 10)] == ["kept"]


# --------------------------------------------------------------------------- dead letters: bounded in time and number


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance_days(self, days: float) -> None:
        self.t += days * 86_400.0


def refuse(spool: Spool, tags: list[str], reason: str = "bundle_id: unknown bundle") -> dict[str, bytes]:
    marks = put_canaries(spool, tags)
    for tag in tags:
        assert spool.dead_letter(spool.destinations[0], tag, reason)
    return marks


def test_dead_letters_expire_after_dead_letter_days(tmp_path, secure_delete_default):
    clock = FakeClock()
    path = tmp_path / "s.db"
    with Spool(path, destinations=["grpc"], dead_letter_days=7, clock=clock) as spool:
        marks = refuse(spool, ["d1"])
        clock.advance_days(3)
        marks |= refuse(spool, ["d2"])
        clock.advance_days(4)  # d1 is exactly 7 days old: kept
        assert spool.expire_dead() == 0
        assert marks["d1"] in file_bytes(path), "the check must be able to see a dead letter's payload"
        clock.advance_days(0.001)
        assert spool.housekeep() == 1
        assert [d["message_id"] for d in spool.dead()] == ["d2"]
        on_disk = file_bytes(path)
        assert marks["d1"] not in on_disk and marks["d2"] in on_disk
        # A new dead letter expires the old ones in the same transaction.
        clock.advance_days(5)
        refuse(spool, ["d3"])
        assert [d["message_id"] for d in spool.dead()] == ["d3"]
    # And opening the spool applies the bound before anything else (e.g. after a week switched off).
    clock.advance_days(8)
    with Spool(path, destinations=["grpc"], dead_letter_days=7, clock=clock) as spool:
        assert spool.dead() == []
    assert all(m not in file_bytes(path) for m in marks.values())


def test_expire_dead_takes_an_explicit_time_and_a_clock_set_back_does_not_keep_them(tmp_path):
    clock = FakeClock()
    with Spool(tmp_path / "s.db", destinations=["grpc"], dead_letter_days=1, clock=clock) as spool:
        refuse(spool, ["d1"])
        assert spool.expire_dead(now=clock.t + 0.5 * 86_400) == 0
        assert spool.expire_dead(now=clock.t + 1.5 * 86_400) == 1
        refuse(spool, ["d2"])
        # The device's clock jumps back a year: the stamp is now "in the future" and its age unknown.
        assert spool.expire_dead(now=clock.t - 365 * 86_400) == 1
        assert spool.dead() == []


def test_dead_letter_max_keeps_the_newest(tmp_path):
    with Spool(tmp_path / "s.db", destinations=["grpc"], dead_letter_max=2) as spool:
        refuse(spool, ["d1", "d2", "d3"])
        assert [d["message_id"] for d in spool.dead()] == ["d2", "d3"]
        spool.purge_dead()
        refuse(spool, ["d4"])
        assert [d["message_id"] for d in spool.dead()] == ["d4"], "sequence gaps after a purge keep nothing extra"
    # A lower bound in the configuration applies when the spool is opened.
    with Spool(tmp_path / "s.db", destinations=["grpc"], dead_letter_max=1) as spool:
        refuse(spool, ["d5"])
        assert [d["message_id"] for d in spool.dead()] == ["d5"]


def test_purge_dead_all_or_older_than(tmp_path):
    clock = FakeClock()
    path = tmp_path / "s.db"
    with Spool(path, destinations=["grpc"], clock=clock) as spool:
        marks = refuse(spool, ["old"])
        clock.advance_days(2)
        marks |= refuse(spool, ["new"])
        assert spool.purge_dead(older_than_days=1) == 1
        assert [d["message_id"] for d in spool.dead()] == ["new"]
        assert marks["old"] not in file_bytes(path)
        assert spool.purge_dead() == 1
        assert spool.dead() == [] and marks["new"] not in file_bytes(path)
        with pytest.raises(ValueError, match=r"older_than_days: expected a number >= 0, received -1"):
            spool.purge_dead(older_than_days=-1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dead_letter_days": 0}, r"dead_letter_days: expected 0 < days <= 365, received 0"),
        ({"dead_letter_days": 366}, r"dead_letter_days: expected 0 < days <= 365, received 366"),
        ({"dead_letter_max": 0}, r"dead_letter_max: expected >= 1, received 0"),
    ],
)
def test_dead_letter_bounds_are_validated(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Spool(tmp_path / "s.db", destinations=["grpc"], **kwargs)


def test_the_agent_housekeeps_its_spool_while_it_runs(make_config, tmp_path):
    cfg = load_config(make_config(spool={"dead_letter_days": 1.0}))
    agent = Agent(cfg, environ={})
    agent.housekeeping_s = 0.05
    agent.open()
    assert agent.spool is not None
    try:
        marks = refuse(agent.spool, ["old"])
        with sqlite3.connect(cfg.spool_path) as db:  # refused two days ago
            db.execute("UPDATE dead SET failed = failed - 2 * 86400")
        agent.start_housekeeping()
        deadline = time.monotonic() + 10
        while agent.spool.dead() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert agent.spool.dead() == []
        time.sleep(0.2)  # the round's checkpoint follows the delete
        assert marks["old"] not in file_bytes(cfg.spool_path)
    finally:
        agent.shutdown(drain_timeout=0)
