"""ConsoleStore on SQLite and PostgreSQL: accounts, sessions, alerts, the audit log and the template summaries.

Every method runs on both stores (the console's tables are shared by replicas on one PostgreSQL), with an
injected clock so that session expiry and the times written are exact.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from peep.server.console.store import Account, ConsoleStore
from peep.server.storage import TemplateRecord
from peep.server.storage.postgres import PostgresStore
from peep.server.storage.sqlite import SqliteStore

HOUR = 3600.0
T0 = 1_700_000_000.0  # the clock's start (not a whole hour)
H0 = int(T0 // HOUR)


class Clock:
    """Wall-clock seconds that move only when told."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def sql(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "sqlite":
        s: Any = SqliteStore(tmp_path / "db" / "peep.db")
    else:
        s = PostgresStore(request.getfixturevalue("pg_dsn"), pool_size=3)
    yield s
    s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cs(sql: Any, clock: Clock) -> ConsoleStore:
    return ConsoleStore(sql, clock=clock)


def record(
    i: int,
    *,
    received_at: float,
    device: str = "cam-1",
    site: str = "lobby",
    track: str = "t1",
    purpose: str = "identify",
    subject: str | None = None,
    eps_vector: float = 32.0,
    kind: str = "peep-raw",
    bundle: str = "eb-1",
    eps_coordinate: float = 8.0,
) -> TemplateRecord:
    return TemplateRecord(
        message_id=f"m{i:05d}", device_id=device, site=site, bundle_id=bundle, mechanism_kind=kind, epsilon=8.0,
        delta=0.0, epsilon_coordinate=eps_coordinate, epsilon_vector=eps_vector, noise_std=0.17, purpose=purpose,
        subject=subject, track_id=track, capture_time=received_at - 0.5, received_at=received_at, n_components=4,
        values=(np.arange(4, dtype=np.float32) + i).tobytes(),
    )  # fmt: skip


def test_refuses_what_is_not_a_sql_store():
    with pytest.raises(TypeError, match="^store: expected a SQL store .*received dict$"):
        ConsoleStore({})


# ---------------------------------------------------------------- accounts


def test_accounts_are_added_read_and_listed_by_name_without_hashes(cs: ConsoleStore, clock: Clock):
    cs.add_account("olga", "operator", "scrypt$olga")
    clock.now += 10
    cs.add_account("alice", "admin", "scrypt$alice", must_change=False)
    assert cs.account("olga") == Account("olga", "operator", "scrypt$olga", True, False, T0)
    assert cs.account("alice") == Account("alice", "admin", "scrypt$alice", False, False, T0 + 10)
    assert cs.account("nobody") is None
    # The list never carries the hashes.
    assert cs.accounts() == [
        Account("alice", "admin", "", False, False, T0 + 10),
        Account("olga", "operator", "", True, False, T0),
    ]
    a = cs.account("olga")
    assert a is not None and type(a.must_change) is bool and type(a.disabled) is bool


def test_a_duplicate_name_is_refused_naming_it_and_changes_nothing(cs: ConsoleStore):
    cs.add_account("olga", "operator", "h1", must_change=False)
    with pytest.raises(ValueError, match=r"^name: expected a new account name, received 'olga' \(it exists\)$"):
        cs.add_account("olga", "admin", "h2")
    assert cs.account("olga") == Account("olga", "operator", "h1", False, False, T0)
    assert [a.name for a in cs.accounts()] == ["olga"]


def _blocked_on_a_lock(sql: Any, admin: Any) -> bool:
    if sql.dialect != "postgres":
        return True
    q = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO console_users%'"
    )
    return int(admin.execute(q).fetchone()[0]) > 0


