"""The demo's open-set task on cached dlib descriptors, without the server: where its targets lie.

Replicates ``peep demo``'s recognition task: 10 LFW people enrolled from 20
photos each and probed with 6 more, 30 strangers (LFW people with 5-9 images)
with one capture each, 1,500 public background templates of other 5-9 image
people teaching "unknown"; the bundle's projection (whitened PCA of public
descriptors, K components, unit sphere) fitted on every public face; every
template released with PrivUnit at per-template ε (seeded simulation
sampler); shrinkage LDA; the unknown threshold set on held-out background
*people* at the identification FAR. It varies what the demo cannot cheaply:
K, the background's modelling (one class or k-means clusters), the open-set
score (posterior or Mahalanobis distance to the nearest enrolled mean) and
the FAR, over several seeds.

Usage::

    eval "$(bash scripts/stage-lfw.sh .data/scikit_learn_data)"; export SCIKIT_LEARN_DATA
    .venv/bin/python scripts/open-set-sim.py --epsilon 16 --components 16 --far 0.05,0.07,0.1 --seeds 6
"""

from __future__ import annotations

import argparse

import numpy as np
from peep.core.features import enable_features
from peep.core.mechanisms.registry import make_mechanism
from peep.core.projections.descriptor import DlibResNetProjection
from peep.edge.embedding import DlibResNetEncoder
from peep.server.datasets import load_dataset
from sklearn.cluster import KMeans
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis


