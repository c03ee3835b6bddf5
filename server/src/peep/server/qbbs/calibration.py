"""Calibrating the fused decision to a target false-accept rate, without reading the soft-trait store.

Why
---
The fused score g = a0·log P(genuine | s) + Σ_j a_j·log P(Y_j*' | Y_j')
(chapter Eq. 5.7) has no natural scale: its level depends on the widths, on
the query noise (with the default ``independent`` transform the likelihood
width is sqrt(c² + Var φ + observation noise), which at ε = 1 per answer is
hundreds of units) and on which traits a claim observes. A fixed rule ("face
posterior 0.5 and every trait 2 widths off") accepted about 80 % of impostor
claims in ``peep demo``. The face-only Verify sets its threshold on
validation impostor scores for ``training.target_far``; this module does the
same for g, so VerifyFused's FAR is about ``target_far`` too.

What the calibration may use (all public, or the recogniser's own validation data)
----------------------------------------------------------------------------------
* **face**: the serving model's validation scores the Parzen densities were
  fitted on (genuine and impostor), resampled with replacement and mapped
  through log P(genuine | s), as the face-only threshold uses them;
* **trait specs**: declared ranges and widths; the width is the measurement
  error of an observation (see :mod:`peep.server.config.qbbs`): continuous
  observed = true + N(0, width²); binary observed = the true bit flipped with
  probability 1/(1 + e^(1/(2·width²))) (the classifier whose log-odds equal
  the width's mismatch penalty, 12 % for width 0.5);
* **the noise of every answer**: each SUM response gets Laplace(Δf/ε) with
  Δf the declared range (the module's mechanism scale), so
  Y' = Y + φ with φ = mean over the m/2 pairs of (η_with - η_without); with
  ``shared-noise`` the observation is shifted by the same φ, which cancels;
  an observation's own known noise (:class:`ObservationNoise`): the edge's
  bounded Laplace for age (clip to [0, bound], add Laplace(bound/ε)), its
  randomized response for gender (flip with probability 1/(1 + e^ε)), or a
  Gaussian of a stated variance; observed values are clipped to the declared
  range, as the service does;
* **a public population model** for true values, declared by the deployer
  (``[qbbs.population]``, :class:`~peep.server.config.qbbs.PopulationPrior`)
  from public knowledge of the site and never computed from the store. The
  default (:data:`POPULATION`) is a general adult population: gender
  Bernoulli(0.5); height (cm) and weight (kg) from the NHANES-based adult
  anthropometry by gender in :mod:`peep.lab.qbbs.anthropometry`; every other
  trait (age included) uniform over its declared range. A site declares its
  male fraction, an age distribution N(age_mean, age_sd²) and per-gender
  height/weight means and SDs when its people are narrower than that: with
  the general model, impostors at a one-gender site resemble the claimed
  person more than simulated and the real FAR exceeds ``target_far`` once the
  traits carry weight.

What it must not use: the soft-trait store. A threshold computed from stored
values would itself be a release of them (and it would change with every
enrolment). The module hands this code only its configuration, the Parzen
model and the shape of a claim; this file does not import the store, which
``tests/qbbs/test_store_boundary.py`` enforces.

Simulation
----------
A genuine claim is one person: the enrolled value Y and the observation come
from the same draw. An impostor claim is two people: the claimed subject's Y
and the presenter's observation, independent draws (``impostor_model =
"independent"``) or, with ``"same-gender"``, the presenter drawn with the
simulated claimed person's gender (the conservative model: at a site where
gender does not tell people apart it cannot earn weight). Both are simulated
people; the stored subject is never looked at. The face term of a genuine
(impostor) claim is a resampled genuine (impostor) validation score. The
simulation draws from a seeded numpy Generator: it is calibration, not
privacy noise, and never reaches a mechanism (the module's mechanisms keep
their own sampler, the secure one in a deployment). The seed is fixed and
public, so the same inputs give the same threshold.

Decision: accept iff g >= threshold, the threshold just above the k-th
largest simulated impostor score, k = floor(target_far · n), so the
simulated FAR is at most ``target_far`` (Monte-Carlo standard error about
sqrt(target_far / n)).

Weights (when ``weights`` is not configured): the point of a simplex grid
(steps of 0.1 for up to four traits, coarser for more) with the highest
simulated GAR at ``target_far``, ties keeping more face weight, as
``peep qbbs evaluate`` chooses them on validation data. The weights are
chosen on one simulation and the threshold set on a second, independent one,
so choosing does not bias the FAR.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from peep.server.config.qbbs import ANTHROPOMETRY, FACE, Anthropometry, PopulationPrior, TraitSpec
from peep.server.qbbs.matcher import ParzenScoreModel, gaussian_log_likelihood

__all__ = [
    "CALIBRATION_SEED",
    "POPULATION",
    "Calibration",
    "ObservationNoise",
    "TraitTerm",
    "anthropometry",
    "calibrate",
    "far_threshold",
    "sample_population",
    "simplex_grid",
    "simulate_claims",
    "weight_grid",
]

#: Public seed of the calibration's simulation (not privacy noise).
CALIBRATION_SEED = 0x9BB5CA1B
#: Largest weight grid searched per claim shape.
MAX_GRID_POINTS = 1001

#: The default population model (``PopulationPrior()``), as :attr:`Calibration.population` names it.
POPULATION = PopulationPrior().describe()


@dataclass(frozen=True, kw_only=True)
class ObservationNoise:
    """Known noise on an observed trait before it reaches the module.

    Attributes
    ----------
    kind : {"gaussian", "edge-laplace", "randomized-response"}
        ``gaussian``: N(0, variance) added. ``edge-laplace``: the edge agent's
        bounded Laplace (value clipped to [0, bound], Laplace(bound/ε) added).
        ``randomized-response``: the bit is flipped with probability
        1/(1 + e^ε).
    variance : float
        Variance the matcher adds to the trait's width.
    bound, epsilon : float
        Parameters of ``edge-laplace`` (both) and ``randomized-response`` (ε).
    """

    kind: Literal["gaussian", "edge-laplace", "randomized-response"]
    variance: float
    bound: float = 0.0
    epsilon: float = 0.0

    @classmethod
    def gaussian(cls, variance: float) -> ObservationNoise:
        v = float(variance)
        if not (math.isfinite(v) and v >= 0.0):
            raise ValueError(f"variance: expected a finite number >= 0, received {variance!r}")
        return cls(kind="gaussian", variance=v)

    @classmethod
    def edge_laplace(cls, *, bound: float, epsilon: float) -> ObservationNoise:
        b, e = float(bound), float(epsilon)
        if not (math.isfinite(b) and b > 0.0):
            raise ValueError(f"bound: expected a finite number > 0, received {bound!r}")
        if not (math.isfinite(e) and e > 0.0):
            raise ValueError(f"epsilon: expected a finite number > 0, received {epsilon!r}")
        return cls(kind="edge-laplace", variance=2.0 * (b / e) ** 2, bound=b, epsilon=e)

    @classmethod
    def randomized_response(cls, *, epsilon: float) -> ObservationNoise:
        e = float(epsilon)
        if not (e > 0.0):  # also refuses NaN; +inf means no flips
            raise ValueError(f"epsilon: expected a number > 0, received {epsilon!r}")
        p = flip_probability(e)
        return cls(kind="randomized-response", variance=p * (1.0 - p), epsilon=e)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "variance": self.variance}
        if self.kind == "edge-laplace":
            out["bound"] = self.bound
        if self.kind != "gaussian":
            out["epsilon"] = self.epsilon
        return out


def flip_probability(epsilon: float) -> float:
    """Randomized response's flip probability 1/(1 + e^ε)."""
    return 1.0 / (1.0 + math.exp(min(epsilon, 700.0)))


