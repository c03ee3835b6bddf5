"""The Store interface on SQLite and PostgreSQL: idempotent batches, enrolment sets, erasure, retention, migrations."""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import pytest
from peep.server.storage import (
    COLUMNS,
    DecisionRecord,
    IngestBatch,
    LedgerEntry,
    StoreError,
    TemplateRecord,
    TrackRelease,
)
from peep.server.storage.migrations import latest
from peep.server.storage.postgres import PostgresStore
from peep.server.storage.sqlite import SqliteStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "db" / "peep.db")
    else:
        s = PostgresStore(request.getfixturevalue("pg_dsn"), pool_size=3)
    yield s
    s.close()


def record(
    i: int,
    *,
    subject: str | None = None,
    purpose: str = "enroll",
    kind: str = "peep-raw",
    received_at: float = 1000.0,
    bundle: str = "eb-1",
    nc: int = 4,
    device: str = "cam-1",
) -> TemplateRecord:
    values = np.arange(nc, dtype=np.float32) + i
    return TemplateRecord(
        message_id=f"m{i:05d}", device_id=device, site="lobby", bundle_id=bundle, mechanism_kind=kind, epsilon=8.0,
        delta=0.0, epsilon_coordinate=8.0, epsilon_vector=32.0, noise_std=0.17, purpose=purpose, subject=subject,
        track_id="t1", capture_time=999.5, received_at=received_at, n_components=nc, values=values.tobytes(),
        soft_traits='[{"trait":"age","value":31.5,"epsilon":1.0,"mechanism":"bounded-laplace"}]' if i % 2 else None,
    )  # fmt: skip


@contextmanager
def direct(store) -> Iterator[Any]:
    """A connection of the store's own driver to its database, around the store."""
    if isinstance(store, SqliteStore):
        conn: Any = sqlite3.connect(store.path, isolation_level=None)
    else:
        conn = psycopg.connect(store.dsn, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def test_schema_is_migrated_to_the_latest_version(store):
    assert store.schema_version() == latest(store.dialect) >= 1


def test_the_migrated_table_has_exactly_the_record_columns(store):
    # The migration spells the table out; the record is the one list the stores use.
    with direct(store) as conn:
        if store.dialect == "sqlite":
            names = [row[1] for row in conn.execute("PRAGMA table_info(templates)")]
        else:
            names = [
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = 'templates' ORDER BY ordinal_position"
                )
            ]
    assert tuple(names) == COLUMNS


def test_a_record_round_trips_through_a_row_by_column_name():
    r = record(1, subject="a")
    assert TemplateRecord.from_row(dict(zip(COLUMNS, r.row(), strict=True))) == r
    shuffled = dict(reversed(list(zip(COLUMNS, r.row(), strict=True))))
    assert TemplateRecord.from_row({**shuffled, "vals": memoryview(r.values)}) == r


def test_refuses_a_newer_schema(store):
    with direct(store) as conn:
        conn.execute("INSERT INTO peep_schema (version, applied_at) VALUES (99, 0)")

    # The store itself closes what it opened when it refuses (filterwarnings=error turns a
    # connection left to the garbage collector into a failure here or in a later test).
    source = f"storage.path {store.path}" if store.dialect == "sqlite" else "storage.dsn"
    with pytest.raises(
        StoreError, match=f"^{source}: schema version 99 is newer than this software's {latest(store.dialect)}; upgrade"
    ):
        type(store)(store.path if store.dialect == "sqlite" else store.dsn)
    gc.collect()


def test_insert_is_idempotent_by_message_id_within_and_across_batches(store):
    first = store.insert_templates([record(1, subject="a"), record(2, subject="a"), record(1, subject="a")])
    assert first == [True, True, False]
    again = store.insert_templates([record(2, subject="a"), record(3, subject="b")])
    assert again == [False, True]
    assert store.count_templates() == 3
    got = store.get_template("m00001")
    assert got == record(1, subject="a")
    np.testing.assert_array_equal(got.as_array(), np.arange(4, dtype=np.float32) + 1)
    assert store.get_template("missing") is None


def test_concurrent_writers_never_store_a_message_twice(store):
    recs = [record(i, subject="s") for i in range(200)]
    results: list[list[bool]] = []

    def worker() -> None:
        results.append(store.insert_templates(recs))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.count_templates() == 200
    assert sum(sum(r) for r in results) == 200  # each id accepted exactly once overall


