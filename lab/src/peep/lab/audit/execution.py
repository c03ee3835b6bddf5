"""Running an audit: splits, jobs (in worker processes), aggregation.

Work is cut into independent jobs so that two CPU cores are used fully:

1. one *prepare* job per repeat: stratified split, eigenfaces and bounds
   (see :mod:`peep.lab.audit.basis`), the no-privacy recogniser,
   reconstruction baselines (mean face, PCA ceiling) and the candidate sets;
2. one *evaluate* job per (repeat, ε) — releases, the recogniser trained on
   perturbed templates, every attack — and one job per sweep point;
3. with ``--frontier``, selection jobs and evaluate jobs for the chosen
   configurations.

This module holds what those jobs compute and :func:`run_jobs`, which runs
them; the job functions the worker processes call, the sweeps, the frontier's
selection and the tags of the jobs' noise streams are in
:mod:`peep.lab.audit.jobs`.

Fitted models are reused across ε where that is valid (split, basis, bounds,
clean recogniser, candidate sets). Each job pins BLAS to one thread: on a
loaded 2-core machine two OpenBLAS threads per process made the MLP several
times slower, while two single-threaded processes scale.

Every recogniser the audit measures is fitted by the server's own code:
:func:`peep.server.recognition.fitting.fit_recogniser` with a preset from
:data:`~peep.server.recognition.presets.PRESETS` (``--preset``, default the
server's default) and the server's default training parameters, so a
template's accuracy here is what a server trained on the same templates
serves (before ONNX export, which the trainer checks agrees).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core import features
from peep.core.mechanisms import mechanism_class
from peep.core.projections import projection_class
from peep.core.release import mechanism_for_bounds
from peep.lab.audit.attacks import (
    ADVERSARIES,
    Adversary,
    CandidateSet,
    ScoreAdversary,
    bayes_log_posterior,
    fit_knn,
    fit_linear,
    linkage_accuracy,
    posterior_from_log,
    quiet_convergence,
    reconstruct_direct,
    reconstruct_shrinkage,
    reconstruction_scores,
    select_candidate_sets,
    shrinkage_prior,
)
from peep.lab.audit.basis import Basis, Domain, fit_basis
from peep.lab.audit.config import AuditConfig, AuditConfigError
from peep.lab.audit.measures import (
    classification_metrics,
    identity_mixture,
    majority_rate,
    membership_auc,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


# --------------------------------------------------------------------------- helpers


class ServedRecogniser:
    """A :class:`~peep.server.recognition.fitting.FittedRecogniser` seen as a classifier of identity indices.

    ``classes_`` are the identity indices the server kept (it drops subjects
    with too few templates), in the column order of :meth:`predict_proba`.
    """

    def __init__(self, fitted: Any) -> None:
        self.fitted = fitted
        self.classes_ = np.array([int(n) for n in fitted.class_names], dtype=np.int64)

    def predict_proba(self, X: FloatArray) -> FloatArray:
        return np.asarray(self.fitted.predict_proba(np.asarray(X, dtype=np.float32)), dtype=np.float64)

    def predict(self, X: FloatArray) -> IntArray:
        return np.asarray(self.classes_[self.predict_proba(X).argmax(axis=1)], dtype=np.int64)


def fit_like_server(
    cfg: AuditConfig, X: FloatArray, subjects: Sequence[str], seed: int, *, background_prefix: str = ""
) -> Any:
    """The server's :func:`~peep.server.recognition.fitting.fit_recogniser` on templates ``X`` labelled
    ``subjects``, with the audit's preset and the server's default training parameters (validation
    fraction, FARs, minimum templates per subject, ...). Subjects starting ``background_prefix`` form the
    "unknown" class. Runs inside :func:`job_env` (BLAS already pinned to one thread)."""
    from peep.server.config import TrainingConfig
    from peep.server.recognition.fitting import fit_recogniser

    server = TrainingConfig()
    return fit_recogniser(
        np.asarray(X, dtype=np.float32),
        list(subjects),
        preset=cfg.recogniser_preset,
        background_prefix=background_prefix,
        validation_fraction=server.validation_fraction,
        target_far=server.target_far,
        identify_far=server.identify_far,
        unknown_reject_rate=server.unknown_reject_rate,
        min_templates_per_subject=server.min_templates_per_subject,
        random_state=seed,
        blas_threads=1,
    )


def fit_served(cfg: AuditConfig, X: FloatArray, y: IntArray, seed: int) -> ServedRecogniser:
    """The recogniser a server trains on templates ``X`` of identities ``y`` (:func:`fit_like_server`; no
    background class)."""
    return ServedRecogniser(fit_like_server(cfg, X, [str(int(v)) for v in y], seed))


def proba_full(clf: Any, X: FloatArray, n_classes: int) -> FloatArray:
    """``predict_proba`` with a column for every identity (zeros for unseen ones)."""
    out = np.zeros((X.shape[0], n_classes))
    out[:, clf.classes_] = clf.predict_proba(X)
    return out


def split_seed(cfg: AuditConfig, split: int) -> int:
    return int(np.random.SeedSequence([cfg.seed, split]).generate_state(1)[0] % (2**31 - 1))


def noise_state(cfg: AuditConfig, key: Sequence[int]) -> np.random.Generator | None:
    """Seeded generator for a job (``None`` = the secure sampler)."""
    if cfg.secure_noise:
        return None
    return np.random.default_rng(np.random.SeedSequence([cfg.seed, *key]))


@contextmanager
def job_env(cfg: AuditConfig) -> Iterator[None]:
    """One BLAS thread, the seeded-noise feature when simulating, quiet convergence."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with ExitStack() as stack:
        stack.enter_context(threadpool_limits(1))
        if not cfg.secure_noise:
            stack.enter_context(features.enabled("seeded-noise"))
        stack.enter_context(quiet_convergence())
        yield


