"""Open-set identification as NIST FRVT judges 1:N: FNIR at a fixed FPIR, where the decision is made.

``peep audit --open-set`` asks how often an enrolled person is missed (false-negative identification
rate, FNIR: a probe not named as its own subject) when at most a share ``fpir_target`` of strangers is
named as someone (false-positive identification rate, FPIR), for two places a decision can be made
(see docs/DESIGN.md, "Where decisions are made"):

``server``
    Today's mode: the device releases a perturbed template of the query at the audited (template) ε,
    and the server's model decides on it. Its unknown threshold is the server's own:
    :func:`~peep.server.recognition.fitting.fit_recogniser` with ``identify_far`` set to the FPIR
    target, calibrated on held-out background *people's* releases.
``device``
    The device runs the same model (a post-processing of releases only) on its own *clean* projection
    and releases only the decision, through k-ary randomized response over ``enrolled + 1`` labels at
    ``epsilon_label`` (:class:`peep.core.labels.RandomizedResponse`); ``epsilon_label = None`` is the
    decision without a label mechanism (what a door deciding locally uses). Its thresholds come from
    :func:`peep.core.decision.calibrate_clean` on clean projections of public *calibration* people the
    model never saw, accounting for the label mechanism so that the *released* FPIR meets the target.
    Where the label mechanism alone names more strangers than the target allows (its
    ``false_positive_floor``), no threshold can meet it: the row is measured at the threshold without
    that accounting and marked ``feasible: false``.

Both modes use one model per split and preset, fitted by the server's own trainer on releases only:
each enrolled person's enrolment images released once at the template ε and the background people's
images released once (the "unknown" class). Both presets named in ``open_set_presets`` are measured on
the same releases, so the project can choose the preset for decision mode by FNIR on clean queries.

A reference says what limits decision mode: the same people with no noise anywhere (a model fitted on the
clean templates, deciding on clean queries, thresholds from the calibration people), reported in
``open_set_setup["no_noise"]``.

Door verification (device mode, no label noise): every probe claims its own subject (genuine) and every
other enrolled subject (impostors); GAR is the share of genuine claims accepted at the verify threshold
``calibrate_clean`` sets for ``far_target``, next to the FAR the impostor claims reach. Server rows carry
the same figures for a claim decided on a released query with the server's verify threshold.

The people, by a rule of this section's own (independent of ``--min-faces``), drawn per split from the
LFW people in the data home with at least 5 images:

enrolled
    ``open_set_enrolled`` people with at least ``enrol_images + probes`` images: ``enrol_images`` of
    them enrolled (released once each), ``probes`` held out as probes;
strangers
    ``open_set_strangers`` people with 5 to 9 images, one capture each: never in the basis, never in
    training, never in calibration;
background
    a share of the other 5-9 image people (``open_set_background_rare``) and of the other public people
    (the frequently photographed ones not enrolled, ``open_set_background_frequent``), each dealt by number
    of images, at most ``public_max_images`` images each: their *releases* teach the model "unknown";
calibration
    where ``lfw_singles/`` is found (``open_set_calibration`` "auto" or "singles"): ``open_set_calibration_people``
    of LFW's one-image people, none of whom is in ``lfw_home/``, one clean photo each; dealt per split from
    one pool drawn by the seed, together with ``open_set_single_strangers`` one-image *strangers*, a second
    stranger population reported as ``fpir_single``. The public LFW people the background class does not take
    are then left out. Otherwise ("public"): every other public person -- neither enrolled, nor a stranger,
    nor in the background class -- with every photo (at most ``calibration_images`` when set). Their *clean*
    projections set the device's thresholds, every person weighing alike (``calibrate_clean(weights=1 /
    photos of the person)``, as a device weighs its model's ``calibration_groups``), as every stranger does
    in the FPIR.

The enrolment sweep (``open_set_enrol_sweep``) fits the same model on the first ``n`` of each enrolled
person's releases (same probes and strangers): ``open_set_setup["enrolment_sweep"]``.

The projection (and its public bounds) is fitted on the background people's faces only (``open_set_basis
= "background"``, the default), so that a calibration face is as new to the projection as a stranger's or an
enrolled person's: measured, fitting it on the calibration people's faces as well lets the device set its
thresholds on faces the whitened projection has seen, whose scores run lower than a stranger's, and the
released FPIR overshoots the target (most at large K). Never an enrolled person's or a stranger's face.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.bounding import BundleBounds, fit_bundle_bounds
from peep.core.decision import calibrate_clean, identify_open_set
from peep.core.labels import RandomizedResponse, fpir_floor
from peep.core.projections import projection_class
from peep.core.release import mechanism_for_bounds
from peep.lab.audit import execution
from peep.lab.audit.basis import Domain
from peep.lab.audit.config import AuditConfig, AuditConfigError
from peep.lab.audit.noise_cost import NOISE_COST_MODES, lda_parts, noise_cost_models
from peep.lab.audit.open_set_people import (
    GROUPS,
    PARTITION_STREAM,
    STRANGER_IMAGES,
    OpenSetPeople,
    Population,
    deal_share,
    load_population,
    partition_people,
    person_weights,
    resolve_calibration,
)

__all__ = [
    "GROUPS",
    "STRANGER_IMAGES",
    "OpenSetPeople",
    "Population",
    "deal_share",
    "load_population",
    "partition_people",
    "person_weights",
    "resolve_calibration",
    "run_open_set",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

MODES = ("server", "device")
# Seed streams of this section: the template releases, the label releases (the people's are in
# open_set_people).
_TAG_RELEASE, _TAG_LABEL = 1_002, 1_003
_BACKGROUND_PREFIX = "background:"
_STD_KEYS = (
    "fnir",
    "fpir",
    "fpir_single",
    "fpir_model",
    "fpir_bound",
    "gar_at_far",
    "far",
    "threshold",
    "rank1_miss",
)


# --------------------------------------------------------------------------- population and splits


@dataclass
class Space:
    """One template dimension's projection of a split's faces (picklable: no faces, no model).

    Attributes
    ----------
    bounds : BundleBounds
        Public bounds of the projection, fitted on the public faces.
    C : dict of str to ndarray of shape (n, n_components)
        Raw coefficients of ``enrol``, ``probe``, ``stranger``, ``background`` and ``calibration`` faces.
    """

    n_components: int
    bounds: BundleBounds
    C: dict[str, FloatArray]
    n_fit: int


@dataclass
class OpenSetContext:
    """What every (template dimension, ε, preset) of one split shares."""

    split: int
    seed: int
    people: OpenSetPeople
    y_enrol: IntArray
    y_probe: IntArray
    background_people: IntArray
    calibration_people: IntArray
    spaces: list[Space] = field(default_factory=list)

    @property
    def enrol_rank(self) -> IntArray:
        """Each enrolment release's place among its person's, shape (enrolled · enrol_images,): the sweep keeps
        the first ``n``."""
        n_people = int(self.people.people["enrolled"].size)
        return np.tile(np.arange(self.people.enrol_rows.size // n_people, dtype=np.int64), n_people)


def component_limit(pop: Population, people: OpenSetPeople, cfg: AuditConfig) -> int:
    """The largest template dimension the public faces allow (identities − 1 for projections that learn them)."""
    public = people.public_rows
    limit = min(public.size - 1, pop.inputs.shape[1])
    if projection_class(cfg.projection).needs_labels:
        limit = min(limit, int(np.unique(pop.labels[public]).size) - 1)
    return int(limit)


def _rng(cfg: AuditConfig, split: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([cfg.seed, split, PARTITION_STREAM]))


def prepare_split(pop: Population, cfg: AuditConfig, split: int) -> OpenSetContext:
    """Partition split ``split``'s people, fit each template dimension's projection on the public faces, project."""
    people = partition_people(pop.labels, cfg, _rng(cfg, split), pop.singles)
    cls = projection_class(cfg.projection)
    public = people.public_rows
    shape = pop.image_shape if cfg.mirrored(cfg.projection) else None
    groups = {
        "enrol": people.enrol_rows,
        "probe": people.probe_rows,
        "stranger": people.stranger_rows,
        "background": people.background_rows,
        "calibration": people.calibration_rows,
    }
    if people.single_stranger_rows.size:
        groups["single_stranger"] = people.single_stranger_rows
    ctx = OpenSetContext(
        split=split,
        seed=execution.split_seed(cfg, split),
        people=people,
        y_enrol=pop.labels[people.enrol_rows],
        y_probe=pop.labels[people.probe_rows],
        background_people=pop.labels[people.background_rows],
        calibration_people=pop.labels[people.calibration_rows],
    )
    X_public = np.asarray(pop.inputs[public], dtype=np.float64)
    for nc in cfg.open_set_dimensions:
        projection = cls(n_components=nc, mirror_shape=shape).fit(X_public, pop.labels[public])
        C_public = projection.transform(X_public)
        ctx.spaces.append(
            Space(
                n_components=nc,
                bounds=fit_bundle_bounds(C_public),
                C={
                    g: projection.transform(np.asarray(pop.inputs[rows], dtype=np.float64))
                    for g, rows in groups.items()
                },
                n_fit=int(public.size),
            )
        )
    return ctx


# --------------------------------------------------------------------------- one split, one model


def fit_open_set_model(
    cfg: AuditConfig,
    preset: str,
    R_enrol: FloatArray,
    y_enrol: IntArray,
    R_background: FloatArray,
    background_people: IntArray,
    seed: int,
    *,
    fpir: float,
) -> Any:
    """The server's recogniser on releases only: enrolled subjects plus the background ("unknown") class.

    The server's own trainer with its default training parameters, ``target_far`` the door's FAR and
    ``identify_far`` the FPIR target (its unknown threshold set on held-out background people's releases).
    """
    from peep.server.config import TrainingConfig
    from peep.server.recognition.fitting import fit_recogniser
    from peep.server.recognition.presets import PRESETS

    server = TrainingConfig()
    subjects = [str(int(v)) for v in y_enrol] + [f"{_BACKGROUND_PREFIX}{int(v)}" for v in background_people]
    return fit_recogniser(
        np.vstack([R_enrol, R_background]).astype(np.float32),
        subjects,
        preset=PRESETS[preset],
        background_prefix=_BACKGROUND_PREFIX,
        validation_fraction=server.validation_fraction,
        target_far=cfg.open_set_far,
        identify_far=fpir,
        min_templates_per_subject=server.min_templates_per_subject,
        random_state=seed,
        blas_threads=1,
    )


def _columns(fitted: Any, y: IntArray) -> IntArray:
    """Position of each identity ``y`` among the model's enrolled columns (``known_indices``)."""
    known = fitted.known_indices
    pos = {fitted.class_names[int(c)]: j for j, c in enumerate(known)}
    return np.array([pos[str(int(v))] for v in y], dtype=np.int64)


def _door(P_probe: FloatArray, known: NDArray[np.intp], truth: IntArray, threshold: float) -> dict[str, float]:
    """GAR of every probe's own claim and FAR of its claims to every other enrolled subject."""
    S = np.asarray(P_probe, dtype=np.float64)[:, known]
    own = np.zeros_like(S, dtype=bool)
    own[np.arange(S.shape[0]), truth] = True
    return {"gar_at_far": float(np.mean(S[own] > threshold)), "far": float(np.mean(S[~own] > threshold))}


def _rank1_miss(P_probe: FloatArray, known: NDArray[np.intp], truth: IntArray) -> float:
    """Share of probes whose most probable enrolled subject is someone else: FNIR with no threshold at all.

    What is left of FNIR once the open-set threshold is taken away (closed-set rank-1 identification), so
    a row shows how much of its FNIR is the model's rejection of strangers.
    """
    return float(np.mean(np.asarray(P_probe)[:, known].argmax(axis=1) != truth))


def _labels(P: FloatArray, known: NDArray[np.intp], threshold: float) -> IntArray:
    """The device's decision as a label: the enrolled column's position, or ``len(known)`` for unknown."""
    d = identify_open_set(P, known, threshold)
    pos = np.searchsorted(known, d.best_class)
    return np.where(d.unknown, known.size, pos).astype(np.int64)


def evaluate_split(
    ctx: OpenSetContext, cfg: AuditConfig, *, space: int, epsilon: float, eps_index: int, preset: str
) -> list[dict[str, Any]]:
    """Every row of one split, template dimension, template ε and preset (server and device modes).

    Every face is released once through the audited mechanism at ``epsilon`` with the audit's noise
    conventions; the releases are the same for every preset (the noise stream is keyed without it). The
    enrolment sweep's models (``open_set_enrol_sweep``) learn from the first ``n`` of the same releases of each
    enrolled person; their rows carry ``enrol_images`` = n.
    """
    sp = ctx.spaces[space]
    rng = execution.noise_state(cfg, (_TAG_RELEASE, ctx.split, space, eps_index))
    mech = mechanism_for_bounds(sp.bounds, kind=cfg.mechanism, epsilon=epsilon, delta=cfg.delta, random_state=rng)
    dom = Domain(cfg.mechanism, sp.bounds)
    Z = {g: dom.forward(C) for g, C in sp.C.items()}
    released = ("enrol", "background", "probe", "stranger", "single_stranger")
    R = {g: np.asarray(mech.release(Z[g]), dtype=np.float64) for g in released if g in Z}
    g = mech.guarantee
    base: dict[str, Any] = {
        "preset": preset,
        "n_components": sp.n_components,
        "epsilon_template": float(epsilon),
        "epsilon_template_vector": float(g.epsilon_vector),
        "enrolled": int(ctx.people.people["enrolled"].size),
        "probes": int(Z["probe"].shape[0]),
        "strangers": int(Z["stranger"].shape[0]),
        "background_templates": int(Z["background"].shape[0]),
        "calibration_faces": int(Z["calibration"].shape[0]),
    }
    if "single_stranger" in Z:
        base["single_strangers"] = int(Z["single_stranger"].shape[0])
    p_index = cfg.open_set_presets.index(preset)
    rank = ctx.enrol_rank
    rows: list[dict[str, Any]] = []
    served: Any = None
    for n_enrol in (cfg.open_set_enrol_images, *cfg.open_set_enrol_sweep):
        keep = rank < n_enrol
        sweep = {**base, "enrol_images": int(n_enrol)}
        models = {
            t: fit_open_set_model(
                cfg, preset, R["enrol"][keep], ctx.y_enrol[keep], R["background"], ctx.background_people, ctx.seed,
                fpir=t,
            )
            for t in cfg.open_set_fpir
        }  # fmt: skip
        if n_enrol == cfg.open_set_enrol_images:
            served = models[cfg.open_set_fpir[0]]
        rows += _server_rows(ctx, cfg, models, R, {**sweep, "mode": "server"})
        # device: the same model (thresholds aside, every fit above is the same model) on clean projections
        rows += _device_rows(
            ctx, cfg, models[cfg.open_set_fpir[0]], Z, {**sweep, "mode": "device"}, (space, eps_index, p_index)
        )
    linear = lda_parts(served) is not None
    if eps_index == 0 or linear:
        # What limits decision mode: the same task with no noise anywhere (a model fitted on clean templates).
        clean = fit_open_set_model(
            cfg, preset, Z["enrol"], ctx.y_enrol, Z["background"], ctx.background_people, ctx.seed,
            fpir=cfg.open_set_fpir[0],
        )  # fmt: skip
        full = {**base, "enrol_images": cfg.open_set_enrol_images}
        if eps_index == 0:
            ref = {**full, "mode": "no_noise", "epsilon_template": None, "epsilon_template_vector": None}
            rows += _device_rows(ctx, cfg, clean, Z, ref, (space, eps_index, p_index), label_epsilons=())
        if linear:
            # Where the noise costs FNIR: the served model with one of its two parts taken from the clean model.
            for mode, hybrid in noise_cost_models(served, clean).items():
                rows += _device_rows(ctx, cfg, hybrid, Z, {**full, "mode": mode}, (space, eps_index, p_index))
    return rows


def _server_rows(
    ctx: OpenSetContext, cfg: AuditConfig, models: dict[float, Any], R: dict[str, FloatArray], base: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rows of the server deciding on released queries with each model's own thresholds (one per FPIR target)."""
    rows: list[dict[str, Any]] = []
    for t, fitted in models.items():
        known = fitted.known_indices
        truth = _columns(fitted, ctx.y_probe)
        P_probe = fitted.predict_proba(R["probe"])
        lab_p = _labels(P_probe, known, fitted.unknown_threshold)
        named = _labels(fitted.predict_proba(R["stranger"]), known, fitted.unknown_threshold) < known.size
        row: dict[str, Any] = {
            **base,
            "epsilon_label": None,
            "fpir_target": t,
            "fnir": float(np.mean(lab_p != truth)),
            "fpir": float(np.mean(named)),
            "fpir_model": float(np.mean(named)),
        }
        if "single_stranger" in R:
            named_single = _labels(fitted.predict_proba(R["single_stranger"]), known, fitted.unknown_threshold)
            row["fpir_single"] = row["fpir_model_single"] = float(np.mean(named_single < known.size))
        row.update(
            {
                "fpir_floor": 0.0,
                "feasible": True,
                "threshold": float(fitted.unknown_threshold),
                "rank1_miss": _rank1_miss(P_probe, known, truth),
                "far_target": cfg.open_set_far,
                **_door(P_probe, known, truth, float(fitted.verify_threshold)),
            }
        )
        rows.append(row)
    return rows


def any_mechanism_fpir_bound(subjects: int, epsilon_label: float, fnir: float) -> float:
    """The least FPIR *any* ε-LDP label mechanism releases at a given FNIR: ``subjects · e^−ε · (1 − FNIR)``.

    :func:`peep.core.labels.fpir_floor`, the bound a device refuses a target under (docs/DECISIONS.md).
    """
    return fpir_floor(int(subjects), float(epsilon_label), float(fnir))


def _device_rows(
    ctx: OpenSetContext,
    cfg: AuditConfig,
    fitted: Any,
    Z: dict[str, FloatArray],
    base: dict[str, Any],
    key: tuple[int, ...],
    label_epsilons: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Rows of a model deciding on clean projections ``Z``, without and with the label mechanism.

    Thresholds from :func:`~peep.core.decision.calibrate_clean` on the calibration people's clean
    projections, every person weighing alike (one over their number of faces, as a device weighs its
    model's ``calibration_groups``); door figures on the row without label noise.
    """
    known = fitted.known_indices
    truth = _columns(fitted, ctx.y_probe)
    P_probe, P_stranger = fitted.predict_proba(Z["probe"]), fitted.predict_proba(Z["stranger"])
    P_single = fitted.predict_proba(Z["single_stranger"]) if "single_stranger" in Z else None
    P_cal = fitted.predict_proba(Z["calibration"])
    w_cal = person_weights(ctx.calibration_people)
    eps_labels = cfg.open_set_label_epsilons if label_epsilons is None else label_epsilons
    rows: list[dict[str, Any]] = []
    for li, eps_label in enumerate((None, *eps_labels)):
        for ti, t in enumerate(cfg.open_set_fpir):
            rr = None
            if eps_label is not None:
                stream = execution.noise_state(cfg, (_TAG_LABEL, ctx.split, *key, li, ti))
                rr = RandomizedResponse(known.size + 1, eps_label, random_state=stream)
            floor = 0.0 if rr is None else rr.false_positive_floor
            feasible = floor < t
            th = calibrate_clean(
                P_cal,
                known,
                fpir=t,
                far=cfg.open_set_far,
                label_false_positive=floor if feasible else 0.0,
                label_keep=1.0 if rr is None or not feasible else rr.keep_probability,
                weights=w_cal,
            )
            lab_p = _labels(P_probe, known, th.unknown_threshold)
            lab_s = _labels(P_stranger, known, th.unknown_threshold)
            draws = 1 if rr is None else cfg.open_set_label_draws
            rel_p = np.tile(lab_p, draws) if rr is None else rr.release(np.tile(lab_p, draws))
            rel_s = np.tile(lab_s, draws) if rr is None else rr.release(np.tile(lab_s, draws))
            fnir = float(np.mean(rel_p != np.tile(truth, draws)))
            row: dict[str, Any] = {
                **base,
                "epsilon_label": eps_label,
                "fpir_target": t,
                "fnir": fnir,
                "fpir": float(np.mean(rel_s != known.size)),
                "fpir_model": float(np.mean(lab_s != known.size)),
            }
            if P_single is not None:
                lab_1 = _labels(P_single, known, th.unknown_threshold)
                rel_1 = np.tile(lab_1, draws) if rr is None else rr.release(np.tile(lab_1, draws))
                row["fpir_single"] = float(np.mean(rel_1 != known.size))
                row["fpir_model_single"] = float(np.mean(lab_1 != known.size))
            row |= {
                "fpir_model_target": float(th.fpir_model_target),
                "fpir_floor": float(floor),
                "fpir_bound": 0.0 if eps_label is None else any_mechanism_fpir_bound(known.size, eps_label, fnir),
                "feasible": bool(feasible),
                "threshold": float(th.unknown_threshold),
                "fpir_calibration": float(th.fpir_public),
                "rank1_miss": _rank1_miss(P_probe, known, truth),
            }
            if rr is None:
                row["far_target"] = cfg.open_set_far
                row.update(_door(P_probe, known, truth, th.verify_threshold))
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- jobs and aggregation


def _prepare_job(pop: Population, cfg: AuditConfig, split: int) -> tuple[OpenSetContext, float]:
    t = time.process_time()
    with execution.job_env(cfg):
        ctx = prepare_split(pop, cfg, split)
    return ctx, time.process_time() - t


def _evaluate_job(ctx: OpenSetContext, cfg: AuditConfig, kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    t = time.process_time()
    with execution.job_env(cfg):
        rows = evaluate_split(ctx, cfg, **kwargs)
    return rows, time.process_time() - t


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies an entry: dimension, mode, preset, template ε, label ε, FPIR target, enrolment releases."""
    return (
        row["n_components"],
        row["mode"],
        row["preset"],
        row["epsilon_template"],
        row["epsilon_label"],
        row["fpir_target"],
        row["enrol_images"],
    )


#: Keys an ``open_set[]`` entry shows first (the rest follow in the order a row was built).
_FIRST_KEYS = (
    "mode",
    "preset",
    "n_components",
    "enrol_images",
    "epsilon_template",
    "epsilon_label",
    "fpir_target",
    "fnir",
    "fpir",
    "fpir_single",
)


def combine(per_split: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``open_set[]`` entry from the rows of its splits: means, ``std`` and each split's figures.

    Every split has the same numbers of probes and strangers, so the mean over splits is the pooled rate.
    """
    mean, std = execution.aggregate(per_split)
    mean = {k: mean[k] for k in _FIRST_KEYS if k in mean} | mean
    mean["std"] = {k: std.get(k) for k in _STD_KEYS if k in std}
    mean["n_repeats"] = len(per_split)
    mean["per_repeat"] = {k: [float(r[k]) for r in per_split] for k in _STD_KEYS if k in per_split[0]}
    return mean


def choose_preset(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The preset with the lowest mean FNIR on clean queries (device mode, no label noise), and by how much."""
    rows = [e for e in entries if e["mode"] == "device" and e["epsilon_label"] is None]
    if not rows:
        return None
    fnir: dict[str, dict[str, float]] = {}
    for e in rows:
        where = f"K={e['n_components']}, ε={e['epsilon_template']:g}, FPIR {e['fpir_target']:g}"
        fnir.setdefault(e["preset"], {})[where] = float(e["fnir"])
    means = {p: float(np.mean(list(v.values()))) for p, v in fnir.items()}
    ranked = sorted(means, key=lambda p: means[p])
    return {
        "criterion": "mean FNIR over template dimensions, template ε and FPIR targets, device mode without label "
        "noise (the model deciding on clean queries)",
        "fnir": fnir,
        "mean_fnir": means,
        "winner": ranked[0],
        "margin": means[ranked[1]] - means[ranked[0]] if len(ranked) > 1 else None,
    }


def setup(cfg: AuditConfig, pop: Population, contexts: Sequence[OpenSetContext]) -> dict[str, Any]:
    """What the section's people, projection, thresholds and label mechanism were (``open_set_setup``)."""
    people = {g: [int(c.people.people[g].size) for c in contexts] for g in GROUPS}
    faces = {
        "enrolment": [int(c.people.enrol_rows.size) for c in contexts],
        "probes": [int(c.people.probe_rows.size) for c in contexts],
        "strangers": [int(c.people.stranger_rows.size) for c in contexts],
        "single_strangers": [int(c.people.single_stranger_rows.size) for c in contexts],
        "background": [int(c.people.background_rows.size) for c in contexts],
        "calibration": [int(c.people.calibration_rows.size) for c in contexts],
    }
    k = cfg.open_set_enrolled + 1
    labels = []
    for e in cfg.open_set_label_epsilons:
        rr = RandomizedResponse(k, e)  # the law only: no label is released
        labels.append(
            {
                "epsilon_label": e,
                "labels": k,
                "keep_probability": rr.keep_probability,
                "false_positive_floor": rr.false_positive_floor,
            }
        )
    return {
        "population": pop.description,
        "people": people,
        "faces": faces,
        "n_components": list(cfg.open_set_dimensions),
        "presets": list(cfg.open_set_presets),
        "fpir_targets": list(cfg.open_set_fpir),
        "far_target": cfg.open_set_far,
        "label_mechanism": {"kind": "k-rr", "labels": k, "draws": cfg.open_set_label_draws, "epsilons": labels},
        "rule": (
            f"per split: {cfg.open_set_enrolled} enrolled people drawn from the LFW people with at least "
            f"{cfg.open_set_enrol_images + cfg.open_set_probes} images ({cfg.open_set_enrol_images} enrolment images "
            f"released once each at the template ε, {cfg.open_set_probes} probes each); {cfg.open_set_strangers} "
            f"strangers drawn from the people with {STRANGER_IMAGES[0]}-{STRANGER_IMAGES[1]} images, one capture "
            "each; the public, everyone else: " + _division(cfg, pop) + " Independent of --min-faces."
        ),
        "calibration": {
            "population": pop.description.get("calibration", "public"),
            "singles": pop.description.get("singles"),
            "people": people["calibration"],
            "faces": faces["calibration"],
            "of_the_strangers_range": [
                int(np.sum(np.isin(c.people.people["calibration"], _range_people(pop)))) for c in contexts
            ],
            "images_per_person": "every photo"
            if cfg.open_set_calibration_images is None
            else f"at most {cfg.open_set_calibration_images}",
            "weights": "1 / (the person's calibration faces): every calibration person weighs alike in the "
            "thresholds (calibrate_clean(weights=...)), as a device weighs its model's calibration_groups",
        },
        "basis": f"{cfg.projection} fitted per split on "
        + (
            "the background people's faces only (at most "
            f"{cfg.open_set_public_max_images} each), so that a calibration face is as unseen by the projection as "
            "a stranger's or an enrolled person's"
            if cfg.open_set_basis == "background"
            else f"every public person's faces (at most {cfg.open_set_public_max_images} each, calibration people "
            "included)"
        )
        + "; never an enrolled person's or a stranger's",
        "server_threshold": "the server's fit_recogniser with identify_far = the FPIR target: held-out background "
        "people's releases (cross-fitted for linear presets)",
        "device_threshold": "peep.core.decision.calibrate_clean on the calibration people's clean projections, "
        "every person weighing alike, accounting for the label mechanism so that the released FPIR meets the "
        "target",
        "label_draws_note": f"each decision is released {cfg.open_set_label_draws} times independently (as many "
        "simulated appearances of the same face, each at epsilon_label) and the rates averaged over the draws: "
        "what one release gives in expectation, with less simulation noise",
        "note": "fnir: share of probes not released as their own subject (called unknown or named as someone "
        "else); fpir: share of strangers released as some enrolled subject; fpir_model: the same before the label "
        "mechanism; rank1_miss: probes whose most probable enrolled subject is someone else (no threshold). "
        "Every split has the same numbers of probes and strangers, so the means are pooled rates. "
        "feasible: false where the label mechanism alone names more strangers than the target allows "
        "(fpir_floor >= fpir_target); such rows use the threshold without the label accounting.",
        "decision_preset": None,
    }


def _range_people(pop: Population) -> IntArray:
    """The population's people with as many images as a stranger has (:data:`STRANGER_IMAGES`)."""
    ids, counts = np.unique(pop.labels, return_counts=True)
    return ids[(counts >= STRANGER_IMAGES[0]) & (counts <= STRANGER_IMAGES[1])]


def _division(cfg: AuditConfig, pop: Population) -> str:
    """The rule dividing the public people between the model's background class and calibration, in words."""
    lo, hi = STRANGER_IMAGES
    singles = pop.description.get("singles")

    def share(x: float) -> str:
        return {0.0: "none", 1.0: "all"}.get(x, f"a share {x:g}")

    cap = (
        "every photo"
        if cfg.open_set_calibration_images is None
        else f"at most {cfg.open_set_calibration_images} images"
    )
    background = (
        f"of the other people with {lo}-{hi} images (the strangers' own range), {share(cfg.open_set_background_rare)} "
        f"go to the model's background class, and of the other public people (the frequently photographed ones "
        f"not enrolled), {share(cfg.open_set_background_frequent)} (each dealt by number of images); background "
        f"people's faces (at most {cfg.open_set_public_max_images} each) are released once each (the model's "
        "unknown class)."
    )
    if singles is None:
        return (
            f"{background} Every other public person is a calibration person: {cap} each, clean, every person "
            "weighing alike (the device's thresholds)."
        )
    return (
        f"{background} The public LFW people the background class does not take are left out. LFW's one-image "
        f"people (lfw_singles/, none of them in lfw_home/: {singles['drawn']} of its {singles['in_folder']} drawn "
        f"once by the seed, {singles['with_a_face']} with a detected face) are dealt anew per split: "
        f"{cfg.open_set_single_strangers} one-capture strangers (a second stranger population) and "
        f"{cfg.open_set_calibration_people} calibration people (their one photo, clean: the device's thresholds). "
        "No stranger of either population is in the projection's basis, the background class or the calibration."
    )


def run_open_set(cfg: AuditConfig) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """The whole section: ``(open_set entries, open_set_setup, CPU seconds of its jobs)``."""
    pop = load_population(cfg)
    first = partition_people(pop.labels, cfg, _rng(cfg, 0), pop.singles)
    limit = component_limit(pop, first, cfg)
    for nc in cfg.open_set_dimensions:
        if nc > limit:
            raise AuditConfigError(
                f"--open-set-components: expected values at most {limit} for {cfg.projection} (the public faces, or "
                f"for projections that learn identities the public people, minus one), received {nc}"
            )
    prepared, cpu = execution.run_jobs(
        cfg, [(_prepare_job, (pop, cfg, r)) for r in range(cfg.repeats)], "audit: open set, people and projections"
    )
    contexts: list[OpenSetContext] = list(prepared)
    jobs: list[tuple[Any, tuple[Any, ...]]] = []
    for ctx in contexts:
        for s in range(len(cfg.open_set_dimensions)):
            for ei, eps in enumerate(cfg.epsilons):
                for preset in cfg.open_set_presets:
                    kw = {"space": s, "epsilon": eps, "eps_index": ei, "preset": preset}
                    jobs.append((_evaluate_job, (ctx, cfg, kw)))
    results, c = execution.run_jobs(cfg, jobs, "audit: open set, server and device decisions")
    cpu += c
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rows in results:
        for row in rows:
            groups.setdefault(row_key(row), []).append(row)
    modes = {m: i for i, m in enumerate(MODES)}

    def order(k: tuple[Any, ...]) -> tuple[Any, ...]:
        eps_t = 0.0 if k[3] is None else k[3]
        eps_l = -1.0 if k[4] is None else k[4]
        return (-k[6], k[0], eps_t, modes.get(k[1], len(modes)), cfg.open_set_presets.index(k[2]), eps_l, -k[5])

    keys = sorted(groups, key=order)
    full = cfg.open_set_enrol_images
    entries = [combine(groups[k]) for k in keys if k[1] in MODES and k[6] == full]
    info = setup(cfg, pop, contexts)
    info["decision_preset"] = choose_preset(entries)
    info["no_noise"] = [combine(groups[k]) for k in keys if k[1] == "no_noise"]
    info["noise_cost"] = [combine(groups[k]) for k in keys if k[1] in NOISE_COST_MODES]
    info["enrolment_sweep"] = [combine(groups[k]) for k in keys if k[1] in MODES and k[6] != full]
    return entries, info, cpu
