"""The experiments of ``peep qbbs evaluate``: verification and fidelity metrics, fusion, query noise.

:func:`peep.lab.qbbs.evaluation.run_evaluation` prepares the data (face
scores of every probe against every enrolled subject, enrolled and observed
soft traits) and calls the steps here in order:

1. :func:`fit_face_model` -- Parzen windows on the validation face scores
   (Eq. 5.5), giving log P(genuine | face score) of every claim;
2. :func:`fit_weights` -- fusion weights on noise-free validation claims;
3. :func:`verification_experiment` -- the test split without noise, with the
   module's query noise at the run's ε (``independent`` transform, weights
   refitted on noised validation claims), and the chapter's ``shared-noise``
   transform;
4. :func:`epsilon_sweep` -- the chapter's Deviation and Distortion, and what
   the noise does to verification, over a sweep of ε.

Every noised step draws from one seeded sampler (:class:`QueryNoise`) in a
fixed order, so a run is reproducible from its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.mechanisms import LaplaceMechanism
from peep.core.sampling import NoiseSampler
from peep.server.config.qbbs import FACE, QbbsConfig
from peep.server.qbbs.calibration import simplex_grid
from peep.server.qbbs.matcher import ParzenScoreModel, gaussian_log_likelihood
from peep.server.qbbs.queries import QueryPlan

TARGET_FAR = 0.01
FAR_GRID = np.unique(np.concatenate([np.logspace(-4, 0, 49), [0.001, 0.01, 0.1]]))

#: What each entry of the test split's GAR table means (reported with it).
GAR_DEFINITIONS = {
    "face": "face score alone (log P(claimed | template))",
    "face_parzen": "a0 = 1: log P(genuine | face score) from the Parzen model",
    "face_all": "face + all traits, no query noise, weights fitted on noise-free validation claims",
    "face_all_noised": "face + all traits with the module's query noise at epsilon_per_response "
    "(independent transform), weights refitted on noised validation claims",
    "face_all_noised_clean_weights": "as face_all_noised but keeping the noise-free weights",
    "face_all_noised_shared_noise": "the chapter's Y*' = Y* + phi (noise cancels; no privacy "
    "against a verifier who knows Y*)",
}
DEVIATION_DEFINITION = (
    "the chapter's Deviation Dev_i = |Y'_i - Y_i| for trait i: the enrolled true value Y_i against the "
    "matcher's estimate Y'_i synthesised from the m perturbed SUM responses of one claim. 'mean_abs': mean "
    "of Dev_i over all test claims, in the trait's unit; 'relative_to_range': the same divided by the "
    "trait's declared range; 'noise_std': the standard deviation of Y'_i - Y_i implied by the mechanism"
)
DISTORTION_DEFINITION = (
    "the chapter's Distortion Dist = (1/(m*n)) * sum_k (R_k - R'_k) over the m*n SUM responses of one "
    "verification (m per trait, n traits): true response R_k minus perturbed response R'_k, averaged over "
    "all test claims. 'mean_difference' is that formula (zero in expectation: the Laplace noise has mean "
    "0); the chapter calls Dist analogous to the MSE, so 'mean_squared_difference' is (1/(m*n)) * sum_k "
    "(R_k - R'_k)^2. The all-trait values mix the traits' units as the formula does; 'traits' gives each "
    "trait's m responses alone, in its unit squared for the squared difference, with the expected value "
    "2*(sensitivity/epsilon)^2 of a Laplace response"
)
VERIFICATION_DEFINITION = (
    "effect of the query noise on verification with face + all traits (independent transform): fraction "
    "of accept/reject decisions that flip and mean |g' - g| / sd(g) against the noise-free system (same "
    "weights, its 1%-FAR threshold); GAR at FAR 1% with weights refitted for each epsilon and with the "
    "noise-free weights. The chapter's shared-noise transform leaves verification unchanged by construction"
)

#: Per-trait log-likelihoods of every claim, each an ndarray of shape (n_probes, n_subjects).
LogLiks = dict[str, NDArray[np.float64]]
#: Fusion weights of each combination of traits: ``{combination: {FACE or trait: weight}}``.
Weights = dict[str, dict[str, float]]


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


def sensitivity(cfg: QbbsConfig, name: str, enrolled: NDArray[np.float64]) -> float:
    """Δf of trait ``name``'s SUM queries: its declared range, or the spread of the ``enrolled`` values."""
    return cfg.traits[name].range if cfg.sensitivity == "declared-range" else float(enrolled.max() - enrolled.min())