def nominal_epsilon(cfg: AuditConfig, kind: str, target_vector: float, basis: Basis) -> float:
    """The mechanism parameter ε whose per-vector guarantee is ``target_vector``.

    Called inside :func:`job_env`, so a seeded probe is allowed when simulating;
    with the secure sampler the probe is secure too (its grid inflation counts).
    """
    return mechanism_class(kind).epsilon_for_vector(
        basis.bounds, target_vector, delta=cfg.delta, random_state=None if cfg.secure_noise else 0
    )


def audited_mechanism(cfg: AuditConfig, basis: Basis, kind: str, epsilon: float, rng: Any) -> Any:
    return mechanism_for_bounds(basis.bounds, kind=kind, epsilon=epsilon, delta=cfg.delta, random_state=rng)


def _release_avg(mech: Any, Z: FloatArray, k: int) -> FloatArray:
    """Mean of ``k`` independent releases of each row."""
    if k == 1:
        return np.asarray(mech.release(Z))
    R = np.asarray(mech.release(np.repeat(Z, k, axis=0)))
    out: FloatArray = R.reshape(Z.shape[0], k, Z.shape[1]).mean(axis=1)
    return out


# --------------------------------------------------------------------------- data


@dataclass
class AuditData:
    """Faces of the audited dataset (and of the background population, if used)."""

    images: NDArray[np.float32]  # (n, h, w)
    labels: IntArray
    target_names: list[str]
    source: str
    normalisation: dict[str, Any]
    n_skipped: int
    background: NDArray[np.float32] | None = None  # flattened (m, pixels)
    background_labels: IntArray | None = None
    background_desc: dict[str, Any] = field(default_factory=dict)
    #: Descriptors of the same faces, by descriptor kind (e.g. ``"dlib-resnet"``): (n, dimension).
    descriptors: dict[str, NDArray[np.float32]] = field(default_factory=dict)
    background_descriptors: dict[str, NDArray[np.float32]] = field(default_factory=dict)
    #: The people the audit never enrols (strangers, calibration and public people of the bystander
    #: section): LFW's identities outside the audited ones, the background itself with --basis background.
    pool: NDArray[np.float32] | None = None  # flattened (m, pixels)
    pool_labels: IntArray | None = None
    pool_descriptors: dict[str, NDArray[np.float32]] = field(default_factory=dict)
    pool_desc: dict[str, Any] = field(default_factory=dict)

    @property
    def X(self) -> NDArray[np.float32]:
        return self.images.reshape(self.images.shape[0], -1)

    def inputs(self, kind: str) -> NDArray[np.float32]:
        """What a projection with input ``kind`` takes for every audited face: flattened pixels or descriptors."""
        return self.X if kind == "pixels" else self.descriptors[kind]

    @property
    def n_classes(self) -> int:
        return len(self.target_names)