def binary_error_rate(width: float) -> float:
    """Error rate of a binary observation whose mismatch costs 1/(2·width²) nats: 1/(1 + e^(1/(2·width²)))."""
    return 1.0 / (1.0 + math.exp(min(1.0 / (2.0 * width * width), 700.0)))


@dataclass(frozen=True, kw_only=True)
class TraitTerm:
    """What the simulation needs to know of one observed trait (all of it public).

    Attributes
    ----------
    name : str
    spec : TraitSpec
    width : float
        The likelihood width the module uses for this trait in such a claim.
    response_scale : float
        Laplace scale of each SUM response (Δf/ε, the module's mechanism).
    pairs : int
        m / 2.
    shared_noise : bool
        ``verification_transform == "shared-noise"`` (φ cancels).
    noise : ObservationNoise or None
        The observation's own known noise.
    """

    name: str
    spec: TraitSpec
    width: float
    response_scale: float
    pairs: int
    shared_noise: bool
    noise: ObservationNoise | None = None


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A calibrated fused decision for one claim shape (the traits observed and their noise).

    Attributes
    ----------
    threshold : float
        Accept iff g >= threshold.
    weights : mapping of str to float
        a0 (``"face"``) and the observed traits' weights, summing to 1.
    weights_chosen : bool
        True when the calibration chose the weights (``weights`` not configured).
    target_far : float
    simulated_far, simulated_gar : float
        Fraction of simulated impostor / genuine claims accepted at ``threshold``
        (on the simulation that set it).
    claims : int
        Simulated claims of each kind.
    observed : tuple of str
        The traits observed (config order).
    noise : mapping of str to ObservationNoise
    model_version : object
        The face model's version the Parzen densities came from.
    population : str
        The population model simulated (:meth:`PopulationPrior.describe`).
    """

    threshold: float
    weights: Mapping[str, float]
    weights_chosen: bool
    target_far: float
    simulated_far: float
    simulated_gar: float
    claims: int
    observed: tuple[str, ...]
    noise: Mapping[str, ObservationNoise] = field(default_factory=dict)
    model_version: object = None
    population: str = POPULATION

    def describe(self) -> dict[str, Any]:
        """JSON-able summary (for logs)."""
        return {
            "threshold": self.threshold,
            "target_far": self.target_far,
            "simulated_far": self.simulated_far,
            "simulated_gar": self.simulated_gar,
            "weights": dict(self.weights),
            "weights_chosen": self.weights_chosen,
            "observed": list(self.observed),
            "observation_noise": {t: n.describe() for t, n in self.noise.items()},
            "claims": self.claims,
            "model_version": self.model_version,
            "population": self.population,
        }


# --------------------------------------------------------------------------- simulation


def anthropometry(
    male: NDArray[np.float64], *, female_params: Anthropometry, male_params: Anthropometry, seed: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Height (cm) and weight (kg) per person from their gender's distribution.

    The model of :func:`peep.lab.qbbs.anthropometry.synthetic_anthropometry`
    (normal height, log-normal weight with the same mean and SD, correlated
    with height) with the means and SDs given; with the defaults it draws
    exactly what that function draws for the same ``seed``.

    Parameters
    ----------
    male : ndarray of shape (n,)
        1 = male, 0 = female.
    female_params, male_params : Anthropometry
    seed : int
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x51A7]))
    n = male.size
    z1, z2 = rng.standard_normal(n), rng.standard_normal(n)
    r = float(ANTHROPOMETRY["height_weight_correlation"])
    height = np.empty(n)
    weight = np.empty(n)
    for g, p in ((0, female_params), (1, male_params)):
        m = male == g
        height[m] = p.height_mean + p.height_sd * z1[m]
        s2 = math.log1p((p.weight_sd / p.weight_mean) ** 2)
        mu = math.log(p.weight_mean) - s2 / 2
        weight[m] = np.exp(mu + math.sqrt(s2) * (r * z1[m] + math.sqrt(1 - r * r) * z2[m]))
    return height, weight


def _sample(
    specs: Mapping[str, TraitSpec],
    n: int,
    rng: np.random.Generator,
    population: PopulationPrior,
    male: NDArray[np.float64] | None = None,
) -> tuple[dict[str, NDArray[np.float64]], NDArray[np.float64]]:
    """:func:`sample_population`, also returning each person's gender (given as ``male``, or drawn)."""
    if male is None:
        male = (rng.random(n) < population.male_fraction).astype(np.float64)
    gender_spec = specs.get("gender")
    out: dict[str, NDArray[np.float64]] = {}
    anthro: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
    for name, spec in specs.items():
        if name == "gender" and gender_spec is not None and gender_spec.kind == "binary":
            v = male
        elif (name, spec.unit) in (("height", "cm"), ("weight", "kg")):
            if anthro is None:
                anthro = anthropometry(
                    male,
                    female_params=population.female,
                    male_params=population.male,
                    seed=int(rng.integers(0, 2**62)),
                )
            v = anthro[0] if name == "height" else anthro[1]
        elif spec.kind == "binary":
            v = (rng.random(n) < 0.5).astype(np.float64)
        elif name == "age" and population.age_mean is not None:
            assert population.age_sd is not None  # validated together
            v = rng.normal(population.age_mean, population.age_sd, n)
        else:
            v = rng.uniform(spec.lower, spec.upper, n)
        out[name] = np.clip(v, spec.lower, spec.upper)
    return out, male


