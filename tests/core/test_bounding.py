from __future__ import annotations

import numpy as np
import pytest
from peep.core.bounding import BundleBounds, CoordinateScaler, clip_box, clip_l1, clip_l2, fit_bundle_bounds


def test_scaler_maps_fit_range_to_unit_box_and_clips(rng):
    Y = rng.normal(size=(200, 6)) * np.arange(1, 7)
    s = CoordinateScaler().fit(Y)
    Z = s.transform(Y)
    np.testing.assert_allclose(Z.min(0), 0.0)
    np.testing.assert_allclose(Z.max(0), 1.0)
    outside = s.transform(Y * 10)
    assert outside.min() == 0.0 and outside.max() == 1.0
    np.testing.assert_allclose(s.inverse_transform(Z), Y, atol=1e-12)


def test_scaler_from_bounds_rejects_empty_ranges():
    with pytest.raises(ValueError, match="upper: expected upper > lower"):
        CoordinateScaler.from_bounds([0.0, 1.0], [1.0, 1.0])


@pytest.mark.parametrize("radius", [0.5, 2.0, 10.0])
def test_l2_and_l1_clipping_bound_norms_and_keep_direction(rng, radius):
    Y = rng.normal(size=(100, 16)) * 3
    C2 = clip_l2(Y, radius)
    assert np.all(np.linalg.norm(C2, axis=1) <= radius * (1 + 1e-12))
    inside = np.linalg.norm(Y, axis=1) <= radius
    np.testing.assert_array_equal(C2[inside], Y[inside])
    cos = np.sum(C2 * Y, axis=1) / (np.linalg.norm(C2, axis=1) * np.linalg.norm(Y, axis=1))
    np.testing.assert_allclose(cos, 1.0)
    C1 = clip_l1(Y, radius)
    assert np.all(np.abs(C1).sum(axis=1) <= radius * (1 + 1e-12))
    np.testing.assert_array_equal(clip_l2(np.zeros(4), 1.0), np.zeros(4))


def test_clip_box():
    np.testing.assert_array_equal(clip_box([[-5.0, 0.5, 9.0]], [0, 0, 0], [1, 1, 1]), [[0.0, 0.5, 1.0]])


def test_fit_bundle_bounds_roundtrip(rng):
    Y = rng.normal(size=(500, 8))
    b = fit_bundle_bounds(Y, radius_quantile=0.9)
    np.testing.assert_array_equal(b.lower, Y.min(0))
    assert b.radius_l2 == pytest.approx(np.quantile(np.linalg.norm(Y, axis=1), 0.9))
    assert np.mean(np.linalg.norm(Y, axis=1) <= b.radius_l2) == pytest.approx(0.9, abs=0.01)
    again = BundleBounds.from_dict(b.to_dict())
    np.testing.assert_array_equal(again.upper, b.upper)
    assert again.radius_l1 == b.radius_l1
    with pytest.raises(ValueError, match="radius_l2: expected > 0"):
        BundleBounds(lower=b.lower, upper=b.upper, radius_l2=0.0, radius_l1=1.0)
    with pytest.raises(ValueError, match="radius_quantile"):
        fit_bundle_bounds(Y, radius_quantile=0.0)