@contextmanager
def progress_bar(cfg: AuditConfig, desc: str) -> Iterator[Callable[[int, int], None]]:
    """A ``(done, total)`` callback showing progress on stderr (only shown if called)."""
    from peep.server.progress import Progress

    with Progress(desc, enabled=cfg.progress) as bar:
        yield bar.update


def load_audit_data(cfg: AuditConfig) -> AuditData:
    """Load the dataset (and background population) with the configured normalisation.

    With ``cfg.bystander`` the never-enrolled people are loaded too (the
    background itself with ``--basis background``; otherwise the same range
    of LFW people, used only by the bystander section). Descriptor
    projections (``dlib-resnet``) among the audited or searched ones get
    their descriptors computed for the same faces (cached by image content
    and network, like the faces).
    """
    from peep.server.datasets import DatasetError, load_dataset
    from peep.server.descriptors import descriptor_encoder

    norm: Any = cfg.normalisation
    kinds = sorted({projection_class(k).input_kind for k in cfg.used_projections} - {"pixels"})
    encoders = {kind: descriptor_encoder(kind) for kind in kinds}
    if len(encoders) > 1:
        raise AuditConfigError(f"--projection/--frontier-projections: at most one descriptor kind, received {kinds}")
    encoder = next(iter(encoders.values()), None)
    described = f" and their {encoder.kind} descriptors" if encoder is not None else ""
    with progress_bar(cfg, f"detecting and normalising faces{described} (cached afterwards)") as cb:
        ds = load_dataset(
            cfg.dataset,
            data_home=cfg.data_home,
            min_faces=cfg.min_faces,
            normalisation=norm,
            progress=cb,
            encoder=encoder,
            jobs=cfg.jobs or None,
        )
    data = AuditData(
        images=ds.images,
        labels=ds.labels,
        target_names=list(ds.target_names),
        source=ds.source,
        normalisation=dict(ds.normalisation),
        n_skipped=ds.n_skipped,
    )
    if encoder is not None and ds.descriptors is not None:
        data.descriptors[encoder.kind] = ds.descriptors
        data.normalisation["descriptor"] = encoder.identity
    if data.n_classes < 2:
        raise AuditConfigError(
            f"--min-faces: expected a value leaving at least 2 identities, "
            f"received {cfg.min_faces} ({data.n_classes} identity left)"
        )
    if cfg.basis == "background":
        bg, desc = _load_population(cfg, ds.target_names, encoder, "background faces (cached afterwards)")
        if bg.n_subjects < 2:
            raise AuditConfigError(
                f"--basis background: expected a background of at least 2 LFW identities outside the audited "
                f"ones, found {bg.n_subjects}"
            )
        data.background = bg.X.astype(np.float32)
        data.background_labels = bg.labels.astype(np.int64)
        if encoder is not None and bg.descriptors is not None:
            data.background_descriptors[encoder.kind] = bg.descriptors
        data.background_desc = desc
    if cfg.bystander:
        if data.background is not None:
            # The same public people: loaded once, shared (pickled once per job, too).
            data.pool, data.pool_labels = data.background, data.background_labels
            data.pool_descriptors = data.background_descriptors
            data.pool_desc = data.background_desc
        else:
            try:
                pool, desc = _load_population(cfg, ds.target_names, encoder, "strangers' faces (cached afterwards)")
            except DatasetError as exc:
                raise AuditConfigError(
                    f"--no-bystander: the bystander section takes its strangers from LFW's people outside the "
                    f"audited ones, which could not be loaded ({exc}); stage LFW or pass --no-bystander"
                ) from exc
            data.pool = pool.X.astype(np.float32)
            data.pool_labels = pool.labels.astype(np.int64)
            if encoder is not None and pool.descriptors is not None:
                data.pool_descriptors[encoder.kind] = pool.descriptors
            data.pool_desc = desc
    return data


