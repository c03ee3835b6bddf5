"""The fused decision calibrated to a target FAR, from public information only (never the soft-trait store)."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
from peep.lab.qbbs.anthropometry import synthetic_anthropometry
from peep.server.config.qbbs import Anthropometry, PopulationPrior
from peep.server.qbbs import (
    ObservationNoise,
    ParzenScoreModel,
    QbbsConfig,
    QbbsError,
    StaticFaceScores,
)
from peep.server.qbbs.calibration import (
    POPULATION,
    Calibration,
    TraitTerm,
    anthropometry,
    binary_error_rate,
    far_threshold,
    flip_probability,
    sample_population,
    simulate_claims,
)

GENUINE = (-0.5, 0.6)  # face-score distributions (mean, sd): overlapping, so the face alone is not enough
IMPOSTOR = (-2.5, 1.0)


def _faces(rng: np.random.Generator, version: str = "v1", impostor: tuple[float, float] = IMPOSTOR) -> StaticFaceScores:
    return StaticFaceScores(
        {},
        genuine=rng.normal(*GENUINE, 400),
        impostor=rng.normal(*impostor, 4000),
        model_version=version,
    )


def _observe(value: float, spec: Any, rng: np.random.Generator) -> float:
    """An observation as the deployment's sensors would make it (the width is the measurement error)."""
    if spec.kind == "binary":
        return 1.0 - value if rng.random() < binary_error_rate(spec.width) else value
    return float(np.clip(value + rng.normal(0.0, spec.width), spec.lower, spec.upper))


def test_far_threshold_accepts_at_most_the_target_share_of_impostors():
    imp = np.arange(1000, dtype=np.float64)  # distinct scores 0..999
    t = far_threshold(imp, 0.01)
    assert np.sum(imp >= t) == 10 and 989.0 < t <= 990.0
    ties = np.array([0.0, 1.0, 1.0, 1.0, 2.0])
    assert np.mean(ties >= far_threshold(ties, 0.4)) == 0.2  # a tie is never split above the target
    assert far_threshold(ties, 1.0) == -math.inf


def test_observation_noise_variances():
    assert ObservationNoise.edge_laplace(bound=100.0, epsilon=2.0).variance == pytest.approx(2 * 50.0**2)
    p = flip_probability(1.0)
    assert p == pytest.approx(1 / (1 + math.e))
    assert ObservationNoise.randomized_response(epsilon=1.0).variance == pytest.approx(p * (1 - p))
    assert ObservationNoise.gaussian(4.0).variance == 4.0
    with pytest.raises(ValueError, match="epsilon"):
        ObservationNoise.edge_laplace(bound=100.0, epsilon=0.0)
    with pytest.raises(ValueError, match="variance"):
        ObservationNoise.gaussian(math.nan)
    # the width's mismatch penalty 1/(2c²) is the log-odds of the binary measurement error
    assert math.log((1 - binary_error_rate(0.5)) / binary_error_rate(0.5)) == pytest.approx(2.0)


