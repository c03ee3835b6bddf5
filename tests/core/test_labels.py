"""k-ary randomized response: its law, its exact ε, its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.core import features
from peep.core.exceptions import UnsafeFeatureError
from peep.core.labels import RandomizedResponse
from scipy.stats import chisquare


@pytest.mark.parametrize(("k", "epsilon"), [(2, 1.0), (11, 2.0), (11, 8.0), (51, 4.0)])
def test_the_secure_release_follows_the_stated_law(k, epsilon):
    rr = RandomizedResponse(k, epsilon)
    n = 60_000
    label = k // 2
    out = rr.release(np.full(n, label))
    counts = np.bincount(out, minlength=k)
    expected = n * rr.output_law(label)
    # Pool the cells too small for the chi-square approximation into one.
    small = expected < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    assert chisquare(counts, expected).pvalue > 1e-4
    assert abs(counts.sum() - n) == 0


def test_the_law_is_epsilon_ldp_exactly_and_no_looser_than_stated():
    for k, eps in [(2, 0.1), (11, 8.0), (1000, 12.0), (3, 40.0)]:
        rr = RandomizedResponse(k, eps)
        assert rr.epsilon_exact <= eps
        # The integer probabilities lose at most one unit of n_other: ε is met to ln(1 + 1/n_other).
        n_other = rr.other_probability * 2.0**64
        assert eps - rr.epsilon_exact <= math.log1p(1.0 / (n_other - 1)) + 1e-12
        law = rr.output_law(0)
        assert math.isclose(law.sum(), 1.0, rel_tol=0, abs_tol=1e-12)
        assert math.isclose(rr.flip_probability, (k - 1) / (math.exp(eps) + k - 1), rel_tol=1e-9 + 1.0 / n_other)
        assert rr.guarantee.epsilon_vector == rr.guarantee.epsilon_coordinate == eps


def test_every_output_is_reachable_from_every_label():
    # Drive the byte source: the largest word moves the label to the last other label, the smallest keeps it.
    words = iter([b"\x00" * 8, b"\xff" * 8])
    rr = RandomizedResponse(4, 1.0, random_bytes=lambda n: next(words))
    assert rr.release_one(3) == 3
    assert rr.release_one(3) == 2  # the last of the others (0, 1, 2)
    words = iter([b"\xff" * 8])
    rr = RandomizedResponse(4, 1.0, random_bytes=lambda n: next(words))
    assert rr.release_one(2) == 3


def test_seeds_are_refused_outside_simulations_and_reproducible_inside():
    with pytest.raises(UnsafeFeatureError):
        RandomizedResponse(5, 2.0, random_state=0)
    with features.enabled("seeded-noise"):
        a = RandomizedResponse(5, 2.0, random_state=3).release(np.zeros(100, dtype=int))
        b = RandomizedResponse(5, 2.0, random_state=3).release(np.zeros(100, dtype=int))
        assert not RandomizedResponse(5, 2.0, random_state=3).is_secure
    assert np.array_equal(a, b)
    assert RandomizedResponse(5, 2.0).is_secure


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 1, "epsilon": 1.0}, "k"),
        ({"k": 5, "epsilon": 0.0}, "epsilon"),
        ({"k": 5, "epsilon": float("nan")}, "epsilon"),
        ({"k": 5, "epsilon": 41.0}, "epsilon"),
    ],
)
def test_bad_parameters_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RandomizedResponse(**kwargs)


def test_labels_outside_the_domain_are_refused():
    rr = RandomizedResponse(3, 1.0)
    for bad in ([3], [-1], [0.5]):
        with pytest.raises(ValueError, match="labels"):
            rr.release(np.array(bad))


def test_the_fpir_floor_of_any_label_mechanism_and_the_epsilon_that_meets_a_target():
    import math

    from peep.core.labels import RandomizedResponse, epsilon_label_for, fpir_floor

    assert fpir_floor(10, 8.0) == pytest.approx(10 * math.exp(-8.0))
    assert fpir_floor(10, 8.0, fnir=0.5) == pytest.approx(5 * math.exp(-8.0))
    assert fpir_floor(10**6, 1.0) == 1.0  # capped: a share
    # k-RR meets the bound up to its denominator: its floor lies just under it.
    for n, eps in [(10, 8.0), (100, 10.0), (1000, 12.0)]:
        rr = RandomizedResponse(n + 1, eps)
        assert (
            rr.false_positive_floor <= fpir_floor(n, eps) <= rr.false_positive_floor * (1 + n * math.exp(-eps)) + 1e-12
        )
    # The ε that puts the floor exactly at a target.
    for n, t in [(10, 0.01), (100, 0.01), (1000, 0.001)]:
        assert fpir_floor(n, epsilon_label_for(n, t)) == pytest.approx(t)
    for bad in [{"enrolled": 0, "epsilon_label": 8.0}, {"enrolled": 10, "epsilon_label": 0.0},
                {"enrolled": 10, "epsilon_label": 8.0, "fnir": 1.5}]:  # fmt: skip
        with pytest.raises(ValueError):
            fpir_floor(**bad)
    with pytest.raises(ValueError, match="fpir"):
        epsilon_label_for(10, 0.0)