def test_a_name_added_concurrently_by_another_replica_is_refused_with_the_same_error(
    cs: ConsoleStore, sql: Any, request: pytest.FixtureRequest
):
    # Another replica (another connection) inserts the name and has not committed yet: this one's check
    # finds nothing, and its insert waits on the other's key. When the other commits, the name exists:
    # the same ValueError as for a name that existed before, never the driver's unique violation.
    if sql.dialect == "sqlite":
        other: Any = sqlite3.connect(sql.path, isolation_level=None, timeout=30.0)
        other.execute("BEGIN IMMEDIATE")
        admin = None
    else:
        other = psycopg.connect(sql.dsn)  # a transaction until commit
        admin = request.getfixturevalue("pg_admin")
    try:
        other.execute(
            "INSERT INTO console_users (name, role, password_hash, must_change, disabled, created_at) "
            f"VALUES ({sql._sql.param}, 'admin', 'theirs', 0, 0, 1.0)",
            ("olga",),
        )
        outcome: list[BaseException | None] = []

        def add() -> None:
            try:
                cs.add_account("olga", "operator", "ours")
                outcome.append(None)
            except BaseException as exc:  # reported by the assertion below
                outcome.append(exc)

        t = threading.Thread(target=add)
        t.start()
        deadline = time.monotonic() + 10
        time.sleep(0.3)
        while not _blocked_on_a_lock(sql, admin) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _blocked_on_a_lock(sql, admin), "add_account never waited on the other replica's insert"
        other.execute("COMMIT") if sql.dialect == "sqlite" else other.commit()
        t.join(30)
    finally:
        other.close()
    assert len(outcome) == 1 and isinstance(outcome[0], ValueError), outcome
    assert str(outcome[0]) == "name: expected a new account name, received 'olga' (it exists)"
    assert cs.account("olga") == Account("olga", "admin", "theirs", False, False, 1.0)


def test_reset_password_replaces_the_hash_sets_must_change_and_ends_sessions(cs: ConsoleStore):
    cs.add_account("olga", "operator", "old", must_change=False)
    cs.add_account("root", "admin", "r", must_change=False)
    cs.create_session("s-olga-1", "olga", "c1", lifetime_s=3600)
    cs.create_session("s-olga-2", "olga", "c2", lifetime_s=3600)
    cs.create_session("s-root", "root", "c3", lifetime_s=3600)

    assert cs.reset_password("olga", "new", must_change=True) is True
    a = cs.account("olga")
    assert a is not None and (a.password_hash, a.must_change) == ("new", True)
    assert cs.session("s-olga-1", idle_s=600) is None
    assert cs.session("s-olga-2", idle_s=600) is None
    assert cs.session("s-root", idle_s=600) is not None  # another account's session stays

    assert cs.reset_password("olga", "newer", must_change=False) is True
    a = cs.account("olga")
    assert a is not None and (a.password_hash, a.must_change) == ("newer", False)
    assert cs.reset_password("nobody", "x", must_change=True) is False
    assert cs.account("nobody") is None


# ---------------------------------------------------------------- sessions


def test_a_session_names_its_account_role_csrf_and_must_change(cs: ConsoleStore, clock: Clock):
    cs.add_account("olga", "operator", "h")
    cs.create_session("sid", "olga", "csrf-1", lifetime_s=8 * HOUR)
    s = cs.session("sid", idle_s=600)
    assert s is not None
    assert (s.name, s.role, s.csrf, s.expires_at, s.must_change) == ("olga", "operator", "csrf-1", T0 + 8 * HOUR, True)
    cs.reset_password("olga", "h2", must_change=False)  # ends it
    assert cs.session("sid", idle_s=600) is None
    cs.create_session("sid2", "olga", "csrf-2", lifetime_s=HOUR)
    s = cs.session("sid2", idle_s=600)
    assert s is not None and s.must_change is False
    assert cs.session("unknown", idle_s=600) is None


def test_a_session_expires_when_idle_and_use_keeps_it_alive(cs: ConsoleStore, clock: Clock):
    cs.add_account("olga", "operator", "h")
    cs.create_session("sid", "olga", "c", lifetime_s=10 * HOUR)
    for _ in range(5):  # used every 500 s: never idle 600 s
        clock.now += 500
        assert cs.session("sid", idle_s=600) is not None
    clock.now += 599.0
    assert cs.session("sid", idle_s=600) is not None
    clock.now += 600.0  # exactly idle_s since the last use
    assert cs.session("sid", idle_s=600) is None
    clock.now -= 600.0  # gone for good: expiry deleted it
    assert cs.session("sid", idle_s=600) is None


def test_use_within_a_few_seconds_does_not_move_the_idle_deadline(cs: ConsoleStore, clock: Clock):
    # last_seen is written at most every 5 s: a use 4 s after the last write does not extend the session.
    cs.add_account("olga", "operator", "h")
    cs.create_session("sid", "olga", "c", lifetime_s=10 * HOUR)
    clock.now += 4.0
    assert cs.session("sid", idle_s=100) is not None
    clock.now = T0 + 100.0
    assert cs.session("sid", idle_s=100) is None


def test_a_session_expires_at_its_lifetime_however_busy(cs: ConsoleStore, clock: Clock):
    cs.add_account("olga", "operator", "h")
    cs.create_session("sid", "olga", "c", lifetime_s=1000)
    for _ in range(9):
        clock.now += 100
        assert cs.session("sid", idle_s=600) is not None
    clock.now = T0 + 999.5
    assert cs.session("sid", idle_s=600) is not None
    clock.now = T0 + 1000.0
    assert cs.session("sid", idle_s=600) is None