def test_empty_batches_change_nothing(store):
    assert store.insert_templates([]) == []
    assert store.relabel([], "carol") == 0
    assert store.count_templates() == 0


def test_batches_larger_than_one_bound_id_list(store):
    # SQLite binds ids in chunks of 500; duplicates across chunk boundaries must still be found.
    recs = [record(i, purpose="identify") for i in range(1200)]
    assert store.insert_templates(recs[:700]) == [True] * 700
    assert store.insert_templates(recs[::-1]) == [True] * 500 + [False] * 700
    assert store.count_templates() == 1200
    keys = [(r.device_id, r.message_id) for r in recs[100:1150]]
    assert store.relabel([*keys, ("cam-1", "unknown-id"), ("cam-9", recs[0].message_id)], "carol") == 1050
    assert store.count_templates(subject="carol", purpose="enroll") == 1050


def test_count_filters_by_subject_bundle_and_purpose(store):
    store.insert_templates(
        [record(1, subject="a"), record(2, subject="a", bundle="eb-2"), record(3, purpose="identify"),
         record(4, subject="a", purpose="verify")]
    )  # fmt: skip
    assert store.count_templates(bundle_id="eb-1") == 3
    assert store.count_templates(purpose="enroll") == 2
    assert store.count_templates(subject="a", bundle_id="eb-1") == 2
    assert store.count_templates(subject="a", bundle_id="eb-1", purpose="enroll") == 1
    assert store.count_templates(subject="nobody") == 0


def test_enrolment_set_of_several_widths_is_a_store_error(store):
    store.insert_templates([record(1, subject="a", nc=4), record(2, subject="b", nc=5)])
    with pytest.raises(StoreError, match=r"several dimensions \[4, 5\]"):
        store.enrolment_set("eb-1", ["peep-raw"])


def test_enrolment_set_selects_bundle_kind_and_labelled_enrolments(store):
    store.insert_templates(
        [record(1, subject="a"), record(2, subject="b"), record(3, subject="a", kind="peep"),
         record(4, purpose="identify"), record(5, subject="a", bundle="eb-2"), record(6, subject="b", purpose="verify")]
    )  # fmt: skip
    assert store.enrolment_kinds("eb-1") == {"peep-raw": 2, "peep": 1}
    es = store.enrolment_set("eb-1", ["peep-raw"])
    assert es.message_ids == ["m00001", "m00002"] and list(es.subjects) == ["a", "b"]
    assert es.values.shape == (2, 4) and es.values.dtype == np.float32
    np.testing.assert_array_equal(es.values[1], np.arange(4, dtype=np.float32) + 2)
    assert len(store.enrolment_set("eb-1", ["gaussian-l2"])) == 0


def test_relabel_turns_stored_templates_into_enrolments(store):
    store.insert_templates([record(1, purpose="identify"), record(2, purpose="identify")])
    assert store.relabel([("cam-1", "m00001"), ("cam-1", "m00002"), ("cam-1", "unknown-id")], "carol") == 2
    es = store.enrolment_set("eb-1", ["peep-raw"])
    assert list(es.subjects) == ["carol", "carol"]


def test_delete_subject_removes_labels_claims_and_recognitions_only(store):
    store.insert_templates(
        [
            record(1, subject="a"),
            record(2, subject="b"),
            record(3, subject="a", purpose="verify"),
            record(4, purpose="identify"),
        ]
    )
    assert store.delete_subject("a") == 2
    assert store.count_templates(subject="a") == 0 and store.count_templates() == 2


def test_retention_keeps_enrolments_unless_asked(store):
    store.insert_templates(
        [record(1, subject="a", received_at=100.0), record(2, purpose="identify", received_at=100.0),
         record(3, purpose="identify", received_at=500.0)]
    )  # fmt: skip
    assert store.delete_received_before(200.0) == 1
    assert store.count_templates() == 2
    assert store.delete_received_before(200.0, include_enrolment=True) == 1
    assert [store.get_template(m) is not None for m in ("m00001", "m00002", "m00003")] == [False, False, True]


