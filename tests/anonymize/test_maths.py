"""The anonymisers' maths (pure functions) and the one anonymiser interface."""

from __future__ import annotations

import numpy as np
import pytest
from peep.core import features
from peep.lab.anonymize import maths
from peep.lab.anonymize.methods import (
    UPBA,
    AnonymiserError,
    DPPixel,
    KSamePixel,
    make_anonymiser,
    upba_basis,
)


@pytest.mark.parametrize(
    ("g", "t", "expected"), [(32, 0.6, (19, 13)), (10, 0.1, (1, 9)), (10, 1.0, (10, 0)), (1, 1.0, (1, 0))]
)
def test_purity_counts(g: int, t: float, expected: tuple[int, int]) -> None:
    assert maths.purity_counts(g, t) == expected


def test_random_sets_have_the_stated_purity_and_never_repeat_the_record(rng: np.random.Generator) -> None:
    attr = rng.integers(0, 3, size=200)
    members = maths.upba_random_sets(attr, attr, g=10, t=0.6, rng=rng, self_index=np.arange(200))
    assert members.shape == (200, 9)
    same = attr[members] == attr[:, None]
    assert (same[:, :5].all()) and not same[:, 5:].any()  # 6 of 10 share the value, d included
    assert not (members == np.arange(200)[:, None]).any()
    assert all(np.unique(row).size == 9 for row in members)


def test_random_sets_refuse_a_set_the_data_cannot_fill(rng: np.random.Generator) -> None:
    attr = np.array([0] * 20 + [1] * 3)
    with pytest.raises(ValueError, match=r"^g: expected a set size"):
        maths.upba_random_sets(attr, attr, g=10, t=0.5, rng=rng, self_index=np.arange(23))


def test_upba_output_is_algorithm_1(rng: np.random.Generator) -> None:
    X = rng.normal(size=(30, 8))
    members = rng.integers(0, 30, size=(30, 4))
    means = maths.set_means(X, X, members)
    np.testing.assert_allclose(means, (X + X[members].sum(axis=1)) / 5)
    mask = maths.retention_mask([np.arange(8.0), np.zeros(8)], [0.25, 0.0])
    assert mask.tolist() == [False] * 6 + [True] * 2
    w = 4.0
    np.testing.assert_allclose(maths.upba_mix(X, means, mask, w), means / w + (w - 1) / w * X * mask)


def test_pixelation_and_dp_pixelation(rng: np.random.Generator) -> None:
    imgs = rng.random((3, 10, 7))
    px = maths.pixelate(imgs, 4)
    assert px.shape == imgs.shape
    np.testing.assert_allclose(px[:, :4, :4], imgs[:, :4, :4].mean(axis=(1, 2))[:, None, None] * np.ones((1, 4, 4)))
    np.testing.assert_allclose(px[:, 8:, 4:], imgs[:, 8:, 4:].mean(axis=(1, 2))[:, None, None] * np.ones((1, 2, 3)))
    seen: list[float] = []

    def noise(values: np.ndarray, sensitivity: float) -> np.ndarray:
        seen.append(sensitivity)
        return values + 1.0

    out = maths.dp_pixelate(imgs, block=4, m=2, noise=noise)
    np.testing.assert_allclose(out, px + 1.0)
    assert sorted(seen) == sorted([2 / 16, 2 / 12, 2 / 8, 2 / 6])  # m / |cell| for every cell size