def test_creating_a_session_sweeps_expired_ones(cs: ConsoleStore, sql: Any, clock: Clock):
    cs.add_account("olga", "operator", "h")
    cs.create_session("old", "olga", "c", lifetime_s=100)
    clock.now += 101
    cs.create_session("new", "olga", "c", lifetime_s=100)
    with sql._session() as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id_sha256 FROM console_sessions").fetchall())
    assert ids == ["new"]


def test_a_disabled_account_has_no_session(cs: ConsoleStore, sql: Any):
    cs.add_account("olga", "operator", "h")
    cs.create_session("sid", "olga", "c", lifetime_s=HOUR)
    with sql._session() as conn:
        conn.execute(f"UPDATE console_users SET disabled = 1 WHERE name = {sql._sql.param}", ("olga",))
    assert cs.session("sid", idle_s=600) is None
    a = cs.account("olga")
    assert a is not None and a.disabled is True


def test_end_session_ends_that_session_only(cs: ConsoleStore):
    cs.add_account("olga", "operator", "h")
    cs.create_session("a", "olga", "c", lifetime_s=HOUR)
    cs.create_session("b", "olga", "c", lifetime_s=HOUR)
    cs.end_session("a")
    cs.end_session("a")  # again: nothing to do
    cs.end_session("unknown")
    assert cs.session("a", idle_s=600) is None
    assert cs.session("b", idle_s=600) is not None


# ---------------------------------------------------------------- alerts


def _alerts(cs: ConsoleStore) -> None:
    cs.add_alert("e1", T0 + 1, "lobby", "cam-1", 0.91, "v000001")
    cs.add_alert("e3", T0 + 3, "yard", "cam-2", 0.93, "v000001")
    cs.add_alert("e2", T0 + 2, "lobby", "cam-2", 0.92, "v000002")
    cs.add_alert("e4", T0 + 4, "lobby", "cam-1", 0.94, "v000002")


def test_alerts_newest_first_with_filters_and_limit(cs: ConsoleStore):
    _alerts(cs)
    assert [a.event_id for a in cs.alerts()] == ["e4", "e3", "e2", "e1"]
    a = cs.alerts()[0]
    assert (a.at, a.site, a.device_id, a.probability, a.model_version) == (T0 + 4, "lobby", "cam-1", 0.94, "v000002")
    assert (a.acknowledged_by, a.acknowledged_at) == (None, None)
    assert [a.event_id for a in cs.alerts(site="lobby")] == ["e4", "e2", "e1"]
    assert [a.event_id for a in cs.alerts(device_id="cam-2")] == ["e3", "e2"]
    assert [a.event_id for a in cs.alerts(site="lobby", device_id="cam-2")] == ["e2"]
    assert [a.event_id for a in cs.alerts(site="nowhere")] == []
    assert [a.event_id for a in cs.alerts(limit=2)] == ["e4", "e3"]
    assert [a.event_id for a in cs.alerts(site="lobby", limit=1)] == ["e4"]


def test_an_alert_is_acknowledged_once_and_leaves_the_open_list(cs: ConsoleStore, clock: Clock):
    _alerts(cs)
    clock.now = T0 + 50
    assert cs.acknowledge("e3", "olga") is True
    clock.now = T0 + 60
    assert cs.acknowledge("e3", "root") is False  # only once: the first acknowledgement stays
    assert cs.acknowledge("nope", "olga") is False
    assert [a.event_id for a in cs.alerts()] == ["e4", "e2", "e1"]
    assert [a.event_id for a in cs.alerts(device_id="cam-2")] == ["e2"]
    every = cs.alerts(open_only=False)
    assert [a.event_id for a in every] == ["e4", "e3", "e2", "e1"]
    e3 = every[1]
    assert (e3.acknowledged_by, e3.acknowledged_at) == ("olga", T0 + 50)
    assert [a.event_id for a in cs.alerts(open_only=False, site="yard")] == ["e3"]
    assert [a.event_id for a in cs.alerts(open_only=False, limit=3)] == ["e4", "e3", "e2"]


def test_an_alert_published_again_is_kept_once_and_stays_acknowledged(cs: ConsoleStore):
    cs.add_alert("e1", T0, "lobby", "cam-1", 0.9, "v1")
    assert cs.acknowledge("e1", "olga")
    cs.add_alert("e1", T0 + 9, "yard", "cam-9", 0.1, "v9")  # a redelivery: ignored
    [a] = cs.alerts(open_only=False)
    assert (a.at, a.site, a.device_id, a.acknowledged_by) == (T0, "lobby", "cam-1", "olga")
    assert cs.alerts() == []


