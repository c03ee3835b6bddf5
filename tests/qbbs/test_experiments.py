"""The evaluation's metrics: the chapter's Deviation and Distortion, alone and through the query plan."""

from __future__ import annotations

import numpy as np
import pytest
from peep.lab.qbbs.experiments import deviation, distortion
from peep.server.qbbs.queries import QueryPlan


def test_deviation_is_the_absolute_gap_between_the_true_value_and_its_estimate():
    assert deviation([30.0, 180.0, 1.0], [33.0, 176.5, 1.0]).tolist() == [3.0, 3.5, 0.0]


def test_distortion_is_the_mean_and_mean_squared_response_difference():
    # m = 2 responses for each of n = 2 traits: R - R' = -1, 2 | -3, 0
    true = np.array([[120.0, 90.0], [1000.0, 800.0]])
    perturbed = np.array([[121.0, 88.0], [1003.0, 800.0]])
    assert distortion(true, perturbed) == (pytest.approx(-0.5), pytest.approx(3.5))  # (-1+2-3+0)/4, (1+4+9+0)/4
    # any layout of the m·n responses gives the same numbers
    assert distortion(true.ravel(), perturbed.ravel()) == distortion(true.T, perturbed.T)
    with pytest.raises(ValueError, match="responses: expected two non-empty arrays of one shape"):
        distortion(true, perturbed[:1])


def test_deviation_and_distortion_of_one_claim_through_the_query_plan():
    """alice's age among three subjects, m = 2: R = (SUM all, SUM all but alice) = (120, 90), Y = 30."""
    plan = QueryPlan(pairs=1, partitions=8, salt="s")
    R = plan.exact_responses("age", "alice", ["alice", "bob", "carol"], np.array([30.0, 40.0, 50.0]))
    R_noisy = R + np.array([1.0, -2.0])  # the responses' noise
    Y, Y_noisy = plan.synthesise(R), plan.synthesise(R_noisy)
    assert (Y, Y_noisy) == (30.0, 33.0)
    assert deviation(Y, Y_noisy) == 3.0  # |(121 - 88) - 30|
    assert distortion(R, R_noisy) == (0.5, 2.5)  # ((-1) + 2) / 2, (1 + 4) / 2