@pytest.mark.slow
def test_calibrated_far_holds_for_claims_verified_through_the_module(make_module, seeded):
    """Real store, plan, mechanism and matcher: impostor claims pass at about target_far, genuine ones far more."""
    rng = np.random.default_rng(20240611)
    target = 0.05
    module = make_module(
        enrol=False,
        random_state=7,
        face_scores=_faces(rng),
        epsilon=20.0,  # informative traits, so the calibration has weights to choose
        epsilon_cap=1e9,
        target_far=target,
    )
    specs = module.config.traits
    people = sample_population(specs, 300, rng)  # the public population model is the truth here
    ids = [f"p{i:03d}" for i in range(300)]
    for i, s in enumerate(ids):
        module.enrol(s, {t: float(people[t][i]) for t in specs})

    def claim(claimed: int, presenter: int, face: tuple[float, float]) -> Any:
        observed = {t: _observe(float(people[t][presenter]), specs[t], rng) for t in specs}
        return module.verify(claimed_subject=ids[claimed], face_score=float(rng.normal(*face)), observed=observed)

    n_imp, n_gen = 2000, 400
    impostors = []
    for _ in range(n_imp):
        c, p = rng.choice(300, size=2, replace=False)
        impostors.append(claim(int(c), int(p), IMPOSTOR))
    genuine = [claim(int(c), int(c), GENUINE) for c in rng.integers(0, 300, n_gen)]

    cal = module.calibration_
    assert isinstance(cal, Calibration) and cal.weights_chosen and cal.observed == tuple(specs)
    assert all(r.calibration is cal and r.threshold == cal.threshold for r in impostors + genuine)
    assert cal.simulated_far <= target and cal.simulated_far == pytest.approx(target, abs=0.002)
    far = np.mean([r.accepted for r in impostors])
    gar = np.mean([r.accepted for r in genuine])
    # binomial sd of the FAR over 2000 claims is 0.005; the calibration's own Monte-Carlo error 0.002
    assert far == pytest.approx(target, abs=0.02)
    assert gar == pytest.approx(cal.simulated_gar, abs=0.08)
    assert gar > 0.5 > 5 * far
    # the traits earn their weight: face + traits beats the face alone at the same FAR
    assert cal.weights["face"] < 1.0
    face_alone = module.calibration(observed=[])
    assert face_alone.weights == {"face": 1.0} and cal.simulated_gar > face_alone.simulated_gar + 0.1
    used = [t for t in specs if cal.weights[t] > 0]
    for r in impostors[:50]:
        assert r.accepted == (r.fused_score >= r.threshold)
        assert r.face_weight == cal.weights["face"] and [t.weight for t in r.traits] == [cal.weights[t] for t in used]
        assert r.epsilon_spent == len(used) * module.config.epsilon_per_value


@pytest.mark.parametrize(
    "population",
    [{}, {"male_fraction": 0.0, "age_mean": 40.0, "age_sd": 9.0, "impostor_model": "same-gender"}],
    ids=["default-population", "declared-population"],
)
def test_the_calibration_never_reads_the_store_nor_spends(make_module, rng, population):
    faces = _faces(rng)
    empty = make_module(enrol=False, face_scores=faces, population=population)
    full = make_module(face_scores=faces, population=population)  # five people with very different traits
    a, b = empty.calibration(), full.calibration()
    assert (a.threshold, dict(a.weights), a.simulated_far, a.simulated_gar) == (
        b.threshold,
        dict(b.weights),
        b.simulated_far,
        b.simulated_gar,
    )

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner, self.touched = inner, []

        def __getattr__(self, name: str) -> Any:
            self.touched.append(name)
            return getattr(self.inner, name)

    spy = Spy(full._soft_trait_store)
    full._soft_trait_store = spy
    try:
        full.recalibrate()
        full.calibration(observed=["age", "height"], observed_noise={"age": ObservationNoise.gaussian(25.0)})
    finally:
        full._soft_trait_store = spy.inner
    assert spy.touched == []
    assert all(full.odometer(s).epsilon_spent == 0.0 for s in ("alice", "bob", "carol", "dave", "erin"))


def test_the_calibration_rng_is_not_the_mechanisms_noise(make_module, rng):
    # No seeded-noise feature: the module's mechanisms keep the secure sampler while the
    # calibration, seeded with a public constant, is reproducible.
    faces = _faces(rng)
    one, two = make_module(face_scores=faces), make_module(face_scores=faces)
    assert one.calibration().threshold == two.calibration().threshold
    assert one.is_secure and all(m.is_secure for m in one._mechanisms.values())
    assert one.query("bob", "age").value != two.query("bob", "age").value


def test_an_explicit_threshold_is_respected_and_nothing_is_calibrated(make_module, rng):
    module = make_module(face_scores=_faces(rng), threshold=-1.25)
    r = module.verify(claimed_subject="bob", face_score=-0.4, observed={"height": 180.0})
    assert r.threshold == -1.25 and r.calibration is None
    assert r.accepted == (r.fused_score >= -1.25)
    assert module.calibrations_ == [] and module.calibration_ is None and module.recalibrate() == []
    with pytest.raises(QbbsError, match="fixed at -1.25"):
        module.calibration()
    # fallback weights 0.6 / 0.1 per trait, renormalised over the face and height
    assert r.face_weight == pytest.approx(0.6 / 0.7) and r.traits[0].weight == pytest.approx(0.1 / 0.7)