# ---------------------------------------------------------------- audit log


def test_the_audit_log_is_newest_first_per_actor_and_limited(cs: ConsoleStore, clock: Clock):
    cs.audit("root", "login", "", "ok", "10.0.0.1")
    clock.now += 1
    cs.audit("olga", "acknowledge", "e1", "ok", "10.0.0.2")
    clock.now += 1
    cs.audit("root", "erase", "alice", "3 templates", "10.0.0.1")
    clock.now -= 5  # a clock that stepped back: the log is still in the order the actions were recorded
    cs.audit("root", "logout", "", "ok", "10.0.0.1")

    log = cs.audit_log()
    assert [(e.actor, e.action) for e in log] == [
        ("root", "logout"), ("root", "erase"), ("olga", "acknowledge"), ("root", "login"),
    ]  # fmt: skip
    e = log[1]
    assert (e.at, e.target, e.outcome, e.address) == (T0 + 2, "alice", "3 templates", "10.0.0.1")
    assert log[0].at == T0 - 3
    assert [e.action for e in cs.audit_log(actor="root")] == ["logout", "erase", "login"]
    assert [e.action for e in cs.audit_log(actor="root", limit=2)] == ["logout", "erase"]
    assert [e.action for e in cs.audit_log(limit=1)] == ["logout"]
    assert cs.audit_log(actor="nobody") == []


def test_audit_fields_are_bounded(cs: ConsoleStore):
    cs.audit("a" * 100, "b" * 100, "c" * 400, "d" * 400, "e" * 100)
    [e] = cs.audit_log()
    assert (len(e.actor), len(e.action), len(e.target), len(e.outcome), len(e.address)) == (64, 64, 300, 300, 64)


# ---------------------------------------------------------------- summaries of templates


def test_empty_summaries(cs: ConsoleStore):
    assert cs.devices() == []
    assert cs.subjects() == []
    assert cs.open_tracks() == []
    assert cs.track_keys("cam-1", "t1", limit=10) == []
    assert cs.hourly(0.0) == []
    assert cs.epsilon_by_device_hour(0.0) == []


def received(sql: Any, records: list[Any], *, traits: float = 0.0, transport: str = "grpc",
             sent_by: str = "device") -> None:  # fmt: skip
    """Take ``records`` as ingest does: one ledger entry each (ids, times, ε, ``traits`` the ε of the soft-trait
    releases that came with each, how it arrived and whose credential sent it); the templates are not kept."""
    from peep.server.storage import IngestBatch, LedgerEntry

    entries = [
        LedgerEntry(
            device_id=r.device_id, message_id=r.message_id, site=r.site, received_at=r.received_at, purpose=r.purpose,
            track_id=r.track_id, bundle_id=r.bundle_id, mechanism_kind=r.mechanism_kind,
            epsilon_coordinate=r.epsilon_coordinate, epsilon_vector=r.epsilon_vector, epsilon_traits=traits,
            transport=transport, sent_by=sent_by,
        )
        for r in records
    ]  # fmt: skip
    assert all(sql.commit_ingest(IngestBatch(entries)))


def test_devices_sum_epsilon_per_device_and_per_track_and_describe_the_latest_release(cs: ConsoleStore, sql: Any):
    # From the ledger of received templates: identify templates are decided, then forgotten.
    received(
        sql,
        [
            record(1, received_at=T0 + 1, device="cam-1", track="a", eps_vector=2.0),
            record(2, received_at=T0 + 2, device="cam-1", track="a", eps_vector=3.0),
            record(3, received_at=T0 + 3, device="cam-1", track="b", eps_vector=4.0),
            record(
                4, received_at=T0 + 4, device="cam-1", track="c", eps_vector=0.5, site="hall", bundle="eb-2",
                kind="peep-lap", eps_coordinate=0.25,
            ),
            record(5, received_at=T0 + 10, device="cam-2", site="yard", track="x", eps_vector=7.0),
        ]
    )  # fmt: skip
    d1, d2 = cs.devices()
    assert d1.device_id == "cam-1" and d1.releases == 4
    assert d1.epsilon_vector_total == pytest.approx(9.5)
    assert d1.epsilon_vector_max_track == pytest.approx(5.0)  # track a: 2 + 3
    assert d1.last_release == T0 + 4
    assert (d1.site, d1.bundle_id, d1.mechanism_kind) == ("hall", "eb-2", "peep-lap")
    assert (d1.epsilon_coordinate, d1.epsilon_vector) == (0.25, 0.5)
    assert (d2.device_id, d2.site, d2.releases, d2.last_release) == ("cam-2", "yard", 1, T0 + 10)
    assert (d2.epsilon_vector_total, d2.epsilon_vector_max_track) == (7.0, 7.0)


