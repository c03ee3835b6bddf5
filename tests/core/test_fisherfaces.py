"""The ``fisherfaces`` projection: its projector, its distributed fit, its parameters, what it is for."""

from __future__ import annotations

import numpy as np
import pytest
from peep.core.bundle import ProjectionBundle, build_bundle_files, write_bundle_files
from peep.core.domains import DOMAINS, unit_rows
from peep.core.eigenface_model import EigenfaceModel
from peep.core.exceptions import BundleError, NotFittedError
from peep.core.imaging import DEFAULT_GEOMETRY
from peep.core.projections import EigenfaceProjection, FisherfaceProjection, projection_class, projector_outputs
from peep.core.statistics import ClassStatistics, FaceStatistics, merge_all

K = 32


@pytest.fixture(scope="module")
def background(lfw_background):
    return lfw_background.X.astype(np.float64), lfw_background.labels


@pytest.fixture(scope="module")
def fisher(background):
    X, y = background
    return FisherfaceProjection(n_components=K).fit(X, y)


@pytest.fixture(scope="module")
def fisher_bundle(fisher, keypair, tmp_path_factory):
    files = build_bundle_files(
        projection=fisher,
        geometry=DEFAULT_GEOMETRY,
        signing_key=keypair[0],
        normalisation={},
        mechanism_defaults={"kind": "privunit", "epsilon": 32.0},
    )
    return ProjectionBundle.load(write_bundle_files(files, tmp_path_factory.mktemp("fisher")), keypair[1])


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# --------------------------------------------------------------- the projector


def test_registered_with_its_contract():
    cls = projection_class("fisherfaces")
    assert cls is FisherfaceProjection and cls.needs_labels and cls.summary
    assert FisherfaceProjection().get_params() == {
        "n_components": 32,
        "n_pca": 200,
        "regularisation": 1e-3,
        "radius_quantile": 0.95,
        "mirror_shape": None,
    }


@pytest.mark.slow
def test_projector_outputs_equal_the_numpy_transform_in_every_domain(fisher, fisher_bundle, lfw100):
    b = fisher_bundle
    assert b.projection_kind == "fisherfaces" and b.outputs == projector_outputs()
    faces = lfw100.images[:300]
    out = b.project(faces)
    ref = fisher.transform(faces.reshape(len(faces), -1).astype(np.float64))
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out["coefficients"], ref, atol=1e-5 * scale)
    for name, dom in DOMAINS.items():
        expected = dom.apply(ref, b.bounds)
        np.testing.assert_allclose(out[name], expected, atol=1e-5 * max(1.0, np.abs(expected).max()), err_msg=name)
    # The unit output is the L2-normalised Fisherface template (what privunit releases).
    np.testing.assert_allclose(out["unit"], unit_rows(ref), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out["unit"], axis=1), 1.0, atol=1e-5)
    b.check_mechanism("privunit")


def test_the_bundle_reads_back_the_projection_and_its_facts(fisher, fisher_bundle, lfw100, background):
    b = fisher_bundle
    back = b.projection()
    assert isinstance(back, FisherfaceProjection)
    X = lfw100.images[:20].reshape(20, -1).astype(np.float64)
    np.testing.assert_allclose(back.transform(X), fisher.transform(X), atol=1e-5 * np.abs(fisher.transform(X)).max())
    np.testing.assert_array_equal(back.bounds_.lower, b.bounds.lower)
    facts = b.metadata["fisherfaces"]
    _, y = background
    assert facts["n_pca"] == back.n_pca_ == fisher.n_pca_ == 200
    assert facts["n_classes"] == back.n_classes_ == len(np.unique(y))
    assert facts["n_faces"] == len(y)
    assert facts["regularisation"] == 1e-3 and 0.5 < facts["pca_variance_ratio"] < 1.0
    lam = np.array(facts["discriminant_eigenvalues"])
    assert lam.shape == (K,) and np.all(np.diff(lam) <= 0) and lam[-1] > 0
    np.testing.assert_allclose(back.eigenvalues_, fisher.eigenvalues_)
    # There is no eigenface model to hand to a reconstruction that expects PCA coefficients.
    with pytest.raises(BundleError, match="no eigenface model"):
        b.model()