def run(
    D,
    L,
    *,
    seed: int,
    epsilon: float,
    k: int,
    clusters: int,
    score: str,
    fars: list[float],
    projection: str = "pca",
    releases: int = 1,
) -> dict[float, tuple]:
    counts = np.bincount(L)
    rng = np.random.default_rng(seed)
    frequent = np.flatnonzero(counts >= 26)
    rare = rng.permutation(np.flatnonzero((counts >= 5) & (counts <= 9)))
    enrolled = rng.choice(frequent, 10, replace=False)
    strangers, background = rare[:30], rare[30:]
    public = ~np.isin(L, np.concatenate([enrolled, strangers]))
    if projection in ("lda-raw", "pca-raw"):
        # Not whitened: LDA scaled to unit within-class variance (discriminative directions spread more), or
        # PCA keeping the descriptor's own variances.
        pub_labels = L[public]
        if projection == "lda-raw":
            keep = np.isin(pub_labels, np.flatnonzero(np.bincount(pub_labels) >= 2))
            est = LinearDiscriminantAnalysis(n_components=k, solver="eigen", shrinkage="auto")
            est.fit(D[public][keep], pub_labels[keep])
        else:
            from sklearn.decomposition import PCA

            est = PCA(n_components=k).fit(D[public])
        mu = est.transform(D[public]).mean(axis=0)

        def transform(X):
            return est.transform(X) - mu
    elif projection == "lda":
        # A discriminative public projection: LDA of the public people's descriptors (whole identities).
        pub_labels = L[public]
        keep = np.isin(pub_labels, np.flatnonzero(np.bincount(pub_labels) >= 2))
        lda = LinearDiscriminantAnalysis(n_components=k, solver="eigen", shrinkage="auto")
        lda.fit(D[public][keep], pub_labels[keep])

        Zp = lda.transform(D[public])
        mu, sd = Zp.mean(axis=0), Zp.std(axis=0)

        def transform(X):
            return (lda.transform(X) - mu) / sd  # whitened, as the PCA path
    else:
        transform = DlibResNetProjection(n_components=k).fit(D[public]).transform

    def release(idx):
        Z = transform(D[idx])
        Z /= np.linalg.norm(Z, axis=1, keepdims=True)
        return np.asarray(make_mechanism("privunit", epsilon=epsilon, n_components=k, random_state=rng).release(Z))

    enrol, probe = [], []
    for p in enrolled:
        idx = rng.permutation(np.flatnonzero(L == p))[:26]
        enrol.append(idx[:20])
        probe.append(idx[20:])
    bg = rng.permutation(np.flatnonzero(np.isin(L, background)))[:1500]
    Xe, Xb = release(np.concatenate(enrol)), release(bg)
    ye, yp = np.repeat(np.arange(10), 20), np.repeat(np.arange(10), 6)
    Xp, Xs = release(np.concatenate(probe)), release(np.array([np.flatnonzero(L == s)[0] for s in strangers]))
    people = np.unique(L[bg])
    held = np.isin(L[bg], rng.choice(people, len(people) // 5, replace=False))

    def fit(Xb_tr):
        yb = np.full(len(Xb_tr), 10)
        if clusters > 1:
            yb = 10 + KMeans(clusters, n_init=3, random_state=seed).fit_predict(Xb_tr)
        X, y = np.vstack([Xe, Xb_tr]), np.concatenate([ye, yb])
        return LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(X, y)

    def scores(lda, X):
        if score == "posterior":
            return lda.predict_proba(X)[:, :10]
        prec = np.linalg.inv(lda.covariance_)
        return -np.stack([np.einsum("ij,jk,ik->i", X - m, prec, X - m) for m in lda.means_[:10]], 1)

    if releases == 2:
        # Track fusion as the server does it: each capture released twice, the product rule with the
        # model's class frequencies, the threshold from pairs of one held-out background person's templates.
        from peep.server.recognition.fusion import fuse_posteriors, fused_background_scores

        lc = fit(Xb[~held])
        held_scores = fused_background_scores(
            lc.predict_proba(Xb[held]), L[bg][held].astype(str), np.arange(10), lc.priors_, rng
        )
        lda = fit(Xb)
        Xp2 = release(np.concatenate(probe))
        Xs2 = release(np.array([np.flatnonzero(L == s)[0] for s in strangers]))

        def fused(X1, X2):
            P1, P2 = lda.predict_proba(X1), lda.predict_proba(X2)
            return np.stack([fuse_posteriors(np.vstack([a, b]), lda.priors_) for a, b in zip(P1, P2, strict=True)])

        Sp, Ss = fused(Xp, Xp2)[:, :10], fused(Xs, Xs2)[:, :10]
    else:
        held_scores = scores(fit(Xb[~held]), Xb[held]).max(1)
        lda = fit(Xb)
        Sp, Ss = scores(lda, Xp), scores(lda, Xs)
    out = {}
    for far in fars:
        thr = np.quantile(held_scores, 1 - far)
        out[far] = (float(np.mean((Sp.max(1) >= thr) & (Sp.argmax(1) == yp))), float(np.mean(Ss.max(1) < thr)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=16.0, help="per-template ε (default 16)")
    ap.add_argument("--components", type=int, default=16, help="K (default 16)")
    ap.add_argument("--clusters", type=int, default=1, help="background classes: 1 or k-means clusters (default 1)")
    ap.add_argument("--score", choices=("posterior", "mahalanobis"), default="posterior")
    ap.add_argument("--projection", choices=("pca", "lda", "lda-raw", "pca-raw"), default="pca",
                    help="public projection (default pca)")  # fmt: skip
    ap.add_argument("--releases", type=int, choices=(1, 2), default=1,
                    help="releases per capture: 2 = track fusion as the server does it (default 1)")  # fmt: skip
    ap.add_argument("--far", default="0.05,0.07,0.1", help="identification FARs (default 0.05,0.07,0.1)")
    ap.add_argument("--seeds", type=int, default=6, help="seeds 0..N-1 (default 6)")
    a = ap.parse_args()
    enable_features("seeded-noise")  # a simulation: never a release
    ds = load_dataset("lfw", min_faces=5, encoder=DlibResNetEncoder())
    D, L = ds.inputs("dlib-resnet"), ds.labels
    fars = [float(f) for f in a.far.split(",")]
    runs = [run(D, L, seed=s, epsilon=a.epsilon, k=a.components, clusters=a.clusters, score=a.score, fars=fars,
                projection=a.projection, releases=a.releases) for s in range(a.seeds)]  # fmt: skip
    for far in fars:
        r = np.array([x[far] for x in runs])
        print(
            f"{a.projection} releases {a.releases} ε {a.epsilon:g} K {a.components} clusters {a.clusters} "
            f"{a.score} FAR {far:g}: identification "
            f"{r[:, 0].mean():.3f} (per seed {' '.join(f'{v:.2f}' for v in r[:, 0])}), unknown rejection "
            f"{r[:, 1].mean():.3f} (per seed {' '.join(f'{v:.2f}' for v in r[:, 1])})"
        )


if __name__ == "__main__":
    main()
