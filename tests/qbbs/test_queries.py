"""The permissible query structure: exact recovery, sensitivity, noise scale, refused shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.core.exceptions import PrivacyLeakWarning, UnsafeFeatureError
from peep.server.config.qbbs import DEFAULT_TRAITS
from peep.server.qbbs import QbbsConfig, QueryPlan, QueryShapeError, QueryStructureChangedError, SumQuery
from peep.server.qbbs.queries import sensitivity


@pytest.mark.parametrize("pairs", [1, 2, 3])
def test_query_structure_recovers_exact_values_without_noise(pairs, rng):
    plan = QueryPlan(pairs=pairs, partitions=4, salt="t")
    subjects = [f"id{i:03d}" for i in range(57)]
    values = rng.uniform(140.0, 210.0, size=len(subjects)).round(1)
    for i in rng.choice(len(subjects), size=10, replace=False):
        r = plan.exact_responses("height", subjects[i], subjects, values)
        assert r.shape == (2 * pairs,)
        assert r[0] == pytest.approx(math.fsum(values))
        assert r[0] - r[1] == pytest.approx(values[i], abs=1e-9)
        assert plan.synthesise(r) == pytest.approx(values[i], abs=1e-9)
    many = plan.exact_responses_many(subjects, values, np.arange(len(subjects)))
    assert plan.synthesise_many(many) == pytest.approx(values, abs=1e-9)


def test_further_pairs_sum_over_the_claimed_subjects_public_group():
    plan = QueryPlan(pairs=2, partitions=3, salt="t")
    subjects = [f"p{i}" for i in range(30)]
    values = np.arange(30, dtype=float) + 20.0
    i = 7
    r = plan.exact_responses("age", subjects[i], subjects, values)
    g = plan.groups(subjects, 1)
    assert r[2] == pytest.approx(values[g == g[i]].sum())
    assert r[3] == pytest.approx(values[g == g[i]].sum() - values[i])
    # The group depends only on the public salt and the id, never on the data.
    assert plan.group("p7", 1) == QueryPlan(pairs=2, partitions=3, salt="t").group("p7", 1)
    assert 1 < len(set(g.tolist())) <= 3


def test_module_query_recovers_values_when_noise_is_negligible(make_module, people):
    module = make_module(epsilon=1e7, epsilon_cap=1e9)
    for name, traits in people.items():
        for trait, value in traits.items():
            r = module.query(name, trait)
            assert r.value == pytest.approx(value, abs=1e-3)
            assert r.responses == 2


def test_sensitivity_is_the_declared_range_or_the_chapters_database_extremes():
    spec = DEFAULT_TRAITS["age"]
    values = np.array([25.0, 31.0, 67.0])
    assert sensitivity(spec, values, "declared-range") == spec.upper - spec.lower == 72.0
    with pytest.warns(PrivacyLeakWarning, match="max/min"):
        assert sensitivity(spec, values, "database-extremes") == 42.0


@pytest.mark.parametrize("trait", ["age", "gender", "height", "weight"])
def test_noise_scale_matches_the_construction(make_module, trait):
    module = make_module(epsilon=0.5)
    spec = module.config.traits[trait]
    mech = module._mechanism(trait, spec.range)
    # Laplace scale Δf/ε (plus the secure sampler's grid inflation, < 2**-20 relative).
    assert mech.scale == pytest.approx(spec.range / 0.5, rel=2e-6)
    assert mech.is_secure
    r = module.query("alice", trait)
    assert r.sensitivity == spec.range
    # Net noise of Q1 - Q2: two independent Laplace(b) draws, variance 2 * 2b².
    assert r.noise_std == pytest.approx(math.sqrt(4.0) * spec.range / 0.5, rel=1e-5)


@pytest.mark.parametrize("m", [2, 4])
def test_empirical_net_noise_matches_its_stated_distribution(make_module, seeded, m):
    module = make_module(epsilon=2.0, epsilon_cap=1e9, queries_per_trait=m, random_state=3)
    b = DEFAULT_TRAITS["height"].range / 2.0
    phi = np.array([module.query("bob", "height").value - 181.5 for _ in range(3000)])
    pairs = m // 2
    assert abs(phi.mean()) < 4 * math.sqrt(4 * b * b / pairs / phi.size)
    assert phi.var() == pytest.approx(4 * b * b / pairs, rel=0.1)
    if pairs == 1:
        # The difference of two Laplace(b) draws has E|φ| = 3b/2.
        assert np.mean(np.abs(phi)) == pytest.approx(1.5 * b, rel=0.06)
    assert module.odometer("bob").epsilon_spent == pytest.approx(3000 * 2.0 * pairs)


def test_seeds_need_the_unsafe_feature(make_module):
    with pytest.raises(UnsafeFeatureError, match="seeded-noise"):
        make_module(random_state=1)


def test_other_query_shapes_are_refused(make_module):
    module = make_module()
    plan = module.plan
    good = plan.queries("age", "bob")
    assert module.execute(good).subject == "bob"
    bad_shapes = [
        [
            SumQuery(trait="age", scheme=0, group=None, exclude=None, aggregate="AVG"),
            SumQuery(trait="age", scheme=0, group=None, exclude="bob", aggregate="AVG"),
        ],
        [good[0], SumQuery(trait="age", scheme=0, group=None, exclude="bob"), *good[1:]],  # extra query
        [good[1], good[0]],  # reordered
        [SumQuery(trait="age", scheme=0, group=None, exclude="bob")],  # a single raw SUM
        [
            SumQuery(trait="age", scheme=1, group=0, exclude=None),  # a custom subject set
            SumQuery(trait="age", scheme=1, group=0, exclude="bob"),
        ],
        [good[0], SumQuery(trait="height", scheme=0, group=None, exclude="bob")],  # mixed traits
    ]
    spent = module.odometer("bob").epsilon_spent
    for shape in bad_shapes:
        with pytest.raises(QueryShapeError, match="fixed structure|SumQuery|excludes"):
            module.execute(shape)
    with pytest.raises(QueryShapeError):
        module.execute([("SELECT", "age", "bob")])
    assert module.odometer("bob").epsilon_spent == spent  # refusals release and spend nothing


def test_the_structure_is_fixed_once_subjects_are_enrolled(make_module, tmp_path):
    module = make_module(persist=True)
    module.close()
    with pytest.raises(QueryStructureChangedError, match="cannot change after enrolment"):
        make_module(persist=True, enrol=False, queries_per_trait=4)
    with pytest.raises(QueryStructureChangedError):
        make_module(
            persist=True,
            enrol=False,
            traits={**DEFAULT_TRAITS, "age": DEFAULT_TRAITS["age"].model_copy(update={"upper": 100.0})},
        )
    # The same structure reopens, and ε or the weights may change.
    again = make_module(persist=True, enrol=False, epsilon=3.0)
    assert again.n_subjects() == 5


def test_config_validates_the_structure():
    with pytest.raises(ValueError, match="even"):
        QbbsConfig(queries_per_trait=3)
    with pytest.raises(ValueError, match="queries_per_trait"):
        QbbsConfig(queries_per_trait=0)
    with pytest.raises(ValueError, match="epsilon_cap"):
        QbbsConfig(epsilon=2.0, epsilon_cap=1.0)
