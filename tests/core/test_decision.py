"""The one decision rule: open-set identification, claims, and thresholds for clean queries."""

from __future__ import annotations

import numpy as np
import pytest
from peep.core.decision import (
    accept_claims,
    calibrate_clean,
    claim_scores,
    identify_open_set,
    threshold_at_far,
    threshold_at_fpir,
)
from peep.core.labels import RandomizedResponse


def test_the_background_column_never_names_anyone():
    P = np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.45, 0.5, 0.05]])
    d = identify_open_set(P, known=[0, 1], threshold=0.5)
    assert d.best_class.tolist() == [1, 0, 1]
    assert d.unknown.tolist() == [True, False, False]  # 0.5 reaches the threshold: named
    assert d.probability.tolist() == [0.2, 0.6, 0.5]
    fused = identify_open_set(P, known=[0, 1], threshold=np.array([0.1, 0.9, 0.5]))
    assert fused.unknown.tolist() == [False, True, False]


def test_a_claim_for_an_unknown_subject_scores_zero_and_ties_are_refused():
    P = np.array([[0.3, 0.7], [0.5, 0.5]])
    s = claim_scores(P, [1, -1])
    assert s.tolist() == [0.7, 0.0]
    assert accept_claims([0.7, 0.5], 0.5).tolist() == [True, False]
    with pytest.raises(ValueError, match="claimed"):
        claim_scores(P, [2, 0])


def test_thresholds_meet_their_rates_on_the_scores_they_were_set_on():
    rng = np.random.default_rng(0)
    s = rng.random(1000)
    t = threshold_at_fpir(s, 0.01)
    assert np.mean(s >= t) <= 0.01 and np.mean(s >= np.nextafter(t, -np.inf) - 1e-12) > 0.0
    t = threshold_at_far(s, 0.001)
    assert np.mean(s > t) <= 0.001
    assert threshold_at_far([], 0.01) == 0.5


def test_clean_calibration_accounts_for_the_label_mechanism():
    rng = np.random.default_rng(1)
    P = rng.dirichlet(np.ones(11), size=2000)
    known = np.arange(10)
    plain = calibrate_clean(P, known, fpir=0.01, far=0.001)
    assert plain.fpir_model_target == 0.01 and plain.fpir_public <= 0.01
    assert plain.far_public <= 0.001 and plain.impostor_scores == 20_000
    rr = RandomizedResponse(11, 8.0)
    withrr = calibrate_clean(
        P, known, fpir=0.01, far=0.001, label_false_positive=rr.false_positive_floor, label_keep=rr.keep_probability
    )
    assert withrr.fpir_model_target < 0.01
    # The released rate: model-named strangers stay named w.p. 1 - per_other, unknown ones move w.p. floor.
    m = withrr.fpir_model_target
    released = m * (1 - rr.other_probability) + (1 - m) * rr.false_positive_floor
    assert released == pytest.approx(0.01, abs=1e-9)
    with pytest.raises(ValueError, match="fpir"):
        calibrate_clean(
            P, known, fpir=0.001, far=0.001, label_false_positive=RandomizedResponse(11, 4.0).flip_probability
        )


def test_weighted_thresholds_count_people_not_photos():
    # One person with 20 photos all scoring high, 99 people with one low photo each: by photos, 17 % of the
    # scores are high; by people (each weighing the same), 1 %.
    scores = np.r_[np.full(20, 0.9), np.linspace(0.1, 0.5, 99)]
    people = np.r_[np.zeros(20), np.arange(1, 100)]
    w = 1.0 / np.bincount(people.astype(int))[people.astype(int)]
    t = threshold_at_fpir(scores, 0.01, weights=w)
    assert t <= 0.9  # the one person may be named (1 % of people)
    assert np.average(scores >= t, weights=w) <= 0.01 + 1e-12
    assert threshold_at_fpir(scores, 0.01) > 0.9  # by photos they may not
    t = threshold_at_far(scores, 0.01, weights=w)
    assert np.average(scores > t, weights=w) <= 0.01 + 1e-12 and t < 0.9
    # Equal weights: the same identification threshold; a claim threshold that meets the rate exactly (the
    # unweighted quantile may stop one score short of it).
    rng = np.random.default_rng(2)
    s = rng.random(500)
    assert threshold_at_fpir(s, 0.02, weights=np.ones(500)) == threshold_at_fpir(s, 0.02)
    tw = threshold_at_far(s, 0.02, weights=np.ones(500))
    assert tw <= threshold_at_far(s, 0.02) and np.mean(s > tw) == 0.02
    with pytest.raises(ValueError, match="weights"):
        threshold_at_far(s, 0.02, weights=np.ones(3))
    P = rng.dirichlet(np.ones(4), size=200)
    c = calibrate_clean(P, [0, 1, 2], fpir=0.05, far=0.01, weights=np.ones(200))
    plain = calibrate_clean(P, [0, 1, 2], fpir=0.05, far=0.01)
    assert c.unknown_threshold == plain.unknown_threshold and c.far_public <= 0.01
