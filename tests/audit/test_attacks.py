"""Each attack on cases whose answer is known: no noise, huge noise, synthetic geometry."""

from __future__ import annotations

import numpy as np
import pytest
from peep.lab.audit.attacks import (
    CandidateSet,
    KnnAdversary,
    bayes_log_posterior,
    fit_knn,
    linkage_accuracy,
    reconstruct_direct,
    reconstruct_shrinkage,
    reconstruction_scores,
    select_candidate_sets,
    shrinkage_prior,
)
from peep.lab.audit.basis import Domain, fit_basis
from peep.lab.audit.execution import evaluate_release, job_env
from peep.lab.audit.measures import ssim_batch

NO_NOISE = 1e9  # noise scale 1e-9: far below any coefficient
HUGE_NOISE = 1e-3  # peep: Laplace scale 1000 on [0, 1] coordinates


# --------------------------------------------------------------------------- reconstruction


def test_direct_reconstruction_with_all_components_recovers_faces(lfw100, seeded) -> None:
    from peep.core.release import mechanism_for_bounds

    X = lfw100.X[:60].astype(np.float64)
    basis = fit_basis(X, 59)  # full rank for 60 faces: the basis spans them
    dom = Domain("peep-raw", basis.bounds)
    mech = mechanism_for_bounds(basis.bounds, kind="peep-raw", epsilon=NO_NOISE, random_state=seeded)
    faces, inputs = reconstruct_direct(mech.release(dom.forward(basis.transform(X))), dom, basis)
    assert inputs is faces or np.array_equal(inputs, faces)  # a pixel projection takes the faces themselves
    ssim = ssim_batch(faces.reshape(lfw100.images[:60].shape), lfw100.images[:60])
    assert ssim.min() > 0.999


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["peep", "peep-raw", "gaussian-l2", "laplace-l1"])
def test_no_noise_reconstruction_reaches_the_pca_ceiling(small_ctx, small_cfg, kind: str, seeded) -> None:
    from peep.core.release import mechanism_for_bounds

    ctx, base = small_ctx
    dom = Domain(kind, ctx.basis.bounds)
    mech = mechanism_for_bounds(
        ctx.basis.bounds,
        kind=kind,
        epsilon=NO_NOISE if kind.startswith("peep") else 1e7,
        delta=1e-5,
        random_state=seeded,
    )
    Ztr, Zte = dom.forward(ctx.C_train), dom.forward(ctx.C_test)
    R = mech.release(Zte)
    m, v = shrinkage_prior(Ztr)
    for faces, inputs in (
        reconstruct_direct(R, dom, ctx.basis),
        reconstruct_shrinkage(R, dom, ctx.basis, m, v, mech.variance),
    ):
        s = reconstruction_scores(faces, ctx.test_images, ctx.basis, ctx.clean_mlp, ctx.y_test, inputs)
        # Only the public bounds' clipping separates a release from the clean coefficients.
        assert s["ssim"] == pytest.approx(base["pca_ceiling"]["ssim"], abs=0.03)
        assert s["reid"] == pytest.approx(base["pca_ceiling"]["reid"], abs=0.06)
    assert base["pca_ceiling"]["ssim"] > base["mean_face"]["ssim"] + 0.1


def test_huge_noise_shrinkage_falls_back_to_the_mean_face(small_ctx, seeded) -> None:
    from peep.core.release import mechanism_for_bounds

    ctx, base = small_ctx
    dom = Domain("peep", ctx.basis.bounds)
    mech = mechanism_for_bounds(ctx.basis.bounds, kind="peep", epsilon=HUGE_NOISE, random_state=seeded)
    R = mech.release(dom.forward(ctx.C_test))
    m, v = shrinkage_prior(dom.forward(ctx.C_train))
    shrink = reconstruction_scores(
        reconstruct_shrinkage(R, dom, ctx.basis, m, v, mech.variance)[0],
        ctx.test_images,
        ctx.basis,
        ctx.clean_mlp,
        ctx.y_test,
    )
    direct = reconstruction_scores(
        reconstruct_direct(R, dom, ctx.basis)[0], ctx.test_images, ctx.basis, ctx.clean_mlp, ctx.y_test
    )
    assert shrink["ssim"] == pytest.approx(base["mean_face"]["ssim"], abs=0.02)
    assert shrink["reid"] == pytest.approx(base["mean_face"]["reid"], abs=0.06)
    assert direct["ssim"] < base["mean_face"]["ssim"]  # noise, not structure