def test_bundles_and_erasures(store):
    assert store.get_bundle() is None
    store.put_bundle("eb-a", b"A", 1.0)
    store.put_bundle("eb-b", b"B", 2.0)
    assert store.get_bundle() == b"B" and store.get_bundle("eb-a") == b"A" and store.get_bundle("eb-x") is None
    store.put_bundle("eb-a", b"A", 3.0)  # republishing makes it current again
    assert store.get_bundle() == b"A"
    store.record_erasure("alice", 10.0)
    store.record_erasure("alice", 11.0)
    assert store.erasures() == {"alice": 11.0}


def test_a_device_keeps_only_its_latest_report(store):
    assert store.device_reports() == {}
    store.put_device_report("cam-1", "site-a", b'{"v":1}', 5.0)
    store.put_device_report("cam-2", "site-a", b"two", 6.0)
    store.put_device_report("cam-1", "site-b", b"newer", 7.0)
    assert store.device_reports() == {"cam-1": ("site-b", b"newer", 7.0), "cam-2": ("site-a", b"two", 6.0)}


def track_release(i: int, *, track: str = "a", device: str = "cam-1", expires_at: float = 200.0) -> TrackRelease:
    return TrackRelease(
        device_id=device, track_id=track, message_id=f"m{i:05d}", site="lobby", bundle_id="eb-1", capture_time=99.0 + i,
        expires_at=expires_at, n_components=4, values=(np.arange(4, dtype="<f4") + i).tobytes(),
    )  # fmt: skip


def test_track_memory_is_found_by_device_and_track_until_it_expires(store):
    rows = [
        track_release(0, expires_at=150.0),  # expired by the look-up at 160
        track_release(1),
        track_release(2, device="cam-2"),  # another device
        track_release(3, track="b"),
    ]
    assert (
        store.commit_ingest(IngestBatch([entry(r.message_id, device=r.device_id) for r in rows], tracks=rows))
        == [True] * 4
    )
    got = store.track_memory([("cam-1", "a"), ("cam-1", "a")], now=160.0)
    assert got == [rows[1]] and got[0].as_array()[0] == 1.0
    both = store.track_memory([("cam-1", "a"), ("cam-2", "a")], now=0.0)
    assert sorted(r.message_id for r in both) == ["m00000", "m00001", "m00002"]
    assert store.track_memory([], now=0.0) == []
    # the sweep deletes what expired, and nothing else
    assert store.expire_track_memory(160.0) == 1
    assert store.kept_counts("background:").track_memory == 3
    assert store.expire_track_memory(200.0) == 3
    assert store.kept_counts("background:").track_memory == 0


def entry(message_id: str, *, device: str = "cam-1", purpose: str = "identify", received_at: float = 100.0,
          traits: float = 0.0) -> LedgerEntry:  # fmt: skip
    return LedgerEntry(
        device_id=device, message_id=message_id, site="lobby", received_at=received_at, purpose=purpose, track_id="t1",
        bundle_id="eb-1", mechanism_kind="privunit", epsilon_coordinate=16.0, epsilon_vector=16.0,
        epsilon_traits=traits,
    )  # fmt: skip


def decision(message_id: str, *, device: str = "cam-1", at: float = 100.0, subject: str = "",
             claimed: str = "") -> DecisionRecord:  # fmt: skip
    return DecisionRecord(
        event_id=f"e-{device}-{message_id}", at=at, site="lobby", device_id=device, message_id=message_id,
        track_id="t1", purpose="verify" if claimed else "identify", subject=subject, claimed_subject=claimed,
        unknown=not (subject or claimed), accepted=bool(subject) if claimed else None, probability=0.25,
        model_version="v000001", releases_fused=1,
    )  # fmt: skip


def test_a_batch_writes_its_rows_only_for_message_ids_the_ledger_did_not_hold(store):
    first = IngestBatch(
        [entry("m00001"), entry("m00002"), entry("m00001")],  # repeated in the batch: a duplicate
        templates=[record(2, purpose="identify")],
        decisions=[decision("m00001"), decision("m00002", subject="carol")],
    )
    assert store.commit_ingest(first) == [True, True, False]
    assert store.seen([("cam-1", "m00001"), ("cam-2", "m00001"), ("cam-1", "m00009")]) == {("cam-1", "m00001")}
    # a redelivery: nothing of it is written again, even with other content
    again = IngestBatch([entry("m00002"), entry("m00003")], templates=[record(2, purpose="identify")],
                        decisions=[decision("m00002"), decision("m00003")])  # fmt: skip
    assert store.commit_ingest(again) == [False, True]
    kept = [(i, d.message_id, d.subject) for i, d in store.decisions()]
    assert [k[1:] for k in kept] == [("m00001", ""), ("m00002", "carol"), ("m00003", "")]
    assert [i for i, _, _ in kept] == sorted(i for i, _, _ in kept)  # increasing ids
    assert [d.message_id for _, d in store.decisions(since_id=kept[0][0])] == ["m00002", "m00003"]
    assert store.count_templates() == 1
    assert store.commit_ingest(IngestBatch([])) == []