def test_template_geometry(fisher, background):
    X, y = background
    C = fisher.transform(X)
    assert C.shape == (len(X), K)
    np.testing.assert_allclose(C.mean(axis=0), 0.0, atol=1e-8 * np.abs(C).max())
    # Scaled so the pooled within-class variance along each direction is 1 (up to the small shrinkage).
    resid = C - np.stack([C[y == c].mean(axis=0) for c in y])
    within_var = (resid**2).sum(axis=0) / (len(y) - len(np.unique(y)))
    np.testing.assert_allclose(within_var, 1.0, rtol=0.02)


# --------------------------------------------------------- distributed fitting


@pytest.mark.slow
def test_distributed_two_pass_fit_equals_the_central_fit(fisher, background, rng):
    """PEEP Alg. 2 extended: 3 partitions, faces split at random so identities span partitions."""
    X, y = background
    parts = np.array_split(rng.permutation(len(X)), 3)
    spanning = set(y[parts[0]]) & set(y[parts[1]])
    assert len(spanning) > 50  # identities present in several partitions: the cross terms matter
    # Pass 1: face statistics -> eigenfaces.
    stats = [FaceStatistics.from_faces(X[idx]) for idx in parts]
    model = EigenfaceModel.from_statistics(merge_all(stats[::-1]), n_components=200)
    # Pass 2: per-identity statistics of the whitened coefficients.
    classes = [
        ClassStatistics.from_coefficients(FisherfaceProjection.whitened_coefficients(model, X[idx]), y[idx])
        for idx in parts
    ]
    merged = merge_all([classes[1], classes[2], classes[0]])
    assert merged.count == len(y) and merged.n_classes == len(np.unique(y))
    distributed = FisherfaceProjection.from_statistics(model, merged, n_components=K, bounds=fisher.bounds_)
    assert _rel(distributed.scalings_, fisher.scalings_) < 1e-8
    assert _rel(distributed.transform(X), fisher.transform(X)) < 1e-8
    np.testing.assert_allclose(distributed.eigenvalues_, fisher.eigenvalues_, rtol=1e-8)
    np.testing.assert_allclose(distributed.mean_, fisher.mean_, atol=1e-12)
    assert distributed.n_pca_ == fisher.n_pca_ and distributed.bounds_ is fisher.bounds_


def test_class_statistics_merge_exactly_with_shared_identities(rng):
    Z = rng.normal(size=(90, 4)) + np.repeat(rng.normal(size=(9, 4)) * 3, 10, axis=0)
    y = np.repeat(np.array([f"p{i}" for i in range(9)]), 10)
    whole = ClassStatistics.from_coefficients(Z, y)
    order = rng.permutation(90)
    parts = [ClassStatistics.from_coefficients(Z[idx], y[idx]) for idx in np.array_split(order, 4)]
    for merged in (merge_all(parts), merge_all(parts[::-1]), parts[0].merge(parts[2].merge(parts[1])).merge(parts[3])):
        np.testing.assert_array_equal(merged.classes, whole.classes)
        np.testing.assert_array_equal(merged.counts, whole.counts)
        np.testing.assert_allclose(merged.means, whole.means, atol=1e-12)
        np.testing.assert_allclose(merged.within_scatter(), whole.within_scatter(), atol=1e-10)
        np.testing.assert_allclose(merged.between_scatter(), whole.between_scatter(), atol=1e-10)
    # Within + between = total scatter.
    centred = Z - Z.mean(axis=0)
    np.testing.assert_allclose(whole.within_scatter() + whole.between_scatter(), centred.T @ centred, atol=1e-9)
    assert set(whole.to_dict()) == {"classes", "counts", "means", "within"}


def test_class_statistics_validate(rng):
    a = ClassStatistics.from_coefficients(rng.normal(size=(6, 3)), [0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match=r"labels: expected shape \(6,\)"):
        ClassStatistics.from_coefficients(rng.normal(size=(6, 3)), [0, 1])
    with pytest.raises(ValueError, match="expected statistics over 3 features, received 2"):
        a.merge(ClassStatistics.from_coefficients(rng.normal(size=(4, 2)), [0, 0, 1, 1]))
    with pytest.raises(TypeError, match="labels of the same kind"):
        a.merge(ClassStatistics.from_coefficients(rng.normal(size=(2, 3)), ["a", "b"]))
    with pytest.raises(TypeError, match="other: expected ClassStatistics"):
        a.merge(FaceStatistics.from_faces(rng.normal(size=(4, 3))))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="parts"):
        merge_all([])


