"""Both evaluation protocols of an anonymiser, side by side.

The data owner anonymises the whole dataset once and shares it; every
measurement splits the records the same way (stratified by identity,
``test_size`` held out).

The source paper's protocol (Moriarty et al.)
    The owner's classifiers are trained on the *original* training faces
    (eigenfaces fitted there): the identity classifier (eigenfaces + RBF SVM
    with Platt posteriors) applied to the anonymised test faces gives the
    identity accuracy and the identity mixture (posterior mass on the true
    identity, top-k, KL from a random guess; :func:`peep.lab.audit.measures.identity_mixture`);
    the attribute classifier (random forest, balanced class weights) applied
    to them gives ``attribute_accuracy.original_model_on_anonymised``.

Hanisch et al.'s protocol ("A False Sense of Privacy")
    *Naive*: recognisers trained on original faces, applied to anonymised ones.
    *Parrot*: the adversary knows the method and its parameters, anonymises
    clear photos of the candidates (the training split, exactly as the owner
    did) and trains on them. *%-parrot*: 25/50/75 % of each identity's
    training faces anonymised, the rest clear. Five recognisers
    (:data:`RECOGNISERS`), ``max`` their best. *Reduced identity sets*: the
    parrot's decision restricted to ``size`` candidates chosen by
    :data:`STRATEGIES`, over ``draws`` draws, down to 3 identities.
    Attribute utility of a classifier *trained on anonymised faces*.

Every accuracy comes with its chance: identity majority rate and 1/K,
attribute majority rate; attribute accuracies with balanced accuracy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.lab.anonymize.methods import UPBA, Anonymised, Anonymiser, UpbaBasis, make_anonymiser, upba_basis
from peep.lab.audit.attacks import (
    Adversary,
    CandidateSet,
    ScoreAdversary,
    fit_knn,
    fit_linear,
    linkage_accuracy,
    quiet_convergence,
)
from peep.lab.audit.config import AuditConfig
from peep.lab.audit.execution import fit_served, proba_full
from peep.lab.audit.measures import classification_metrics, identity_mixture, majority_rate, ssim_batch

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Recognisers of Hanisch's protocol: name -> description.
RECOGNISERS: dict[str, str] = {
    "eigen-svm": "eigenfaces + standardised RBF SVM (C = 10, gamma 'scale')",
    "mlp": "eigenfaces + the server's default MLP preset (fit_recogniser)",
    "lda": "eigenfaces + shrinkage LDA, the server's 'lda' preset (linear, noise-aware)",
    "logreg": "eigenfaces + standardised logistic regression (the audit's)",
    "knn": "eigenfaces + k-nearest neighbours, k by leave-one-out (the audit's)",
}
#: Recognisers of each sweep point (the quick ones).
SWEEP_RECOGNISERS = ("eigen-svm", "lda")
#: Reduced-set selection strategies (Hanisch et al.).
STRATEGIES = ("random", "classification", "metadata", "distinctive", "center")
PERCENT_PARROT = (25, 50, 75)


@dataclass(frozen=True)
class EvalSettings:
    """How the evaluation measures (every field is recorded in ``anonymize.json``)."""

    n_components: int = 128
    test_size: float = 0.3
    seed: int = 0
    reduced_sizes: tuple[int, ...] = (32, 16, 8, 5, 3)
    draws: int = 10
    recognisers: tuple[str, ...] = tuple(RECOGNISERS)
    sweep_recognisers: tuple[str, ...] = SWEEP_RECOGNISERS
    percent_parrot: tuple[int, ...] = PERCENT_PARROT
    rf_trees: int = 200
    grid_faces: int = 6


@dataclass
class EvalData:
    """The dataset under evaluation, its labels and the split (picklable; sent to workers)."""

    images: NDArray[np.float32]  # (n, h, w) in [0, 1]
    identity: IntArray  # (n,)
    attribute: IntArray  # (n,) the attribute of interest
    attributes: dict[str, IntArray]  # every labelled attribute
    train: IntArray
    test: IntArray
    n_identities: int
    grid: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def additional(self) -> dict[str, IntArray]:
        return {k: v for k, v in self.attributes.items() if not np.array_equal(v, self.attribute)}


def split(identity: IntArray, test_size: float, seed: int) -> tuple[IntArray, IntArray]:
    """Stratified split of record indices by identity."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(identity.shape[0])
    tr, te = train_test_split(idx, test_size=test_size, stratify=identity, random_state=seed)
    return np.sort(np.asarray(tr, dtype=np.int64)), np.sort(np.asarray(te, dtype=np.int64))


