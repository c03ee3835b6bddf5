"""Bystanders: how well an operator links a stranger's appearances from what the server kept.

A *stranger* is a person who never enrolled. Each photo of one is an
appearance at a camera, released once through the audited mechanism at the
audited ε. What the operator holds depends on the server's
``recognition.keep`` setting:

``keep = "all"``
    Every released template, for ``keep_days``. The operator links templates
    with the best similarities we have and clusters them:

    - ``cosine``: cosine similarity of the releases, centred on the public
      people's mean release (for the unit-sphere mechanisms the inner product
      of two releases is an unbiased estimate of the clean one);
    - ``parrot_lda``: a *parrot* metric (Hanisch et al.): linear discriminant
      analysis fitted on released templates of public people (what a server
      keeps as its background population), then cosine in that space;
    - ``parrot_plda``: the two-covariance (PLDA) log-likelihood ratio of
      "same person" against "different people", its between- and
      within-person covariances (noise included) estimated on the same public
      releases;
    - ``combined``: the sum of the ``cosine`` and ``parrot_lda`` similarities,
      each standardised on the calibration people's pairs.

``keep = "none"`` (the default)
    No template. What remains of a stranger is a recognition event per
    release: site, device, time, the decision (unknown, or the enrolled
    subject a false accept names), the recogniser's best enrolled-class
    probability, the model version, and a per-device per-run track id that
    links the releases of one appearance only. The operator links events by
    the probability (``probability``: ``−|p_i − p_j|``), and by decision and
    probability (``decision_probability``: events with different decisions are
    a full unit further apart). Time and device are not measured: the audit
    has no deployment timeline, and how much they link depends on a site's
    traffic.

``keep = "recognised"``
    The templates of releases named as an enrolled subject: for strangers, the
    recogniser's false accepts, counted.

decision mode (``keep_decision``)
    The device decides on its own clean projection with the model the server
    trained on releases (the recogniser with a background class below) and
    releases only the decision: one label per appearance through k-ary
    randomized response at ``epsilon_label`` over the model's enrolled
    subjects and "unknown" (:class:`peep.core.labels.RandomizedResponse`), its
    thresholds set as a device sets them (:func:`peep.core.decision.calibrate_clean`
    on the calibration people's clean projections, every person weighing
    alike, at the device model's FPIR target, the label mechanism accounted
    for). What the server receives and keeps of a stranger is that label (an
    opaque class id of the current device model, or unknown), device, time and
    a per-run track id: no template, probability or score. The operator's best
    linker is the released label itself: ``same_label`` puts appearances with
    one label in one cluster (unknown included), ``same_named_label`` only
    those released as one enrolled subject (each unknown alone). With one
    release per appearance the track id links nothing across appearances;
    time and device are not measured (as above).

Clustering (:mod:`peep.lab.audit.clustering`) is average-linkage
agglomeration on the similarity, stopped at a threshold chosen on a disjoint
set of *calibration* people (released the same way) to maximise the
clustering's pairwise F1 there. Pairwise precision is the share of
same-cluster pairs that are one person; recall the share of one person's
pairs put in one cluster. Chance: ``chance_precision`` is the share
of pairs that are one person (any clustering that ignores the data has that
precision in expectation), ``chance_f1`` the expected F1 of the best such
clustering (all appearances in one cluster: ``2P / (1 + P)``), and each
method's ``chance_f1`` that of a random clustering with the method's cluster
sizes.

Strangers, calibration and public people are disjoint thirds of the people
the audit never enrols (LFW's identities outside the audited ones), drawn per
split. With ``--basis background`` the projection and bounds are refitted
without the strangers (a bundle is built from public faces, never from the
people later walking past the camera); with ``--basis train`` they are the
split's own. The events come from two recognisers, both the server's
:func:`~peep.server.recognition.fitting.fit_recogniser` with the audit's preset
trained on the enrolled people's releases (the split's training part): the
one every other section measures (:func:`~peep.lab.audit.execution.fit_served`:
enrolled subjects only, its unknown threshold set so that a share of enrolled
people is called unknown), and one that also has the public people's releases
as its background class (a server with an enrolled background population:
its unknown threshold is set on held-out background people).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.bounding import BundleBounds
from peep.core.decision import calibrate_clean, identify_open_set
from peep.core.labels import RandomizedResponse
from peep.core.projections import projection_class
from peep.core.release import mechanism_for_bounds
from peep.lab.audit import execution
from peep.lab.audit.basis import Basis, Domain, fit_basis
from peep.lab.audit.clustering import chance_f1, link_and_score, pair_counts, score_clustering
from peep.lab.audit.config import AuditConfig, AuditConfigError
from peep.lab.audit.execution import AuditData

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Template linkers of ``keep = "all"``, in report order.
LINK_METHODS = ("cosine", "parrot_lda", "parrot_plda", "combined")
#: Event linkers of ``keep = "none"``, in report order.
EVENT_METHODS = ("probability", "decision_probability")
#: Label linkers of decision mode (the server keeps one released label per appearance), in report order.
DECISION_METHODS = ("same_label", "same_named_label")
#: The three disjoint groups of never-enrolled people.
GROUPS = ("strangers", "calibration", "public")
# Seed stream of the people partition (apart from the splits' and candidate sets').
_PARTITION_STREAM = 77
# Background ids for the server's training: the prefix marks them as "unknown", never as identities.
_BACKGROUND_PREFIX = "background:"
# Seed stream of decision mode's label releases (apart from the template releases of the same job).
_TAG_LABEL = 91

Similarity = Callable[[FloatArray], FloatArray]


# --------------------------------------------------------------------------- similarities


def _cosine(X: FloatArray) -> FloatArray:
    norm = np.linalg.norm(X, axis=1)
    U = X / np.where(norm > 0, norm, 1.0)[:, None]
    S: FloatArray = U @ U.T
    return S


def cosine_similarity(center: FloatArray) -> Similarity:
    """Cosine similarity of releases, centred on ``center`` (the public people's mean release), (n, n)."""
    c = np.asarray(center, dtype=np.float64)
    return lambda R: _cosine(np.asarray(R, dtype=np.float64) - c)


def fit_parrot_lda(R: FloatArray, y: NDArray[np.integer]) -> Similarity:
    """Cosine in the space of a (shrinkage) LDA fitted on public people's releases ``R`` of identities ``y``."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    n_classes = int(np.unique(y).shape[0])
    lda = LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto", n_components=min(R.shape[1], n_classes - 1)).fit(
        np.asarray(R, dtype=np.float64), y
    )
    return lambda X: _cosine(np.asarray(lda.transform(np.asarray(X, dtype=np.float64)), dtype=np.float64))


def fit_two_covariance(R: FloatArray, y: NDArray[np.integer]) -> Similarity:
    """PLDA (two-covariance model) log-likelihood ratio of "one person" vs "two people", up to a constant.

    A release is ``x = μ + a + e`` with the person's offset ``a ~ N(0, B)`` and
    everything else (pose, light, the mechanism's noise) ``e ~ N(0, W)``,
    both estimated on public people's releases ``R`` (n, nc) of identities
    ``y``. For two releases, ``log N([x₁; x₂]; [[T, B], [B, T]]) −
    log N(x₁; T) − log N(x₂; T)`` with ``T = B + W`` is
    ``−½ (x₁ᵀQx₁ + x₂ᵀQx₂) − x₁ᵀGx₂`` plus a constant, where ``[[A, G], [G, A]]``
    is the inverse of the joint covariance and ``Q = A − T⁻¹``.
    """
    X = np.asarray(R, dtype=np.float64)
    classes, inv = np.unique(y, return_inverse=True)
    inv = inv.ravel()
    mu = X.mean(axis=0)
    counts = np.bincount(inv)
    means = np.zeros((classes.shape[0], X.shape[1]))
    np.add.at(means, inv, X)
    means /= counts[:, None]
    resid = X - means[inv]
    d = X.shape[1]
    W = resid.T @ resid / max(X.shape[0] - classes.shape[0], 1)
    D = means - mu
    # The spread of class means holds W / n_c of each mean's own noise: take it out.
    B = D.T @ D / max(classes.shape[0] - 1, 1) - W * float(np.mean(1.0 / counts))
    floor = 1e-6 * float(np.trace(W)) / d
    vals, vecs = np.linalg.eigh((B + B.T) / 2.0)
    B = (vecs * np.maximum(vals, floor)) @ vecs.T
    W = W + floor * np.eye(d)
    T = B + W
    T_inv = np.linalg.inv(T)
    A = np.linalg.inv(T - B @ T_inv @ B)
    G = -T_inv @ B @ A
    G = (G + G.T) / 2.0
    Q = A - T_inv

    def score(Xq: FloatArray) -> FloatArray:
        Z = np.asarray(Xq, dtype=np.float64) - mu
        q = np.einsum("ij,jk,ik->i", Z, Q, Z)
        S: FloatArray = -0.5 * (q[:, None] + q[None, :]) - Z @ G @ Z.T
        return S

    return score


def _off_diagonal_stats(S: FloatArray) -> tuple[float, float]:
    s = S[np.triu_indices(S.shape[0], 1)]
    return float(s.mean()), float(s.std()) or 1.0


def fit_linkers(R_public: FloatArray, y_public: IntArray, R_calibration: FloatArray) -> dict[str, Similarity]:
    """Every template linker of :data:`LINK_METHODS`, learned on public releases only.

    ``combined`` standardises its two parts on the calibration people's pairs
    (``R_calibration``) so that neither dominates by scale.
    """
    cos = cosine_similarity(R_public.mean(axis=0))
    lda = fit_parrot_lda(R_public, y_public)
    plda = fit_two_covariance(R_public, y_public)
    (m1, s1), (m2, s2) = _off_diagonal_stats(cos(R_calibration)), _off_diagonal_stats(lda(R_calibration))

    def combined(R: FloatArray) -> FloatArray:
        out: FloatArray = (cos(R) - m1) / s1 + (lda(R) - m2) / s2
        return out

    return {"cosine": cos, "parrot_lda": lda, "parrot_plda": plda, "combined": combined}


def event_similarity(method: str, probability: FloatArray, decision: IntArray) -> FloatArray:
    """Similarity of events from the best enrolled-class probability (and the decision), (n, n).

    ``decision`` is the subject index a false accept names, or −1 for unknown;
    ``decision_probability`` puts events with different decisions a full unit
    (the probability's whole range) further apart.
    """
    p = np.asarray(probability, dtype=np.float64)
    S: FloatArray = -np.abs(p[:, None] - p[None, :])
    if method == "decision_probability":
        d = np.asarray(decision)
        S = S - (d[:, None] != d[None, :]).astype(np.float64)
    elif method != "probability":
        raise ValueError(f"method: expected one of {', '.join(EVENT_METHODS)}, received {method!r}")
    return S


def label_clusterings(released: IntArray, unknown: int) -> dict[str, IntArray]:
    """The clusterings of :data:`DECISION_METHODS` from each appearance's released label.

    ``same_label``: one cluster per label, unknown included; ``same_named_label``: one cluster per enrolled
    label, every appearance released as ``unknown`` a cluster of its own.
    """
    r = np.asarray(released, dtype=np.int64)
    alone = np.arange(r.shape[0], dtype=np.int64) + int(unknown) + 1
    return {"same_label": r, "same_named_label": np.where(r == unknown, alone, r)}


# --------------------------------------------------------------------------- people and releases


def partition_people(labels: NDArray[np.integer], rng: np.random.Generator) -> dict[str, IntArray]:
    """Split identities into :data:`GROUPS`, about a third each, with alike numbers of appearances.

    Identities are ordered by their number of images and dealt in threes, one
    to each group in random order, so that no group gets all the frequently
    photographed people (whose pairs dominate pairwise scores).

    Returns
    -------
    dict of str to ndarray of int
        The identity labels of each group.
    """
    ids, counts = np.unique(np.asarray(labels), return_counts=True)
    tie_break = np.asarray(rng.permutation(ids.shape[0]))
    order = ids[np.lexsort((tie_break, counts))]
    groups: dict[str, list[int]] = {g: [] for g in GROUPS}
    for start in range(0, order.shape[0], len(GROUPS)):
        chunk = order[start : start + len(GROUPS)]
        for g, person in zip(rng.permutation(len(GROUPS)), chunk, strict=False):
            groups[GROUPS[int(g)]].append(int(person))
    return {g: np.array(sorted(v), dtype=np.int64) for g, v in groups.items()}


@dataclass
class BystanderContext:
    """What every ε of one split's bystander section shares (picklable; sent to worker processes).

    Attributes
    ----------
    bounds : BundleBounds
        Public bounds of the projection the releases go through.
    C_enrol : ndarray of shape (n_train, nc)
        Raw coefficients of the enrolled people's training faces (the split's).
    y_enrol : ndarray of shape (n_train,)
    C : dict of str to ndarray of shape (n_appearances, nc)
        Raw coefficients of each group's appearances (:data:`GROUPS`).
    people : dict of str to ndarray of shape (n_appearances,)
        Identity of each appearance.
    n_fit : int
        Faces the projection and bounds were fitted on.
    """

    split: int
    seed: int
    bounds: BundleBounds
    n_components: int
    projection: str
    C_enrol: FloatArray
    y_enrol: IntArray
    C: dict[str, FloatArray] = field(default_factory=dict)
    people: dict[str, IntArray] = field(default_factory=dict)
    n_fit: int = 0
    basis_fitted_on: str = ""


def _basis_without_strangers(data: AuditData, cfg: AuditConfig, train_idx: IntArray, strangers: IntArray) -> Basis:
    """The projection and bounds the releases go through, fitted on no stranger's face."""
    if data.background is None or data.background_labels is None:
        # --basis train: the split's training faces (audited people), as every other section.
        return execution.fit_split_basis(data, cfg, train_idx, cfg.components, cfg.projection)
    keep = ~np.isin(data.background_labels, strangers)
    cls = projection_class(cfg.projection)
    inputs = data.background if cls.input_kind == "pixels" else data.background_descriptors[cls.input_kind]
    shape = (int(data.images.shape[1]), int(data.images.shape[2])) if cfg.mirrored(cfg.projection) else None
    return fit_basis(
        inputs[keep],
        cfg.components,
        projection=cfg.projection,
        labels=data.background_labels[keep],
        mirror_shape=shape,
        faces=None if cls.input_kind == "pixels" else data.background[keep],
    )


def prepare_bystanders(data: AuditData, cfg: AuditConfig, split: int) -> BystanderContext:
    """Partition the never-enrolled people of split ``split``, fit the basis and project every face."""
    if data.pool is None or data.pool_labels is None:
        raise AuditConfigError("--no-bystander: the bystander section needs the never-enrolled people, none loaded")
    n_people = int(np.unique(data.pool_labels).shape[0])
    if n_people < 2 * len(GROUPS):
        raise AuditConfigError(
            f"--no-bystander: the bystander section needs at least {2 * len(GROUPS)} LFW identities outside the "
            f"audited ones (two strangers, two calibration and two public people), found {n_people}; "
            "pass --no-bystander"
        )
    seed = execution.split_seed(cfg, split)
    tr, _ = execution.stratified_split(data.labels, cfg.test_size, seed)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, split, _PARTITION_STREAM]))
    groups = partition_people(data.pool_labels, rng)
    basis = _basis_without_strangers(data, cfg, tr, groups["strangers"])
    pool_inputs = data.pool if basis.input_kind == "pixels" else data.pool_descriptors[basis.input_kind]
    ctx = BystanderContext(
        split=split,
        seed=seed,
        bounds=basis.bounds,
        n_components=basis.n_components,
        projection=basis.kind,
        C_enrol=basis.transform(data.inputs(basis.input_kind)[tr]),
        y_enrol=data.labels[tr],
        n_fit=basis.n_fit,
        basis_fitted_on=(
            "the split's training faces of the enrolled people"
            if data.background is None
            else f"the {basis.n_fit} background faces of the calibration and public people (no stranger's)"
        ),
    )
    for g in GROUPS:
        rows = np.isin(data.pool_labels, groups[g])
        ctx.C[g] = basis.transform(pool_inputs[rows])
        ctx.people[g] = data.pool_labels[rows].astype(np.int64)
    return ctx