# --------------------------------------------------------------------------- full evaluation: linkage, averaging, MIA


@pytest.fixture(scope="module")
def no_noise_eval(small_ctx, small_cfg):
    with job_env(small_cfg):
        return evaluate_release(small_ctx[0], small_cfg, kind="peep-raw", epsilon=NO_NOISE, key=(7, 0))


@pytest.fixture(scope="module")
def huge_noise_eval(small_ctx, small_cfg):
    with job_env(small_cfg):
        return evaluate_release(small_ctx[0], small_cfg, kind="peep", epsilon=HUGE_NOISE, key=(7, 1))


@pytest.mark.slow
def test_no_noise_linkage_reaches_clean_accuracy(no_noise_eval, small_ctx) -> None:
    clean = small_ctx[1]["accuracy"]
    link = no_noise_eval["linkage"]
    assert link["max"] >= clean - 0.03
    assert link["max"] == max(link[a] for a in ("knn", "svm", "logreg", "mlp", "bayes"))
    assert no_noise_eval["accuracy"] == pytest.approx(clean, abs=0.05)
    assert no_noise_eval["reconstruction_reid"] == pytest.approx(small_ctx[1]["pca_ceiling"]["reid"], abs=0.06)
    for row in no_noise_eval["linkage_subsets"]:  # smaller candidate sets are no harder
        assert row["max"] >= link["max"] - 0.05


def test_huge_noise_linkage_is_chance(huge_noise_eval) -> None:
    r = huge_noise_eval
    assert r["epsilon_vector"] == pytest.approx(32 * HUGE_NOISE)
    assert r["chance"] - 0.05 <= r["linkage"]["max"] <= r["chance"] + 0.06
    assert r["linkage"]["bayes"] == pytest.approx(r["chance"], abs=0.03)  # falls back to the prior
    for k in ("1", "5", "20"):
        assert r["averaging"][k] <= r["chance"] + 0.06
    for row in r["linkage_subsets"]:
        assert row["max"] <= row["chance"] + 0.1
    assert r["balanced_accuracy"] == pytest.approx(1 / 5, abs=0.07)


def test_membership_fresh_release_is_chance_under_huge_noise(huge_noise_eval, small_ctx, small_cfg) -> None:
    assert huge_noise_eval["membership_auc"] == pytest.approx(0.5, abs=0.07)
    # Whatever the noise, a recogniser learns something of the very templates it was trained on. How
    # much depends on the preset: the reference MLP (weak L2 penalty, trained to its loss plateau)
    # memorises them; the server's default (L2 penalty 1.0, early stopping) much less.
    cfg = small_cfg.with_(preset="reference")
    with job_env(cfg):
        reference = evaluate_release(small_ctx[0], cfg, kind="peep", epsilon=HUGE_NOISE, key=(7, 1))
    assert reference["membership_auc_template"] > 0.6
    assert reference["membership_auc_template"] > huge_noise_eval["membership_auc_template"] > 0.5


def test_identity_mixture_informed_vs_uninformed(no_noise_eval, huge_noise_eval) -> None:
    informed, blind = no_noise_eval["identity_mixture"], huge_noise_eval["identity_mixture"]
    assert informed["mixture"] > 0.6
    assert informed["top_k"]["2"] > informed["top_k_prior"]["2"] + 0.1
    assert blind["kl_from_prior"] < 0.02 < 0.3 < informed["kl_from_prior"]
    assert blind["top_k"]["2"] == pytest.approx(blind["top_k_prior"]["2"], abs=0.1)