# --------------------------------------------------------------------------- recognisers


class Eigen:
    """Eigenfaces fitted on one training set; every recogniser of that regime works on its coefficients."""

    def __init__(self, images: NDArray[np.floating], n_components: int) -> None:
        from peep.core.eigenface_model import EigenfaceModel

        flat = np.asarray(images, dtype=np.float64).reshape(images.shape[0], -1)
        self.model = EigenfaceModel(n_components=min(n_components, flat.shape[0] - 1)).fit(flat)

    def __call__(self, images: NDArray[np.floating]) -> FloatArray:
        out: FloatArray = self.model.transform(np.asarray(images, dtype=np.float64).reshape(images.shape[0], -1))
        return out


class Trained:
    """One recogniser trained on a gallery; :meth:`adversary` answers for a batch of probes."""

    def __init__(self, name: str, gallery: FloatArray, y: IntArray, n_classes: int, seed: int) -> None:
        self.name, self.n_classes, self.seed = name, n_classes, seed
        self.gallery, self.y = gallery, y
        self.model: Any = None
        if name == "eigen-svm":
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler
            from sklearn.svm import SVC

            self.model = make_pipeline(StandardScaler(), SVC(C=10.0, gamma="scale")).fit(gallery, y)
        elif name in ("mlp", "lda"):
            self.model = fit_served(AuditConfig(preset="default" if name == "mlp" else "lda"), gallery, y, seed)
        elif name not in ("logreg", "knn"):
            raise ValueError(f"recogniser: expected one of {', '.join(RECOGNISERS)}, received {name!r}")

    def adversary(self, probes: FloatArray) -> Adversary:
        K = self.n_classes
        if self.name == "knn":
            return fit_knn(self.gallery, self.y, probes, K)
        if self.name == "logreg":
            return fit_linear("logreg", self.gallery, self.y, probes, K, self.seed)[0]
        if self.name == "eigen-svm":
            scores = np.full((probes.shape[0], K), -np.inf)
            d = self.model.decision_function(probes)
            scores[:, self.model.classes_] = d if d.ndim == 2 else np.column_stack([-d, d])
            return ScoreAdversary(scores)
        return ScoreAdversary(np.log(np.clip(proba_full(self.model, probes, K), 1e-300, None)))


def train_regime(
    images: NDArray[np.floating], y: IntArray, n_classes: int, names: tuple[str, ...], settings: EvalSettings
) -> tuple[Eigen, dict[str, Trained]]:
    """Eigenfaces fitted on ``images`` and every named recogniser trained on their coefficients."""
    eig = Eigen(images, settings.n_components)
    C = eig(images)
    with quiet_convergence():
        return eig, {n: Trained(n, C, y, n_classes, settings.seed) for n in names}


def accuracies(
    eig: Eigen, trained: dict[str, Trained], probes: NDArray[np.floating], y: IntArray
) -> tuple[dict[str, float], dict[str, Adversary]]:
    """Accuracy of each recogniser (and ``max``) on ``probes``, and the adversaries for reduced sets."""
    C = eig(probes)
    with quiet_convergence():
        advs = {n: t.adversary(C) for n, t in trained.items()}
    K = next(iter(trained.values())).n_classes
    full = CandidateSet(size=K, strategy="all", classes=np.arange(K, dtype=np.int64))
    acc = linkage_accuracy(advs, y, full)
    return {n: acc[n] for n in trained} | {"max": acc["max"]}, advs


# --------------------------------------------------------------------------- attributes