def test_configured_weights_are_kept_and_only_the_threshold_is_calibrated(make_module, rng):
    weights = {"face": 0.5, "age": 0.2, "gender": 0.1, "height": 0.1, "weight": 0.1}
    module = make_module(face_scores=_faces(rng), weights=weights)
    cal = module.calibration(observed=["age", "height"])
    assert not cal.weights_chosen
    assert dict(cal.weights) == pytest.approx({"face": 0.625, "age": 0.25, "height": 0.125})
    r = module.verify(claimed_subject="bob", face_score=-0.4, observed={"age": 50.0, "height": 180.0})
    assert r.calibration == cal and r.face_weight == pytest.approx(0.625)


def test_recalibrated_when_the_face_model_changes(make_module, rng, caplog):
    caplog.set_level(logging.INFO, logger="peep.server.qbbs.module")
    faces = _faces(rng, "v1")
    module = make_module(face_scores=faces)
    noise = {"age": ObservationNoise.edge_laplace(bound=100.0, epsilon=1.0)}
    first = module.verify(claimed_subject="bob", face_score=-1.0, observed={"age": 50.0}, observed_noise=noise)
    second = module.verify(claimed_subject="bob", face_score=-1.0, observed={"age": 60.0}, observed_noise=noise)
    assert second.calibration is first.calibration  # cached per claim shape and face model
    assert first.calibration is not None and first.calibration.model_version == "v1"
    assert first.calibration.noise == noise

    # a promoted model whose impostors score higher: the same threshold would accept more of them
    promoted = _faces(rng, "v2", impostor=(-1.5, 1.0))
    faces._genuine, faces._impostor, faces.model_version = promoted._genuine, promoted._impostor, "v2"
    again = module.recalibrate()
    assert [c.model_version for c in again] == ["v2"] and again[0].observed == ("age",)
    assert again[0].threshold != first.calibration.threshold
    assert module.calibrations_ == again
    third = module.verify(claimed_subject="bob", face_score=-1.0, observed={"age": 50.0}, observed_noise=noise)
    assert third.calibration is again[0] and third.threshold == again[0].threshold
    logged = [r for r in caplog.records if r.getMessage().startswith("QBBS: fused threshold calibrated")]
    assert [r.calibration["model_version"] for r in logged] == ["v1", "v2"]
    assert logged[-1].calibration["simulated_far"] <= module.config.target_far


def test_a_calibration_failure_spends_nothing(make_module):
    module = make_module(weights={"face": 0.0, "age": 1.0, "gender": 0.0, "height": 0.0, "weight": 0.0})
    module.use_face_model(ParzenScoreModel().fit([0.0, -1.0, -0.5], [-4.0, -6.0, -5.0]))
    with pytest.raises(QbbsError, match="all have weight 0"):
        module.verify(claimed_subject="bob", face_score=-0.2, observed={"height": 180.0})
    assert module.odometer("bob").epsilon_spent == 0.0


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"target_far": 0.0}, "target_far"),
        ({"target_far": 0.6}, "target_far"),
        ({"target_far": 0.001, "calibration_claims": 10_000}, r"calibration_claims: expected at least 20 / target_far"),
        ({"sensitivity": "database-extremes"}, "fixed threshold with sensitivity = 'database-extremes'"),
    ],
)
def test_calibration_settings_are_validated(fields, match):
    with pytest.raises(ValueError, match=match):
        QbbsConfig(**fields)
    if "sensitivity" in fields:
        assert QbbsConfig(**fields, threshold=-2.0).threshold == -2.0


# --------------------------------------------------------------------------- the declared population