def test_from_statistics_checks_its_inputs(background, fisher):
    X, y = background
    model = EigenfaceModel(n_components=50).fit(X[:400])
    classes = ClassStatistics.from_coefficients(FisherfaceProjection.whitened_coefficients(model, X[:400]), y[:400])
    with pytest.raises(ValueError, match="classes: expected statistics of 50 whitened coefficients"):
        FisherfaceProjection.from_statistics(model, ClassStatistics.from_coefficients(X[:400, :3], y[:400]))
    with pytest.raises(ValueError, match="bounds: expected 8 components"):
        FisherfaceProjection.from_statistics(model, classes, n_components=8, bounds=fisher.bounds_)
    p = FisherfaceProjection.from_statistics(model, classes, n_components=8)
    assert p.transform(X[:3]).shape == (3, 8) and not hasattr(p, "bounds_")


# ---------------------------------------------------------------- parameters


def _toy(rng, n_classes=3, per_class=6, d=30):
    y = np.repeat(np.arange(n_classes), per_class)
    X = rng.uniform(size=(len(y), d)) + rng.normal(size=(n_classes, d))[y]
    return X, y


@pytest.mark.parametrize(
    ("params", "exc", "match"),
    [
        ({"n_components": 0}, ValueError, "n_components: expected >= 1, received 0"),
        ({"n_components": 2.5}, TypeError, "n_components: expected an integer"),
        ({"n_components": 3}, ValueError, r"n_components: expected <= 2 \(at most n_classes - 1 = 2"),
        ({"n_components": 2, "n_pca": 0}, ValueError, "n_pca: expected >= 1, received 0"),
        ({"n_components": 2, "n_pca": 1}, ValueError, r"n_components: expected <= 1 .*n_pca = 1"),
        ({"n_components": 2, "regularisation": -0.1}, ValueError, "regularisation: expected >= 0.0"),
        ({"n_components": 2, "regularisation": 1.5}, ValueError, "regularisation: expected <= 1.0"),
        ({"n_components": 2, "regularisation": "small"}, TypeError, "regularisation: expected a real number"),
        ({"n_components": 2, "radius_quantile": 0.0}, ValueError, "radius_quantile: expected > 0.0"),
    ],
)
def test_parameters_are_validated_by_name(params, exc, match, rng):
    X, y = _toy(rng)
    with pytest.raises(exc, match=match):
        FisherfaceProjection(**params).fit(X, y)


def test_fitting_needs_identities(rng):
    X, y = _toy(rng)
    with pytest.raises(ValueError, match="y: expected the identities of the faces for projection 'fisherfaces'"):
        FisherfaceProjection(n_components=2).fit(X)
    with pytest.raises(ValueError, match=r"y: expected one identity per face, shape \(18,\)"):
        FisherfaceProjection(n_components=2).fit(X, y[:5])
    with pytest.raises(ValueError, match="y: expected at least 2 identities to separate, received 1"):
        FisherfaceProjection(n_components=1).fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="y: expected at least one identity with two or more distinct faces"):
        FisherfaceProjection(n_components=1).fit(X[:4], [0, 1, 2, 3])
    with pytest.raises(NotFittedError, match="not fitted"):
        FisherfaceProjection().transform(X)


def test_regularisation_makes_a_singular_within_class_scatter_invertible(rng):
    # Two identities whose faces are exact copies: no within-class spread along their directions.
    a = rng.uniform(size=(3, 30))
    X = np.vstack([a, np.repeat(rng.uniform(size=(1, 30)), 3, axis=0), np.repeat(rng.uniform(size=(1, 30)), 3, axis=0)])
    y = np.repeat([0, 1, 2], 3)
    with pytest.raises(ValueError, match="regularisation: the within-class scatter is singular"):
        FisherfaceProjection(n_components=2, regularisation=0.0).fit(X, y)
    p = FisherfaceProjection(n_components=2).fit(X, y)
    assert np.all(np.isfinite(p.scalings_)) and p.n_pca_ == 4  # 5 distinct faces: rank 4