def test_averaging_releases_helps_at_moderate_noise(small_ctx, small_cfg) -> None:
    with job_env(small_cfg):
        r = evaluate_release(small_ctx[0], small_cfg, kind="peep", epsilon=8.0, key=(7, 2))
    assert r["averaging"]["1"] == pytest.approx(r["linkage"]["max"])
    assert r["averaging"]["20"] > r["averaging"]["1"] + 0.1
    assert r["averaging"]["5"] >= r["averaging"]["1"] - 0.02


def test_seeded_evaluation_is_reproducible(small_ctx, small_cfg) -> None:
    small = small_cfg.with_(averaging=())
    with job_env(small):
        a = evaluate_release(small_ctx[0], small, kind="laplace-l1", epsilon=500.0, key=(7, 3), attacks=False)
        b = evaluate_release(small_ctx[0], small, kind="laplace-l1", epsilon=500.0, key=(7, 3), attacks=False)
        c = evaluate_release(small_ctx[0], small, kind="laplace-l1", epsilon=500.0, key=(7, 4), attacks=False)
    assert a == b
    assert a["accuracy"] != c["accuracy"] or a["weighted_f1"] != c["weighted_f1"]


# --------------------------------------------------------------------------- adversaries on synthetic data


def _clusters(rng: np.random.Generator, centres: np.ndarray, spreads: list[float], n: int = 30):
    X = np.concatenate([c + rng.normal(0, s, (n, centres.shape[1])) for c, s in zip(centres, spreads, strict=True)])
    y = np.repeat(np.arange(len(centres)), n).astype(np.int64)
    return X, y


def test_candidate_set_strategies_pick_the_expected_identities(rng) -> None:
    centres = np.array([[10.0, 0], [-10, 0], [0, 10], [0.5, 0.5], [-0.5, -0.5], [0.0, 0.8]])
    X, y = _clusters(rng, centres, [1.0, 1.0, 1.0, 0.05, 0.05, 0.5])
    sets, skipped = select_candidate_sets(X, y, 6, [2, 3, 6, 10], rng)
    by = {(s.size, s.strategy): set(s.classes.tolist()) for s in sets}
    assert by[(6, "all")] == set(range(6))
    assert by[(3, "distinctive")] == {0, 1, 2}
    assert by[(2, "center")] == {3, 4}
    assert len(by[(3, "random")]) == 3
    assert {s["size"] for s in skipped} == {6, 10}


def test_knn_and_bayes_respect_restricted_candidates(rng) -> None:
    centres = np.array([[0.0, 0], [5, 0], [0, 5]])
    X, y = _clusters(rng, centres, [0.5, 0.5, 0.5])
    probes, yp = _clusters(rng, centres, [0.5, 0.5, 0.5], n=10)
    knn = fit_knn(X, y, probes, 3)
    assert isinstance(knn, KnnAdversary)
    assert (knn.predict() == yp).mean() > 0.95
    allowed = np.array([1, 2])
    assert set(knn.predict(allowed).tolist()) <= {1, 2}
    from peep.lab.audit.attacks import ScoreAdversary

    bayes = ScoreAdversary(bayes_log_posterior(X, y, probes, np.zeros(2), 3))
    assert (bayes.predict() == yp).mean() > 0.95
    res = linkage_accuracy({"knn": knn, "bayes": bayes}, yp, CandidateSet(2, "random", allowed))
    assert res["max"] > 0.95
    assert res["chance_uniform"] == pytest.approx(0.5)


def test_bayes_under_huge_noise_guesses_the_most_frequent_identity(rng) -> None:
    centres = np.array([[0.0, 0], [5, 0], [0, 5]])
    X, y = _clusters(rng, centres, [0.5, 0.5, 0.5])
    X, y = np.concatenate([X, X[y == 2]]), np.concatenate([y, y[y == 2]])  # identity 2 twice as frequent
    probes, _ = _clusters(rng, centres, [0.5, 0.5, 0.5], n=10)
    post = bayes_log_posterior(X, y, probes, np.full(2, 1e8), 3)
    assert np.all(post.argmax(axis=1) == 2)