# --------------------------------------------------------------------------- face scores and fusion


@dataclass(frozen=True)
class ScoredClaims:
    """Every validation and test probe claimed as every enrolled subject.

    Attributes
    ----------
    val, test : ndarray of shape (n_images,), bool
        The validation and test probes among the dataset's images.
    s_val, s_test : ndarray of shape (n_val, n_subjects) and (n_test, n_subjects)
        Face scores log P(claimed | template) of each claim.
    gmask_val, gmask_test : ndarray of bool, shapes as ``s_val`` and ``s_test``
        Whether the claim is genuine.
    lp_val, lp_test : ndarray, shapes as ``s_val`` and ``s_test``
        log P(genuine | face score) from :attr:`parzen`.
    parzen : ParzenScoreModel
        The Parzen-window model fitted on the validation scores.
    """

    val: NDArray[np.bool_]
    test: NDArray[np.bool_]
    s_val: NDArray[np.float64]
    s_test: NDArray[np.float64]
    gmask_val: NDArray[np.bool_]
    gmask_test: NDArray[np.bool_]
    lp_val: NDArray[np.float64]
    lp_test: NDArray[np.float64]
    parzen: ParzenScoreModel


def fit_face_model(
    log_p: NDArray[np.float64], labels: NDArray[np.int64], part: NDArray[np.int8], cfg: QbbsConfig
) -> ScoredClaims:
    """Parzen windows on the validation face scores (Eq. 5.5), applied to every validation and test claim.

    Parameters
    ----------
    log_p : ndarray of shape (n_images, n_subjects)
        Face score of each image claimed as each subject.
    labels : ndarray of shape (n_images,)
        True subject of each image.
    part : ndarray of shape (n_images,)
        Split of each image: 0 train, 1 validation, 2 test.
    cfg : QbbsConfig
        Gives the genuine prior.
    """
    val, test = part == 1, part == 2
    n_subjects = log_p.shape[1]
    gmask_val = labels[val][:, None] == np.arange(n_subjects)[None, :]
    gmask_test = labels[test][:, None] == np.arange(n_subjects)[None, :]
    s_val, s_test = log_p[val], log_p[test]
    parzen = ParzenScoreModel(prior=cfg.genuine_prior).fit(s_val[gmask_val], s_val[~gmask_val])
    lp_val = parzen.log_posterior(s_val.ravel()).reshape(s_val.shape)
    lp_test = parzen.log_posterior(s_test.ravel()).reshape(s_test.shape)
    return ScoredClaims(val, test, s_val, s_test, gmask_val, gmask_test, lp_val, lp_test, parzen)


def trait_logliks(traits: dict[str, dict[str, Any]], widths: dict[str, float], rows: NDArray[np.bool_]) -> LogLiks:
    """Noise-free log-likelihood of each trait (in the order of ``widths``) for every claim of the probes ``rows``."""
    return {n: _loglik(traits[n]["observed"][rows], traits[n]["enrolled"], w) for n, w in widths.items()}


def _loglik(observed: NDArray[np.float64], enrolled: NDArray[np.float64], width: float) -> NDArray[np.float64]:
    return np.asarray(gaussian_log_likelihood(observed[:, None], enrolled[None, :], width))


def combinations(names: list[str]) -> dict[str, list[str]]:
    """The fused combinations: face with each trait alone (``face_<trait>``), then with all (``face_all``)."""
    combos: dict[str, list[str]] = {f"face_{n}": [n] for n in names}
    combos["face_all"] = names
    return combos