def _load_population(
    cfg: AuditConfig, audited_names: Sequence[str], encoder: Any, desc: str
) -> tuple[Any, dict[str, Any]]:
    """Every LFW identity in the data home that is not audited, and its description.

    For ``lfw`` the people with 5 to ``min_faces − 1`` images, for a folder
    LFW's people whose names are not in it (:attr:`AuditConfig.background_faces_range`).
    """
    from peep.server.datasets import load_dataset

    min_bg, max_faces = cfg.background_faces_range
    norm: Any = cfg.normalisation
    with progress_bar(cfg, desc) as cb:
        pop = load_dataset(
            "lfw",
            data_home=cfg.data_home,
            min_faces=min_bg,
            max_faces=max_faces,
            normalisation=norm,
            progress=cb,
            encoder=encoder,
            jobs=cfg.jobs or None,
        )
    audited = set(audited_names)
    excluded = sorted(audited & set(pop.target_names))
    if excluded:
        pop = pop.subset(np.array([pop.target_names[int(i)] not in audited for i in pop.labels]))
    return pop, {
        "source": "lfw",
        "min_faces": min_bg,
        "max_faces": max_faces,
        "n_images": pop.n_images,
        "n_subjects": pop.n_subjects,
        "excluded_audited_identities": len(excluded),
    }


def basis_faces(
    data: AuditData, train_idx: IntArray, input_kind: str = "pixels"
) -> tuple[NDArray[np.float32], IntArray, NDArray[np.float32]]:
    """The public faces the projection and bounds are fitted on: (inputs, identities, flattened pixels).

    The inputs are what a projection of ``input_kind`` takes (the pixels
    themselves, or the faces' descriptors).
    """
    if data.background is not None and data.background_labels is not None:
        inputs = data.background if input_kind == "pixels" else data.background_descriptors[input_kind]
        return inputs, data.background_labels, data.background
    return data.inputs(input_kind)[train_idx], data.labels[train_idx], data.X[train_idx]


def fit_split_basis(
    data: AuditData, cfg: AuditConfig, train_idx: IntArray, n_components: int, kind: str, variant: str = "bundle"
) -> Basis:
    """:func:`fit_basis` on the split's public faces, for projection ``kind``."""
    input_kind = projection_class(kind).input_kind
    fit_on, fit_labels, pixels = basis_faces(data, train_idx, input_kind)
    shape = (int(data.images.shape[1]), int(data.images.shape[2])) if cfg.mirrored(kind) else None
    return fit_basis(
        fit_on,
        n_components,
        variant=variant,
        projection=kind,
        labels=fit_labels,
        mirror_shape=shape,
        faces=None if input_kind == "pixels" else pixels,
    )


# --------------------------------------------------------------------------- repeat context


@dataclass
class RepeatContext:
    """What every ε of one split shares (picklable; sent to worker processes)."""

    split: int
    seed: int
    basis: Basis
    y_train: IntArray
    y_test: IntArray
    C_train: FloatArray
    C_test: FloatArray
    test_images: NDArray[np.float32]
    n_classes: int
    train_idx: IntArray
    test_idx: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    clean_mlp: Any = None
    candidate_sets: list[CandidateSet] = field(default_factory=list)
    grid_idx: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def stratified_split(labels: IntArray, test_size: float, seed: int) -> tuple[IntArray, IntArray]:
    """A split's (training, test) indices of the audited faces, stratified by identity ``labels``.

    The bystander section draws its enrolled people here too, so that split ``r`` enrols the
    same faces in both sections.
    """
    from sklearn.model_selection import train_test_split

    idx = np.arange(labels.shape[0])
    tr, te = train_test_split(idx, test_size=test_size, stratify=labels, random_state=seed)
    return np.asarray(tr, dtype=np.int64), np.asarray(te, dtype=np.int64)


def _grid_indices(y_test: IntArray, n: int) -> IntArray:
    """One test face per identity first, then more, up to ``n``."""
    first = [int(np.flatnonzero(y_test == c)[0]) for c in np.unique(y_test)]
    rest = [i for i in range(y_test.shape[0]) if i not in set(first)]
    return np.array((first + rest)[:n], dtype=np.int64)


