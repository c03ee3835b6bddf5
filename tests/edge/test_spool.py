"""The SQLite spool: durable, ordered, bounded with the documented drop policy."""

from __future__ import annotations

import sqlite3
import threading

import pytest
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