def sample_population(
    specs: Mapping[str, TraitSpec],
    n: int,
    rng: np.random.Generator,
    population: PopulationPrior | None = None,
) -> dict[str, NDArray[np.float64]]:
    """True trait values of ``n`` independent people from a public population model.

    Parameters
    ----------
    specs : mapping of str to TraitSpec
    n : int
    rng : numpy Generator
    population : PopulationPrior, optional
        The deployer's declared prior; default :data:`POPULATION`.

    Returns
    -------
    dict of str to ndarray of shape (n,)
    """
    return _sample(specs, n, rng, population or PopulationPrior())[0]


def _observe(
    values: NDArray[np.float64], spec: TraitSpec, noise: ObservationNoise | None, rng: np.random.Generator
) -> NDArray[np.float64]:
    """An observation of ``values``: measurement error (the width), the observation's own noise, clipping."""
    n = values.size
    if spec.kind == "binary":
        obs = np.where(rng.random(n) < binary_error_rate(spec.width), 1.0 - values, values)
        if noise is not None and noise.kind == "randomized-response":
            obs = np.where(rng.random(n) < flip_probability(noise.epsilon), 1.0 - obs, obs)
    else:
        obs = values + rng.normal(0.0, spec.width, n)
    if noise is not None:
        if noise.kind == "edge-laplace":
            obs = np.clip(obs, 0.0, noise.bound) + rng.laplace(0.0, noise.bound / noise.epsilon, n)
        elif noise.kind == "gaussian" or spec.kind != "binary":
            obs = obs + rng.normal(0.0, math.sqrt(noise.variance), n)
    out: NDArray[np.float64] = np.clip(obs, spec.lower, spec.upper)
    return out


