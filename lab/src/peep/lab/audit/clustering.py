"""Clustering appearances by similarity, and scoring a clustering by its pairs against the true identities.

The bystander section (:mod:`peep.lab.audit.bystander`) asks how well an
operator links a stranger's appearances; this module is the measuring part,
which knows nothing of releases, recognisers or people:

- pair counts and the pairwise precision, recall and F1 of a clustering
  (precision: the share of same-cluster pairs that are one person; recall:
  the share of one person's pairs put in one cluster), the pair AUC of a
  similarity, and the F1 a data-blind or random clustering gets by chance;
- average-linkage agglomeration of a similarity matrix, cut at a threshold
  calibrated on other people (the one that maximises pairwise F1 there), so
  that the cut is never tuned on the people it is scored on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


# --------------------------------------------------------------------------- pairwise metrics


@dataclass(frozen=True)
class PairCounts:
    """Pair counts of a clustering against the true identities.

    Attributes
    ----------
    linked_same : int
        Pairs in one cluster that are one person (true positives).
    linked : int
        Pairs in one cluster.
    same : int
        Pairs that are one person.
    total : int
        All pairs, ``n (n − 1) / 2``.
    """

    linked_same: int
    linked: int
    same: int
    total: int


def _pairs(counts: NDArray[np.integer]) -> int:
    c = np.asarray(counts, dtype=np.int64)
    return int((c * (c - 1) // 2).sum())


def pair_counts(y_true: NDArray[np.integer], y_pred: NDArray[np.integer]) -> PairCounts:
    """Pair counts of clustering ``y_pred`` against identities ``y_true``.

    Parameters
    ----------
    y_true, y_pred : ndarray of shape (n_appearances,)
        Identity and cluster of each appearance (any integer labels).
    """
    t = np.unique(np.asarray(y_true), return_inverse=True)[1].ravel()
    p = np.unique(np.asarray(y_pred), return_inverse=True)[1].ravel()
    if t.shape != p.shape:
        raise ValueError(f"y_true, y_pred: expected equal lengths, received {t.shape[0]} and {p.shape[0]}")
    table = np.zeros((int(t.max(initial=-1)) + 1, int(p.max(initial=-1)) + 1), dtype=np.int64)
    np.add.at(table, (t, p), 1)
    n = int(t.shape[0])
    return PairCounts(
        linked_same=_pairs(table),
        linked=_pairs(table.sum(axis=0)),
        same=_pairs(table.sum(axis=1)),
        total=n * (n - 1) // 2,
    )


def pairwise_scores(counts: PairCounts) -> dict[str, float]:
    """Pairwise precision, recall and F1 (NaN where undefined: precision when nothing is linked)."""
    tp, linked, same = counts.linked_same, counts.linked, counts.same
    return {
        "precision": tp / linked if linked else float("nan"),
        "recall": tp / same if same else float("nan"),
        "f1": 2.0 * tp / (linked + same) if linked + same else float("nan"),
    }


def chance_precision(y: NDArray[np.integer]) -> float:
    """Share of all pairs that are one person: the expected precision of any data-blind clustering."""
    c = pair_counts(y, np.zeros_like(np.asarray(y)))
    return c.same / c.total if c.total else float("nan")


def chance_f1(y: NDArray[np.integer]) -> float:
    """Expected pairwise F1 of the best data-blind clustering: everything in one cluster, ``2P / (1 + P)``."""
    p = chance_precision(y)
    return 2.0 * p / (1.0 + p)


def random_clustering_f1(counts: PairCounts) -> float:
    """Expected pairwise F1 of a random clustering with the same cluster sizes.

    Each linked pair of a random clustering is one person with probability
    ``same / total``, so it links ``linked · same / total`` same-person pairs
    in expectation (the ratio of expectations is reported).
    """
    if counts.total == 0 or counts.linked + counts.same == 0:
        return float("nan")
    return 2.0 * counts.linked * counts.same / (counts.total * (counts.linked + counts.same))


def pair_auc(S: FloatArray, y: NDArray[np.integer]) -> float:
    """Probability that a same-person pair scores above a two-person pair (ties count half).

    Parameters
    ----------
    S : ndarray of shape (n, n)
        Symmetric similarity matrix.
    y : ndarray of shape (n,)
    """
    from scipy.stats import rankdata

    iu = np.triu_indices(S.shape[0], 1)
    s = S[iu]
    same = np.asarray(y)[iu[0]] == np.asarray(y)[iu[1]]
    n_pos, n_neg = int(same.sum()), int((~same).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(s)
    return float((ranks[same].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# --------------------------------------------------------------------------- clustering


@dataclass(frozen=True)
class Dendrogram:
    """Average-linkage merges of a similarity matrix, most similar first.

    Attributes
    ----------
    merges : ndarray of shape (n − 1, 2)
        Cluster ids merged at each step (scipy's numbering: ``n + i`` is the
        cluster formed at step ``i``).
    similarity : ndarray of shape (n − 1,)
        Average pairwise similarity between the two clusters merged at each
        step, non-increasing (average linkage has no inversions).
    """

    n: int
    merges: IntArray
    similarity: FloatArray


def average_linkage(S: FloatArray) -> Dendrogram:
    """Agglomerate on similarity ``S`` of shape (n, n), merging the most similar clusters on average first."""
    from scipy.cluster.hierarchy import linkage

    n = int(S.shape[0])
    if n < 2:
        return Dendrogram(n, np.zeros((0, 2), dtype=np.int64), np.zeros(0))
    s = np.asarray(S, dtype=np.float64)[np.triu_indices(n, 1)]
    # scipy wants non-negative distances; average linkage commutes with the shift, so heights map back exactly.
    top = float(s.max())
    Z = linkage(top - s, method="average")
    return Dendrogram(n, Z[:, :2].astype(np.int64), top - Z[:, 2])


def cut(tree: Dendrogram, threshold: float) -> IntArray:
    """Flat clusters: every merge whose average similarity is at least ``threshold``, shape (n,)."""
    parent = np.arange(2 * tree.n - 1)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    for step, (a, b) in enumerate(tree.merges):
        if tree.similarity[step] < threshold:
            break  # similarities only decrease from here
        parent[root(int(a))] = tree.n + step
        parent[root(int(b))] = tree.n + step
    return np.array([root(i) for i in range(tree.n)], dtype=np.int64)


def merge_f1(tree: Dendrogram, y: NDArray[np.integer]) -> FloatArray:
    """Pairwise F1 of the clustering after each number of merges, shape (n,) (index 0: all singletons)."""
    labels = np.asarray(y)
    same = pair_counts(labels, np.arange(labels.shape[0])).same
    members: list[dict[Any, int] | None] = [{lab: 1} for lab in labels.tolist()]
    members += [None] * max(tree.n - 1, 0)
    sizes = [1] * tree.n + [0] * max(tree.n - 1, 0)
    f1 = np.zeros(tree.n)
    tp = linked = 0
    for step, (a, b) in enumerate(tree.merges):
        A, B = members[int(a)], members[int(b)]
        assert A is not None and B is not None
        if len(A) < len(B):
            A, B = B, A
        tp += sum(v * A.get(k, 0) for k, v in B.items())
        linked += sizes[int(a)] * sizes[int(b)]
        for k, v in B.items():
            A[k] = A.get(k, 0) + v
        members[tree.n + step], members[int(a)], members[int(b)] = A, None, None
        sizes[tree.n + step] = sizes[int(a)] + sizes[int(b)]
        f1[step + 1] = 2.0 * tp / (linked + same) if linked + same else 0.0
    return f1


def calibrate_threshold(S: FloatArray, y: NDArray[np.integer]) -> float:
    """The similarity threshold whose average-linkage clustering of ``S`` has the best pairwise F1 on ``y``.

    Midway between the last merge kept and the first refused, so that the
    same threshold applied to other people's similarities of the same kind
    transfers without sitting on a calibration merge.

    Parameters
    ----------
    S : ndarray of shape (n, n)
        Similarities of the calibration people's appearances.
    y : ndarray of shape (n,)
        Their identities.
    """
    tree = average_linkage(S)
    if tree.n < 2:
        return float("inf")
    f1 = merge_f1(tree, y)
    k = int(np.argmax(f1))  # merges kept
    sims = tree.similarity
    if k == 0:
        return float(sims[0] + max(1.0, abs(sims[0])))
    if k == tree.n - 1:
        return float(sims[-1] - max(1.0, abs(sims[-1])))
    return float((sims[k - 1] + sims[k]) / 2.0)


# --------------------------------------------------------------------------- scoring a linkage


def link_and_score(S_calibration: FloatArray, y_calibration: IntArray, S: FloatArray, y: IntArray) -> dict[str, float]:
    """Calibrate the threshold on one set of people, cluster another, and score the clustering.

    Returns
    -------
    dict
        ``precision``, ``recall``, ``f1`` (pairwise, of the clustering of
        ``S``), ``threshold`` (similarity units of the method),
        ``pair_auc`` (threshold-free), ``n_clusters`` and ``chance_f1`` (a
        random clustering with the same cluster sizes).
    """
    threshold = calibrate_threshold(S_calibration, y_calibration)
    labels = cut(average_linkage(S), threshold)
    counts = pair_counts(y, labels)
    return {
        **pairwise_scores(counts),
        "threshold": threshold,
        "pair_auc": pair_auc(S, y),
        "n_clusters": int(np.unique(labels).shape[0]),
        "chance_f1": random_clustering_f1(counts),
    }


def score_clustering(labels: NDArray[np.integer], y: NDArray[np.integer]) -> dict[str, float | int | None]:
    """Pairwise scores of a clustering given outright (no similarity, no threshold), against identities ``y``.

    Returns
    -------
    dict
        ``precision``, ``recall``, ``f1`` (None where undefined: precision when nothing is linked),
        ``threshold`` (None), ``pair_auc`` (the same-cluster indicator as the pair's score, ties half),
        ``n_clusters`` and ``chance_f1`` (a random clustering with the same cluster sizes).
    """
    lab = np.asarray(labels)
    counts = pair_counts(y, lab)
    same_cluster = (lab[:, None] == lab[None, :]).astype(np.float64)
    out: dict[str, float | int | None] = {
        **pairwise_scores(counts),
        "threshold": None,
        "pair_auc": pair_auc(same_cluster, y),
        "n_clusters": int(np.unique(lab).shape[0]),
        "chance_f1": random_clustering_f1(counts),
    }
    return {k: None if isinstance(v, float) and v != v else v for k, v in out.items()}
