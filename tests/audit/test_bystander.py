"""The bystander section: pairwise clustering metrics, linkers and the people it draws (synthetic and LFW)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from peep.lab.audit.bystander import (
    EVENT_METHODS,
    GROUPS,
    cosine_similarity,
    event_similarity,
    fit_linkers,
    fit_two_covariance,
    partition_people,
)
from peep.lab.audit.clustering import (
    average_linkage,
    calibrate_threshold,
    chance_f1,
    chance_precision,
    cut,
    link_and_score,
    merge_f1,
    pair_auc,
    pair_counts,
    pairwise_scores,
    random_clustering_f1,
)


def _people(n_people: int, per_person: int) -> np.ndarray:
    return np.repeat(np.arange(n_people), per_person)


def _brute_force_counts(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[int, int, int, int]:
    tp = linked = same = total = 0
    for i, j in itertools.combinations(range(len(y_true)), 2):
        s, p = y_true[i] == y_true[j], y_pred[i] == y_pred[j]
        tp += int(s and p)
        linked += int(p)
        same += int(s)
        total += 1
    return tp, linked, same, total


# --------------------------------------------------------------------------- metrics


def test_pairwise_scores_known_case() -> None:
    c = pair_counts(np.array([0, 0, 1, 1]), np.array([5, 5, 5, 9]))
    assert (c.linked_same, c.linked, c.same, c.total) == (1, 3, 2, 6)
    s = pairwise_scores(c)
    assert s["precision"] == pytest.approx(1 / 3)
    assert s["recall"] == pytest.approx(1 / 2)
    assert s["f1"] == pytest.approx(2 * 1 / (3 + 2))


@pytest.mark.parametrize("seed", range(5))
def test_pair_counts_agree_with_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y_true, y_pred = rng.integers(0, 6, 40), rng.integers(0, 9, 40)
    c = pair_counts(y_true, y_pred)
    assert (c.linked_same, c.linked, c.same, c.total) == _brute_force_counts(y_true, y_pred)


def test_nothing_linked_has_undefined_precision_and_zero_f1() -> None:
    s = pairwise_scores(pair_counts(_people(3, 4), np.arange(12)))
    assert np.isnan(s["precision"])
    assert s["recall"] == 0.0 and s["f1"] == 0.0


def test_chance_precision_and_one_cluster_f1() -> None:
    y = np.array([0, 0, 1, 1, 1])  # 1 + 3 same-person pairs of 10
    assert chance_precision(y) == pytest.approx(0.4)
    assert chance_f1(y) == pytest.approx(0.8 / 1.4)
    # putting everything in one cluster scores exactly the chance F1
    assert pairwise_scores(pair_counts(y, np.zeros(5, dtype=int)))["f1"] == pytest.approx(chance_f1(y))


def test_random_clustering_f1_is_the_mean_over_relabellings() -> None:
    rng = np.random.default_rng(0)
    y = _people(12, 5)
    pred = np.repeat(np.arange(20), 3)  # 20 clusters of 3
    c = pair_counts(y, pred)
    tp = np.mean([pair_counts(y, rng.permutation(pred)).linked_same for _ in range(3000)])
    expected_f1 = 2 * tp / (c.linked + c.same)
    assert random_clustering_f1(c) == pytest.approx(expected_f1, rel=0.05)


def test_pair_auc_extremes() -> None:
    y = _people(3, 3)
    same = (y[:, None] == y[None, :]).astype(float)
    assert pair_auc(same, y) == pytest.approx(1.0)
    assert pair_auc(-same, y) == pytest.approx(0.0)
    assert pair_auc(np.zeros((9, 9)), y) == pytest.approx(0.5)


# --------------------------------------------------------------------------- clustering


def test_average_linkage_merges_never_get_more_similar() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 8))
    tree = average_linkage(cosine_similarity(np.zeros(8))(X))
    assert tree.merges.shape == (59, 2)
    assert np.all(np.diff(tree.similarity) <= 1e-12)


def test_cut_keeps_merges_at_or_above_the_threshold() -> None:
    S = np.array(
        [
            [1.0, 0.9, 0.1, 0.0],
            [0.9, 1.0, 0.2, 0.1],
            [0.1, 0.2, 1.0, 0.8],
            [0.0, 0.1, 0.8, 1.0],
        ]
    )
    tree = average_linkage(S)
    labels = cut(tree, 0.85)
    assert labels[0] == labels[1] and len(set(labels.tolist())) == 3
    two = cut(tree, 0.5)
    assert two[0] == two[1] and two[2] == two[3] and two[0] != two[2]
    assert len(set(cut(tree, -1.0).tolist())) == 1
    assert len(set(cut(tree, 2.0).tolist())) == 4


def test_calibrated_threshold_reproduces_the_best_merge_count() -> None:
    rng = np.random.default_rng(2)
    y = _people(25, 4)
    centres = rng.normal(size=(25, 12))
    X = centres[y] + rng.normal(scale=1.2, size=(100, 12))  # overlapping identities: a non-trivial optimum
    S = cosine_similarity(np.zeros(12))(X)
    tree = average_linkage(S)
    f1 = merge_f1(tree, y)
    t = calibrate_threshold(S, y)
    got = pairwise_scores(pair_counts(y, cut(tree, t)))["f1"]
    assert got == pytest.approx(f1.max())
    # and merge_f1 follows the clustering cut after each number of merges
    for k in (1, 10, 50, 99):
        labels = cut(tree, float(tree.similarity[k - 1]))
        assert pairwise_scores(pair_counts(y, labels))["f1"] == pytest.approx(f1[k])


def _separable(rng: np.random.Generator, n_people: int, per: int, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    y = _people(n_people, per)
    centres = rng.normal(size=(n_people, dim))
    return centres[y] + rng.normal(scale=0.01, size=(y.shape[0], dim)), y


@pytest.mark.parametrize("method", ["cosine", "parrot_lda", "parrot_plda", "combined"])
def test_separable_identities_are_linked_perfectly(method: str) -> None:
    rng = np.random.default_rng(3)
    pub, y_pub = _separable(rng, 40, 6)
    cal, y_cal = _separable(rng, 30, 5)
    strangers, y_s = _separable(rng, 30, 5)
    link = fit_linkers(pub, y_pub, cal)[method]
    r = link_and_score(link(cal), y_cal, link(strangers), y_s)
    assert r["precision"] == pytest.approx(1.0)
    assert r["recall"] == pytest.approx(1.0)
    assert r["pair_auc"] == pytest.approx(1.0)
    assert r["n_clusters"] == 30


@pytest.mark.parametrize("seed", range(3))
def test_pure_noise_links_at_chance(seed: int) -> None:
    rng = np.random.default_rng(seed)

    def noise(n_people: int, per: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.normal(size=(n_people * per, 16)), _people(n_people, per)

    pub, y_pub = noise(60, 6)
    cal, y_cal = noise(40, 5)
    strangers, y_s = noise(40, 5)
    chance = chance_precision(y_s)
    for name, link in fit_linkers(pub, y_pub, cal).items():
        r = link_and_score(link(cal), y_cal, link(strangers), y_s)
        assert abs(r["pair_auc"] - 0.5) < 0.05, name
        if r["precision"] == r["precision"]:  # defined: something was linked
            assert r["precision"] < 3 * chance, name
        # no better than a data-blind clustering, give or take the calibration's luck
        assert r["f1"] < chance_f1(y_s) + 0.03, name


def test_plda_learns_which_directions_carry_identity() -> None:
    """Identity in 2 of 16 directions, large noise in the rest: the parrot beats plain cosine."""
    rng = np.random.default_rng(4)

    def draw(n_people: int, per: int) -> tuple[np.ndarray, np.ndarray]:
        y = _people(n_people, per)
        centres = np.zeros((n_people, 16))
        centres[:, :2] = rng.normal(scale=3.0, size=(n_people, 2))
        return centres[y] + rng.normal(scale=1.0, size=(y.shape[0], 16)), y

    pub, y_pub = draw(80, 6)
    strangers, y_s = draw(40, 5)
    plda = pair_auc(fit_two_covariance(pub, y_pub)(strangers), y_s)
    cos = pair_auc(cosine_similarity(pub.mean(axis=0))(strangers), y_s)
    assert plda > cos + 0.1
    assert plda > 0.8


def test_event_similarity_puts_different_decisions_a_unit_apart() -> None:
    p = np.array([0.30, 0.32, 0.90])
    d = np.array([-1, 2, -1])
    prob = event_similarity("probability", p, d)
    both = event_similarity("decision_probability", p, d)
    assert prob[0, 1] == pytest.approx(-0.02) and both[0, 1] == pytest.approx(-1.02)
    assert both[0, 2] == pytest.approx(prob[0, 2]) == pytest.approx(-0.60)
    assert set(EVENT_METHODS) == {"probability", "decision_probability"}
    with pytest.raises(ValueError, match="method"):
        event_similarity("time", p, d)


def test_partition_is_disjoint_balanced_and_by_identity() -> None:
    rng = np.random.default_rng(5)
    counts = 5 + rng.permutation(61)  # distinct numbers of images: the dealing order is known
    ids = np.arange(61) * 7  # non-contiguous ids
    labels = np.repeat(ids, counts)
    groups = partition_people(labels, np.random.default_rng(6))
    assert set(groups) == set(GROUPS)
    sets = [set(groups[g].tolist()) for g in GROUPS]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert set.union(*sets) == set(ids.tolist())
    # dealt in threes by number of images: among the k least photographed (k a multiple of 3), k / 3 each
    by_count = ids[np.argsort(counts)]
    for k in range(3, 61, 3):
        first = set(by_count[:k].tolist())
        assert [len(first & s) for s in sets] == [k // 3] * 3
    again = partition_people(labels, np.random.default_rng(6))
    assert all(np.array_equal(groups[g], again[g]) for g in GROUPS)
    other = partition_people(labels, np.random.default_rng(7))
    assert not all(np.array_equal(groups[g], other[g]) for g in GROUPS)


# --------------------------------------------------------------------------- on LFW


def test_strangers_never_enter_the_background_basis(small_cfg) -> None:
    from peep.lab.audit.bystander import prepare_bystanders
    from peep.lab.audit.execution import job_env, load_audit_data

    cfg = small_cfg.with_(basis="background", components=16, background_max_faces=9)
    data = load_audit_data(cfg)
    assert data.pool is data.background  # the same public people, loaded once
    with job_env(cfg):
        ctx = prepare_bystanders(data, cfg, 0)
    people = {g: set(np.unique(ctx.people[g]).tolist()) for g in GROUPS}
    assert not (people["strangers"] & (people["calibration"] | people["public"]))
    assert data.background_labels is not None
    strangers_faces = int(np.isin(data.background_labels, list(people["strangers"])).sum())
    assert ctx.n_fit == data.background.shape[0] - strangers_faces
    assert ctx.C["strangers"].shape == (strangers_faces, 16)
    # the enrolled people are the audited ones, never part of the never-enrolled pool
    assert ctx.C_enrol.shape[0] == ctx.y_enrol.shape[0] and ctx.y_enrol.max() < data.n_classes


@pytest.mark.slow
def test_evaluation_is_reproducible_and_keeps_no_template_by_default(small_cfg, audit_data) -> None:
    from peep.lab.audit.bystander import evaluate_bystanders, prepare_bystanders
    from peep.lab.audit.execution import job_env

    cfg = small_cfg.with_(components=16)
    with job_env(cfg):
        ctx = prepare_bystanders(audit_data, cfg, 0)
        a = evaluate_bystanders(ctx, cfg, epsilon=16.0, key=(5, 0, 0))
        b = evaluate_bystanders(ctx, cfg, epsilon=16.0, key=(5, 0, 0))
        c = evaluate_bystanders(ctx, cfg, epsilon=16.0, key=(5, 0, 1))
    assert a == b
    assert a["keep_all"]["methods"] != c["keep_all"]["methods"]  # another noise stream
    assert a["keep_none"]["templates_kept"] == 0
    assert a["keep_all"]["templates_kept"] == a["n_appearances"] == ctx.people["strangers"].shape[0]
    assert a["n_same_pairs"] / a["n_pairs"] == pytest.approx(a["chance_precision"])
    assert a["epsilon_vector"] == pytest.approx(16 * 16.0)  # peep: per coordinate × nc


# --------------------------------------------------------------------------- decision mode


def test_label_clusterings_and_their_scores() -> None:
    from peep.lab.audit.bystander import DECISION_METHODS, label_clusterings
    from peep.lab.audit.clustering import score_clustering

    y = np.array([0, 0, 1, 1, 2, 2])
    released = np.array([3, 3, 0, 0, 3, 1])  # 3 = unknown (three enrolled subjects)
    c = label_clusterings(released, unknown=3)
    assert set(c) == set(DECISION_METHODS)
    # same_label: {0,1,4} unknown, {2,3} subject 0, {5} subject 1 -> linked pairs (0,1) (0,4) (1,4) (2,3)
    s = score_clustering(c["same_label"], y)
    assert (s["precision"], s["recall"], s["n_clusters"]) == (pytest.approx(2 / 4), pytest.approx(2 / 3), 3)
    # same_named_label: every unknown alone -> only (2,3) linked, one person
    n = score_clustering(c["same_named_label"], y)
    assert (n["precision"], n["recall"], n["n_clusters"]) == (pytest.approx(1.0), pytest.approx(1 / 3), 5)
    assert s["threshold"] is None and 0.0 <= s["pair_auc"] <= 1.0
    # nothing linked: precision undefined (None, not NaN, so results compare and serialise)
    alone = score_clustering(label_clusterings(np.full(6, 3), unknown=3)["same_named_label"], y)
    assert alone["precision"] is None and alone["f1"] == 0.0


@pytest.mark.slow
def test_decision_mode_keeps_one_label_per_appearance_released_by_the_mechanisms_law(small_cfg, audit_data) -> None:
    from peep.core.labels import RandomizedResponse
    from peep.lab.audit.bystander import DECISION_METHODS, evaluate_bystanders, prepare_bystanders
    from peep.lab.audit.execution import job_env

    cfg = small_cfg.with_(components=16)
    with job_env(cfg):
        ctx = prepare_bystanders(audit_data, cfg, 0)
        res = evaluate_bystanders(ctx, cfg, epsilon=16.0, key=(5, 0, 0))
    dec = res["keep_decision"]
    assert dec["templates_kept"] == 0 and dec["labels_kept"] == res["n_appearances"]
    rows = dec["_rows"]
    assert [r["epsilon_label"] for r in rows] == [None, *cfg.bystander_label_epsilons]
    k = dec["labels"]
    assert k == audit_data.n_classes + 1
    # without a label mechanism the device names about its FPIR target's share of strangers (set on other people)
    assert rows[0]["named_share"] == rows[0]["named_share_model"] < 0.1
    for r in rows[1:]:
        rr = RandomizedResponse(k, r["epsilon_label"])  # the law only
        m = r["named_share_model"]
        expected = m * (1.0 - rr.other_probability) + (1.0 - m) * rr.false_positive_floor
        assert r["named_share"] == pytest.approx(expected, abs=0.05), r
        assert r["feasible"] == (rr.false_positive_floor < dec["fpir_target"])
        for method in DECISION_METHODS:
            scores = r["methods"][method]
            assert scores["threshold"] is None and scores["f1"] is not None
    # at ε_label 2 the released labels are mostly noise: linking by them is close to chance
    low = rows[1]["methods"]["same_label"]
    assert low["precision"] < 3 * res["chance_precision"]