def test_the_default_population_is_the_general_model_the_evaluation_uses():
    prior = PopulationPrior()
    assert (prior.male_fraction, prior.age_mean, prior.impostor_model) == (0.5, None, "independent")
    assert prior.describe() == POPULATION and "age uniform" in POPULATION and "impostors: independent" in POPULATION
    male = (np.arange(1000) % 3 == 0).astype(np.float64)
    ours = anthropometry(male, female_params=prior.female, male_params=prior.male, seed=77)
    theirs = synthetic_anthropometry(male, seed=77)  # the evaluation's synthetic height and weight
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_the_declared_population_is_what_is_simulated():
    specs = QbbsConfig().traits
    site = PopulationPrior(
        male_fraction=1.0,
        age_mean=30.0,
        age_sd=4.0,
        male=Anthropometry(height_mean=185.0, height_sd=5.0, weight_mean=80.0, weight_sd=8.0),
    )
    people = sample_population(specs, 20_000, np.random.default_rng(3), site)
    assert np.all(people["gender"] == 1.0)
    for trait, mean, sd in (("age", 30.0, 4.0), ("height", 185.0, 5.0), ("weight", 80.0, 8.0)):
        assert np.mean(people[trait]) == pytest.approx(mean, abs=0.05 * sd), trait  # standard error 0.007 sd
        assert np.std(people[trait]) == pytest.approx(sd, rel=0.05), trait
    general = sample_population(specs, 20_000, np.random.default_rng(3))
    assert np.mean(general["gender"]) == pytest.approx(0.5, abs=0.015)
    assert np.mean(general["age"]) == pytest.approx((18.0 + 90.0) / 2, abs=0.6)  # uniform over the declared range


@pytest.mark.slow
def test_a_declared_site_population_restores_the_target_far(make_module, seeded):
    """At a site of young men only, impostors resemble the claimed person more than a general population.

    The truth here is the site's population; the same impostor claims go through a module calibrated on
    the default population and one calibrated on the site's declared prior (real store, mechanism, matcher).
    """
    rng = np.random.default_rng(20240612)
    target = 0.05
    site = {"male_fraction": 1.0, "age_mean": 30.0, "age_sd": 4.0}
    faces = _faces(rng)
    specs = QbbsConfig().traits
    people = sample_population(specs, 300, rng, PopulationPrior(**site))
    ids = [f"p{i:03d}" for i in range(300)]
    claims = []
    for _ in range(2000):
        c, p = rng.choice(300, size=2, replace=False)
        observed = {t: _observe(float(people[t][p]), specs[t], rng) for t in specs}
        claims.append((ids[int(c)], float(rng.normal(*IMPOSTOR)), observed))
    far = {}
    for name, population in (("general", {}), ("declared", site)):
        module = make_module(
            enrol=False,
            random_state=7,
            face_scores=faces,
            epsilon=20.0,
            epsilon_cap=1e9,
            target_far=target,
            population=population,
        )
        for i, s in enumerate(ids):
            module.enrol(s, {t: float(people[t][i]) for t in specs})
        far[name] = np.mean([module.verify(claimed_subject=c, face_score=f, observed=o).accepted for c, f, o in claims])
        assert module.calibration_ is not None and module.calibration_.simulated_far <= target
        assert module.calibration_.population == PopulationPrior(**population).describe()
    # binomial sd of each FAR over 2000 claims is 0.005
    assert far["general"] > target + 0.025
    assert far["declared"] == pytest.approx(target, abs=0.015)


def _true_far(module: Any, observed: list[str], truth: PopulationPrior) -> float:
    """FAR of the module's calibrated decision on impostors drawn from ``truth`` (large vectorised simulation)."""
    cal = module.calibration(observed)
    terms = module._trait_terms(list(cal.observed), {})
    _, impostor = simulate_claims(module.face_model(), terms, 200_000, np.random.default_rng(5), truth)
    w = np.array([cal.weights[k] for k in ("face", *cal.observed)])
    return float(np.mean(w @ impostor >= cal.threshold))