def test_every_epsilon_sum_is_the_whole_spend_templates_and_soft_traits(cs: ConsoleStore, sql: Any):
    """The demo's cameras: ε 16 per template plus 2 for age and gender; the device's ledger counts 18 each."""
    base = H0 * HOUR
    received(sql, [record(i, received_at=base + i, device="cam-1", track="a" if i < 2 else "b", eps_vector=16.0)
                   for i in range(3)], traits=2.0)  # fmt: skip
    (d,) = cs.devices()
    assert d.epsilon_vector_total == pytest.approx(3 * 18.0) and d.epsilon_traits_total == pytest.approx(3 * 2.0)
    assert d.epsilon_vector_max_track == pytest.approx(2 * 18.0)
    assert cs.epsilon_by_device_hour(base - 1.0) == [("cam-1", H0, pytest.approx(54.0))]


def test_devices_count_what_the_administrator_sent_in_a_devices_name_apart_and_name_each_transport(
    cs: ConsoleStore, sql: Any
):
    """A desk's own enrolments against the background the administrator enrolled through it, a camera on MQTT with
    rows from before the transport was recorded, and a device the administrator alone sent for."""
    base = H0 * HOUR
    own = [record(i, received_at=base + i, device="desk-1", purpose="enroll", eps_vector=16.0) for i in range(3)]
    received(sql, own, traits=2.0)
    # later than the desk's own and on its track id: in neither its last release, its totals nor its track's
    background = [record(10 + i, received_at=base + 100 + i, device="desk-1", purpose="enroll", eps_vector=16.0)
                  for i in range(5)]  # fmt: skip
    received(sql, background, sent_by="admin")
    received(sql, [record(20 + i, received_at=base + 5 + i, device="cam-3", eps_vector=4.0) for i in range(2)],
             transport="mqtt")  # fmt: skip
    received(sql, [record(30, received_at=base + 7, device="cam-3", eps_vector=4.0)], transport="", sent_by="")
    received(sql, [record(40, received_at=base + 9, device="desk-2", eps_vector=16.0)], sent_by="admin")
    by = {d.device_id: d for d in cs.devices()}
    assert list(by) == ["cam-3", "desk-1", "desk-2"]
    desk = by["desk-1"]
    assert (desk.releases, desk.last_release, dict(desk.transports)) == (3, base + 2, {"grpc": 3})
    assert desk.epsilon_vector_total == pytest.approx(3 * 18.0) and desk.epsilon_traits_total == pytest.approx(6.0)
    assert desk.epsilon_vector_max_track == pytest.approx(3 * 18.0)
    assert (desk.admin_releases, desk.admin_epsilon_vector_total) == (5, pytest.approx(5 * 16.0))
    cam = by["cam-3"]
    assert (cam.releases, dict(cam.transports), cam.admin_releases) == (3, {"mqtt": 2, "": 1}, 0)
    alone = by["desk-2"]
    assert (alone.releases, alone.last_release, alone.epsilon_vector_total, dict(alone.transports)) == (0, None, 0, {})
    assert (alone.admin_releases, alone.mechanism_kind) == (1, "peep-raw")
    # the chart and its span: the devices' own spend only
    per = cs.epsilon_by_device_hour(base - 1.0)
    assert {d for d, _, _ in per} == {"cam-3", "desk-1"}
    assert sum(e for d, _, e in per if d == "desk-1") == pytest.approx(desk.epsilon_vector_total)
    assert cs.ledger_span(base - 1.0) == (base, base + 7)


def test_subjects_count_enrolment_templates_by_name(cs: ConsoleStore, sql: Any):
    sql.insert_templates(
        [
            record(1, received_at=T0 + 1, purpose="enroll", subject="bob"),
            record(2, received_at=T0 + 5, purpose="enroll", subject="bob"),
            record(3, received_at=T0 + 3, purpose="enroll", subject="alice"),
            record(4, received_at=T0 + 9, purpose="identify", subject="carol"),  # not an enrolment
            record(5, received_at=T0 + 9, purpose="enroll", subject=None),  # enrolled to nobody yet
        ]
    )
    assert cs.subjects() == [("alice", 1, T0 + 3), ("bob", 2, T0 + 5)]
    assert cs.subjects(limit=1) == [("alice", 1, T0 + 3)]