def attribute_scores(y_true: IntArray, y_pred: IntArray) -> dict[str, float]:
    """Accuracy, balanced accuracy and the majority rate of ``y_true``."""
    m = classification_metrics(y_true, y_pred)
    return {"accuracy": m["accuracy"], "balanced_accuracy": m["balanced_accuracy"], "majority": majority_rate(y_true)}


def fit_attribute(C: FloatArray, y: IntArray, settings: EvalSettings) -> Any:
    """Random forest of the attribute (balanced class weights), as the source paper's attribute classifier."""
    from sklearn.ensemble import RandomForestClassifier

    forest = RandomForestClassifier(
        n_estimators=settings.rf_trees, class_weight="balanced", random_state=settings.seed, n_jobs=1
    )
    return forest.fit(C, y)


# --------------------------------------------------------------------------- the owner (trained on originals)


@dataclass
class Owner:
    """The data owner's models, trained once on the original training faces."""

    eig: Eigen
    identity_svm: Any  # RBF SVM with Platt (sigmoid) posteriors from cross-validation
    attribute_rf: Any
    naive: dict[str, Trained]
    original: dict[str, Any]


def fit_owner(data: EvalData, settings: EvalSettings) -> Owner:
    """Fit the owner's models and measure them on the original test faces."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    tr, te = data.train, data.test
    eig, naive = train_regime(data.images[tr], data.identity[tr], data.n_identities, settings.recognisers, settings)
    Ctr, Cte = eig(data.images[tr]), eig(data.images[te])
    from sklearn.calibration import CalibratedClassifierCV

    svm = CalibratedClassifierCV(make_pipeline(StandardScaler(), SVC(C=10.0, gamma="scale")), ensemble=False)
    svm.fit(Ctr, data.identity[tr])
    rf = fit_attribute(Ctr, data.attribute[tr], settings)
    acc, _ = accuracies(eig, naive, data.images[te], data.identity[te])
    original = {
        "identity_accuracy": acc,
        "owner_identity_accuracy": float((svm.predict(Cte) == data.identity[te]).mean()),
        "attribute": attribute_scores(data.attribute[te], rf.predict(Cte)),
    }
    return Owner(eig=eig, identity_svm=svm, attribute_rf=rf, naive=naive, original=original)


def source_protocol(owner: Owner, data: EvalData, anon_test: NDArray[np.floating]) -> dict[str, Any]:
    """Identity accuracy and mixture of the owner's classifier, and its attribute accuracy, on anonymised faces."""
    C = owner.eig(anon_test)
    y = data.identity[data.test]
    proba = proba_full(owner.identity_svm, C, data.n_identities)
    prior = np.bincount(data.identity[data.train], minlength=data.n_identities)
    mixture = {
        "accuracy": float((proba.argmax(axis=1) == y).mean()),
        "original_accuracy": owner.original["owner_identity_accuracy"],
        **identity_mixture(proba, y, prior),
    }
    attr = attribute_scores(data.attribute[data.test], owner.attribute_rf.predict(C))
    return {"identity_mixture": mixture, "original_model_on_anonymised": attr}


# --------------------------------------------------------------------------- reduced identity sets


def identity_profiles(data: EvalData, eig: Eigen) -> dict[str, Any]:
    """What the adversary knows of each identity from its clear training photos.

    ``centroids`` (K, nc), ``spread`` (mean distance of an identity's photos to
    its centroid), ``loo_accuracy`` (leave-one-out 1-NN accuracy per identity
    on the clear gallery) and ``metadata`` (majority label of each attribute).
    """
    from scipy.spatial.distance import cdist

    tr = data.train
    C = eig(data.images[tr])
    y = data.identity[tr]
    K = data.n_identities
    centroids = np.stack([C[y == c].mean(axis=0) for c in range(K)])
    spread = np.array([np.linalg.norm(C[y == c] - centroids[c], axis=1).mean() for c in range(K)])
    D = cdist(C, C)
    np.fill_diagonal(D, np.inf)
    nn_ok = y[np.argmin(D, axis=1)] == y
    loo = np.array([nn_ok[y == c].mean() for c in range(K)])
    combos = np.zeros(K, dtype=np.int64)
    base = 1
    for labels in data.attributes.values():
        maj = np.array([np.bincount(labels[tr][y == c]).argmax() for c in range(K)])
        combos += base * maj
        base *= int(labels.max()) + 1
    return {"centroids": centroids, "spread": spread, "loo_accuracy": loo, "metadata": combos}