def make_context(
    data: AuditData,
    cfg: AuditConfig,
    split: int,
    *,
    n_components: int,
    variant: str = "bundle",
    with_clean: bool = True,
    projection: str | None = None,
) -> tuple[RepeatContext, dict[str, Any]]:
    """Split, fit the basis and (optionally) the clean recogniser and baselines."""
    seed = split_seed(cfg, split)
    tr, te = stratified_split(data.labels, cfg.test_size, seed)
    kind = projection or cfg.projection
    basis = fit_split_basis(data, cfg, tr, n_components, kind, variant)
    X = data.inputs(basis.input_kind)
    ctx = RepeatContext(
        split=split,
        seed=seed,
        basis=basis,
        y_train=data.labels[tr],
        y_test=data.labels[te],
        C_train=basis.transform(X[tr]),
        C_test=basis.transform(X[te]),
        test_images=data.images[te],
        n_classes=data.n_classes,
        train_idx=tr,
        test_idx=te,
        grid_idx=_grid_indices(data.labels[te], cfg.grid_faces),
    )
    baseline: dict[str, Any] = {}
    if not with_clean:
        return ctx, baseline
    mlp = fit_served(cfg, ctx.C_train, ctx.y_train, seed)
    ctx.clean_mlp = mlp
    p_te = proba_full(mlp, ctx.C_test, ctx.n_classes)
    p_tr = proba_full(mlp, ctx.C_train, ctx.n_classes)
    baseline.update(classification_metrics(ctx.y_test, p_te.argmax(axis=1)))
    member = p_tr[np.arange(p_tr.shape[0]), ctx.y_train]
    nonmember = p_te[np.arange(p_te.shape[0]), ctx.y_test]
    baseline["membership_auc"] = membership_auc(member, nonmember)
    n_test = ctx.C_test.shape[0]
    mean_face = np.broadcast_to(basis.mean_face, (n_test, basis.mean_face.shape[0]))
    baseline["mean_face"] = reconstruction_scores(
        np.clip(mean_face, 0, 1), ctx.test_images, basis, mlp, ctx.y_test, basis.inputs_of_mean(n_test)
    )
    ceiling, ceiling_inputs = basis.reconstruct(ctx.C_test)
    baseline["pca_ceiling"] = reconstruction_scores(ceiling, ctx.test_images, basis, mlp, ctx.y_test, ceiling_inputs)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, split, 99]))
    ctx.candidate_sets, skipped = select_candidate_sets(ctx.C_train, ctx.y_train, ctx.n_classes, cfg.subset_sizes, rng)
    baseline["subsets_skipped"] = skipped
    baseline["n_components"] = basis.n_components
    baseline["n_train"] = int(tr.shape[0])
    baseline["n_test"] = int(te.shape[0])
    baseline["explained_variance_ratio"] = basis.explained_variance_ratio
    baseline["projection"] = basis.kind
    return ctx, baseline


# --------------------------------------------------------------------------- evaluation of one ε


def _adversaries(
    ctx: RepeatContext,
    gallery: FloatArray,
    probes: FloatArray,
    clean_domain: FloatArray,
    noise_var: FloatArray,
    mlp_scores: FloatArray | None,
    seed: int,
) -> tuple[dict[str, Adversary], FloatArray]:
    K = ctx.n_classes
    advs: dict[str, Adversary] = {"knn": fit_knn(gallery, ctx.y_train, probes, K)}
    advs["svm"], _ = fit_linear("svm", gallery, ctx.y_train, probes, K, seed)
    advs["logreg"], _ = fit_linear("logreg", gallery, ctx.y_train, probes, K, seed)
    if mlp_scores is not None:
        advs["mlp"] = ScoreAdversary(mlp_scores)
    log_post = bayes_log_posterior(clean_domain, ctx.y_train, probes, noise_var, K)
    advs["bayes"] = ScoreAdversary(log_post)
    # The noise-aware posterior is the calibrated one (it falls back to the prior under huge
    # noise, where a classifier fitted to noisy data is over-confident): identity mixture uses it.
    return advs, posterior_from_log(log_post)