def test_open_tracks_are_the_unlabelled_ones_newest_first(cs: ConsoleStore, sql: Any):
    sql.insert_templates(
        [
            record(1, received_at=T0 + 1, device="cam-1", track="a"),
            record(2, received_at=T0 + 7, device="cam-1", track="a"),
            record(3, received_at=T0 + 5, device="cam-2", site="yard", track="a"),
            record(4, received_at=T0 + 9, device="cam-1", track="b", subject="bob", purpose="enroll"),
            record(5, received_at=T0 + 3, device="cam-1", track="c"),
        ]
    )
    assert cs.open_tracks() == [
        ("cam-1", "lobby", "a", 2, T0 + 7),
        ("cam-2", "yard", "a", 1, T0 + 5),
        ("cam-1", "lobby", "c", 1, T0 + 3),
    ]
    assert cs.open_tracks(limit=2) == cs.open_tracks()[:2]


def test_track_keys_are_a_tracks_unlabelled_templates_oldest_first(cs: ConsoleStore, sql: Any):
    sql.insert_templates(
        [
            record(1, received_at=T0 + 3, device="cam-1", track="a"),
            record(2, received_at=T0 + 1, device="cam-1", track="a"),
            record(3, received_at=T0 + 2, device="cam-1", track="a", subject="bob", purpose="enroll"),
            record(4, received_at=T0 + 2, device="cam-2", track="a"),  # another device's track "a"
            record(5, received_at=T0 + 4, device="cam-1", track="a"),
            record(6, received_at=T0 + 0, device="cam-1", track="b"),
        ]
    )
    assert cs.track_keys("cam-1", "a", limit=10) == [("cam-1", "m00002"), ("cam-1", "m00001"), ("cam-1", "m00005")]
    assert cs.track_keys("cam-1", "a", limit=2) == [("cam-1", "m00002"), ("cam-1", "m00001")]
    assert cs.track_keys("cam-2", "a", limit=10) == [("cam-2", "m00004")]
    assert cs.track_keys("cam-3", "a", limit=10) == []


def _hours(sql: Any) -> None:
    base = H0 * HOUR  # the start of an hour
    received(
        sql,
        [
            record(1, received_at=base - 0.25, eps_vector=1.0),  # the last instant of hour H0-1
            record(2, received_at=base, eps_vector=2.0),  # the first of H0
            record(3, received_at=base + 1799.5, purpose="verify", eps_vector=4.0),  # mid-hour: never rounded up
            record(4, received_at=base + 3599.75, device="cam-2", eps_vector=8.0),  # still H0
            record(5, received_at=base + 3600.0, device="cam-2", eps_vector=16.0),  # H0+1
            record(6, received_at=base + 2 * 3600 + 10, purpose="enroll", subject="bob", eps_vector=32.0),  # H0+2
            record(7, received_at=base - 7200.0, eps_vector=64.0),  # before `since` below
        ],
    )


def test_hourly_counts_recognitions_per_hour_floored(cs: ConsoleStore, sql: Any):
    _hours(sql)
    since = H0 * HOUR - 3600.0
    assert cs.hourly(since) == [(H0 - 1, 1), (H0, 3), (H0 + 1, 1)]
    assert cs.hourly(since, purposes=["identify"]) == [(H0 - 1, 1), (H0, 2), (H0 + 1, 1)]
    assert cs.hourly(since, purposes=["enroll"]) == [(H0 + 2, 1)]
    assert cs.hourly(H0 * HOUR) == [(H0, 3), (H0 + 1, 1)]
    assert all(type(h) is int and type(n) is int for h, n in cs.hourly(0.0))


def test_epsilon_per_device_and_hour(cs: ConsoleStore, sql: Any):
    _hours(sql)
    got = cs.epsilon_by_device_hour(H0 * HOUR - 3600.0)
    assert [h for _, h, _ in got] == sorted(h for _, h, _ in got)  # by hour
    assert sorted(got) == [
        ("cam-1", H0 - 1, 1.0),
        ("cam-1", H0, 6.0),
        ("cam-1", H0 + 2, 32.0),
        ("cam-2", H0, 8.0),
        ("cam-2", H0 + 1, 16.0),
    ]
    assert sorted(cs.epsilon_by_device_hour(H0 * HOUR + 3600.0)) == [("cam-1", H0 + 2, 32.0), ("cam-2", H0 + 1, 16.0)]