def draw_reduced_set(strategy: str, size: int, profiles: dict[str, Any], rng: np.random.Generator) -> IntArray:
    """One draw of ``size`` candidate identities by ``strategy``.

    ``random``: uniformly. ``classification``: among the ``2·size`` identities
    the adversary recognises best on its clear gallery (leave-one-out 1-NN).
    ``metadata``: one identity per combination of attribute values in turn
    (random order), so the set spans the attributes. ``distinctive``: greedy
    farthest-point on clear centroids from a random start. ``center``: among
    the ``2·size`` identities whose photos lie closest to their centroid.
    """
    K = profiles["centroids"].shape[0]
    top = min(K, 2 * size)
    if strategy == "random":
        chosen = rng.choice(K, size=size, replace=False)
    elif strategy in ("classification", "center"):
        key = -profiles["loo_accuracy"] if strategy == "classification" else profiles["spread"]
        best = np.argsort(key + 1e-9 * rng.random(K), kind="stable")[:top]
        chosen = rng.choice(best, size=size, replace=False)
    elif strategy == "metadata":
        meta = profiles["metadata"]
        groups = [rng.permutation(np.flatnonzero(meta == v)).tolist() for v in rng.permutation(np.unique(meta))]
        picked: list[int] = []
        while len(picked) < size:
            for grp in groups:
                if grp and len(picked) < size:
                    picked.append(int(grp.pop()))
        chosen = np.array(picked)
    elif strategy == "distinctive":
        from scipy.spatial.distance import cdist

        CD = cdist(profiles["centroids"], profiles["centroids"])
        picked = [int(rng.integers(K))]
        while len(picked) < size:
            d = CD[:, picked].min(axis=1)
            d[picked] = -np.inf
            picked.append(int(np.argmax(d)))
        chosen = np.array(picked)
    else:
        raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, received {strategy!r}")
    return np.sort(np.asarray(chosen, dtype=np.int64))


