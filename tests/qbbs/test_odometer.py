"""Privacy odometer: per-subject sequential composition, cap, persistence, audit log."""

from __future__ import annotations

import json

import pytest
from peep.core.exceptions import BudgetError
from peep.server.qbbs import OdometerExhaustedError, StaticFaceScores


def test_every_answer_spends_pairs_times_epsilon_for_the_subject_only(make_module):
    module = make_module(epsilon=0.5, queries_per_trait=4, epsilon_cap=100.0)
    r = module.query("alice", "age")
    assert r.epsilon_spent == pytest.approx(1.0)  # 2 pairs x 0.5
    assert r.epsilon_total == pytest.approx(1.0)
    module.query("alice", "height")
    assert module.odometer("alice").epsilon_spent == pytest.approx(2.0)
    assert module.odometer("alice").releases == 2
    # Only Y' leaves the module and it does not depend on anyone else's value.
    assert module.odometer("bob").epsilon_spent == 0.0


def test_refusal_after_the_cap_and_nothing_recorded(make_module):
    module = make_module(epsilon=1.0, epsilon_cap=5.0)
    for _ in range(5):
        module.query("carol", "weight")
    with pytest.raises(OdometerExhaustedError, match=r"'carol' has spent ε=5 of its cap ε=5") as info:
        module.query("carol", "weight")
    assert isinstance(info.value, BudgetError) and isinstance(info.value, ValueError)
    reading = module.odometer("carol")
    assert (reading.epsilon_spent, reading.releases, reading.epsilon_remaining) == (5.0, 5, 0.0)
    assert module.query("dave", "weight").epsilon_total == 1.0  # other subjects are unaffected


def test_a_verification_that_would_pass_the_cap_is_refused_whole(make_module):
    faces = StaticFaceScores({"erin": -0.1}, genuine=[-0.1, -0.3, -0.2], impostor=[-5.0, -6.0, -4.0])
    module = make_module(epsilon=1.0, epsilon_cap=6.0, face_scores=faces)
    observed = {"age": 60.0, "gender": 0.0, "height": 163.0, "weight": 72.0}
    assert module.verify(claimed_subject="erin", face_score=-0.1, observed=observed).epsilon_spent == 4.0
    with pytest.raises(OdometerExhaustedError):
        module.verify(claimed_subject="erin", face_score=-0.1, observed=observed)  # needs 4, 2 left
    assert module.odometer("erin").epsilon_spent == 4.0
    r = module.verify(claimed_subject="erin", face_score=-0.1, observed={"age": 60.0, "gender": 0.0})
    assert r.epsilon_total == 6.0


def test_the_odometer_persists_across_reopen(make_module, tmp_path):
    module = make_module(persist=True, epsilon=2.0, epsilon_cap=6.0)
    module.query("bob", "age", requester="ops@test")
    module.query("bob", "height", requester="ops@test")
    module.close()
    again = make_module(persist=True, enrol=False, epsilon=2.0, epsilon_cap=6.0)
    assert again.odometer("bob").epsilon_spent == 4.0
    again.query("bob", "age")
    with pytest.raises(OdometerExhaustedError):
        again.query("bob", "age")
    lines = (tmp_path / "qbbs-ledger.jsonl").read_text().splitlines()
    assert len(lines) == 3
    log = again.audit_log("bob")
    assert [e["traits"] for e in log] == [["age"], ["height"], ["age"]]
    assert log[0]["requester"] == "ops@test" and log[0]["op"] == "query" and log[0]["responses"] == 2
    assert all(e["epsilon"] == 2.0 and e["subject"] == "bob" for e in log)
    assert json.loads(lines[0])["key"] == "qbbs:subject:bob"
