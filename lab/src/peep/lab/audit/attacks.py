"""The adversaries of the audit: reconstruction, parrot linkage, averaging.

Linkage (Hanisch et al., "A False Sense of Privacy")
    The *parrot* adversary knows the mechanism and ε and holds clean photos of
    the candidates (the training split). It perturbs them exactly as a device
    would and trains recognisers on the result: k-nearest neighbours (k chosen
    by leave-one-out on its own data), a linear SVM, logistic regression and
    the MLP. We add a fifth, ``bayes``, which uses the clean photos directly
    and the *known* noise variance: a Gaussian model of each identity's faces
    with the noise covariance added (linear discriminant analysis on
    ``W + diag(σ²)``; :func:`bayes_log_posterior`). ``max`` is the best of them.

    Reduced candidate sets condition each adversary's decision on the set
    (arg-max over the set's identities; kNN restricts its gallery),
    which for posterior-based adversaries is ``P(c | y, c ∈ S) ∝ P(c | y)``,
    instead of retraining per set.

Reconstruction (PEEP Eq. 14 and a shrinkage estimator)
    Direct inversion maps the release back to coefficients and faces.
    Shrinkage (Wiener) knows the noise variance per coordinate
    (``mechanism.variance``) and the prior mean and variance of each released
    coordinate (the eigen-spectrum, as seen through the bounding), and
    estimates ``ẑ = m + v/(v + σ²)·(y − m)`` — the linear MMSE estimate in the
    eigenface basis, whose coordinates are uncorrelated.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray
from peep.lab.audit.basis import Basis, Domain
from peep.lab.audit.measures import psnr_batch, ssim_batch
from scipy.spatial.distance import cdist

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Adversaries of the linkage attack, in report order.
ADVERSARIES = ("knn", "svm", "logreg", "mlp", "bayes")
#: Reduced-set selection strategies (Hanisch et al.).
STRATEGIES = ("random", "distinctive", "center")
KNN_CANDIDATES = (1, 3, 7, 15, 31)


@contextmanager
def quiet_convergence() -> Iterator[None]:
    """Silence scikit-learn's convergence chatter on very noisy data (results stand as they are)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


class Adversary(Protocol):
    """A trained recogniser answering for a fixed batch of probes."""

    def predict(self, allowed: IntArray | None = None) -> IntArray:
        """Predicted identity of every probe, restricted to ``allowed`` identities."""
        ...


class ScoreAdversary:
    """Arg-max of a score matrix (decision values, probabilities or log-posteriors)."""

    def __init__(self, scores: FloatArray) -> None:
        self.scores = scores

    def predict(self, allowed: IntArray | None = None) -> IntArray:
        if allowed is None:
            pred: IntArray = np.argmax(self.scores, axis=1).astype(np.int64)
            return pred
        sub: IntArray = np.asarray(allowed, dtype=np.int64)[np.argmax(self.scores[:, allowed], axis=1)]
        return sub


class KnnAdversary:
    """k-nearest-neighbour vote (Euclidean), gallery restricted to the allowed identities."""

    def __init__(self, distances: FloatArray, gallery_labels: IntArray, k: int, n_classes: int) -> None:
        self.distances = distances
        self.gallery_labels = gallery_labels
        self.k = k
        self.n_classes = n_classes

    def predict(self, allowed: IntArray | None = None) -> IntArray:
        D = self.distances
        gy = self.gallery_labels
        if allowed is not None:
            cols = np.isin(gy, allowed)
            D, gy = D[:, cols], gy[cols]
        return _knn_vote(D, gy, min(self.k, D.shape[1]), self.n_classes)


def _knn_vote(D: FloatArray, gy: IntArray, k: int, n_classes: int) -> IntArray:
    idx = np.argpartition(D, k - 1, axis=1)[:, :k] if k < D.shape[1] else np.argsort(D, axis=1)
    labels = gy[idx]
    votes = np.zeros((D.shape[0], n_classes))
    np.add.at(votes, (np.repeat(np.arange(D.shape[0]), labels.shape[1]), labels.ravel()), 1.0)
    # Ties go to the identity whose voting neighbours are nearer on average.
    dist_sum = np.zeros_like(votes)
    np.add.at(
        dist_sum,
        (np.repeat(np.arange(D.shape[0]), labels.shape[1]), labels.ravel()),
        np.take_along_axis(D, idx, axis=1).ravel(),
    )
    tie_break = -dist_sum / np.maximum(votes, 1.0) / (np.abs(dist_sum).max() + 1.0)
    pred: IntArray = np.argmax(votes + 1e-3 * tie_break, axis=1).astype(np.int64)
    return pred


def fit_knn(gallery: FloatArray, gy: IntArray, probes: FloatArray, n_classes: int) -> KnnAdversary:
    """kNN with k chosen by leave-one-out accuracy on the adversary's own gallery."""
    G = cdist(gallery, gallery)
    np.fill_diagonal(G, np.inf)
    best_k, best_acc = 1, -1.0
    for k in KNN_CANDIDATES:
        if k >= gallery.shape[0]:
            break
        acc = float((_knn_vote(G, gy, k, n_classes) == gy).mean())
        if acc > best_acc:
            best_k, best_acc = k, acc
    return KnnAdversary(cdist(probes, gallery), gy, best_k, n_classes)