def _events(fitted: Any, R: FloatArray) -> tuple[FloatArray, IntArray]:
    """(best enrolled-class probability, decision) of each release: what a recognition event carries."""
    P = fitted.predict_proba(np.asarray(R, dtype=np.float32))
    known = fitted.known_indices
    Pk = P[:, known]
    best = Pk.max(axis=1)
    named = Pk.argmax(axis=1).astype(np.int64)
    decision = np.where(best >= fitted.unknown_threshold, named, -1).astype(np.int64)
    return best, decision


def fit_server_recogniser(
    cfg: AuditConfig, R_enrol: FloatArray, y_enrol: IntArray, R_public: FloatArray, y_public: IntArray, seed: int
) -> Any:
    """The server's recogniser: enrolled people plus the public people as its background ("unknown") class."""
    subjects = [str(int(v)) for v in y_enrol] + [f"{_BACKGROUND_PREFIX}{int(v)}" for v in y_public]
    return execution.fit_like_server(
        cfg, np.vstack([R_enrol, R_public]), subjects, seed, background_prefix=_BACKGROUND_PREFIX
    )


def _person_weights(people: NDArray[np.integer]) -> FloatArray:
    """One over the number of faces of each face's person (every calibration person weighs alike)."""
    _, inverse, n = np.unique(np.asarray(people), return_inverse=True, return_counts=True)
    return 1.0 / n[inverse.ravel()].astype(np.float64)


