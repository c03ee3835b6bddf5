"""Fusion (chapter Eq. 5.7), Gaussian likelihood, Parzen posterior (Eq. 5.5), weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.core.exceptions import NotFittedError
from peep.server.qbbs import (
    FaceScoreUnavailableError,
    ParzenScoreModel,
    QbbsConfig,
    StaticFaceScores,
    fused_score,
    gaussian_log_likelihood,
)

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _phi(z: float) -> float:
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def test_gaussian_log_likelihood_by_hand():
    # d = 2 cm, c = 5 cm: -(0.4²)/2 - ln 5 - ln √(2π)
    assert gaussian_log_likelihood(172.0, 170.0, 5.0) == pytest.approx(-0.08 - math.log(5) - LOG_SQRT_2PI)
    assert gaussian_log_likelihood(172.0, 170.0, 5.0) == pytest.approx(-2.6083764, abs=1e-7)
    out = gaussian_log_likelihood(np.array([1.0, 3.0]), np.array([1.0, 1.0]), 2.0)
    assert out == pytest.approx([-math.log(2) - LOG_SQRT_2PI, -0.5 - math.log(2) - LOG_SQRT_2PI])
    with pytest.raises(ValueError, match="width"):
        gaussian_log_likelihood(1.0, 1.0, 0.0)


def test_parzen_posterior_by_hand():
    model = ParzenScoreModel(prior=0.5, bandwidth=1.0).fit([0.0, -1.0], [-4.0, -6.0])
    p_g = 0.5 * (_phi(0.5) + _phi(0.5))
    p_i = 0.5 * (_phi(3.5) + _phi(5.5))
    assert model.log_posterior([-0.5])[0] == pytest.approx(math.log(p_g / (p_g + p_i)), abs=1e-6)
    assert model.log_posterior([-0.5])[0] == pytest.approx(-0.00123876, abs=1e-6)
    # A different prior moves it by Bayes' rule; outside the grid it is evaluated exactly.
    biased = ParzenScoreModel(prior=0.2, bandwidth=1.0).fit([0.0, -1.0], [-4.0, -6.0])
    assert biased.log_posterior([-0.5])[0] == pytest.approx(math.log(0.2 * p_g / (0.2 * p_g + 0.8 * p_i)), abs=1e-6)
    far = model.log_posterior([-30.0])[0]
    assert far == pytest.approx(math.log(1e-12))  # floored, never -inf
    with pytest.raises(NotFittedError):
        ParzenScoreModel().log_posterior([0.0])
    with pytest.raises(ValueError, match="genuine"):
        ParzenScoreModel().fit([1.0], [0.0, 1.0])


def test_parzen_posterior_separates_genuine_from_impostor(rng):
    g = rng.normal(0.0, 1.0, 400)
    i = rng.normal(-5.0, 1.5, 4000)
    model = ParzenScoreModel().fit(g, i)
    lp = np.exp(model.log_posterior([-6.0, -2.5, 1.0]))
    assert lp[0] < 0.01 < lp[1] < 0.99 < lp[2]


def test_fused_score_by_hand():
    g = fused_score(-0.2, {"age": -3.0, "height": -2.5}, {"face": 0.5, "age": 0.2, "height": 0.3})
    assert g == pytest.approx(0.5 * -0.2 + 0.2 * -3.0 + 0.3 * -2.5) == pytest.approx(-1.45)
    with pytest.raises(ValueError, match="summing to 1"):
        fused_score(-0.2, {"age": -3.0}, {"face": 0.5, "age": 0.2})
    with pytest.raises(ValueError, match=">= 0"):
        fused_score(-0.2, {"age": -3.0}, {"face": 1.5, "age": -0.5})


def test_module_fusion_equals_a_hand_computed_example(make_module):
    # shared-noise (the chapter): Y*' - Y' = Y* - Y, so the fused score is deterministic.
    module = make_module(
        verification_transform="shared-noise",
        weights={"face": 0.4, "age": 0.2, "gender": 0.1, "height": 0.2, "weight": 0.1},
    )
    module.use_face_model(ParzenScoreModel(prior=0.5, bandwidth=1.0).fit([0.0, -1.0], [-4.0, -6.0]))
    r = module.verify(claimed_subject="alice", face_score=-0.5, observed={"age": 40.0, "height": 171.0})
    # alice: age 34 (c = 8), height 168 (c = 5); weights renormalised over face, age, height: 0.5/0.25/0.25
    ll_age = -0.5 * (6 / 8) ** 2 - math.log(8) - LOG_SQRT_2PI
    ll_height = -0.5 * (3 / 5) ** 2 - math.log(5) - LOG_SQRT_2PI
    p_g, p_i = _phi(0.5), 0.5 * (_phi(3.5) + _phi(5.5))
    expected = 0.5 * math.log(p_g / (p_g + p_i)) + 0.25 * ll_age + 0.25 * ll_height
    assert r.fused_score == pytest.approx(expected, abs=1e-6)
    assert r.fused_score == pytest.approx(-1.4976210, abs=1e-6)
    assert [(t.trait, t.weight) for t in r.traits] == [("age", 0.25), ("height", 0.25)]
    assert r.traits[0].log_likelihood == pytest.approx(ll_age)
    assert r.face_weight == 0.5 and r.epsilon_spent == 2.0


def test_a_fixed_threshold_is_the_decision_boundary(make_module):
    # A claim with face posterior 0.5 and each trait 2 widths off, by hand (shared-noise: deterministic);
    # fallback weights 0.6 / 0.1 per trait renormalised over face, age, height: 0.75 / 0.125 / 0.125.
    on_score = (
        0.75 * math.log(0.5) + 0.125 * (-2.0 - math.log(8) - LOG_SQRT_2PI) + 0.125 * (-2.0 - math.log(5) - LOG_SQRT_2PI)
    )
    module = make_module(verification_transform="shared-noise", threshold=on_score - 1e-9)
    module.use_face_model(ParzenScoreModel(prior=0.5, bandwidth=1.0).fit([1.0, 2.0], [-1.0, -2.0]))
    at_half = 0.0  # midway between the two symmetric densities: P(genuine | 0) = 0.5
    assert module.face_model().log_posterior([at_half])[0] == pytest.approx(math.log(0.5))
    on = module.verify(claimed_subject="bob", face_score=at_half, observed={"age": 52.0 + 16.0, "height": 181.5 - 10})
    assert on.fused_score == pytest.approx(on_score, abs=1e-9) and on.threshold == on_score - 1e-9
    assert on.accepted and on.calibration is None
    off = module.verify(claimed_subject="bob", face_score=at_half, observed={"age": 52.0 + 17.0, "height": 181.5 - 10})
    assert off.fused_score < off.threshold and not off.accepted


def test_independent_transform_widens_the_likelihood_by_the_net_noise(make_module):
    # Fixed weights: the toy face scores separate perfectly, so a calibration would give the trait
    # weight 0 and the module would (rightly) not query it.
    module = make_module(epsilon=4.0, weights={"face": 0.6, "age": 0.1, "gender": 0.1, "height": 0.1, "weight": 0.1})
    module.use_face_model(ParzenScoreModel().fit([0.0, -1.0, -0.5], [-4.0, -6.0, -5.0]))
    r = module.verify(claimed_subject="dave", face_score=-0.3, observed={"weight": 81.0})
    b = 120.0 / 4.0
    (t,) = r.traits
    assert t.width == pytest.approx(math.sqrt(6.0**2 + 4 * b * b), rel=1e-5)
    assert t.log_likelihood <= -math.log(t.width) - LOG_SQRT_2PI
    assert module.effective_width("weight") == pytest.approx(t.width)


def test_weights_must_sum_to_one_and_cover_face_and_traits():
    with pytest.raises(ValueError, match="summing to 1"):
        QbbsConfig(weights={"face": 0.5, "age": 0.1, "gender": 0.1, "height": 0.1, "weight": 0.1})
    with pytest.raises(ValueError, match="exactly the keys"):
        QbbsConfig(weights={"face": 0.6, "age": 0.4})
    with pytest.raises(ValueError, match=">= 0"):
        QbbsConfig(weights={"face": 1.2, "age": -0.2, "gender": 0.0, "height": 0.0, "weight": 0.0})


def test_verification_needs_a_face_score_provider(make_module):
    module = make_module()
    with pytest.raises(FaceScoreUnavailableError, match="face-score provider"):
        module.verify(claimed_subject="bob", face_score=0.0, observed={"age": 50.0})
    assert module.odometer("bob").epsilon_spent == 0.0


def test_provider_validation_scores_fit_the_parzen_model_and_refit_on_a_new_version(make_module):
    faces = StaticFaceScores({"bob": -0.2}, genuine=[0.0, -0.5, -1.0], impostor=[-5.0, -6.0, -7.0], model_version="v1")
    module = make_module(face_scores=faces)
    first = module.face_model()
    assert first.n_genuine_ == 3 and module.face_model() is first
    faces.model_version = "v2"
    assert module.face_model() is not first
    r = module.verify_template(claimed_subject="bob", values=np.zeros(4, np.float32), observed={})
    assert r.face_score == -0.2 and r.traits == () and r.epsilon_spent == 0.0
    assert r.fused_score == pytest.approx(float(module.face_model().log_posterior([-0.2])[0]))