def fit_weights(
    lp: NDArray[np.float64],
    lls: LogLiks,
    gmask: NDArray[np.bool_],
    combos: dict[str, list[str]],
    keys: Sequence[str],
) -> tuple[Weights, dict[str, float]]:
    """Fusion weights of the combinations ``keys`` chosen on validation claims, and their GAR at FAR 1 %.

    Parameters
    ----------
    lp : ndarray of shape (n_probes, n_subjects)
        log P(genuine | face score) of each claim.
    lls : dict of str to ndarray of shape (n_probes, n_subjects)
        Each trait's log-likelihood of each claim.
    gmask : ndarray of shape (n_probes, n_subjects)
        Whether the claim is genuine.
    combos : dict of str to list of str
        The traits of each combination (:func:`combinations`).
    keys : sequence of str
        The combinations to fit.
    """
    ws: Weights = {}
    gars: dict[str, float] = {}
    for key in keys:
        used = combos[key]
        w, g = choose_weights([lp] + [lls[n] for n in used], gmask, TARGET_FAR, steps=20 if len(used) == 1 else 10)
        ws[key] = {FACE: float(w[0]), **{n: float(wi) for n, wi in zip(used, w[1:], strict=True)}}
        gars[key] = g
    return ws, gars


def fused(w: dict[str, float], lp: NDArray[np.float64], lls: LogLiks) -> NDArray[np.float64]:
    """Fused score ``w[FACE]·lp + Σ w[n]·lls[n]`` of each claim, shape of ``lp``."""
    g = w[FACE] * lp
    for n, wn in w.items():
        if n != FACE:
            g = g + wn * lls[n]
    return np.asarray(g)


# --------------------------------------------------------------------------- query noise


class NoisyTerms(NamedTuple):
    """What the query noise at one ε does to every claim of some probes, per trait.

    ``independent`` and ``shared`` are the noised log-likelihoods, shape
    (n_probes, n_subjects), under the ``independent`` and the chapter's
    ``shared-noise`` transform; ``estimates`` holds (enrolled Y, synthesised
    Y') of each claim, ``stds`` the standard deviation of Y' - Y, and
    ``responses`` the (true, perturbed) SUM responses of each claim, shape
    (n_claims, m).
    """

    independent: LogLiks
    shared: LogLiks
    estimates: dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]
    stds: dict[str, float]
    responses: dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]


@dataclass(frozen=True)
class QueryNoise:
    """The module's query plan answering every claim's SUM queries with fresh Laplace noise.

    ``sampler`` is shared by every call, so the calls' order fixes the
    noise each one draws.
    """

    cfg: QbbsConfig
    plan: QueryPlan
    traits: dict[str, dict[str, Any]]
    widths: dict[str, float]
    subjects: list[str]
    sampler: NoiseSampler

    def terms(self, eps: float, rows: NDArray[np.bool_]) -> NoisyTerms:
        """Noised log-likelihoods of every claim of the probes ``rows`` at ``eps`` per response."""
        n_s = len(self.subjects)
        n_p = int(rows.sum())
        claims = np.tile(np.arange(n_s), n_p)
        out = NoisyTerms({}, {}, {}, {}, {})
        for n, width in self.widths.items():
            enrolled = self.traits[n]["enrolled"]
            mech = LaplaceMechanism(
                epsilon=eps, sensitivity=sensitivity(self.cfg, n, enrolled), random_state=self.sampler
            )
            exact = self.plan.exact_responses_many(self.subjects, enrolled, claims)
            perturbed = np.asarray(mech.randomise(exact), dtype=np.float64)
            y_noisy = self.plan.synthesise_many(perturbed)
            phi = y_noisy - enrolled[claims]
            var = self.plan.net_noise_variance(mech.variance)
            obs = np.repeat(self.traits[n]["observed"][rows], n_s)
            shape = (n_p, n_s)
            independent = gaussian_log_likelihood(obs, y_noisy, math.sqrt(width**2 + var))
            out.independent[n] = np.asarray(independent).reshape(shape)
            out.shared[n] = np.asarray(gaussian_log_likelihood(obs + phi, y_noisy, width)).reshape(shape)
            out.estimates[n] = (enrolled[claims], y_noisy)
            out.stds[n] = math.sqrt(var)
            out.responses[n] = (exact, perturbed)
        return out


# --------------------------------------------------------------------------- experiments