def test_same_gender_impostors_are_conservative(make_module, rng):
    """Without declaring the site's gender, ``impostor_model = "same-gender"`` holds the FAR at one-gender sites."""
    faces, target, observed = _faces(rng), 0.05, ["gender", "height", "weight"]
    modules = {
        model: make_module(
            enrol=False, face_scores=faces, epsilon=20.0, target_far=target, population={"impostor_model": model}
        )
        for model in ("independent", "same-gender")
    }
    # the calibration's own Monte-Carlo error is sqrt(0.05 / 20000) = 0.0016; these simulations' 0.0005
    for male_fraction in (1.0, 0.0):  # a men-only and a women-only site
        truth = PopulationPrior(male_fraction=male_fraction)
        assert _true_far(modules["independent"], observed, truth) > target + 0.01
        assert _true_far(modules["same-gender"], observed, truth) <= target + 0.005
    mixed = PopulationPrior()
    assert _true_far(modules["independent"], observed, mixed) == pytest.approx(target, abs=0.005)
    assert _true_far(modules["same-gender"], observed, mixed) <= target


def test_same_gender_impostors_share_the_claimed_persons_gender(rng):
    # A near-exact binary observation (error rate 1/(1 + e^12.5)) and no query noise: the likelihood shows
    # whether the presenter's gender differs from the claimed person's.
    spec = QbbsConfig().traits["gender"].model_copy(update={"width": 0.2})
    term = TraitTerm(name="gender", spec=spec, width=0.2, response_scale=1.0, pairs=1, shared_noise=True)
    parzen = ParzenScoreModel().fit(rng.normal(*GENUINE, 50), rng.normal(*IMPOSTOR, 50))

    def mismatches(population: PopulationPrior) -> float:
        genuine, impostor = simulate_claims(parzen, [term], 20_000, np.random.default_rng(1), population)
        match = genuine[1].max()
        assert np.mean(genuine[1] < match - 1.0) < 0.001
        return float(np.mean(impostor[1] < match - 1.0))

    assert mismatches(PopulationPrior()) == pytest.approx(0.5, abs=0.015)
    assert mismatches(PopulationPrior(impostor_model="same-gender")) < 0.001
    assert mismatches(PopulationPrior(male_fraction=0.9)) == pytest.approx(2 * 0.9 * 0.1, abs=0.01)


@pytest.mark.parametrize(
    ("population", "match"),
    [
        ({"male_fraction": 1.5}, "male_fraction"),
        ({"age_mean": 40.0}, "age_mean/age_sd: expected both or neither"),
        ({"age_sd": 5.0}, "age_mean/age_sd: expected both or neither"),
        ({"age_mean": 40.0, "age_sd": 0.0}, "age_sd"),
        ({"age_mean": 120.0, "age_sd": 5.0}, r"population.age_mean: expected a value in the age trait's declared"),
        ({"impostor_model": "same-age"}, "impostor_model"),
        ({"male": {"height_mean": 180.0}}, "height_sd"),  # a gender's table is given whole
        ({"median_age": 40.0}, "median_age"),
    ],
)
def test_the_population_prior_is_validated(population, match):
    with pytest.raises(ValueError, match=match):
        QbbsConfig(population=population)


def test_an_age_prior_needs_an_age_trait():
    traits = {"height": QbbsConfig().traits["height"]}
    with pytest.raises(ValueError, match="expected a continuous 'age' trait"):
        QbbsConfig(traits=traits, population={"age_mean": 40.0, "age_sd": 5.0})
    assert QbbsConfig(traits=traits, population={"male_fraction": 0.2}).population.male_fraction == 0.2


def test_the_documented_anthropometry_defaults_are_the_model():
    # the configuration reference shows the first docstring line of [population.female] / [population.male]
    first_line = (Anthropometry.__doc__ or "").splitlines()[0]
    for gender in ("female", "male"):
        a = getattr(PopulationPrior(), gender)
        assert f"{gender} {a.height_mean:g}±{a.height_sd:g} cm, {a.weight_mean:g}±{a.weight_sd:g} kg" in first_line