def _two_columns(d: FloatArray) -> FloatArray:
    return np.column_stack([-d, d]) if d.ndim == 1 else d


def fit_linear(
    kind: str, gallery: FloatArray, gy: IntArray, probes: FloatArray, n_classes: int, seed: int
) -> tuple[ScoreAdversary, FloatArray | None]:
    """Standardised linear SVM (``svm``) or logistic regression (``logreg``).

    Returns the adversary and, for ``logreg``, the posterior matrix
    (n_probes, n_classes) with columns for every identity.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    est: Any = LinearSVC(random_state=seed) if kind == "svm" else LogisticRegression(max_iter=1000)
    pipe = make_pipeline(StandardScaler(), est)
    with quiet_convergence():
        pipe.fit(gallery, gy)
    classes = pipe.classes_
    full = np.full((probes.shape[0], n_classes), -np.inf)
    if kind == "svm":
        full[:, classes] = _two_columns(pipe.decision_function(probes))
        return ScoreAdversary(full), None
    proba = pipe.predict_proba(probes)
    post = np.zeros((probes.shape[0], n_classes))
    post[:, classes] = proba
    full[:, classes] = np.log(np.clip(proba, 1e-300, None))
    return ScoreAdversary(full), post


def bayes_log_posterior(
    clean_gallery: FloatArray,
    gy: IntArray,
    probes: FloatArray,
    noise_var: FloatArray,
    n_classes: int,
    *,
    shrinkage: float = 0.1,
) -> FloatArray:
    """Log-posterior (up to a constant) of a Gaussian model that knows the noise, (n_probes, n_classes).

    Each identity's clean faces are modelled as ``N(μ_c, W)`` (means and pooled
    within-identity covariance of the adversary's clean photos, mapped into the
    release domain; ``W`` shrunk by ``shrinkage`` towards its diagonal), and a
    release adds independent noise of the mechanism's known variance, so
    ``y | c ~ N(μ_c, W + diag(noise_var))``; class frequencies are the prior.
    This is linear discriminant analysis with the noise covariance added — the
    Bayes rule for Gaussian faces and Gaussian noise, and a strong rule for
    Laplace noise too.

    Parameters
    ----------
    clean_gallery : ndarray of shape (n_gallery, nc)
        The candidates' clean photos, in the release domain (bounded/scaled).
    noise_var : ndarray of shape (nc,)
        Noise variance of what the probes carry (``mechanism.variance / k``
        for an average of k releases).
    """
    present = np.array([c for c in range(n_classes) if np.any(gy == c)], dtype=np.int64)
    mus = np.stack([clean_gallery[gy == c].mean(axis=0) for c in present])
    resid = clean_gallery - mus[np.searchsorted(present, gy)]
    dof = max(clean_gallery.shape[0] - present.size, 1)
    W = resid.T @ resid / dof
    W = (1.0 - shrinkage) * W + shrinkage * np.diag(np.diag(W))
    S = W + np.diag(np.maximum(np.asarray(noise_var, dtype=np.float64), 0.0))
    S_inv = np.linalg.pinv(S, hermitian=True)
    # (y−μ)ᵀS⁻¹(y−μ) = yᵀS⁻¹y − 2yᵀS⁻¹μ + μᵀS⁻¹μ; the first term is the same for every class.
    cross = probes @ S_inv @ mus.T
    quad = np.einsum("ci,ij,cj->c", mus, S_inv, mus)
    prior = np.log(np.bincount(gy, minlength=n_classes)[present] / gy.shape[0])
    out = np.full((probes.shape[0], n_classes), -np.inf)
    out[:, present] = cross - 0.5 * quad[None, :] + prior[None, :]
    return out


def posterior_from_log(log_post: FloatArray) -> FloatArray:
    """Normalise log-posteriors row-wise (``-inf`` columns get probability 0)."""
    m = log_post.max(axis=1, keepdims=True)
    p = np.exp(log_post - m)
    out: FloatArray = p / p.sum(axis=1, keepdims=True)
    return out


@dataclass(frozen=True)
class CandidateSet:
    """A set of candidate identities for the linkage attack."""

    size: int
    strategy: str  # "all", "random", "distinctive", "center"
    classes: IntArray


def select_candidate_sets(
    clean_gallery: FloatArray,
    gy: IntArray,
    n_classes: int,
    sizes: Sequence[int],
    rng: np.random.Generator,
) -> tuple[list[CandidateSet], list[dict[str, Any]]]:
    """The full set plus reduced sets chosen by the three strategies.

    ``distinctive``: identities whose centroids are far apart (greedy
    farthest-point selection, starting from the most distant pair).
    ``center``: identities whose photos lie closest to their own centroid
    (the most consistent faces). ``random``: uniformly at random. All are
    computed on the adversary's clean gallery, which it holds.

    Returns
    -------
    sets : list of CandidateSet
    skipped : list of dict
        Sizes that cannot be formed (``size >= n_classes`` collapses to the
        full set, reported once).
    """
    sets = [CandidateSet(size=n_classes, strategy="all", classes=np.arange(n_classes, dtype=np.int64))]
    skipped: list[dict[str, Any]] = []
    present = [c for c in range(n_classes) if np.any(gy == c)]
    centroids = np.stack([clean_gallery[gy == c].mean(axis=0) for c in present])
    spread = np.array(
        [np.linalg.norm(clean_gallery[gy == c] - centroids[i], axis=1).mean() for i, c in enumerate(present)]
    )
    CD = cdist(centroids, centroids)
    for size in sorted(set(sizes)):
        if size >= len(present):
            skipped.append(
                {
                    "size": size,
                    "reason": f"only {len(present)} identities: the full set is the largest candidate set"
                    if size > len(present)
                    else "equals the full set",
                }
            )
            continue
        i, j = np.unravel_index(np.argmax(CD), CD.shape)
        chosen = [int(i), int(j)]
        while len(chosen) < size:
            mind = CD[:, chosen].min(axis=1)
            mind[chosen] = -np.inf
            chosen.append(int(np.argmax(mind)))
        distinctive = np.array(sorted(present[c] for c in chosen), dtype=np.int64)
        center = np.array(sorted(present[c] for c in np.argsort(spread)[:size]), dtype=np.int64)
        random = np.array(sorted(rng.choice(present, size=size, replace=False)), dtype=np.int64)
        sets += [
            CandidateSet(size, "random", random),
            CandidateSet(size, "distinctive", distinctive),
            CandidateSet(size, "center", center),
        ]
    return sets, skipped


def linkage_accuracy(
    adversaries: dict[str, Adversary], y_probe: IntArray, candidates: CandidateSet
) -> dict[str, float]:
    """Accuracy of each adversary on the probes of ``candidates``, plus ``max`` and chance."""
    from peep.lab.audit.measures import majority_rate

    rows = np.isin(y_probe, candidates.classes)
    out: dict[str, float] = {}
    allowed = None if candidates.strategy == "all" else candidates.classes
    for name, adv in adversaries.items():
        pred = adv.predict(allowed)
        out[name] = float((pred[rows] == y_probe[rows]).mean()) if rows.any() else float("nan")
    out["max"] = max(out.values())
    out["chance"] = majority_rate(y_probe[rows])
    out["chance_uniform"] = 1.0 / len(candidates.classes)
    return out


# --------------------------------------------------------------------------- reconstruction


def shrinkage_prior(clean_domain: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Prior mean and variance of each released coordinate, from basis faces (never released ones)."""
    return clean_domain.mean(axis=0), clean_domain.var(axis=0)