@dataclass(frozen=True)
class VerificationOutcome:
    """The test split at the run's ε: fused scores, GAR table, ROC curves and the noised terms they used.

    ``scores`` maps each curve to its scores, shape (n_test, n_subjects);
    ``noised`` holds the test claims' :class:`NoisyTerms` at the run's ε.
    """

    weights_noised: Weights
    val_gar_noised: dict[str, float]
    scores: dict[str, NDArray[np.float64]]
    gar_table: dict[str, Any]
    roc_curves: dict[str, list[float]]
    noised: NoisyTerms


def _gar(g: NDArray[np.float64], gmask: NDArray[np.bool_]) -> float:
    return gar_at_far(g[gmask], g[~gmask], TARGET_FAR)[0]


def verification_experiment(
    claims: ScoredClaims,
    ll_test: LogLiks,
    weights: Weights,
    combos: dict[str, list[str]],
    noise: QueryNoise,
    epsilon: float,
) -> VerificationOutcome:
    """The test split without noise, with query noise at ``epsilon`` per response, and the chapter's transform."""
    # A deployment sets its weights for its ε: refit them on noised validation claims.
    noised = noise.terms(epsilon, claims.test)
    ll_val_noised = noise.terms(epsilon, claims.val).independent
    weights_noised, val_gar_noised = fit_weights(claims.lp_val, ll_val_noised, claims.gmask_val, combos, list(combos))
    lp = claims.lp_test
    scores: dict[str, NDArray[np.float64]] = {"face": claims.s_test, "face_parzen": lp}
    for key in combos:
        scores[key] = fused(weights[key], lp, ll_test)
        scores[f"{key}_noised"] = fused(weights_noised[key], lp, noised.independent)
    scores["face_all_noised_clean_weights"] = fused(weights["face_all"], lp, noised.independent)
    scores["face_all_noised_shared_noise"] = fused(weights["face_all"], lp, noised.shared)
    gmask = claims.gmask_test
    names = combos["face_all"]
    gar_table = _gar_table(scores, gmask, names, epsilon)
    roc_curves = {k: roc(v[gmask], v[~gmask], FAR_GRID) for k, v in scores.items()}
    return VerificationOutcome(weights_noised, val_gar_noised, scores, gar_table, roc_curves, noised)


def _gar_table(
    scores: dict[str, NDArray[np.float64]], gmask: NDArray[np.bool_], names: list[str], epsilon: float
) -> dict[str, Any]:
    """GAR at FAR 1 % of the test split's curves, each trait's beside face alone."""

    def gar(key: str) -> float:
        return _gar(scores[key], gmask)

    return {
        "face": gar("face"),
        "face_all": gar("face_all"),
        "face_all_noised": gar("face_all_noised"),
        "face_all_noised_clean_weights": gar("face_all_noised_clean_weights"),
        "face_all_noised_shared_noise": gar("face_all_noised_shared_noise"),
        "face_parzen": gar("face_parzen"),
        "per_trait": {
            n: {"face": gar("face"), "face_trait": gar(f"face_{n}"), "face_trait_noised": gar(f"face_{n}_noised")}
            for n in names
        },
        "epsilon_per_response": epsilon,
        "definitions": dict(GAR_DEFINITIONS),
    }


@dataclass(frozen=True)
class SweepTables:
    """The ε sweep's tables as reported: ``deviation``, ``distortion`` and ``verification_vs_epsilon``."""

    deviation: dict[str, Any]
    distortion: dict[str, Any]
    verification: dict[str, Any]


def _sweep_tables(sweep: list[float], m: int, names: list[str]) -> SweepTables:
    """Empty tables, one list per quantity, filled point by point."""
    deviation_table: dict[str, Any] = {
        "epsilons": sweep,
        "definition": DEVIATION_DEFINITION,
        "traits": {n: {"mean_abs": [], "relative_to_range": [], "noise_std": []} for n in names},
    }
    distortion_table: dict[str, Any] = {
        "epsilons": sweep,
        "m": m,
        "n_traits": len(names),
        "definition": DISTORTION_DEFINITION,
        "mean_difference": [],
        "mean_squared_difference": [],
        "traits": {
            n: {"mean_difference": [], "mean_squared_difference": [], "expected_mean_squared_difference": []}
            for n in names
        },
    }
    verification: dict[str, Any] = {
        "epsilons": sweep,
        "definition": VERIFICATION_DEFINITION,
        "decision_flip_rate": [],
        "score_change": [],
        "gar_at_far_1pct": [],
        "gar_at_far_1pct_clean_weights": [],
        "weights": [],
        "epsilon_per_verification": [],
    }
    return SweepTables(deviation_table, distortion_table, verification)