def reduced_sets(
    advs: dict[str, Adversary], y_test: IntArray, profiles: dict[str, Any], settings: EvalSettings, key: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Best parrot accuracy on reduced sets over the draws: ``{strategy: {size: {mean, std, chance, …}}}``.

    ``chance`` is 1/size; ``chance_majority`` the mean over draws of the set's
    majority rate among the test faces (identities have unequal numbers of faces).
    """
    K = profiles["centroids"].shape[0]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for s_i, strategy in enumerate(STRATEGIES):
        rng = np.random.default_rng(np.random.SeedSequence([settings.seed, key, s_i]))
        out[strategy] = {}
        for size in sorted({s for s in settings.reduced_sizes if 2 <= s < K}, reverse=True):
            vals, majority = [], []
            for _ in range(settings.draws):
                classes = draw_reduced_set(strategy, size, profiles, rng)
                acc = linkage_accuracy(advs, y_test, CandidateSet(size, strategy, classes))
                vals.append(acc["max"])
                majority.append(acc["chance"])
            out[strategy][str(size)] = {
                "mean": float(np.mean(vals)),
                "std": float(np.std(vals)),
                "chance": 1.0 / size,
                "chance_majority": float(np.mean(majority)),
            }
    return out


# --------------------------------------------------------------------------- one method


@contextmanager
def job_env() -> Iterator[None]:
    """One BLAS thread per worker; seeded noise (the evaluation is a simulation, and says so)."""
    from peep.core import features
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with threadpool_limits(1), features.enabled("seeded-noise"):
        yield


def anonymise_dataset(anonymiser: Anonymiser, data: EvalData, basis: UpbaBasis | None = None) -> Anonymised:
    """What the owner shares: the whole dataset anonymised at once (fitted on it).

    ``basis``: UPBA's representation and importances, fitted once by
    :func:`shared_basis` for every UPBA run on these records.
    """
    if basis is not None and isinstance(anonymiser, UPBA):
        return anonymiser.fit_transform(data.images, data.attribute, data.additional, basis=basis)
    return anonymiser.fit_transform(data.images, data.attribute, data.additional)


def shared_basis(data: EvalData, params: Any, settings: EvalSettings, n_jobs: int = 1) -> UpbaBasis:
    """UPBA's basis for ``params`` on the whole dataset (forests seeded by ``settings.seed``), for every UPBA run.

    The basis depends only on the records, their attributes, the
    representation, ``n_components`` and ``n_estimators`` — not on (t, g, w,
    r_p) — so the method and every sweep point share one fit.
    """
    a = make_anonymiser("upba", params)
    return upba_basis(
        data.images,
        data.attribute,
        data.additional,
        representation=str(a.get_params()["representation"]),
        n_components=int(a.get_params()["n_components"]),
        n_estimators=int(a.get_params()["n_estimators"]),
        seed=settings.seed,
        n_jobs=n_jobs,
    )


def _chance(data: EvalData) -> dict[str, float]:
    yt = data.identity[data.test]
    return {
        "identity_majority": majority_rate(yt),
        "identity_uniform": 1.0 / data.n_identities,
        "attribute_majority": majority_rate(data.attribute[data.test]),
        "attribute_uniform": 1.0 / (int(data.attribute.max()) + 1),
    }


def _percent_mix(data: EvalData, anon: NDArray[np.float32], percent: int, seed: int) -> NDArray[np.float32]:
    """Training faces with ``percent`` % of each identity's faces anonymised, the rest clear."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, percent]))
    tr = data.train
    mix = data.images[tr].copy()
    y = data.identity[tr]
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        pick = rng.choice(rows, size=round(percent / 100 * rows.size), replace=False)
        mix[pick] = anon[tr][pick]
    return mix


def evaluate_method(
    name: str,
    params: dict[str, Any],
    data: EvalData,
    owner: Owner,
    profiles: dict[str, Any],
    settings: EvalSettings,
    key: int,
    basis: UpbaBasis | None = None,
) -> tuple[dict[str, Any], float]:
    """Both protocols for one method; returns the result and its CPU seconds (``basis``: UPBA's, shared)."""
    t0 = time.process_time()
    with job_env():
        anonymiser = make_anonymiser(name, params, random_state=settings.seed + key)
        start = time.perf_counter()
        released = anonymise_dataset(anonymiser, data, basis)
        seconds = time.perf_counter() - start
        A = released.images
        tr, te = data.train, data.test
        y_tr, y_te = data.identity[tr], data.identity[te]
        out: dict[str, Any] = {**anonymiser.describe(), "representation": released.representation}
        out["anonymise_seconds"] = seconds
        src = source_protocol(owner, data, A[te])
        naive, _ = accuracies(owner.eig, owner.naive, A[te], y_te)
        eig, parrot_models = train_regime(A[tr], y_tr, data.n_identities, settings.recognisers, settings)
        parrot, advs = accuracies(eig, parrot_models, A[te], y_te)
        rf = fit_attribute(eig(A[tr]), data.attribute[tr], settings)
        out["attribute_accuracy"] = {
            "original_model_on_anonymised": src["original_model_on_anonymised"],
            "trained_on_anonymised": attribute_scores(data.attribute[te], rf.predict(eig(A[te]))),
            "original_on_original": owner.original["attribute"],
        }
        out["identity_mixture"] = src["identity_mixture"]
        out["naive_accuracy"] = naive
        out["parrot_accuracy"] = parrot
        percent: dict[str, Any] = {}
        for p in settings.percent_parrot:
            mix = _percent_mix(data, A, p, settings.seed)
            e_p, models = train_regime(mix, y_tr, data.n_identities, settings.recognisers, settings)
            percent[str(p)], _ = accuracies(e_p, models, A[te], y_te)
        out["percent_parrot"] = percent
        out["reduced_sets"] = reduced_sets(advs, y_te, profiles, settings, key)
        out["chance"] = _chance(data)
        out["ssim_mean"] = float(ssim_batch(A, data.images).mean())
        own = anonymiser.own_protocol(data.images, A, data.identity, te, settings.seed + key)
        if own is not None:
            out["own_protocol"] = own
        out["_grid"] = A[data.grid]
    return out, time.process_time() - t0


def sweep_point(
    params: dict[str, Any],
    data: EvalData,
    owner: Owner,
    settings: EvalSettings,
    key: int,
    basis: UpbaBasis | None = None,
) -> tuple[dict[str, Any], float]:
    """UPBA at one (t, g, w, r_p): source protocol, parrot (quick recognisers), attribute utility."""
    t0 = time.process_time()
    with job_env():
        anonymiser = make_anonymiser("upba", params, random_state=settings.seed + key)
        A = anonymise_dataset(anonymiser, data, basis).images
        tr, te = data.train, data.test
        src = source_protocol(owner, data, A[te])
        eig, models = train_regime(A[tr], data.identity[tr], data.n_identities, settings.sweep_recognisers, settings)
        parrot, _ = accuracies(eig, models, A[te], data.identity[te])
        rf = fit_attribute(eig(A[tr]), data.attribute[tr], settings)
        out = {
            "parameters": anonymiser.describe()["parameters"],
            "identity_accuracy_source": src["identity_mixture"]["accuracy"],
            "identity_mixture": src["identity_mixture"]["mixture"],
            "parrot_accuracy": parrot,
            "attribute_original_model_on_anonymised": src["original_model_on_anonymised"],
            "attribute_trained_on_anonymised": attribute_scores(data.attribute[te], rf.predict(eig(A[te]))),
            "ssim_mean": float(ssim_batch(A, data.images).mean()),
        }
    return out, time.process_time() - t0


def sweep_point_of(result: dict[str, Any], settings: EvalSettings) -> dict[str, Any]:
    """The sweep point at a UPBA method result's parameters (:func:`evaluate_method`), taken from it.

    :func:`sweep_point` on the method's release (its seed) would measure the
    same: the same owner's models, and the sweep recognisers are trained alike
    among the method's.
    """
    parrot = {k: result["parrot_accuracy"][k] for k in settings.sweep_recognisers}
    att = result["attribute_accuracy"]
    return {
        "parameters": result["parameters"],
        "identity_accuracy_source": result["identity_mixture"]["accuracy"],
        "identity_mixture": result["identity_mixture"]["mixture"],
        "parrot_accuracy": parrot | {"max": max(parrot.values())},
        "attribute_original_model_on_anonymised": att["original_model_on_anonymised"],
        "attribute_trained_on_anonymised": att["trained_on_anonymised"],
        "ssim_mean": result["ssim_mean"],
    }


def default_sweep(base: dict[str, Any]) -> list[dict[str, Any]]:
    """UPBA's sweep: the paper's face defaults, then one parameter at a time, then joint points.

    ``base`` holds the defaults (t 0.6, g 32, r_p 0.01, w 100). One at a
    time: t in {1/g, 1}, g in {8, 128}, w in {2, 10}, r_p in {0.1, 0.5, 1};
    jointly, the settings where mixing and utility both move: (w, r_p) in
    {(2, 0.1), (2, 0.5), (10, 0.1), (10, 0.5)} at t = 1.
    """
    pts: list[dict[str, Any]] = [dict(base)]
    g = int(base.get("g", 32))
    for k, values in (("t", (1.0 / g, 1.0)), ("g", (8, 128)), ("w", (2.0, 10.0)), ("r_p", (0.1, 0.5, 1.0))):
        for v in values:
            p = dict(base)
            p[k] = v
            if k == "g":
                p["t"] = max(float(p.get("t", 0.6)), 1.0 / int(v))
            pts.append(p)
    for w, r in ((2.0, 0.1), (2.0, 0.5), (10.0, 0.1), (10.0, 0.5)):
        pts.append({**base, "t": 1.0, "w": w, "r_p": r})
    return pts