def evaluate_decision_mode(
    cfg: AuditConfig,
    fitted: Any,
    Z_calibration: FloatArray,
    y_calibration: IntArray,
    Z_strangers: FloatArray,
    y_strangers: IntArray,
    key: Sequence[int],
) -> dict[str, Any]:
    """Linkage of the strangers' appearances from the labels a device in decision mode releases.

    The device runs ``fitted`` (trained on releases only) on each appearance's clean projection
    ``Z_strangers``, sets its thresholds as a device does (:func:`~peep.core.decision.calibrate_clean` on the
    calibration people's clean projections ``Z_calibration``, each person weighing alike, at the device
    model's FPIR and FAR targets of :class:`~peep.server.config.DeviceModelsConfig`, the label mechanism
    accounted for where it can be), and releases the label without a label mechanism and through k-RR at each
    of ``cfg.bystander_label_epsilons``. One ``_rows`` entry per ε_label (None first): the shares of
    appearances named before and after the label mechanism, and the :data:`DECISION_METHODS` clusterings'
    scores.
    """
    from peep.server.config import DeviceModelsConfig

    device = DeviceModelsConfig()
    known = fitted.known_indices
    unknown = int(known.size)
    P_cal = fitted.predict_proba(np.asarray(Z_calibration, dtype=np.float32))
    P_s = fitted.predict_proba(np.asarray(Z_strangers, dtype=np.float32))
    weights = _person_weights(y_calibration)
    rows: list[dict[str, Any]] = []
    for li, eps_label in enumerate((None, *cfg.bystander_label_epsilons)):
        rr = None
        if eps_label is not None:
            rr = RandomizedResponse(
                unknown + 1, eps_label, random_state=execution.noise_state(cfg, (*key, _TAG_LABEL, li))
            )
        floor = 0.0 if rr is None else rr.false_positive_floor
        feasible = floor < device.fpir
        th = calibrate_clean(
            P_cal,
            known,
            fpir=device.fpir,
            far=device.far,
            label_false_positive=floor if feasible else 0.0,
            label_keep=1.0 if rr is None or not feasible else rr.keep_probability,
            weights=weights,
        )
        d = identify_open_set(P_s, known, th.unknown_threshold)
        decided = np.where(d.unknown, unknown, np.searchsorted(known, d.best_class)).astype(np.int64)
        released = decided if rr is None else np.asarray(rr.release(decided), dtype=np.int64)
        rows.append(
            {
                "epsilon_label": eps_label,
                "feasible": bool(feasible),
                "fpir_floor": float(floor),
                "named_share_model": float(np.mean(decided != unknown)),
                "named_share": float(np.mean(released != unknown)),
                "methods": {
                    m: score_clustering(c, y_strangers) for m, c in label_clusterings(released, unknown).items()
                },
            }
        )
    return {
        "templates_kept": 0,
        "labels_kept": int(np.asarray(y_strangers).shape[0]),
        "labels": unknown + 1,
        "fpir_target": float(device.fpir),
        "_rows": rows,
    }


