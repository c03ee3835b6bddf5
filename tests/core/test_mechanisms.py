"""Mechanisms: validation, stated guarantees, exact variances, clipping, DP checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.core import features
from peep.core.exceptions import PrivacyLeakWarning, UnsafeFeatureError
from peep.core.mechanisms import (
    MECHANISM_KINDS,
    GaussianL2Mechanism,
    GaussianMechanism,
    LaplaceL1Mechanism,
    LaplaceMechanism,
    LaplaceVectorMechanism,
    PeepMechanism,
    PeepRawMechanism,
    PrivacyGuarantee,
    TemplateMechanism,
    analytic_gaussian_sigma,
    bounds_from_data,
    classic_gaussian_sigma,
    make_mechanism,
    mechanism_class,
    mechanism_classes,
    mechanism_kinds,
)
from peep.core.sampling import grid_inflation_l1, grid_inflation_l2, secure_sampler
from scipy import stats
from scipy.special import log_ndtr

NC = 8
LOWER = -np.linspace(1.0, 4.0, NC)
UPPER = np.linspace(2.0, 5.0, NC)


def _build(kind: str, epsilon: float = 2.0, **kw: object) -> TemplateMechanism:
    params: dict[str, object] = {
        "epsilon": epsilon,
        "delta": 1e-5,
        "n_components": NC,
        "lower": LOWER,
        "upper": UPPER,
        "radius_l2": 3.0,
        "radius_l1": 6.0,
    }
    params.update(kw)
    return make_mechanism(kind, **params)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- validation

SCALAR_FACTORIES = {
    "laplace": lambda **kw: LaplaceMechanism(**{"epsilon": 1.0, "sensitivity": 1.0, **kw}),
    "gaussian": lambda **kw: GaussianMechanism(**{"epsilon": 1.0, "delta": 1e-5, "sensitivity": 1.0, **kw}),
}
TEMPLATE_FACTORIES = {
    "peep": lambda **kw: PeepMechanism(**{"epsilon": 1.0, "n_components": NC, **kw}),
    "peep-raw": lambda **kw: PeepRawMechanism(**{"epsilon": 1.0, "lower": LOWER, "upper": UPPER, **kw}),
    "laplace-vector": lambda **kw: LaplaceVectorMechanism(**{"epsilon": 1.0, "n_components": NC, **kw}),
    "gaussian-l2": lambda **kw: GaussianL2Mechanism(
        **{"epsilon": 1.0, "delta": 1e-5, "radius": 2.0, "n_components": NC, **kw}
    ),
    "laplace-l1": lambda **kw: LaplaceL1Mechanism(**{"epsilon": 1.0, "radius": 2.0, "n_components": NC, **kw}),
}
ALL_FACTORIES = {**SCALAR_FACTORIES, **TEMPLATE_FACTORIES}
WITH_DELTA = ("gaussian", "gaussian-l2")


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_epsilon_out_of_range(name, bad):
    with pytest.raises(ValueError, match="epsilon"):
        ALL_FACTORIES[name](epsilon=bad)


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
@pytest.mark.parametrize("bad", ["1", None, [1.0], True])
def test_epsilon_wrong_type(name, bad):
    with pytest.raises(TypeError, match="epsilon"):
        ALL_FACTORIES[name](epsilon=bad)


@pytest.mark.parametrize("name", WITH_DELTA)
@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_delta_out_of_range(name, bad):
    with pytest.raises(ValueError, match="delta"):
        ALL_FACTORIES[name](delta=bad)


@pytest.mark.parametrize("name", WITH_DELTA)
def test_delta_wrong_type(name):
    with pytest.raises(TypeError, match="delta"):
        ALL_FACTORIES[name](delta="1e-5")


@pytest.mark.parametrize("name", sorted(SCALAR_FACTORIES))
@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf])
def test_sensitivity_out_of_range(name, bad):
    with pytest.raises(ValueError, match="sensitivity"):
        SCALAR_FACTORIES[name](sensitivity=bad)


@pytest.mark.parametrize("name", ["peep", "laplace-vector", "gaussian-l2", "laplace-l1"])
def test_n_components_validated(name):
    with pytest.raises(ValueError, match="n_components"):
        TEMPLATE_FACTORIES[name](n_components=0)
    with pytest.raises(TypeError, match="n_components"):
        TEMPLATE_FACTORIES[name](n_components=2.5)


@pytest.mark.parametrize("name", ["gaussian-l2", "laplace-l1"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_radius_validated(name, bad):
    with pytest.raises(ValueError, match="radius"):
        TEMPLATE_FACTORIES[name](radius=bad)


def test_peep_raw_bounds_validated():
    with pytest.raises(ValueError, match="upper"):
        PeepRawMechanism(epsilon=1.0, lower=[0.0, 1.0], upper=[1.0, 0.5])
    with pytest.raises(ValueError, match="upper"):
        PeepRawMechanism(epsilon=1.0, lower=[0.0, 1.0], upper=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="lower"):
        PeepRawMechanism(epsilon=1.0, lower=[0.0, np.nan], upper=[1.0, 2.0])


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
def test_random_state_wrong_type(name):
    with pytest.raises(TypeError, match="random_state"):
        ALL_FACTORIES[name](random_state="seed")


def test_keyword_only():
    with pytest.raises(TypeError):
        LaplaceMechanism(1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        PeepMechanism(1.0, 8)  # type: ignore[misc]


def test_too_small_epsilon_for_the_grid_is_refused():
    with pytest.raises(ValueError, match="epsilon"):
        LaplaceVectorMechanism(epsilon=1e-9, n_components=128)


def test_make_mechanism_errors():
    with pytest.raises(ValueError, match=", ".join(MECHANISM_KINDS)):
        make_mechanism("laplace", epsilon=1.0, n_components=NC)
    with pytest.raises(ValueError, match="lower"):
        make_mechanism("peep-raw", epsilon=1.0, n_components=NC)
    with pytest.raises(ValueError, match="delta"):
        make_mechanism("gaussian-l2", epsilon=1.0, n_components=NC, radius_l2=1.0)
    with pytest.raises(ValueError, match="radius_l2"):
        make_mechanism("gaussian-l2", epsilon=1.0, delta=1e-5, n_components=NC)
    with pytest.raises(ValueError, match="radius_l1"):
        make_mechanism("laplace-l1", epsilon=1.0, n_components=NC)
    with pytest.raises(ValueError, match="n_components"):
        make_mechanism("peep-raw", epsilon=1.0, n_components=NC + 1, lower=LOWER, upper=UPPER)
    with pytest.raises(TypeError, match="kind"):
        make_mechanism(3, epsilon=1.0, n_components=NC)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("peep", PeepMechanism),
        ("peep-raw", PeepRawMechanism),
        ("laplace-vector", LaplaceVectorMechanism),
        ("gaussian-l2", GaussianL2Mechanism),
        ("laplace-l1", LaplaceL1Mechanism),
    ],
)
def test_make_mechanism_kinds(kind, cls):
    m = _build(kind)
    assert type(m) is cls and m.kind == kind and kind in MECHANISM_KINDS
    assert m.n_components == NC
    assert m.variance.shape == (NC,)
    assert m.noise_std == pytest.approx(math.sqrt(m.variance.mean()))
    assert m.is_secure
    assert kind in repr(m)


def test_mechanism_kinds_come_from_the_registry():
    assert set(MECHANISM_KINDS) >= {"peep", "peep-raw", "laplace-vector", "gaussian-l2", "laplace-l1"}
    assert MECHANISM_KINDS == mechanism_kinds() == tuple(mechanism_classes())
    assert all(mechanism_class(k).kind == k for k in MECHANISM_KINDS)


# --------------------------------------------------------------------------- guarantees


def test_peep_guarantee():
    g = PeepMechanism(epsilon=8, n_components=128).guarantee
    numbers = (g.epsilon_coordinate, g.epsilon_vector, g.delta, g.n_components)
    assert numbers == (8.0, 1024.0, 0.0, 128)
    assert str(g) == "ε=8 per coordinate, ε=1024 per vector (nc=128)"


def test_peep_raw_honest_guarantee():
    eps = 0.5
    m = PeepRawMechanism(epsilon=eps, lower=LOWER, upper=UPPER)
    width = UPPER - LOWER
    assert m.scale == 1 / eps  # the paper's reading: sensitivity not scaled
    np.testing.assert_allclose(m.epsilon_per_coordinate, eps * width, rtol=1e-5)
    assert m.epsilon_per_coordinate.min() > 0
    assert np.all(m.epsilon_per_coordinate >= eps * width)  # grid inflation only adds
    assert m.guarantee.epsilon_coordinate == pytest.approx(eps * width.max(), rel=1e-5)
    assert m.guarantee.epsilon_vector == pytest.approx(eps * width.sum(), rel=1e-5)
    with features.enabled("seeded-noise"):
        seeded = PeepRawMechanism(epsilon=eps, lower=LOWER, upper=UPPER, random_state=0)
    np.testing.assert_array_equal(seeded.epsilon_per_coordinate, eps * width)
    assert seeded.guarantee.epsilon_vector == pytest.approx(eps * width.sum(), rel=1e-15)


def test_laplace_vector_guarantee():
    g = LaplaceVectorMechanism(epsilon=4.0, n_components=128).guarantee
    assert g.epsilon_vector == 4.0
    assert g.epsilon_coordinate == 4.0 / 128


def test_gaussian_l2_guarantee():
    g = GaussianL2Mechanism(epsilon=2.0, delta=1e-6, radius=3.0, n_components=40).guarantee
    assert (g.epsilon_coordinate, g.epsilon_vector, g.delta) == (2.0, 2.0, 1e-6)
    assert str(g) == "ε=2 per coordinate, ε=2 per vector (nc=40), δ=1e-06"


def test_laplace_l1_guarantee():
    g = LaplaceL1Mechanism(epsilon=1024.0, radius=5.0, n_components=40).guarantee
    assert g.epsilon_vector == 1024.0
    assert g.epsilon_coordinate <= 1024.0
    assert g.epsilon_coordinate == pytest.approx(1024.0, rel=1e-3)


def test_guarantee_is_frozen_and_keyword_only():
    g = PrivacyGuarantee(epsilon_coordinate=1.0, epsilon_vector=2.0, n_components=2, description="x")
    with pytest.raises(AttributeError):
        g.epsilon_vector = 3.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        PrivacyGuarantee(1.0, 2.0, 0.0, 2, "x")  # type: ignore[misc]


def test_grid_inflation_is_accounted_for():
    """With the secure grid the calibrated scale covers sensitivity + grid inflation."""
    eps = 3.0
    m = PeepMechanism(epsilon=eps, n_components=NC)
    step = secure_sampler.grid_step(m.scale)
    assert step == m.grid_step > 0
    assert m.scale * eps >= 1.0 + grid_inflation_l1(step, 1)
    assert m.scale == pytest.approx(1 / eps, rel=1e-5)

    v = LaplaceVectorMechanism(epsilon=eps, n_components=NC)
    assert v.scale * eps >= NC + grid_inflation_l1(secure_sampler.grid_step(v.scale), NC)

    l1 = LaplaceL1Mechanism(epsilon=eps, radius=2.0, n_components=NC)
    assert l1.scale * eps >= 4.0 + grid_inflation_l1(secure_sampler.grid_step(l1.scale), NC)

    g = GaussianL2Mechanism(epsilon=eps, delta=1e-5, radius=2.0, n_components=NC)
    needed = analytic_gaussian_sigma(eps, 1e-5, 4.0 + grid_inflation_l2(g.grid_step, NC))
    assert g.sigma >= needed * (1 - 1e-12)
    assert g.grid_step == secure_sampler.grid_step(g.sigma)

    lap = LaplaceMechanism(epsilon=eps, sensitivity=2.0)
    assert lap.scale * eps >= 2.0 + lap.grid_step
    with features.enabled("seeded-noise"):
        seeded = LaplaceMechanism(epsilon=eps, sensitivity=2.0, random_state=1)
    assert seeded.scale == 2.0 / eps and seeded.grid_step == 0.0


# --------------------------------------------------------------------------- variance and clipping


@pytest.mark.parametrize("kind", MECHANISM_KINDS)
def test_empirical_variance_matches(kind):
    m = _build(kind, epsilon=4.0)
    centre = {
        "peep": np.full(NC, 0.5),
        "laplace-vector": np.full(NC, 0.5),
        "peep-raw": (LOWER + UPPER) / 2,
    }.get(kind, np.zeros(NC))
    out = m.release(np.tile(centre, (25_000, 1)))
    emp = out.var(axis=0).mean()
    assert emp == pytest.approx(float(m.variance.mean()), rel=0.04)
    # Unbiased for the input as the mechanism sees it (the unit-sphere kinds map 0 to a fixed direction).
    expected = m.clip(centre)
    assert np.abs(out.mean(axis=0) - expected).max() < 6 * m.noise_std / math.sqrt(25_000)


def test_scalar_variances():
    lap = LaplaceMechanism(epsilon=0.5, sensitivity=1.0)
    t = lap.scale / lap.grid_step
    q = math.exp(-1 / t)
    assert lap.variance == pytest.approx(2 * q / (1 - q) ** 2 * lap.grid_step**2, rel=1e-9)
    assert lap.variance == pytest.approx(2 * lap.scale**2, rel=1e-9)
    assert np.var(lap.randomise(np.zeros(300_000))) == pytest.approx(lap.variance, rel=0.04)
    gauss = GaussianMechanism(epsilon=0.5, delta=1e-5, sensitivity=1.0)
    assert gauss.variance == gauss.sigma**2
    assert np.var(gauss.randomise(np.zeros(300_000))) == pytest.approx(gauss.variance, rel=0.02)
    with features.enabled("seeded-noise"):
        seeded = LaplaceMechanism(epsilon=0.5, sensitivity=1.0, random_state=3)
    assert seeded.variance == 2 * seeded.scale**2 == 8.0


def test_randomise_types():
    lap = LaplaceMechanism(epsilon=1.0)
    assert isinstance(lap.randomise(0.5), float)
    assert isinstance(lap.randomise(np.float32(0.5)), float)
    assert lap.randomise(np.zeros((2, 3))).shape == (2, 3)
    with pytest.raises(ValueError, match="x"):
        lap.randomise(math.nan)
    with pytest.raises(ValueError, match="x"):
        lap.randomise(np.array([0.0, math.inf]))
    gauss = GaussianMechanism(epsilon=1.0, delta=1e-5, sensitivity=1.0)
    assert isinstance(gauss.randomise(2), float)


HUGE = 1e6


@pytest.mark.parametrize(
    ("kind", "raw", "expected"),
    [
        ("peep", np.full(NC, HUGE), np.ones(NC)),
        ("peep", np.full(NC, -HUGE), np.zeros(NC)),
        ("laplace-vector", np.full(NC, HUGE), np.ones(NC)),
        ("peep-raw", np.full(NC, HUGE), UPPER),
        ("peep-raw", np.full(NC, -HUGE), LOWER),
        ("gaussian-l2", np.eye(NC)[0] * HUGE, np.eye(NC)[0] * 3.0),
        ("laplace-l1", np.eye(NC)[1] * -HUGE, np.eye(NC)[1] * -6.0),
    ],
)
def test_release_clips_whatever_the_caller_passes(kind, raw, expected):
    m = _build(kind, epsilon=8.0)
    np.testing.assert_allclose(m.clip(raw), expected, rtol=1e-9, atol=1e-12)
    out = m.release(np.tile(raw, (20_000, 1)))
    assert np.abs(out.mean(axis=0) - expected).max() < 6 * m.noise_std / math.sqrt(20_000)


def test_ball_clipping_never_exceeds_the_radius():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 64)) * rng.uniform(0.1, 1e4, (2000, 1))
    l2 = GaussianL2Mechanism(epsilon=1.0, delta=1e-5, radius=3.0, n_components=64)
    l1 = LaplaceL1Mechanism(epsilon=1.0, radius=7.0, n_components=64)
    assert np.linalg.norm(l2.clip(X), axis=1).max() <= 3.0
    assert np.abs(l1.clip(X)).sum(axis=1).max() <= 7.0
    small = X[:1] / np.linalg.norm(X[:1]) * 0.5
    np.testing.assert_array_equal(l2.clip(small), small)  # inside the ball: untouched
    np.testing.assert_array_equal(l2.clip(np.zeros((1, 64))), np.zeros((1, 64)))


@pytest.mark.parametrize("kind", MECHANISM_KINDS)
def test_release_shapes_grid_and_validation(kind):
    m = _build(kind)
    one = m.release(np.zeros(NC))
    assert one.shape == (NC,) and one.dtype == np.float64
    assert m.release(np.zeros((3, NC))).shape == (3, NC)
    units = one / m.grid_step
    assert np.array_equal(units, np.rint(units))  # secure output lies on the grid
    with pytest.raises(ValueError, match="X"):
        m.release(np.zeros(NC + 1))
    with pytest.raises(ValueError, match="X"):
        m.release(np.full(NC, np.nan))
    with pytest.raises(ValueError, match="X"):
        m.release(np.zeros((2, 2, NC)))


# --------------------------------------------------------------------------- Gaussian calibration


def _delta_linear(sigma: float, epsilon: float, sensitivity: float) -> float:
    a = sensitivity / (2 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2 * sigma) - epsilon * sigma / sensitivity
    return float(stats.norm.cdf(a) - math.exp(epsilon) * stats.norm.cdf(b))


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_analytic_beats_classic_below_one(epsilon, delta):
    analytic = analytic_gaussian_sigma(epsilon, delta, 2.0)
    assert analytic < classic_gaussian_sigma(epsilon, delta, 2.0)


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1.0, 4.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_analytic_sigma_satisfies_delta_tightly(epsilon, delta):
    sensitivity = 3.0
    sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    assert _delta_linear(sigma, epsilon, sensitivity) <= delta * (1 + 1e-9)
    assert _delta_linear(sigma * (1 - 1e-6), epsilon, sensitivity) > delta


@pytest.mark.parametrize("epsilon", [50.0, 1e3, 1e4])
def test_analytic_sigma_large_epsilon(epsilon):
    """ε up to 1e4 works (log space); recomputed here with scipy's normal logcdf."""
    delta = 1e-5
    sigma = analytic_gaussian_sigma(epsilon, delta, 1.0)
    assert math.isfinite(sigma) and sigma > 0

    def log_delta(s: float) -> float:
        a, b = 1 / (2 * s) - epsilon * s, -1 / (2 * s) - epsilon * s
        la, lb = float(stats.norm.logcdf(a)), float(stats.norm.logcdf(b))
        return la + math.log(-math.expm1(epsilon + lb - la))

    assert log_delta(sigma) <= math.log(delta) + 1e-9
    assert log_delta(sigma * (1 - 1e-6)) > math.log(delta)
    assert float(log_ndtr(-1.0)) < 0  # scipy.special available for the check above
    assert analytic_gaussian_sigma(epsilon, delta, 1.0) < analytic_gaussian_sigma(epsilon / 2, delta, 1.0)