def test_concurrent_batches_of_one_message_id_commit_it_once(store):
    batch = IngestBatch([entry(f"m{i:05d}") for i in range(100)], decisions=[decision(f"m{i:05d}") for i in range(100)])
    results: list[list[bool]] = []
    threads = [threading.Thread(target=lambda: results.append(store.commit_ingest(batch))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(sum(r) for r in results) == 100
    assert store.kept_counts("background:").decisions == 100


def test_kept_counts_name_each_category(store):
    from dataclasses import replace

    store.insert_templates(
        [record(1, subject="a"), record(2, subject="background:7"), record(3, subject="background:8"),
         replace(record(4, purpose="identify"), decided_subject="a"), record(5, purpose="identify"),
         record(6, purpose="verify", subject="a")]
    )  # fmt: skip
    store.commit_ingest(
        IngestBatch([entry("x1"), entry("x2")], decisions=[decision("x1"), decision("x2", subject="a")])
    )
    k = store.kept_counts("background:")
    assert (k.enrolment, k.background, k.recognised, k.unknown) == (1, 2, 1, 2)
    assert (k.decisions, k.unknown_decisions, k.ledger, k.track_memory) == (2, 1, 2, 0)
    assert store.kept_counts("").background == 0


def test_recognition_templates_are_deleted_by_category_and_age(store):
    from dataclasses import replace

    store.insert_templates(
        [record(1, subject="a"), replace(record(2, purpose="identify", received_at=100.0), decided_subject="a"),
         record(3, purpose="identify", received_at=100.0), record(4, purpose="verify", subject="b", received_at=500.0),
         replace(record(5, purpose="verify", subject="b", received_at=500.0), decided_subject="b")]
    )  # fmt: skip
    assert store.delete_recognition_templates(unknown_only=True, before=200.0) == {"recognised": 0, "unknown": 1}
    assert store.delete_recognition_templates(before=200.0) == {"recognised": 1, "unknown": 0}
    assert store.delete_recognition_templates() == {"recognised": 1, "unknown": 1}
    assert store.count_templates() == 1 and store.get_template("m00001") is not None  # the enrolment stays


def test_erasure_deletes_what_was_recognised_as_the_subject_and_its_decisions(store):
    from dataclasses import replace

    store.insert_templates([record(1, subject="a"), replace(record(2, purpose="identify"), decided_subject="a"),
                            replace(record(3, purpose="identify"), decided_subject="b")])  # fmt: skip
    store.add_decisions([decision("m1", subject="a"), decision("m2", claimed="a"), decision("m3", subject="b"),
                         decision("m4")])  # fmt: skip
    assert store.delete_subject("a") == 2
    assert store.delete_subject_decisions("a") == 2
    assert [d.message_id for _, d in store.decisions()] == ["m3", "m4"]


def test_ledger_decisions_and_alerts_expire_by_their_own_clocks(store):
    store.commit_ingest(IngestBatch([entry("old", received_at=100.0), entry("new", received_at=300.0)],
                                    decisions=[decision("old", at=100.0), decision("new", at=300.0)]))  # fmt: skip
    with store._session() as conn:
        p = store._sql.param
        for eid, at in (("a-old", 100.0), ("a-new", 300.0)):
            conn.execute(
                f"INSERT INTO console_alerts (event_id, at, site, device_id, probability, model_version) "
                f"VALUES ({p}, {p}, 'lobby', 'cam-1', 0.1, 'v1')",
                (eid, at),
            )
    assert store.delete_ledger_before(200.0) == 1
    assert store.seen([("cam-1", "old"), ("cam-1", "new")]) == {("cam-1", "new")}
    assert store.delete_decisions_before(200.0) == 1
    assert [d.message_id for _, d in store.decisions()] == ["new"]
    assert store.delete_alerts_before(200.0) == 1


def test_sqlite_uses_wal(tmp_path):
    s = SqliteStore(tmp_path / "peep.db")
    s.close()
    with sqlite3.connect(tmp_path / "peep.db") as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_postgres_migrations_run_once_for_concurrent_replicas(pg_dsn):
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(PostgresStore(pg_dsn, pool_size=1))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(s.schema_version() == latest("postgres") for s in stores)
    for s in stores:
        s.close()


def test_postgres_unreachable_is_a_store_error():
    with pytest.raises(StoreError, match="could not connect"):
        PostgresStore("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1")


# --------------------------------------------------------------------------- per-device message ids


def test_message_ids_are_unique_per_device_not_globally(store):
    # Another device re-using a message id is not a duplicate; the same device re-sending it is.
    first = store.insert_templates(
        [record(1, device="cam-1"), record(1, device="cam-2"), record(1, device="cam-1"), record(2, device="cam-2")]
    )
    assert first == [True, True, False, True]
    assert store.insert_templates([record(1, device="cam-2"), record(1, device="cam-3")]) == [False, True]
    assert store.count_templates() == 4
    assert store.get_template("m00001", device_id="cam-2") == record(1, device="cam-2")
    assert store.get_template("m00001", device_id="cam-9") is None
    assert store.devices_of(["m00001", "m00002", "missing"]) == {"m00001": ["cam-1", "cam-2", "cam-3"],
                                                                 "m00002": ["cam-2"]}  # fmt: skip


def test_concurrent_devices_reusing_ids_are_each_stored_once(store):
    recs = [record(i, device=d) for i in range(100) for d in ("cam-1", "cam-2")]
    results: list[list[bool]] = []
    threads = [threading.Thread(target=lambda: results.append(store.insert_templates(recs))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.count_templates() == 200 and sum(sum(r) for r in results) == 200


def test_relabel_touches_only_the_named_devices_template(store):
    store.insert_templates(
        [record(1, purpose="identify", device="cam-1"), record(1, purpose="identify", device="cam-2")]
    )
    assert store.relabel([("cam-2", "m00001")], "carol") == 1
    assert store.get_template("m00001", device_id="cam-2").subject == "carol"
    assert store.get_template("m00001", device_id="cam-1").subject is None


def _schema_v1(store_kind: str, tmp_path, pg_dsn_factory) -> tuple[Any, Any]:
    """A database at schema version 1 (the single-column message id key), as released, with rows in it."""
    from peep.server.storage.migrations import MIGRATIONS

    v1 = MIGRATIONS[store_kind][0]
    if store_kind == "sqlite":
        path = tmp_path / "old.db"
        conn: Any = sqlite3.connect(path, isolation_level=None)
        target: Any = path
    else:
        target = pg_dsn_factory()
        conn = psycopg.connect(target, autocommit=True)
    p = "?" if store_kind == "sqlite" else "%s"
    conn.execute("CREATE TABLE peep_schema (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    for stmt in v1:
        conn.execute(stmt)
    conn.execute(f"INSERT INTO peep_schema (version, applied_at) VALUES ({p}, {p})", (1, 0.0))
    rows = [record(i, subject="a" if i < 3 else None, purpose="enroll" if i < 3 else "identify") for i in range(6)]
    v1_columns = COLUMNS[: COLUMNS.index("decided_subject")]  # the columns of schema 1
    for r in rows:
        conn.execute(
            f"INSERT INTO templates ({', '.join(v1_columns)}) VALUES ({', '.join([p] * len(v1_columns))})",
            r.row()[: len(v1_columns)],
        )
    conn.close()
    return target, rows


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_migration_from_schema_1_keeps_every_row_and_keys_by_device(kind, tmp_path, request):
    target, rows = _schema_v1(kind, tmp_path, lambda: request.getfixturevalue("pg_dsn"))
    store = SqliteStore(target) if kind == "sqlite" else PostgresStore(target, pool_size=2)
    try:
        assert store.schema_version() == latest(kind) == 18
        assert store.count_templates() == 6
        assert [store.get_template(r.message_id, device_id="cam-1") for r in rows] == rows
        # every stored template is in the ledger (a redelivery of one stays a duplicate once templates are
        # forgotten), with the ε of its soft traits (record(i) carries an ε 1 age release for odd i)
        assert store.seen([("cam-1", r.message_id) for r in rows]) == {("cam-1", r.message_id) for r in rows}
        with direct(store) as conn:
            traits = dict(conn.execute("SELECT message_id, epsilon_traits FROM ingest_ledger").fetchall())
        assert traits == {r.message_id: (1.0 if i % 2 else 0.0) for i, r in enumerate(rows)}
        # how those rows arrived was not recorded then: "" for both, never a guess
        with direct(store) as conn:
            origins = conn.execute("SELECT DISTINCT transport, sent_by FROM ingest_ledger").fetchall()
        assert [tuple(o) for o in origins] == [("", "")]
        assert store.enrolment_set("eb-1", ["peep-raw"]).message_ids == ["m00000", "m00001", "m00002"]
        # the old rows still de-duplicate their own device's resends; another device's id is new now
        again = store.insert_templates([rows[4], record(4, purpose="identify", device="cam-2")])
        assert again == [False, True]
        # and the indexes the queries use came back
        with direct(store) as conn:
            if kind == "sqlite":
                names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
            else:
                names = {
                    r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
                }
        assert {
            "templates_enrolment",
            "templates_subject",
            "templates_received",
            "templates_message",
            "templates_decided",
            "ingest_ledger_received",
            "track_memory_expires",
        } <= names
        assert "templates_track" not in names  # fusion's recall reads track_memory now
    finally:
        store.close()
    reopened = SqliteStore(target) if kind == "sqlite" else PostgresStore(target, pool_size=1)
    try:
        assert reopened.schema_version() == latest(kind) and reopened.count_templates() == 7
    finally:
        reopened.close()


# What the QBBS package created itself on the server's PostgreSQL (and any database), before migration 16 did.
_QBBS_TABLES_BEFORE = {
    "sqlite": [
        "CREATE TABLE IF NOT EXISTS qbbs_soft_traits (subject TEXT NOT NULL, trait TEXT NOT NULL, value REAL NOT NULL, "
        "enrolled_at REAL NOT NULL, PRIMARY KEY (subject, trait)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS qbbs_soft_traits_trait ON qbbs_soft_traits (trait, subject)",
        "CREATE TABLE IF NOT EXISTS qbbs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ],
    "postgres": [
        "CREATE TABLE IF NOT EXISTS qbbs_soft_traits (subject TEXT NOT NULL, trait TEXT NOT NULL, "
        "value DOUBLE PRECISION NOT NULL, enrolled_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (subject, trait))",
        "CREATE INDEX IF NOT EXISTS qbbs_soft_traits_trait ON qbbs_soft_traits (trait, subject)",
        "CREATE TABLE IF NOT EXISTS qbbs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ],
}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("qbbs_made_its_tables", [True, False], ids=["qbbs-tables", "no-qbbs-tables"])
def test_migration_16_creates_the_soft_trait_tables_and_keeps_those_qbbs_made(kind, qbbs_made_its_tables, tmp_path,
                                                                             request):  # fmt: skip
    """A database at schema 15 (where a hosting server's QBBS may have made its own tables, with soft traits in
    them) is migrated to 16 with every row kept; a database already at 16 opens as it is."""
    from peep.server.storage.dialect import POSTGRES, SQLITE
    from peep.server.storage.migrations import MIGRATIONS, migrate

    dialect = SQLITE if kind == "sqlite" else POSTGRES
    if kind == "sqlite":
        target: Any = tmp_path / "at15.db"
        conn: Any = sqlite3.connect(target, isolation_level=None)
    else:
        target = request.getfixturevalue("pg_dsn")
        conn = psycopg.connect(target, autocommit=True)
    p = dialect.param
    try:
        migrate(conn, MIGRATIONS[kind][:15], dialect, source="test")
        if qbbs_made_its_tables:
            for stmt in _QBBS_TABLES_BEFORE[kind]:
                conn.execute(stmt)
            conn.execute(f"INSERT INTO qbbs_soft_traits VALUES ({p}, {p}, {p}, {p})", ("alice", "age", 41.0, 5.0))
            conn.execute(f"INSERT INTO qbbs_meta VALUES ({p}, {p})", ("structure", "f00d"))
    finally:
        conn.close()
    for _ in range(2):  # migrated, then opened at 16
        store = SqliteStore(target) if kind == "sqlite" else PostgresStore(target, pool_size=1)
        try:
            assert store.schema_version() == latest(kind) == 18
            with direct(store) as conn:
                traits = [tuple(r) for r in conn.execute("SELECT subject, trait, value FROM qbbs_soft_traits")]
                meta = [tuple(r) for r in conn.execute("SELECT key, value FROM qbbs_meta")]
                conn.execute(f"INSERT INTO qbbs_soft_traits VALUES ({p}, {p}, {p}, {p})", ("bob", "age", 1.0, 1.0))
                conn.execute(f"DELETE FROM qbbs_soft_traits WHERE subject = {p}", ("bob",))
        finally:
            store.close()
        assert traits == ([("alice", "age", 41.0)] if qbbs_made_its_tables else [])
        assert meta == ([("structure", "f00d")] if qbbs_made_its_tables else [])


def test_qbbs_on_a_database_the_server_has_not_migrated_is_refused_naming_the_migration(pg_dsn):
    """QBBS no longer makes its tables on PostgreSQL: the server's migrations do, when it opens its database."""
    from peep.server.qbbs import QbbsConfig, QbbsModule

    with pytest.raises(StoreError, match=r"storage.dsn: expected the tables of storage migration 16"):
        QbbsModule(QbbsConfig(), connect=lambda: psycopg.connect(pg_dsn, autocommit=True))
    PostgresStore(pg_dsn, pool_size=1).close()  # migrated
    module = QbbsModule(QbbsConfig(), connect=lambda: psycopg.connect(pg_dsn, autocommit=True))
    try:
        module.enrol("carol", {"age": 30.0})
        assert module.enrolled_traits("carol") == ["age"]
    finally:
        module.close()


def test_templates_keep_their_site_key_id_and_enrolment_sets_select_by_it(store):
    """Rows migrated from before keys have key "" (none); a key's enrolment set holds that key's rows only."""
    from dataclasses import replace

    keys = ["", "sk-00000000000000aa", "sk-00000000000000aa", "sk-00000000000000bb"]
    rows = [replace(record(i, subject="a", purpose="enroll"), key_id=k) for i, k in enumerate(keys)]
    assert store.insert_templates(rows) == [True] * 4
    kinds = [rows[0].mechanism_kind]
    bundle = rows[0].bundle_id
    assert store.enrolment_key_ids(bundle, kinds) == {"": 1, "sk-00000000000000aa": 2, "sk-00000000000000bb": 1}
    assert len(store.enrolment_set(bundle, kinds, "sk-00000000000000aa")) == 2
    assert len(store.enrolment_set(bundle, kinds, "")) == 1
    assert len(store.enrolment_set(bundle, kinds)) == 4
    assert store.get_template(rows[3].message_id, device_id=rows[3].device_id).key_id == "sk-00000000000000bb"


def test_decision_ids_commit_in_order_so_a_reader_resuming_from_an_id_misses_none(pg_dsn):
    """PostgreSQL hands out identity ids in the order transactions ask, not the order they commit. A reader of
    ``id > last seen`` (a replica catching up its event subscribers) would pass over a decision whose transaction
    took its id first and committed last. The events lock orders the commits."""
    store = PostgresStore(pg_dsn, pool_size=3)
    real = store._executemany

    def slow_first(conn, sql, rows):
        real(conn, sql, rows)
        if threading.current_thread().name == "slow" and "recognition_events" in sql:
            time.sleep(1.0)  # its id taken, its commit late

    store._executemany = slow_first
    try:
        slow = threading.Thread(target=store.add_decisions, args=([decision("m-slow")],), name="slow")
        fast = threading.Thread(target=store.add_decisions, args=([decision("m-fast")],), name="fast")
        slow.start()
        time.sleep(0.2)
        fast.start()
        time.sleep(0.4)
        # While the first transaction is open, the second has not committed a larger id past it.
        assert store.decisions(since_id=0) == []
        slow.join(5)
        fast.join(5)
        rows = store.decisions(since_id=0)
        assert [r.message_id for _, r in rows] == ["m-slow", "m-fast"]
        assert rows[0][0] < rows[1][0]
    finally:
        store.close()