def evaluate_release(
    ctx: RepeatContext,
    cfg: AuditConfig,
    *,
    kind: str,
    epsilon: float | None = None,
    target_vector: float | None = None,
    key: Sequence[int] = (),
    attacks: bool = True,
    keep_grid: bool = False,
) -> dict[str, Any]:
    """Utility and every attack for one split and one ε.

    Parameters
    ----------
    epsilon : float, optional
        The mechanism's ε parameter; or give ``target_vector``, the per-vector
        ε to calibrate to (frontier).
    key : sequence of int
        Identifies the job's noise stream.
    attacks : bool
        False: utility only (frontier selection).
    """
    basis = ctx.basis
    eps = float(epsilon) if epsilon is not None else nominal_epsilon(cfg, kind, float(target_vector or 0), basis)
    rng = noise_state(cfg, key)
    mech = audited_mechanism(cfg, basis, kind, eps, rng)
    dom = Domain(kind, basis.bounds)
    Ztr, Zte = dom.forward(ctx.C_train), dom.forward(ctx.C_test)
    Rtr, Rte = np.asarray(mech.release(Ztr)), np.asarray(mech.release(Zte))
    K = ctx.n_classes
    mlp = fit_served(cfg, Rtr, ctx.y_train, ctx.seed)
    p_te = proba_full(mlp, Rte, K)
    g = mech.guarantee
    out: dict[str, Any] = {
        "epsilon": eps,
        "epsilon_coordinate": float(g.epsilon_coordinate),
        "epsilon_vector": float(g.epsilon_vector),
        "delta": float(g.delta),
        "noise_std": float(mech.noise_std),
        "n_components": basis.n_components,
        **classification_metrics(ctx.y_test, p_te.argmax(axis=1)),
        "chance": majority_rate(ctx.y_test),
        "chance_uniform": 1.0 / K,
    }
    if not attacks:
        return out
    yte, ytr = ctx.y_test, ctx.y_train
    # (d) membership: a fresh release of each training photo (what LDP bounds) and the
    # stored template itself (memorisation of the template).
    p_fresh = proba_full(mlp, np.asarray(mech.release(Ztr)), K)
    p_tr = proba_full(mlp, Rtr, K)
    nonmember = p_te[np.arange(yte.shape[0]), yte]
    out["membership_auc"] = membership_auc(p_fresh[np.arange(ytr.shape[0]), ytr], nonmember)
    out["membership_auc_template"] = membership_auc(p_tr[np.arange(ytr.shape[0]), ytr], nonmember)

    # (b) linkage by the parrot adversary; (c) averaging; (e) identity mixture.
    var = np.asarray(mech.variance, dtype=np.float64)
    averaging: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    for k in cfg.averaging_ks:
        if k == 1:
            gal, prb = Rtr, Rte
            mlp_scores = np.log(np.clip(p_te, 1e-300, None))
        else:
            gal, prb = _release_avg(mech, Ztr, k), _release_avg(mech, Zte, k)
            mlp_scores = np.log(np.clip(proba_full(mlp, prb, K), 1e-300, None))
        advs, post = _adversaries(ctx, gal, prb, Ztr, var / k, mlp_scores, ctx.seed)
        sets = ctx.candidate_sets if k == 1 else ctx.candidate_sets[:1]
        accs = [linkage_accuracy(advs, yte, s) for s in sets]
        full = accs[0]
        detail[str(k)] = {a: full[a] for a in ADVERSARIES if a in full} | {"max": full["max"]}
        averaging[str(k)] = full["max"]
        if k == 1:
            out["linkage"] = {a: full[a] for a in ADVERSARIES} | {"max": full["max"]}
            out["linkage_subsets"] = [
                {
                    "size": s.size,
                    "strategy": s.strategy,
                    "subjects": [int(c) for c in s.classes],
                    **{a: r[a] for a in (*ADVERSARIES, "max", "chance", "chance_uniform")},
                }
                for s, r in zip(sets, accs, strict=True)
            ]
            out["identity_mixture"] = identity_mixture(post, yte, np.bincount(ytr, minlength=K))
    out["averaging"] = averaging
    out["averaging_detail"] = detail

    # (a) reconstruction: direct inversion (Eq. 14) and shrinkage with known variances.
    m, v = shrinkage_prior(Ztr)
    direct, direct_inputs = reconstruct_direct(Rte, dom, basis)
    shrink, shrink_inputs = reconstruct_shrinkage(Rte, dom, basis, m, v, var)
    rec_d = reconstruction_scores(direct, ctx.test_images, basis, ctx.clean_mlp, yte, direct_inputs)
    rec_s = reconstruction_scores(shrink, ctx.test_images, basis, ctx.clean_mlp, yte, shrink_inputs)
    out["reconstruction"] = {"direct": rec_d, "shrinkage": rec_s}
    out["reconstruction_ssim"] = max(rec_d["ssim"], rec_s["ssim"])
    out["reconstruction_psnr"] = max(rec_d["psnr"], rec_s["psnr"])
    out["reconstruction_reid"] = max(rec_d["reid"], rec_s["reid"])
    if keep_grid:
        shape = ctx.test_images.shape[1:]
        out["_grid"] = {
            "direct": direct[ctx.grid_idx].reshape(-1, *shape).astype(np.float32),
            "shrinkage": shrink[ctx.grid_idx].reshape(-1, *shape).astype(np.float32),
        }
    return out


