"""Tracker, release policy and the persistent ledger (unit level, source timestamps)."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from peep.core.accounting import PrivacyAccountant
from peep.core.imaging import FaceBox
from peep.edge.ledger import SqliteLedger
from peep.edge.policy import ReleasePolicy
from peep.edge.tracking import Tracker


def box(x: float, y: float = 100.0, s: float = 100.0) -> FaceBox:
    return FaceBox(x=x, y=y, w=s, h=s)


def test_tracker_follows_moving_faces_and_separates_people():
    tr = Tracker(iou_threshold=0.3, max_distance=0.6, max_age_s=1.0)
    a1, b1 = tr.update([box(0), box(400)], 0.0)
    a2, b2 = tr.update([box(405), box(20)], 0.1)  # order swapped, both moved
    assert (a2.id, b2.id) == (b1.id, a1.id)
    # A fast jump (no overlap) within 0.6 box widths still continues the track.
    (a3,) = tr.update([box(75)], 0.2)
    assert a3.id == a1.id and a3.hits == 3
    # Unseen for longer than max_age_s: the track ends, the face gets a new id.
    (a4,) = tr.update([box(75)], 1.5)
    assert a4.id != a1.id


def test_tracker_ids_are_random_per_track():
    """An id names one appearance: no counter or start time links it to the device's other tracks."""
    tr = Tracker(id_prefix="t", max_age_s=0.5)
    ids = [tr.update([box(0)], float(k))[0].id for k in range(50)]  # each a new track (the last one aged out)
    assert len(set(ids)) == 50
    assert all(re.fullmatch(r"t-[0-9a-f]{20}", i) for i in ids)
    # the ids' hex digits look uniform: no shared prefix beyond what chance gives
    assert len({i[2] for i in ids}) > 8


def make_policy(budget: float = 100.0, k: int = 1, window: float = 10.0, cost: float = 10.0, min_hits: int = 1):
    acc = PrivacyAccountant(epsilon_budget=budget)
    return ReleasePolicy(
        accountant=acc, releases_per_window=k, window_s=window, min_hits=min_hits, cost_epsilon=cost
    ), acc


def drive(policy: ReleasePolicy, seconds: float, fps: float = 5.0) -> list[float]:
    tr = Tracker()
    released = []
    for i in range(int(seconds * fps)):
        t = i / fps
        (track,) = tr.update([box(100)], t)
        if policy.decide(track, t).allowed:
            policy.record(track, t, epsilon=policy.cost_epsilon, epsilon_coordinate=0.1)
            released.append(t)
    return released


@pytest.mark.parametrize(("k", "window"), [(1, 10.0), (2, 10.0), (3, 6.0)])
def test_at_most_k_releases_in_any_window(k, window):
    policy, _ = make_policy(budget=1e9, k=k, window=window)
    times = drive(policy, 60.0)
    assert times, "a visible track must be released"
    for t in times:
        assert sum(1 for u in times if t <= u < t + window) <= k
    # A continuously visible face is released as often as allowed: k per window,
    # spread out (at least window/k apart) rather than in a burst of similar frames.
    assert len(times) == k * int(60 / window)
    assert min(b - a for a, b in itertools.pairwise(times)) >= window / k - 1e-9
    assert policy.suppressed["rate"] == 300 - len(times)


def test_budget_exhaustion_stops_releases_for_that_track_only():
    policy, acc = make_policy(budget=35.0, k=1, window=1.0, cost=10.0)
    times = drive(policy, 20.0)
    assert len(times) == 3  # 3 x 10 <= 35 < 4 x 10
    key = acc.keys()[0]
    assert acc.spent(key)[0] == pytest.approx(30.0)
    assert policy.suppressed["budget"] > 0
    # A new person (new track) has its own budget.
    tr = Tracker(id_prefix="other")
    (t,) = tr.update([box(100)], 0.0)
    assert policy.decide(t, 0.0).allowed


