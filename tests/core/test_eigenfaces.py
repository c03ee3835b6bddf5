from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from peep.core.eigenface_model import EigenfaceModel
from peep.core.exceptions import NotFittedError
from peep.core.statistics import FaceStatistics, merge_all


@pytest.mark.slow
def test_gram_method_matches_svd_on_lfw(lfw100):
    X = lfw100.X.astype(np.float64)
    gram = EigenfaceModel(n_components=64, method="gram").fit(X)
    svd = EigenfaceModel(n_components=64, method="svd").fit(X)
    angles = scipy.linalg.subspace_angles(gram.components_.T, svd.components_.T)
    assert angles.max() < 1e-6
    np.testing.assert_allclose(gram.explained_variance_, svd.explained_variance_, rtol=1e-8)
    # Signs are fixed, so the eigenfaces themselves agree, not just the span.
    np.testing.assert_allclose(gram.components_, svd.components_, atol=1e-6)


def test_components_orthonormal_and_variance_decreasing(lfw100):
    m = EigenfaceModel(n_components=128).fit(lfw100.X)
    np.testing.assert_allclose(m.components_ @ m.components_.T, np.eye(128), atol=1e-9)
    assert np.all(np.diff(m.explained_variance_) <= 1e-12)
    assert 0.8 < m.explained_variance_ratio_.sum() < 1.0
    assert m.n_features_in_ == 62 * 47 and m.n_components_ == 128


@pytest.mark.slow
def test_transform_inverse_transform_is_projection(lfw100):
    X = lfw100.X.astype(np.float64)
    m = EigenfaceModel(n_components=128).fit(X)
    Y = m.transform(X)
    R = m.inverse_transform(Y)
    # Projecting a reconstruction again gives the same coefficients.
    np.testing.assert_allclose(m.transform(R), Y, atol=1e-8)
    # With all components the reconstruction is exact.
    full = EigenfaceModel(n_components=X.shape[0] - 1).fit(X[: X.shape[0]])
    np.testing.assert_allclose(full.inverse_transform(full.transform(X)), X, atol=1e-6)
    # Truncation loses what the discarded components held, and only that.
    err = np.mean((R - X) ** 2)
    assert 0 < err < np.mean((X - X.mean(0)) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3, 7])
def test_merged_partitions_give_centralised_eigenfaces_on_lfw(lfw100, k, rng):
    """PEEP Alg. 2: k partitions merged in random order == centralised (angle < 1e-6 rad)."""
    X = lfw100.X.astype(np.float64)
    central = EigenfaceModel(n_components=128, method="svd").fit(X)
    order = rng.permutation(X.shape[0])
    parts = [FaceStatistics.from_faces(X[idx]) for idx in np.array_split(order, k)]
    rng.shuffle(parts)
    merged = merge_all(parts)
    assert merged.count == X.shape[0]
    np.testing.assert_allclose(merged.mean, X.mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(merged.covariance(), np.cov(X, rowvar=False), atol=1e-10)
    distributed = EigenfaceModel.from_statistics(merged, n_components=128)
    angles = scipy.linalg.subspace_angles(distributed.components_.T, central.components_.T)
    assert angles.max() < 1e-6, angles.max()
    np.testing.assert_allclose(distributed.explained_variance_, central.explained_variance_, rtol=1e-7)


def test_merge_is_order_independent(rng):
    X = rng.normal(size=(60, 8))
    a, b, c = (FaceStatistics.from_faces(p) for p in np.array_split(X, 3))
    left = a.merge(b).merge(c)
    right = c.merge(a.merge(b))
    np.testing.assert_allclose(left.comoment, right.comoment, atol=1e-10)
    np.testing.assert_allclose(left.mean, right.mean, atol=1e-12)


def test_merge_rejects_mismatched_features(rng):
    a = FaceStatistics.from_faces(rng.normal(size=(5, 4)))
    b = FaceStatistics.from_faces(rng.normal(size=(5, 3)))
    with pytest.raises(ValueError, match="expected statistics over 4 features, received 3"):
        a.merge(b)
    with pytest.raises(ValueError, match="parts"):
        merge_all([])


@pytest.mark.parametrize(
    ("params", "X", "exc", "match"),
    [
        ({"n_components": 0}, np.ones((5, 4)), ValueError, "n_components: expected >= 1"),
        ({"n_components": 10}, np.arange(20.0).reshape(5, 4), ValueError, "n_components: expected <= 4"),
        ({"n_components": 2.5}, np.arange(20.0).reshape(5, 4), TypeError, "n_components: expected an integer"),
        ({"method": "magic"}, np.arange(20.0).reshape(5, 4), ValueError, "method: expected one of"),
        ({}, np.full((5, 4), np.nan), ValueError, "X: expected finite values, received NaN"),
        ({}, np.ones(4), ValueError, "X: expected a 2-d array"),
        ({"n_components": 1}, np.ones((1, 4)), ValueError, "at least 2 faces"),
    ],
)
def test_fit_validates(params, X, exc, match):
    with pytest.raises(exc, match=match):
        EigenfaceModel(**params).fit(X)


def test_transform_checks_fitted_and_width(rng):
    m = EigenfaceModel(n_components=2)
    with pytest.raises(NotFittedError, match="not fitted"):
        m.transform(np.ones((1, 3)))
    m.fit(rng.normal(size=(10, 3)))
    with pytest.raises(ValueError, match="expected 3 features"):
        m.transform(np.ones((1, 4)))
    with pytest.raises(ValueError, match="expected 2 features"):
        m.inverse_transform(np.ones((1, 3)))


def test_params_contract_works_with_sklearn_clone(rng):
    from sklearn.base import clone

    m = EigenfaceModel(n_components=3, method="svd").fit(rng.normal(size=(10, 5)))
    c = clone(m)
    assert c.get_params() == {"n_components": 3, "method": "svd"}
    assert not hasattr(c, "components_")
    assert repr(c) == "EigenfaceModel(n_components=3, method='svd')"
    with pytest.raises(ValueError, match="set_params: expected one of"):
        c.set_params(bogus=1)
