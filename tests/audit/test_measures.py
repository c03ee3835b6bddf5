"""Vectorised image metrics agree with scikit-image; classification helpers on known cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.lab.audit.measures import (
    classification_metrics,
    identity_mixture,
    majority_rate,
    membership_auc,
    psnr_batch,
    ssim_batch,
)
from skimage.metrics import peak_signal_noise_ratio, structural_similarity


@pytest.mark.parametrize("noise", [0.0, 0.05, 0.3])
def test_ssim_and_psnr_match_skimage_on_faces(lfw100, noise: float) -> None:
    rng = np.random.default_rng(3)
    a = lfw100.images[:6].astype(np.float64)
    b = np.clip(a + rng.normal(0, noise, a.shape), 0, 1) if noise else a[::-1].copy()
    ours = ssim_batch(a, b)
    ref = [structural_similarity(x, y, data_range=1.0) for x, y in zip(a, b, strict=True)]
    np.testing.assert_allclose(ours, ref, atol=1e-9)
    ours_p = psnr_batch(a, b)
    ref_p = [peak_signal_noise_ratio(x, y, data_range=1.0) for x, y in zip(a, b, strict=True)]
    np.testing.assert_allclose(ours_p, ref_p, atol=1e-9)


def test_identical_images_score_one_and_capped_psnr(lfw100) -> None:
    a = lfw100.images[:3]
    np.testing.assert_allclose(ssim_batch(a, a), 1.0)
    assert np.all(psnr_batch(a, a) == 100.0)


def test_ssim_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="equal shapes"):
        ssim_batch(np.zeros((2, 10, 10)), np.zeros((2, 10, 11)))


def test_classification_metrics_known_case() -> None:
    y = np.array([0, 0, 0, 1])
    p = np.array([0, 0, 1, 1])
    m = classification_metrics(y, p)
    assert m["accuracy"] == pytest.approx(0.75)
    assert m["balanced_accuracy"] == pytest.approx((2 / 3 + 1) / 2)
    # class 0: precision 1, recall 2/3; class 1: precision 1/2, recall 1; weights 3/4 and 1/4
    assert m["weighted_precision"] == pytest.approx(0.75 * 1 + 0.25 * 0.5)
    assert m["weighted_recall"] == pytest.approx(0.75)
    assert majority_rate(y) == pytest.approx(0.75)


def test_membership_auc_extremes() -> None:
    assert membership_auc([0.9, 0.8], [0.1, 0.2]) == pytest.approx(1.0)
    assert membership_auc([0.5, 0.5], [0.5, 0.5]) == pytest.approx(0.5)
    assert membership_auc([0.1], [0.9]) == pytest.approx(0.0)


def test_identity_mixture_certain_and_uninformed() -> None:
    y = np.array([0, 1, 2, 3, 0, 1])
    certain = np.eye(4)[y]
    m = identity_mixture(certain, y, prior=np.ones(4))
    assert m["mixture"] == pytest.approx(1.0)
    assert m["top_k"]["1"] == pytest.approx(1.0)
    assert m["kl_from_random"] == pytest.approx(math.log(4), rel=1e-6)
    uniform = np.full((6, 4), 0.25)
    u = identity_mixture(uniform, y, prior=np.ones(4))
    assert u["mixture"] == pytest.approx(0.25)
    assert u["kl_from_random"] == pytest.approx(0.0, abs=1e-12)
    assert u["top_k_random"]["2"] == pytest.approx(0.5)
    assert u["random_guess"] == pytest.approx(0.25)
