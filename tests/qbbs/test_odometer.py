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
    # Fixed weights, every trait positive: these face scores separate perfectly, so calibrated weights
    # would be all face and no trait would be queried (see the zero-weight tests below).
    module = make_module(epsilon=1.0, epsilon_cap=6.0, face_scores=faces, weights=EQUAL)
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


# --------------------------------------------------------------------------- zero-weight traits cost nothing

EQUAL = {"face": 0.6, "age": 0.1, "gender": 0.1, "height": 0.1, "weight": 0.1}
SEPARATING = dict(genuine=[-0.1, -0.3, -0.2], impostor=[-5.0, -6.0, -4.0])  # the face alone decides every claim


def test_a_zero_weight_trait_is_neither_queried_nor_charged(make_module):
    faces = StaticFaceScores({"erin": -0.1, "frank": -0.2}, **SEPARATING)
    weights = {"face": 0.5, "age": 0.3, "gender": 0.0, "height": 0.2, "weight": 0.0}
    module = make_module(epsilon=1.0, epsilon_cap=4.0, face_scores=faces, weights=weights)
    read: list[str] = []
    column = module._soft_trait_store.column
    module._soft_trait_store.column = lambda t: (read.append(t), column(t))[1]

    observed = {"age": 60.0, "gender": 0.0, "height": 163.0, "weight": 72.0}
    r = module.verify(claimed_subject="erin", face_score=-0.1, observed=observed)
    assert read == ["age", "height"]  # the store is read for the positive-weight traits only
    assert [t.trait for t in r.traits] == ["age", "height"] and r.skipped == ("gender", "weight")
    assert [t.weight for t in r.traits] == [0.3, 0.2] and r.face_weight == 0.5
    assert r.epsilon_spent == 2.0 and module.odometer("erin").epsilon_spent == 2.0
    assert module.audit_log("erin")[-1]["traits"] == ["age", "height"]
    # the fused score and decision are those of the used traits, against the claim shape's calibration
    by_hand = 0.5 * r.log_p_genuine_face + 0.3 * r.traits[0].log_likelihood + 0.2 * r.traits[1].log_likelihood
    assert r.fused_score == pytest.approx(by_hand, abs=1e-12)
    assert r.threshold == module.calibration(list(observed)).threshold and r.accepted == (r.fused_score >= r.threshold)

    # the cap counts only what is released: 2 more fit, then a claim needing age is refused whole ...
    assert module.verify(claimed_subject="erin", face_score=-0.1, observed={"age": 61.0}).epsilon_total == 3.0
    module.verify(claimed_subject="erin", face_score=-0.1, observed={"height": 164.0, "gender": 0.0})
    with pytest.raises(OdometerExhaustedError):
        module.verify(claimed_subject="erin", face_score=-0.1, observed={"age": 60.0, "weight": 70.0})
    # ... while one observing only zero-weight traits releases nothing and still gets its face decision
    z = module.verify(claimed_subject="erin", face_score=-0.1, observed={"gender": 0.0, "weight": 70.0})
    assert z.traits == () and z.epsilon_spent == 0.0 and z.fused_score == pytest.approx(z.log_p_genuine_face)
    assert module.odometer("erin").epsilon_spent == 4.0

    # a skipped trait need not even be enrolled (it is never looked up)
    module.enrol("frank", {"age": 40.0})
    f = module.verify(claimed_subject="frank", face_score=-0.2, observed={"age": 41.0, "weight": 80.0})
    assert f.skipped == ("weight",) and f.epsilon_spent == 1.0


def test_traits_the_calibration_gives_weight_0_are_not_charged(make_module):
    """The face alone separates these claims, so the calibration keeps all weight on it (ties keep the face)."""
    module = make_module(epsilon=1.0, face_scores=StaticFaceScores({"erin": -0.1, "bob": -5.0}, **SEPARATING))
    observed = {"age": 60.0, "gender": 0.0, "height": 163.0, "weight": 72.0}
    for claimed, face in (("erin", -0.1), ("bob", -5.0)):
        r = module.verify_template(claimed_subject=claimed, values=[0.0], observed=observed)
        assert r.calibration is not None
        assert dict(r.calibration.weights) == {"face": 1.0, **dict.fromkeys(observed, 0.0)}
        assert r.traits == () and r.skipped == tuple(observed) and r.epsilon_spent == 0.0
        assert r.face_score == face and r.fused_score == pytest.approx(r.log_p_genuine_face)
        assert r.accepted == (r.fused_score >= r.threshold) == (claimed == "erin")
        assert module.odometer(claimed).epsilon_spent == 0.0 and module.audit_log(claimed) == []
    # an admin query is still an answer, and still charged
    assert module.query("erin", "age").epsilon_total == 1.0