@pytest.fixture(params=["sqlite", "postgres"])
def store_pair(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[Any, Any]]:
    """Two ConsoleStores on one database, as two replicas have."""
    from peep.server.console.store import ConsoleStore

    if request.param == "sqlite":
        one: Any = SqliteStore(tmp_path / "db" / "peep.db")
        two: Any = SqliteStore(tmp_path / "db" / "peep.db")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        one, two = PostgresStore(dsn, pool_size=2), PostgresStore(dsn, pool_size=2)
    yield ConsoleStore(one), ConsoleStore(two)
    one.close()
    two.close()


def test_failed_logins_are_counted_in_the_database_for_every_replica(store_pair):
    """Two consoles on one database (two replicas): failures made on one throttle the other; success clears the
    account's failures, not the address's; the window and the row bound hold."""
    from peep.server.console.accounts import Throttled
    from peep.server.console.throttle import SharedLoginThrottle

    a, b = store_pair
    now = [1000.0]
    ta = SharedLoginThrottle(a, attempts=2, window_s=60.0, clock=lambda: now[0])
    tb = SharedLoginThrottle(b, attempts=2, window_s=60.0, clock=lambda: now[0])
    ta.failed("root", "10.0.0.1")
    tb.check("root", "10.0.0.9")  # one failure: still allowed
    tb.failed("root", "10.0.0.2")
    with pytest.raises(Throttled):
        ta.check("root", "10.0.0.3")  # the account's two failures, one on each replica
    ta.check("someone", "10.0.0.1")  # the address 10.0.0.1 has one failure: allowed
    now[0] += 61.0
    tb.check("root", "10.0.0.3")  # the window passed
    ta.failed("x", "10.0.0.5")
    ta.failed("y", "10.0.0.5")
    with pytest.raises(Throttled):
        tb.check("z", "10.0.0.5")  # the address's failures, whatever the names
    tb.succeeded("x")
    with pytest.raises(Throttled):
        ta.check("z", "10.0.0.5")  # success clears the account, not the address
    tc = SharedLoginThrottle(a, attempts=2, window_s=60.0, clock=lambda: now[0], max_rows=6)
    for i in range(10):
        tc.failed(f"name{i}", "10.0.0.7")
    assert len(a.login_failures("address", "10.0.0.7", 0.0)) <= 6


def _throttle(sql: Any, now: list[float], **kw: Any) -> Any:
    from peep.server.console.store import ConsoleStore
    from peep.server.console.throttle import SharedLoginThrottle

    return SharedLoginThrottle(ConsoleStore(sql), clock=lambda: now[0], **kw)


def test_throttle_counts_per_account_and_per_address_in_a_window(sql):
    from peep.server.console.accounts import Throttled

    now = [0.0]
    t = _throttle(sql, now, attempts=3, window_s=60.0)
    for _ in range(3):
        t.check("alice", "10.0.0.1")
        t.failed("alice", "10.0.0.1")
    with pytest.raises(Throttled, match="account"):
        t.check("alice", "10.0.0.9")  # the account, from anywhere
    with pytest.raises(Throttled, match="address"):
        t.check("bob", "10.0.0.1")  # the address, for any account
    t.check("bob", "10.0.0.2")
    now[0] = 61.0
    t.check("alice", "10.0.0.1")  # the window has passed


def test_throttle_success_clears_the_account_only(sql):
    from peep.server.console.accounts import Throttled

    t = _throttle(sql, [0.0], attempts=1, window_s=60.0)
    t.failed("alice", "10.0.0.1")
    t.succeeded("alice")
    t.check("alice", "10.0.0.2")
    with pytest.raises(Throttled):
        t.check("alice", "10.0.0.1")


def test_throttle_keeps_a_bounded_number_of_failures(sql):
    t = _throttle(sql, [0.0], attempts=1, window_s=60.0, max_rows=10)
    for i in range(100):
        t.failed(f"user{i}", "10.0.0.1")
    with sql._session() as conn:
        (n,) = conn.execute("SELECT COUNT(*) FROM console_login_failures").fetchone()
    assert n <= 10


# ------------------------------------------------------------ a day's use: alert groups, recognitions, audit


def decision(i: int, *, at: float, device: str = "cam-1", purpose: str = "identify", unknown: bool = False,
             accepted: bool | None = None) -> Any:  # fmt: skip
    from peep.server.storage import DecisionRecord

    return DecisionRecord(
        event_id=f"e{i}", at=at, site="lobby", device_id=device, message_id=f"m{i}", track_id=f"t{i}",
        purpose=purpose, subject="" if unknown else "alice", claimed_subject="bob" if purpose == "verify" else "",
        unknown=unknown, accepted=accepted, probability=0.5, model_version="v000001", releases_fused=1,
    )  # fmt: skip