def reconstruct_direct(releases: FloatArray, domain: Domain, basis: Basis) -> tuple[FloatArray, FloatArray]:
    """PEEP Eq. 14 (undo the scaling and project back), the learned decoder, or retrieval.

    Returns flattened faces (n, pixels) and the projection's inputs for them
    (the faces themselves, or the retrieved public faces' descriptors).
    """
    return basis.reconstruct_from(releases, domain.name)


def reconstruct_shrinkage(
    releases: FloatArray,
    domain: Domain,
    basis: Basis,
    prior_mean: FloatArray,
    prior_var: FloatArray,
    noise_var: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Wiener/linear-MMSE estimate of each release's clean value, then as :func:`reconstruct_direct`."""
    gain = prior_var / (prior_var + np.asarray(noise_var, dtype=np.float64))
    Z = prior_mean + gain * (releases - prior_mean)
    return basis.reconstruct_from(Z, domain.name)


class Recogniser(Protocol):
    def predict(self, X: Any) -> Any: ...


def reconstruction_scores(
    faces_hat: FloatArray,
    originals: NDArray[np.floating],
    basis: Basis,
    clean_recogniser: Recogniser,
    y: IntArray,
    inputs_hat: FloatArray | None = None,
) -> dict[str, float]:
    """SSIM and PSNR against the originals, and re-identification by a clean recogniser.

    Parameters
    ----------
    faces_hat : ndarray of shape (n, pixels)
    originals : ndarray of shape (n, height, width)
    clean_recogniser
        Trained on clean coefficients of the training faces.
    inputs_hat : ndarray of shape (n, input dimension), optional
        What the projection takes for the reconstructed faces (default: the
        faces; for a descriptor projection, the retrieved faces' descriptors).
    """
    shape = originals.shape
    imgs = faces_hat.reshape(shape)
    reid = clean_recogniser.predict(basis.transform(faces_hat if inputs_hat is None else inputs_hat))
    return {
        "ssim": float(ssim_batch(imgs, originals).mean()),
        "psnr": float(psnr_batch(imgs, originals).mean()),
        "reid": float((np.asarray(reid) == y).mean()),
    }