# --------------------------------------------------------------------------- job execution


def n_workers(cfg: AuditConfig) -> int:
    if cfg.jobs:
        return cfg.jobs
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run_jobs(
    cfg: AuditConfig,
    jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]],
    desc: str,
) -> tuple[list[Any], float]:
    """Run ``fn(*args)`` for every job (each returns ``(result, cpu_seconds)``), in order.

    Returns the results and the summed CPU seconds of the jobs.
    """
    from peep.server.progress import Progress

    results: list[Any] = [None] * len(jobs)
    cpu = 0.0
    bar = Progress(desc, total=len(jobs), enabled=cfg.progress)
    bar.update(0)
    try:
        workers = min(n_workers(cfg), len(jobs))
        if workers <= 1:
            for i, (fn, args) in enumerate(jobs):
                results[i], c = fn(*args)
                cpu += c
                bar.advance()
        else:
            from joblib import Parallel, delayed  # type: ignore[import-untyped]

            par = Parallel(n_jobs=workers, backend="loky", return_as="generator_unordered")
            for i, (res, c) in par(delayed(_indexed)(i, fn, args) for i, (fn, args) in enumerate(jobs)):
                results[i] = res
                cpu += c
                bar.advance()
    finally:
        bar.close()
    return results, cpu


def _indexed(i: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[int, Any]:
    res, c = fn(*args)
    return i, (res, c)


# --------------------------------------------------------------------------- aggregation


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def aggregate(items: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Mean and (population) std over repeats of nested dicts with the same keys.

    Numbers are averaged (NaN-aware); nested dicts recurse; anything else is
    taken from the first item. Keys starting with ``_`` are dropped.
    """
    mean: dict[str, Any] = {}
    std: dict[str, Any] = {}
    first = items[0]
    for key, val in first.items():
        if key.startswith("_"):
            continue
        vals = [it.get(key) for it in items]
        if _is_number(val):
            arr = np.array([np.nan if v is None else float(v) for v in vals])
            if np.all(np.isnan(arr)):
                mean[key], std[key] = None, None
            else:
                mean[key] = float(np.nanmean(arr))
                std[key] = float(np.nanstd(arr))
            if isinstance(val, (int, np.integer)) and np.all(arr == arr[0]):
                mean[key] = int(val)
        elif isinstance(val, dict) and all(isinstance(v, dict) for v in vals):
            m, s = aggregate([v for v in vals if isinstance(v, dict)])
            mean[key] = m
            if s:
                std[key] = s
        else:
            mean[key] = val
    return mean, std


def aggregate_subsets(per_repeat: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Group reduced-set linkage results by (size, strategy) across repeats."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rows in per_repeat:
        for r in rows:
            groups.setdefault((int(r["size"]), str(r["strategy"])), []).append(r)
    out = []
    for (size, strategy), rows in groups.items():
        numeric = [{k: v for k, v in r.items() if k not in ("size", "strategy", "subjects")} for r in rows]
        m, s = aggregate(numeric)
        out.append({"size": size, "strategy": strategy, "subjects": [r["subjects"] for r in rows], **m, "std": s})
    return out


def combine_results(per_repeat: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``results[]`` entry from the per-repeat results of one ε."""
    subsets = (
        aggregate_subsets([r["linkage_subsets"] for r in per_repeat]) if "linkage_subsets" in per_repeat[0] else None
    )
    stripped = [{k: v for k, v in r.items() if k != "linkage_subsets"} for r in per_repeat]
    mean, std = aggregate(stripped)
    if subsets is not None:
        mean["linkage_subsets"] = subsets
    mean["std"] = std
    mean["n_repeats"] = len(per_repeat)
    mean["per_repeat"] = per_repeat_values(per_repeat)
    return mean


def per_repeat_values(per_repeat: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Headline numbers of each split, so a difference can be judged against the spread."""
    out: dict[str, list[float]] = {}
    for key in ("accuracy", "balanced_accuracy", "weighted_f1"):
        if key in per_repeat[0]:
            out[key] = [float(r[key]) for r in per_repeat]
    if "linkage" in per_repeat[0]:
        out["linkage_max"] = [float(r["linkage"]["max"]) for r in per_repeat]
    return out
