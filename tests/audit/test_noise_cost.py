"""Swapping a part of a fitted linear discriminant (the audit's "where the noise costs FNIR" rows)."""

from __future__ import annotations

import numpy as np
import pytest
from peep.lab.audit.noise_cost import lda_parts, noise_cost_models, with_lda_parts
from peep.server.recognition.fitting import fit_recogniser
from peep.server.recognition.presets import PRESETS


def _fit(X: np.ndarray, subjects: list[str], preset: str = "lda"):
    return fit_recogniser(
        X.astype(np.float32), subjects, preset=PRESETS[preset], background_prefix="background:",
        validation_fraction=0.25, target_far=0.01, identify_far=0.01, min_templates_per_subject=2, random_state=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def clean_and_noisy():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 8))
    people = np.repeat(np.arange(6), 20)
    clean = centres[people] + 0.3 * rng.normal(size=(people.size, 8))
    noisy = clean + 1.5 * rng.normal(size=clean.shape)
    subjects = [f"background:{p}" if p >= 4 else f"s{p}" for p in people]
    return _fit(clean, subjects), _fit(noisy, subjects), clean, people


def test_a_model_given_its_own_parts_decides_as_it_did(clean_and_noisy) -> None:
    _, noisy, X, _ = clean_and_noisy
    _, means, cov, _ = lda_parts(noisy)
    again = with_lda_parts(noisy, means, cov)
    np.testing.assert_allclose(again.predict_proba(X), noisy.predict_proba(X), atol=1e-6)
    assert again is not noisy and again.pipeline is not noisy.pipeline  # the served model is left as it was


def test_both_parts_from_the_clean_model_decide_as_the_clean_model(clean_and_noisy) -> None:
    clean, noisy, X, _ = clean_and_noisy
    _, means, cov, _ = lda_parts(clean)
    both = with_lda_parts(noisy, means, cov)
    np.testing.assert_allclose(both.predict_proba(X), clean.predict_proba(X), atol=1e-6)
    swapped = noise_cost_models(noisy, clean)
    assert set(swapped) == {"clean_means", "clean_covariance"}
    # each swap changes the served model's decisions (the parts differ), and not into the clean model's
    for hybrid in swapped.values():
        P = hybrid.predict_proba(X)
        assert not np.allclose(P, noisy.predict_proba(X), atol=1e-3)
        assert not np.allclose(P, clean.predict_proba(X), atol=1e-3)


def test_a_model_that_is_no_discriminant_has_no_parts_to_swap(clean_and_noisy) -> None:
    clean, _, X, people = clean_and_noisy
    subjects = [f"background:{p}" if p >= 4 else f"s{p}" for p in people]
    logreg = _fit(X, subjects, preset="logreg")
    assert lda_parts(logreg) is None and noise_cost_models(logreg, clean) == {}
    with pytest.raises(ValueError, match="LinearDiscriminantAnalysis"):
        with_lda_parts(logreg, np.zeros((5, 8)), np.eye(8))