def _fidelity_point(tables: SweepTables, eps: float, terms: NoisyTerms, noise: QueryNoise) -> None:
    """Append the chapter's Deviation and Distortion at ``eps``, per trait and over all traits."""
    names = list(noise.widths)
    for n in names:
        dev = float(np.mean(deviation(*terms.estimates[n])))
        tables.deviation["traits"][n]["mean_abs"].append(dev)
        tables.deviation["traits"][n]["relative_to_range"].append(dev / noise.cfg.traits[n].range)
        tables.deviation["traits"][n]["noise_std"].append(terms.stds[n])
        mean_d, mean_sq = distortion(*terms.responses[n])
        row = tables.distortion["traits"][n]
        row["mean_difference"].append(mean_d)
        row["mean_squared_difference"].append(mean_sq)
        row["expected_mean_squared_difference"].append(
            2.0 * (sensitivity(noise.cfg, n, noise.traits[n]["enrolled"]) / eps) ** 2
        )
    # one verification's m*n responses side by side: (n_claims, n_traits * m)
    mean_d, mean_sq = distortion(
        np.hstack([terms.responses[n][0] for n in names]), np.hstack([terms.responses[n][1] for n in names])
    )
    tables.distortion["mean_difference"].append(mean_d)
    tables.distortion["mean_squared_difference"].append(mean_sq)


def epsilon_sweep(
    epsilons: Sequence[float],
    claims: ScoredClaims,
    weights: Weights,
    combos: dict[str, list[str]],
    noise: QueryNoise,
    at_run: tuple[float, VerificationOutcome],
    progress: Callable[[int, int], None],
) -> SweepTables:
    """Deviation, Distortion and the effect on verification (face + all traits) over ``epsilons`` and the run's ε.

    ``at_run`` is the run's ε with its :func:`verification_experiment` outcome,
    whose noised terms and refitted weights are reused at that ε rather
    than drawn again.
    """
    epsilon, outcome = at_run
    g_clean = outcome.scores["face_all"]
    gmask = claims.gmask_test
    _, thr_clean = gar_at_far(g_clean[gmask], g_clean[~gmask], TARGET_FAR)
    sd_g = float(np.std(g_clean)) or 1.0
    sweep = sorted({float(e) for e in epsilons} | {float(epsilon)})
    tables = _sweep_tables(sweep, noise.plan.m, list(noise.widths))
    verification = tables.verification
    for j, eps in enumerate(sweep):
        if eps == epsilon:
            terms, w_eps = outcome.noised, outcome.weights_noised["face_all"]
        else:
            terms = noise.terms(eps, claims.test)
            ll_val = noise.terms(eps, claims.val).independent
            w_eps = fit_weights(claims.lp_val, ll_val, claims.gmask_val, combos, ["face_all"])[0]["face_all"]
        _fidelity_point(tables, eps, terms, noise)
        g_n = fused(weights["face_all"], claims.lp_test, terms.independent)
        verification["decision_flip_rate"].append(float(np.mean((g_n > thr_clean) != (g_clean > thr_clean))))
        verification["score_change"].append(float(np.mean(np.abs(g_n - g_clean)) / sd_g))
        verification["gar_at_far_1pct_clean_weights"].append(_gar(g_n, gmask))
        verification["gar_at_far_1pct"].append(_gar(fused(w_eps, claims.lp_test, terms.independent), gmask))
        verification["weights"].append(w_eps)
        verification["epsilon_per_verification"].append(eps * noise.plan.pairs * len(noise.widths))
        progress(j + 1, len(sweep))
    return tables
