"""The fused decision calibrated to a target FAR, from public information only (never the soft-trait store)."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
from peep.server.qbbs import (
    ObservationNoise,
    ParzenScoreModel,
    QbbsConfig,
    QbbsError,
    StaticFaceScores,
)
from peep.server.qbbs.calibration import (
    Calibration,
    binary_error_rate,
    far_threshold,
    flip_probability,
    sample_population,
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


def test_the_calibration_never_reads_the_store_nor_spends(make_module, rng):
    faces = _faces(rng)
    empty = make_module(enrol=False, face_scores=faces)
    full = make_module(face_scores=faces)  # five people with very different traits
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