def test_min_hits_delays_the_first_release_without_counting_suppression():
    policy, _ = make_policy(budget=1e9, min_hits=3)
    times = drive(policy, 1.0, fps=5.0)
    assert times[0] == pytest.approx(0.4)
    assert "warming_up" not in policy.suppressed


def test_device_budget_caps_all_tracks_together():
    acc = PrivacyAccountant(epsilon_budget=1e9, budgets={"device:cam": (25.0, 0.0)})
    policy = ReleasePolicy(
        accountant=acc, releases_per_window=1, window_s=1.0, min_hits=1, cost_epsilon=10.0, device_key="device:cam"
    )
    tr = Tracker()
    allowed = 0
    for i in range(10):
        (track,) = tr.update([box(100 + 300 * (i % 2), s=80)], 10.0 * i)  # a new person each time
        if policy.decide(track, 10.0 * i).allowed:
            policy.record(track, 10.0 * i, epsilon=10.0, epsilon_coordinate=1.0)
            allowed += 1
    assert allowed == 2
    assert policy.suppressed["device_budget"] == 8


def test_ledger_persists_spend_across_restarts(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    ledger = SqliteLedger(path)
    acc = PrivacyAccountant(epsilon_budget=50.0, ledger=ledger)
    acc.spend("track:a-1", 20.0, epsilon_coordinate=0.5, purpose="identify", message_id="m1")
    acc.spend("track:a-1", 20.0, epsilon_coordinate=0.5, purpose="identify", message_id="m2")
    acc.spend("device:cam", 40.0, epsilon_coordinate=0.5)
    ledger.close()
    again = SqliteLedger(path)
    acc2 = PrivacyAccountant(epsilon_budget=50.0, ledger=again)
    assert acc2.spent("track:a-1") == (40.0, 0.0)
    assert acc2.remaining("track:a-1")[0] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="budget exceeded for key 'track:a-1'"):
        acc2.spend("track:a-1", 20.0)
    assert [s.key for s in again.entries()] == ["track:a-1", "track:a-1", "device:cam"]
    vec, coord, n = again.lifetime()
    assert (vec, coord, n) == (40.0, 1.0, 2)  # device cap keys are not double counted
    first = again.entries("track:a-1")[0]
    assert (first.epsilon_vector, first.epsilon_coordinate, first.purpose, first.message_id) == (
        20.0,
        0.5,
        "identify",
        "m1",
    )


def test_a_ledger_from_before_the_typed_columns_keeps_its_per_coordinate_spend(tmp_path):
    """Devices that ran the earlier agent kept the per-coordinate ε as JSON in the note;
    opening their ledger moves it into the typed columns, so the lifetime total is unchanged."""
    import sqlite3

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE spends (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, epsilon REAL NOT NULL,"
        " delta REAL NOT NULL, time REAL NOT NULL, note TEXT NOT NULL);"
        "CREATE TABLE totals (key TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL, n INTEGER NOT NULL);"
    )
    for key, note in (
        ("track:a-1", json.dumps({"epsilon_coordinate": 8.0, "message_id": "m1", "purpose": "identify"})),
        ("subject:ann", json.dumps({"epsilon_coordinate": 8.0, "message_id": "m2", "purpose": "enroll"})),
        ("track:a-2", "free text"),
    ):
        db.execute("INSERT INTO spends (key, epsilon, delta, time, note) VALUES (?, 1024, 0, 1, ?)", (key, note))
        db.execute("INSERT INTO totals VALUES (?, 1024, 0, 1)", (key,))
    db.commit()
    db.close()
    ledger = SqliteLedger(path)
    assert ledger.lifetime() == (3072.0, 16.0, 3)
    by_key = {s.key: s for s in ledger.entries()}
    assert (by_key["subject:ann"].purpose, by_key["subject:ann"].message_id) == ("enroll", "m2")
    assert by_key["track:a-2"].note == "free text" and by_key["track:a-2"].epsilon_coordinate == 0.0
    ledger.close()
    assert SqliteLedger(path).lifetime() == (3072.0, 16.0, 3)  # migrated once