def test_n_pca_is_capped_by_the_data(rng):
    X, y = _toy(rng, n_classes=4, per_class=5, d=30)
    p = FisherfaceProjection(n_components=3).fit(X, y)
    assert p.n_pca_ == 20 - 4  # the within-class scatter's rank, below n_pca=200 and n - 1
    assert p.get_params()["n_pca"] == 200


def test_the_fit_is_deterministic_and_does_not_depend_on_face_order(background):
    X, y = background
    X, y = X[:400], y[:400]
    a = FisherfaceProjection(n_components=16, n_pca=80).fit(X, y)
    b = FisherfaceProjection(n_components=16, n_pca=80).fit(X, y)
    np.testing.assert_array_equal(a.scalings_, b.scalings_)
    perm = np.random.default_rng(3).permutation(len(X))
    c = FisherfaceProjection(n_components=16, n_pca=80).fit(X[perm], y[perm])
    assert _rel(c.scalings_, a.scalings_) < 1e-8  # signs fixed by convention, not by the data's order


def test_params_contract_works_with_sklearn_clone(rng):
    from sklearn.base import clone

    X, y = _toy(rng)
    p = FisherfaceProjection(n_components=2, n_pca=10, regularisation=0.01).fit(X, y)
    c = clone(p)
    assert c.get_params() == p.get_params() and not hasattr(c, "scalings_")
    assert repr(c) == (
        "FisherfaceProjection(n_components=2, n_pca=10, regularisation=0.01, radius_quantile=0.95, mirror_shape=None)"
    )


# ----------------------------------------------------------------- behaviour


def _accuracies(T, y, seeds=(0, 1, 2)):
    """Nearest-class-mean and shrinkage-LDA accuracy, 70/30 stratified splits, mean over seeds."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.model_selection import train_test_split

    ncm, lda = [], []
    for seed in seeds:
        tr, te = train_test_split(np.arange(len(y)), test_size=0.3, stratify=y, random_state=seed)
        classes = np.unique(y[tr])
        centroids = np.stack([T[tr][y[tr] == c].mean(axis=0) for c in classes])
        nearest = classes[np.argmin(((T[te][:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)]
        ncm.append(np.mean(nearest == y[te]))
        lda.append(LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(T[tr], y[tr]).score(T[te], y[te]))
    return float(np.mean(ncm)), float(np.mean(lda))


def test_fisherfaces_separate_unseen_identities_better_than_eigenfaces(fisher, background, lfw100):
    """Fitted on LFW's 5-9-image people only, tested on the 5 people with >= 100 images (never seen).

    Measured (K = 32, unit vectors, mean of 3 splits): nearest class mean 0.83 vs 0.42 for
    eigenfaces, shrinkage LDA 0.87 vs 0.74. The margins asserted are a little below those.
    """
    X, _ = background
    eig = EigenfaceProjection(n_components=K).fit(X)
    faces = lfw100.X.astype(np.float64)
    f_ncm, f_lda = _accuracies(unit_rows(fisher.transform(faces)), lfw100.labels)
    e_ncm, e_lda = _accuracies(unit_rows(eig.transform(faces)), lfw100.labels)
    assert f_ncm > e_ncm + 0.3, (f_ncm, e_ncm)
    assert f_lda > e_lda + 0.08, (f_lda, e_lda)


@pytest.mark.slow
def test_mirrored_fit_treats_a_face_and_its_mirror_alike(lfw_background, lfw100):
    from peep.core.projections import mirror_faces

    shape = lfw100.images.shape[1:]
    p = FisherfaceProjection(n_components=16, mirror_shape=shape).fit(lfw_background.X, lfw_background.labels)
    X = lfw100.X[:50].astype(np.float64)
    # The mirrored public data makes every discriminant direction symmetric.
    np.testing.assert_allclose(p.transform(mirror_faces(X, shape)), p.transform(X), atol=1e-6)
    assert p.metadata()["fisherfaces"]["mirrored"] and p.n_samples_ == 2 * lfw_background.n_images
    plain = FisherfaceProjection(n_components=16).fit(lfw_background.X, lfw_background.labels)
    assert not np.allclose(plain.transform(mirror_faces(X, shape)), plain.transform(X), atol=1e-3)
    with pytest.raises(ValueError, match="mirror_shape"):
        bad = FisherfaceProjection(n_components=4, mirror_shape=(10, 10))
        bad.fit(lfw_background.X[:50], lfw_background.labels[:50])