def _trait_log_likelihood(
    term: TraitTerm, enrolled: NDArray[np.float64], observed: NDArray[np.float64], rng: np.random.Generator
) -> NDArray[np.float64]:
    if term.shared_noise:
        # Y*' = Y* + φ against Y' = Y + φ: the net noise cancels.
        return np.asarray(gaussian_log_likelihood(observed, enrolled, term.width), dtype=np.float64)
    eta = rng.laplace(0.0, term.response_scale, (enrolled.size, 2 * term.pairs))
    phi = np.mean(eta[:, 0::2] - eta[:, 1::2], axis=1)
    return np.asarray(gaussian_log_likelihood(observed, enrolled + phi, term.width), dtype=np.float64)


def simulate_claims(
    parzen: ParzenScoreModel,
    terms: Sequence[TraitTerm],
    n: int,
    rng: np.random.Generator,
    population: PopulationPrior | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Simulated genuine and impostor claims of people from ``population`` (default :data:`POPULATION`).

    Returns
    -------
    genuine, impostor : ndarray of shape (1 + n_traits, n)
        Row 0: log P(genuine | face score); row 1 + j: log P(Y_j*' | Y_j') of
        ``terms[j]``.
    """
    g_face = rng.choice(parzen.genuine_scores_, size=n, replace=True)
    i_face = rng.choice(parzen.impostor_scores_, size=n, replace=True)
    genuine = np.empty((1 + len(terms), n))
    impostor = np.empty((1 + len(terms), n))
    genuine[0] = parzen.log_posterior(g_face)
    impostor[0] = parzen.log_posterior(i_face)
    if terms:
        pop = population or PopulationPrior()
        specs = {t.name: t.spec for t in terms}
        same, _ = _sample(specs, n, rng, pop)  # genuine: claimed subject = presenter
        claimed, claimed_male = _sample(specs, n, rng, pop)  # impostor: two people
        presenter, _ = _sample(specs, n, rng, pop, claimed_male if pop.impostor_model == "same-gender" else None)
        for j, t in enumerate(terms, start=1):
            genuine[j] = _trait_log_likelihood(t, same[t.name], _observe(same[t.name], t.spec, t.noise, rng), rng)
            impostor[j] = _trait_log_likelihood(
                t, claimed[t.name], _observe(presenter[t.name], t.spec, t.noise, rng), rng
            )
    return genuine, impostor


# --------------------------------------------------------------------------- thresholds and weights


def far_threshold(impostor: NDArray[np.float64], far: float) -> float:
    """A threshold t with mean(impostor >= t) <= ``far``: just above the k-th largest, k = floor(far·n)."""
    imp = np.asarray(impostor, dtype=np.float64).ravel()
    k = math.floor(far * imp.size + 1e-9)
    if k >= imp.size:
        return -math.inf
    kth = float(np.partition(imp, imp.size - 1 - k)[imp.size - 1 - k])
    return float(np.nextafter(kth, math.inf))


def simplex_grid(k: int, steps: int) -> NDArray[np.float64]:
    """All weight vectors of length ``k`` with entries in multiples of 1/steps summing to 1."""
    rows = []
    for cut in combinations(range(steps + k - 1), k - 1):
        parts = np.diff(np.concatenate([[-1], cut, [steps + k - 1]])) - 1
        rows.append(parts / steps)
    return np.array(rows, dtype=np.float64)


def weight_grid(k: int, max_points: int = MAX_GRID_POINTS) -> NDArray[np.float64]:
    """A simplex grid over ``k`` weights (face first): steps of 0.1, coarser when that exceeds ``max_points``."""
    if k == 1:
        return np.ones((1, 1))
    steps = 10
    while steps > 1 and math.comb(steps + k - 1, k - 1) > max_points:
        steps -= 1
    return simplex_grid(k, steps)


def _choose_weights(genuine: NDArray[np.float64], impostor: NDArray[np.float64], far: float) -> NDArray[np.float64]:
    """The grid point with the highest GAR at ``far``; ties keep more face weight."""
    grid = weight_grid(genuine.shape[0])
    n = impostor.shape[1]
    k = math.floor(far * n + 1e-9)
    gars = np.empty(grid.shape[0])
    for start in range(0, grid.shape[0], 64):
        w = grid[start : start + 64]
        gi = w @ impostor
        kth = np.partition(gi, n - 1 - k, axis=1)[:, n - 1 - k]
        thr = np.nextafter(kth, np.inf)
        gars[start : start + 64] = np.mean(w @ genuine >= thr[:, None], axis=1)
    best = np.lexsort((grid[:, 0], gars))[-1]  # highest GAR, then highest face weight
    out: NDArray[np.float64] = grid[best]
    return out


def _seed(observed: Sequence[str], noise: Mapping[str, ObservationNoise]) -> np.random.SeedSequence:
    key = repr([(t, noise[t].describe() if t in noise else None) for t in observed]).encode()
    words = np.frombuffer(hashlib.sha256(key).digest()[:16], dtype=np.uint32)
    return np.random.SeedSequence([CALIBRATION_SEED, *(int(w) for w in words)])


def calibrate(
    *,
    parzen: ParzenScoreModel,
    terms: Sequence[TraitTerm],
    target_far: float,
    claims: int,
    weights: Mapping[str, float] | None = None,
    model_version: object = None,
    population: PopulationPrior | None = None,
) -> Calibration:
    """Choose the weights (unless given) and the threshold for claims observing ``terms``.

    Parameters
    ----------
    parzen : ParzenScoreModel
        Fitted on the face recogniser's validation scores.
    terms : sequence of TraitTerm
        The observed traits, in the order the module sums them.
    target_far : float
    claims : int
        Simulated claims of each kind, per simulation.
    weights : mapping, optional
        Fixed weights over ``"face"`` and the observed traits (summing to 1);
        chosen on a first simulation when not given.
    model_version : object
        Recorded in the result.
    population : PopulationPrior, optional
        The deployer's declared public population (default :data:`POPULATION`).
    """
    if not 0.0 < target_far < 1.0:
        raise ValueError(f"target_far: expected a number in (0, 1), received {target_far!r}")
    if not (isinstance(claims, int) and claims >= 100):
        raise ValueError(f"claims: expected an int >= 100, received {claims!r}")
    pop = population or PopulationPrior()
    names = [t.name for t in terms]
    noise = {t.name: t.noise for t in terms if t.noise is not None}
    choose_rng, threshold_rng = (np.random.default_rng(s) for s in _seed(names, noise).spawn(2))
    if weights is None:
        w = _choose_weights(*simulate_claims(parzen, terms, claims, choose_rng, pop), target_far)
    else:
        w = np.array([weights[FACE], *(weights[t] for t in names)], dtype=np.float64)
    genuine, impostor = simulate_claims(parzen, terms, claims, threshold_rng, pop)
    g_imp, g_gen = w @ impostor, w @ genuine
    thr = far_threshold(g_imp, target_far)
    return Calibration(
        threshold=thr,
        weights={FACE: float(w[0]), **{t: float(x) for t, x in zip(names, w[1:], strict=True)}},
        weights_chosen=weights is None,
        target_far=float(target_far),
        simulated_far=float(np.mean(g_imp >= thr)),
        simulated_gar=float(np.mean(g_gen >= thr)),
        claims=claims,
        observed=tuple(names),
        noise=noise,
        model_version=model_version,
        population=pop.describe(),
    )
