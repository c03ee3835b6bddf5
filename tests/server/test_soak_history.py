"""The soak's checker reads histories: which templates, events and claims, not how many."""

from __future__ import annotations

from peep.lab.bench.soak.history import DeviceHistory, check_door, check_epsilon, check_events, check_templates


def test_each_sent_template_is_decided_once_dead_lettered_queued_lost_or_duplicated():
    cam1 = DeviceHistory("cam-1", frozenset({"a", "b", "c", "d", "e"}), {"d": "rejected: stale"}, frozenset({"e"}))
    cam2 = DeviceHistory("cam-2", frozenset({"x", "y"}))
    decided = [("cam-1", "a"), ("cam-1", "b"), ("cam-1", "b"), ("cam-2", "x"), ("cam-3", "z")]
    per, totals = check_templates([cam1, cam2], decided)
    assert per["cam-1"] | {"examples": None, "dead_letter_reasons": None} == {
        "sent": 5, "decided_once": 1, "dead_lettered": 1, "queued": 1, "lost": 1, "duplicated": 1, "unknown": 0,
        "examples": None, "dead_letter_reasons": None,
    }  # fmt: skip
    assert per["cam-1"]["examples"] == {"lost": ["c"], "duplicated": ["b"]}
    assert per["cam-1"]["dead_letter_reasons"] == {"rejected: stale": 1}
    assert per["cam-2"]["lost"] == 1 and per["cam-2"]["examples"] == {"lost": ["y"]}
    assert per["cam-3"]["unknown"] == 1 and per["cam-3"]["examples"] == {"unknown": ["z"]}
    assert totals == {"sent": 7, "decided_once": 2, "dead_lettered": 1, "queued": 1, "lost": 2, "duplicated": 1,
                      "unknown": 1}  # fmt: skip


def test_a_clean_history_has_nothing_lost_or_repeated():
    dev = DeviceHistory("cam-1", frozenset({"a", "b"}))
    per, totals = check_templates([dev], [("cam-1", "a"), ("cam-1", "b")])
    assert totals["lost"] == totals["duplicated"] == totals["unknown"] == 0 and totals["decided_once"] == 2
    assert per["cam-1"]["examples"] == {}


def test_events_received_are_matched_with_those_committed_from_where_the_subscriber_started():
    committed = [(1, "e1"), (2, "e2"), (3, "e3"), (4, "e4"), (5, "e5")]
    assert check_events(committed, [(2, "e2"), (3, "e3"), (4, "e4"), (5, "e5")]) == {
        "expected": 4, "received": 4, "missing": 0, "repeats": 0, "out_of_order": 0, "unexpected": 0}  # fmt: skip
    got = check_events(committed, [(2, "e2"), (4, "e4"), (3, "e3"), (4, "e4"), (9, "e9")])
    assert got == {"expected": 4, "received": 5, "missing": 1, "repeats": 1, "out_of_order": 1, "unexpected": 1}
    assert check_events(committed, [])["missing"] == 5


def test_a_lock_driven_without_an_accepted_decision_for_its_claim_is_a_wrong_drive():
    claims = [
        {"nonce": "n1", "outcome": "opened", "reason": ""},
        {"nonce": "n2", "outcome": "refused", "reason": "rejected"},
        {"nonce": "n3", "outcome": "refused", "reason": ""},
        {"nonce": "n4", "outcome": ""},
    ]
    got = check_door(claims, ["n1", "n2", "n1"], accepted=["n1"])
    assert got == {"claims": 4, "opened": 1, "refused": 2, "unended": 1, "refused_without_reason": 1,
                   "wrong_lock_drives": 2, "refusals": {"rejected": 1, "": 1}}  # fmt: skip
    assert check_door(claims[:2], ["n1"], accepted=["n1"])["wrong_lock_drives"] == 0


def test_the_epsilon_shown_must_equal_the_devices_ledgers():
    assert check_epsilon({"cam-1": 48.0, "cam-2": 16.0}, {"cam-1": 48.0, "cam-2": 16.0})["mismatches"] == {}
    got = check_epsilon({"cam-1": 48.0, "cam-2": 16.0}, {"cam-1": 32.0, "cam-3": 1.0})["mismatches"]
    assert got == {"cam-1": {"device": 48.0, "shown": 32.0}, "cam-2": {"device": 16.0, "shown": None},
                   "cam-3": {"device": None, "shown": 1.0}}  # fmt: skip


def test_in_flight_counts_each_devices_releases_within_each_fault_window():
    from peep.lab.bench.soak.history import in_flight

    released = {"cam-1": [1.0, 2.0, 3.5, 10.0], "cam-2": [2.5], "door-1": []}
    assert in_flight(released, [(2.0, 3.5), (9.0, 9.5)]) == [{"cam-1": 2, "cam-2": 1}, {}]