def evaluate_bystanders(
    ctx: BystanderContext, cfg: AuditConfig, *, epsilon: float, key: Sequence[int]
) -> dict[str, Any]:
    """Linkage of the strangers' appearances at one ε, for ``keep = "all"``, ``keep = "none"`` and decision mode.

    Every face (enrolled, stranger, calibration, public) is released once
    through the audited mechanism with the audit's noise conventions
    (:func:`peep.lab.audit.execution.noise_state`: seeded simulation, or the
    secure sampler). Decision mode's device model is the recogniser with a
    background class, deciding on clean projections
    (:func:`evaluate_decision_mode`).
    """
    rng = execution.noise_state(cfg, key)
    mech = mechanism_for_bounds(ctx.bounds, kind=cfg.mechanism, epsilon=epsilon, delta=cfg.delta, random_state=rng)
    dom = Domain(cfg.mechanism, ctx.bounds)
    R_enrol = np.asarray(mech.release(dom.forward(ctx.C_enrol)), dtype=np.float64)
    R = {g: np.asarray(mech.release(dom.forward(ctx.C[g])), dtype=np.float64) for g in GROUPS}
    y_s, y_c, y_p = ctx.people["strangers"], ctx.people["calibration"], ctx.people["public"]

    linkers = fit_linkers(R["public"], y_p, R["calibration"])
    methods = {name: link_and_score(f(R["calibration"]), y_c, f(R["strangers"]), y_s) for name, f in linkers.items()}

    counts = pair_counts(y_s, np.zeros_like(y_s))
    n = int(y_s.shape[0])
    recognisers = {
        "enrolled_only": execution.fit_served(cfg, R_enrol, ctx.y_enrol, ctx.seed).fitted,
        "background_class": fit_server_recogniser(cfg, R_enrol, ctx.y_enrol, R["public"], y_p, ctx.seed),
    }
    events: dict[str, dict[str, Any]] = {}
    named: dict[str, int] = {}
    for variant, fitted in recognisers.items():
        p_c, d_c = _events(fitted, R["calibration"])
        p_s, d_s = _events(fitted, R["strangers"])
        events[variant] = {
            m: link_and_score(event_similarity(m, p_c, d_c), y_c, event_similarity(m, p_s, d_s), y_s)
            for m in EVENT_METHODS
        }
        named[variant] = int((d_s >= 0).sum())
    decision = evaluate_decision_mode(
        cfg,
        recognisers["background_class"],
        dom.forward(ctx.C["calibration"]),
        y_c,
        dom.forward(ctx.C["strangers"]),
        y_s,
        key,
    )
    g = mech.guarantee
    return {
        "epsilon": float(epsilon),
        "epsilon_coordinate": float(g.epsilon_coordinate),
        "epsilon_vector": float(g.epsilon_vector),
        "n_components": ctx.n_components,
        "n_strangers": int(np.unique(y_s).shape[0]),
        "n_appearances": n,
        "n_pairs": counts.total,
        "n_same_pairs": counts.same,
        "n_calibration": int(np.unique(y_c).shape[0]),
        "n_public": int(np.unique(y_p).shape[0]),
        "chance_precision": counts.same / counts.total,
        "chance_f1": chance_f1(y_s),
        "keep_all": {"templates_kept": n, "methods": methods},
        "keep_none": {
            "templates_kept": 0,
            "methods": events["enrolled_only"],
            "background_class": {"methods": events["background_class"]},
        },
        "keep_recognised": {
            "templates_kept": named["enrolled_only"],
            "share": named["enrolled_only"] / max(n, 1),
            "background_class": {
                "templates_kept": named["background_class"],
                "share": named["background_class"] / max(n, 1),
            },
        },
        "keep_decision": decision,
    }