def test_k_same_groups_hold_at_least_k_faces(rng: np.random.Generator) -> None:
    X = rng.normal(size=(23, 5))
    groups = maths.k_same_groups(X, 5, rng.permutation(23))
    assert (groups >= 0).all() and np.bincount(groups).min() >= 5
    out = maths.k_same_pixel(X, groups)
    for g in np.unique(groups):
        np.testing.assert_allclose(
            out[groups == g], np.broadcast_to(X[groups == g].mean(axis=0), out[groups == g].shape)
        )


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"g": 32, "t": 0.01}, r"^t: expected a purity in \[1/g, 1\]"),
        ({"t": 1.5}, r"^t: expected a purity"),
        ({"g": 0}, r"^g: expected >= 1"),
        ({"r_p": 2.0}, r"^r_p: expected <= 1"),
        ({"w": 0.5}, r"^w: expected >= 1"),
        ({"representation": "wavelets"}, r"^representation: expected one of eigenfaces, pixels"),
    ],
)
def test_upba_validates_at_construction(params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        UPBA(**params)


def test_upba_refuses_g_larger_than_the_dataset_and_revalidates_set_params(rng: np.random.Generator) -> None:
    imgs = rng.random((12, 6, 5))
    attr = np.array([0, 1] * 6)
    with pytest.raises(
        AnonymiserError, match=r"^g: expected at most the number of records in the dataset \(12\), received 13"
    ):
        UPBA(g=13, t=0.5).fit(imgs, attr)
    u = UPBA(g=4, t=0.5, n_components=5, n_estimators=5, random_state=0)
    with pytest.raises(ValueError, match=r"^t: "):
        u.set_params(t=0.1)
    u.set_params(t=0.5, r_p=0.4)
    out = u.fit_transform(imgs, attr)
    assert out.images.shape == imgs.shape and out.features.shape == (12, 5) and out.representation == "eigenfaces"
    assert 0 <= out.images.min() and out.images.max() <= 1
    px = UPBA(g=4, t=0.5, w=2.0, r_p=1.0, representation="pixels", n_estimators=5, random_state=0).fit_transform(
        imgs, attr
    )
    assert px.features.shape == (12, 30)


def test_a_shared_upba_basis_gives_the_same_release_and_refuses_other_parameters(rng: np.random.Generator) -> None:
    imgs, attr, extra = rng.random((12, 6, 5)), np.array([0, 1] * 6), {"age": np.array([0, 1, 2] * 4)}
    seed = int(np.random.default_rng(3).integers(2**31 - 1))  # what UPBA(random_state=3) seeds its forests with
    basis = upba_basis(imgs, attr, extra, n_components=5, n_estimators=5, seed=seed)
    for g, w in ((4, 2.0), (6, 10.0)):  # the sweep: one basis, several (g, w)
        own = UPBA(g=g, t=0.5, w=w, r_p=0.4, n_components=5, n_estimators=5, random_state=3)
        shared = UPBA(g=g, t=0.5, w=w, r_p=0.4, n_components=5, n_estimators=5, random_state=3)
        a = own.fit_transform(imgs, attr, extra)
        b = shared.fit_transform(imgs, attr, extra, basis=basis)
        np.testing.assert_array_equal(a.images, b.images)
        np.testing.assert_array_equal(a.features, b.features)
    with pytest.raises(AnonymiserError, match=r"^basis: expected one fitted with"):
        UPBA(g=4, t=0.5, n_components=6, n_estimators=5).fit(imgs, attr, extra, basis=basis)


def test_baselines_share_the_interface(rng: np.random.Generator) -> None:
    imgs = rng.random((12, 8, 8))
    for name, params in (("blur", {"sigma": 1.0}), ("pixelate", {"block": 4}), ("k-same", {"k": 3})):
        a = make_anonymiser(name, params, random_state=0)
        out = a.fit_transform(imgs)
        assert out.images.shape == imgs.shape and out.images.dtype == np.float32
        assert a.describe()["method"] == name and "random_state" not in a.describe()["parameters"]
    with pytest.raises(AnonymiserError, match=r"^k: expected at most the number of faces"):
        KSamePixel(k=20).fit_transform(imgs)
    with pytest.raises(TypeError, match=r"^epsilon: expected a real number"):
        DPPixel(epsilon="big")
    with features.enabled("seeded-noise"):
        dp = DPPixel(epsilon=1.0, block=4, m=1, random_state=0)
        assert dp.fit_transform(imgs).images.shape == imgs.shape
    assert "ε = 1 per image" in dp.guarantee()