def test_alerts_group_per_device_and_window_and_are_acknowledged_in_bulk(cs: ConsoleStore, clock: Clock):
    h = H0 * HOUR
    for i, (dev, at) in enumerate(
        [("cam-1", h + 10), ("cam-1", h + 20), ("cam-1", h + HOUR + 5), ("cam-2", h + 30), ("cam-2", h + 40)]
    ):
        cs.add_alert(f"a{i}", at, "lobby", dev, 0.1 * (i + 1), "v000001")
    groups, total = cs.alert_groups(window_s=HOUR)
    assert total == 3
    assert [(g.device_id, g.window_start, g.n) for g in groups] == [
        ("cam-1", h + HOUR, 1), ("cam-1", h, 2), ("cam-2", h, 2)
    ]  # fmt: skip
    assert groups[1].first == h + 10 and groups[1].last == h + 20 and groups[2].max_probability == pytest.approx(0.5)
    assert cs.alert_groups(window_s=HOUR, limit=1, offset=1)[0][0].window_start == h
    # One group: cam-1's first hour.
    assert cs.acknowledge_many("olga", device_id="cam-1", since=h, before=h + HOUR) == 2
    assert cs.count_alerts() == 3 and cs.count_alerts(device_id="cam-1") == 1
    # Older than: everything before h + 35 (cam-2's first).
    assert cs.acknowledge_many("olga", before=h + 35) == 1
    assert cs.acknowledge_many("olga") == 2 and cs.count_alerts() == 0
    assert {a.acknowledged_by for a in cs.alerts(open_only=False)} == {"olga"}


def test_recognitions_page_newest_first_and_filter_by_decision(cs: ConsoleStore, sql: Any):
    rows = [decision(i, at=T0 + i, device="cam-2" if i % 3 == 0 else "cam-1", unknown=i % 2 == 1) for i in range(20)]
    rows += [decision(100 + i, at=T0 + 30 + i, purpose="verify", accepted=i % 2 == 0) for i in range(4)]
    sql.add_decisions(rows)
    first = cs.recognitions(limit=10)
    assert [r.event_id for r in first][:4] == ["e103", "e102", "e101", "e100"]
    assert first[0].subject == "bob" and first[0].accepted is False and not first[0].unknown  # the claim
    second = cs.recognitions(limit=10, before_id=first[-1].id)
    assert not {r.id for r in first} & {r.id for r in second} and all(r.id < first[-1].id for r in second)
    assert cs.count_recognitions() == 24
    assert cs.count_recognitions(decision="unknown") == 10 and cs.count_recognitions(decision="named") == 10
    assert cs.count_recognitions(decision="accepted") == 2 and cs.count_recognitions(decision="refused") == 2
    assert all(r.unknown for r in cs.recognitions(decision="unknown"))
    assert {r.device_id for r in cs.recognitions(device_id="cam-2", limit=100)} == {"cam-2"}
    assert cs.count_recognitions(since=T0 + 10) == 14
    assert cs.recognition_sites_and_devices() == (["lobby"], ["cam-1", "cam-2"])
    with pytest.raises(ValueError, match="decision: expected one of"):
        cs.recognitions(decision="1=1; DROP TABLE recognition_events")


def test_audit_log_filters_and_pages(cs: ConsoleStore):
    for k in range(12):
        cs.audit("olga" if k % 2 else "root", "erase" if k % 3 == 0 else "login", f"t{k}",
                 "refused: 100% sure_not" if k == 4 else "ok", "10.0.0.1")  # fmt: skip
    page = cs.audit_log(limit=5)
    assert [e.target for e in page] == ["t11", "t10", "t9", "t8", "t7"]
    assert [e.target for e in cs.audit_log(limit=5, before_id=page[-1].id)] == ["t6", "t5", "t4", "t3", "t2"]
    assert {e.actor for e in cs.audit_log(actor="olga")} == {"olga"}
    assert {e.action for e in cs.audit_log(action="erase")} == {"erase"}
    assert [e.target for e in cs.audit_log(outcome="REFUSED")] == ["t4"]
    assert [e.target for e in cs.audit_log(outcome="100% sure_")] == ["t4"]
    # LIKE's wildcards in the operator's text are literal: only the entry holding them matches.
    assert [e.target for e in cs.audit_log(outcome="%")] == ["t4"]
    assert [e.target for e in cs.audit_log(outcome="_")] == ["t4"]
    assert cs.audit_actions() == ["erase", "login"] and cs.audit_actors() == ["olga", "root"]