# --------------------------------------------------------------------------- jobs and aggregation


def prepare_job(data: AuditData, cfg: AuditConfig, split: int) -> tuple[BystanderContext, float]:
    """:func:`prepare_bystanders` as a job of :func:`~peep.lab.audit.execution.run_jobs`.

    Module-level, like :func:`evaluate_job`, so that a worker process can unpickle it by name.

    Returns
    -------
    ctx : BystanderContext
        Split ``split``'s people, basis and projections.
    cpu : float
        CPU seconds the job took.
    """
    t = time.process_time()
    with execution.job_env(cfg):
        ctx = prepare_bystanders(data, cfg, split)
    return ctx, time.process_time() - t


def evaluate_job(
    ctx: BystanderContext, cfg: AuditConfig, epsilon: float, key: Sequence[int]
) -> tuple[dict[str, Any], float]:
    """:func:`evaluate_bystanders` at ``epsilon`` as a job of :func:`~peep.lab.audit.execution.run_jobs`.

    Returns
    -------
    result : dict
        The linkage of one split's strangers at one ε.
    cpu : float
        CPU seconds the job took.
    """
    t = time.process_time()
    with execution.job_env(cfg):
        res = evaluate_bystanders(ctx, cfg, epsilon=epsilon, key=key)
    return res, time.process_time() - t