def test_analytic_sigma_is_linear_in_sensitivity():
    assert analytic_gaussian_sigma(1.0, 1e-5, 5.0) == pytest.approx(
        5 * analytic_gaussian_sigma(1.0, 1e-5, 1.0), rel=1e-12
    )


def test_classic_sigma_only_below_one():
    assert classic_gaussian_sigma(0.5, 1e-5, 1.0) == pytest.approx(math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5)
    with pytest.raises(ValueError, match="epsilon"):
        classic_gaussian_sigma(1.0, 1e-5, 1.0)
    with pytest.raises(ValueError, match="delta"):
        analytic_gaussian_sigma(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        analytic_gaussian_sigma(1.0, 1e-5, -1.0)


# --------------------------------------------------------------------------- statistical DP check


def test_laplace_neighbour_ratio_within_e_epsilon():
    """Histogram of outputs for neighbouring inputs: ratio <= e^ε (+ sampling slack),
    and attained in the tails (the mechanism is not over-noised)."""
    epsilon, n = 1.0, 400_000
    mech = LaplaceMechanism(epsilon=epsilon, sensitivity=1.0)
    y0 = mech.randomise(np.zeros(n))
    y1 = mech.randomise(np.ones(n))
    edges = np.arange(-6.0, 7.01, 0.5)
    h0, _ = np.histogram(y0, edges)
    h1, _ = np.histogram(y1, edges)
    enough = (h0 >= 2000) & (h1 >= 2000)
    assert enough.sum() >= 10
    ratio = np.maximum(h0[enough] / h1[enough], h1[enough] / h0[enough])
    # relative s.d. of a count ratio is ≈ sqrt(1/h0 + 1/h1) <= 0.032; allow 5 s.d.
    slack = 5 * np.sqrt(1 / h0[enough] + 1 / h1[enough])
    assert np.all(ratio <= math.exp(epsilon) * (1 + slack))
    assert ratio.max() >= math.exp(epsilon) * 0.85


# --------------------------------------------------------------------------- randomness policy


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
def test_secure_by_default(name):
    assert ALL_FACTORIES[name]().is_secure


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
def test_seeded_refused_without_the_feature(name):
    with pytest.raises(UnsafeFeatureError, match="seeded-noise"):
        ALL_FACTORIES[name](random_state=0)


@pytest.mark.parametrize("kind", MECHANISM_KINDS)
def test_seeded_inside_the_feature_is_reproducible(kind):
    with features.enabled("seeded-noise"):
        a = _build(kind, random_state=5)
        b = _build(kind, random_state=5)
    assert not a.is_secure and a.grid_step == 0.0
    x = np.full((4, NC), 0.25)
    np.testing.assert_array_equal(a.release(x), b.release(x))


def test_bounds_from_data_warns():
    X = np.array([[0.0, 5.0], [2.0, -1.0], [1.0, 3.0]])
    with pytest.warns(PrivacyLeakWarning, match="public bounds"):
        lo, hi = bounds_from_data(X)
    np.testing.assert_array_equal(lo, [0.0, -1.0])
    np.testing.assert_array_equal(hi, [2.0, 5.0])


# --------------------------------------------------------------------------- the declared contract


@pytest.mark.parametrize("kind", MECHANISM_KINDS)
def test_plausible_range_is_the_domain_widened_by_the_noise(kind):
    m = _build(kind)
    lo, hi = m.domain_box()
    assert lo.shape == hi.shape == (NC,) and np.all(lo < hi)
    clipped = m.clip(np.random.default_rng(0).normal(scale=50.0, size=(200, NC)))
    assert np.all(clipped >= lo - 1e-12) and np.all(clipped <= hi + 1e-12)
    plo, phi = m.plausible_range(40.0)
    assert np.all(plo <= lo) and np.all(phi >= hi)
    released = m.release(np.random.default_rng(1).normal(scale=50.0, size=(2000, NC)))
    assert np.all(released >= plo) and np.all(released <= phi)
    if type(m).plausible_range is TemplateMechanism.plausible_range:
        np.testing.assert_allclose(plo, lo - 40.0 * m.noise_std)
        np.testing.assert_allclose(phi, hi + 40.0 * m.noise_std)


@pytest.mark.parametrize("kind", MECHANISM_KINDS)
def test_epsilon_for_vector_gives_that_per_vector_guarantee(kind):
    from peep.core.bounding import BundleBounds

    bounds = BundleBounds(lower=LOWER, upper=UPPER, radius_l2=3.0, radius_l1=7.0)
    cls = mechanism_class(kind)
    eps = cls.epsilon_for_vector(bounds, 64.0, delta=1e-5)
    m = cls.from_bounds(bounds, epsilon=eps, delta=1e-5)
    assert m.guarantee.epsilon_vector == pytest.approx(64.0, rel=1e-6)
    assert (cls.epsilon_scope == "vector") == (eps == 64.0)


# --------------------------------------------------------------------------- randomized response


def test_randomized_response_keeps_the_bit_with_the_stated_probability():
    from peep.core.mechanisms import RandomizedResponse

    rr = RandomizedResponse(epsilon=1.0)
    assert rr.is_secure and rr.p_keep == pytest.approx(math.e / (1 + math.e))
    n = 20_000
    kept = sum(rr.randomise(1) for _ in range(n)) / n
    assert abs(kept - rr.p_keep) < 4 * math.sqrt(rr.p_keep * (1 - rr.p_keep) / n)
    flipped = sum(rr.randomise(0) for _ in range(n)) / n
    assert abs(flipped - (1 - rr.p_keep)) < 4 * math.sqrt(rr.p_keep * (1 - rr.p_keep) / n)
    with pytest.raises(ValueError, match="bit: expected 0 or 1"):
        rr.randomise(2)
    with pytest.raises(ValueError, match="epsilon"):
        RandomizedResponse(epsilon=0.0)
    with pytest.raises(UnsafeFeatureError, match="seeded-noise"):
        RandomizedResponse(epsilon=1.0, random_state=0)


def test_secure_bernoulli_rounds_the_probability_down_never_up():
    from peep.core.sampling import SecureSampler

    # Words just below and at the 53-bit threshold of p = 0.5 decide the coin exactly.
    below = (np.uint64(2**52 - 1) << np.uint64(11)).tobytes()
    at = (np.uint64(2**52) << np.uint64(11)).tobytes()
    s = SecureSampler(random_bytes=lambda n: (below + at)[:n] if n == 16 else below[:n])
    assert s.bernoulli(0.5, 2).tolist() == [True, False]
    assert not SecureSampler().bernoulli(0.0, 1000).any() and SecureSampler().bernoulli(1.0, 1000).all()
    with pytest.raises(ValueError, match="p: expected <= 1"):
        SecureSampler().bernoulli(1.5, 1)


@pytest.mark.parametrize("d", [8, 64])
def test_the_vector_cap_is_the_per_vector_epsilon_a_device_configured(d):
    # A per-coordinate ε: the cap is the guarantee's sum over coordinates (peep-raw's scale 1/ε on a width-2
    # interval is 2ε per coordinate, and a hair more for the sampler's grid), never the ε asked for.
    raw = make_mechanism("peep-raw", epsilon=0.5, n_components=d, lower=-np.ones(d), upper=np.ones(d))
    assert raw.epsilon_scope == "coordinate"
    assert raw.epsilon_vector_cap == raw.guarantee.epsilon_vector == pytest.approx(d * 2 * 0.5, rel=1e-5)
    # A per-vector ε: PrivUnit's calibrated guarantee sits under the ε asked for, which stays the cap.
    pu = make_mechanism("privunit", epsilon=8.0, n_components=d)
    assert pu.guarantee.epsilon_vector <= 8.0 and pu.epsilon_vector_cap == 8.0


def test_a_device_releaser_refuses_a_sampler_that_is_not_secure(bundle, monkeypatch):
    from peep.core import release

    assert release.secure_releaser(bundle, kind="privunit", epsilon=8.0).mechanism.is_secure
    real = release.TemplateReleaser.__init__

    def seeded_by_default(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.mechanism.is_secure = False

    monkeypatch.setattr(release.TemplateReleaser, "__init__", seeded_by_default)
    with pytest.raises(RuntimeError, match="not on the secure sampler"):
        release.secure_releaser(bundle, kind="privunit", epsilon=8.0)