def _best(methods: dict[str, Any], order: Sequence[str]) -> str:
    """The method with the highest mean F1 (the first listed among equals; undefined F1 loses)."""
    return max(order, key=lambda m: -1.0 if methods[m]["f1"] is None else float(methods[m]["f1"]))


def combine_bystanders(per_repeat: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``bystander[]`` entry (mean, ``std`` over splits) from the per-split results of one ε.

    ``keep_all.best`` and ``keep_none.events`` name the method with the
    highest mean F1 and repeat its numbers, so that precision, recall and F1
    shown together belong to one method; so does each ``keep_decision.per_label``
    entry's ``best`` (one per ε_label, the decision without a label mechanism first).
    """
    mean, std = execution.aggregate(per_repeat)
    ka, kn = mean["keep_all"], mean["keep_none"]
    best = _best(ka["methods"], LINK_METHODS)
    ka["best"] = {"method": best, **{k: ka["methods"][best][k] for k in ("precision", "recall", "f1")}}
    ka["chance_precision"] = mean["chance_precision"]
    std_all = std.get("keep_all", {}).get("methods", {})
    std.setdefault("keep_all", {})["best"] = {k: std_all.get(best, {}).get(k) for k in ("precision", "recall", "f1")}
    chosen: dict[str, str] = {}
    for where, m_node, s_node in (
        ("enrolled_only", kn, std.setdefault("keep_none", {})),
        ("background_class", kn["background_class"], std["keep_none"].setdefault("background_class", {})),
    ):
        ev = chosen[where] = _best(m_node["methods"], EVENT_METHODS)
        m_node["events"] = {
            "method": ev,
            **{k: m_node["methods"][ev][k] for k in ("precision", "recall", "f1")},
            "chance_precision": mean["chance_precision"],
        }
        s_methods = s_node.get("methods", {})
        s_node["events"] = {k: s_methods.get(ev, {}).get(k) for k in ("precision", "recall", "f1")}
    per_label = []
    for i in range(len(per_repeat[0]["keep_decision"]["_rows"])):
        rows = [r["keep_decision"]["_rows"][i] for r in per_repeat]
        m, s = execution.aggregate(rows)
        dm = _best(m["methods"], DECISION_METHODS)
        m["best"] = {"method": dm, **{k: m["methods"][dm][k] for k in ("precision", "recall", "f1")}}
        m["std"] = s
        m["per_repeat"] = {
            "f1": [_or_none(r["methods"][dm]["f1"]) for r in rows],
            "named_share": [float(r["named_share"]) for r in rows],
        }
        per_label.append(m)
    mean["keep_decision"]["per_label"] = per_label
    mean["std"] = std
    mean["n_repeats"] = len(per_repeat)
    mean["per_repeat"] = {
        "keep_all_f1": [float(r["keep_all"]["methods"][best]["f1"]) for r in per_repeat],
        "events_f1": [float(r["keep_none"]["methods"][chosen["enrolled_only"]]["f1"]) for r in per_repeat],
    }
    return mean


def _or_none(v: Any) -> float | None:
    return None if v is None or v != v else float(v)
