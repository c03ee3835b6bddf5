"""Noise samplers: distribution against OpenDP, floating-point safety, injection.

The OpenDP comparisons use two-sample Kolmogorov–Smirnov tests on the
signed noise and on its absolute value (the folded test is the one with power
against a wrong scale) at a fixed family-wise significance of 0.001:
Bonferroni over the 16 comparisons, so a correct sampler fails the file by
chance less than once in a thousand runs (OpenDP's side cannot be seeded).
``test_wrong_scale_is_rejected`` proves that a 5 % scale error is still caught
at these sample sizes and this threshold. Checks of our sampler alone use a
seeded byte source, so they are deterministic.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from peep.core import features
from peep.core.exceptions import UnsafeFeatureError
from peep.core.sampling import (
    GRID_BITS,
    NoiseSampler,
    SecureSampler,
    SeededSampler,
    check_random_state,
    gaussian_variance,
    grid_inflation_l1,
    grid_inflation_l2,
    laplace_variance,
    round_to_grid,
    secure_sampler,
)
from scipy import stats

ALPHA = 1e-3
SCALES = (0.05, 1.0, 8.0, 1e4)
# signed + folded, for two families, at each scale
KS_THRESHOLD = ALPHA / (2 * 2 * len(SCALES))
# OpenDP's exact samplers cost ~18 µs (Laplace) / ~40 µs (Gaussian) per draw.
# Against 10x as many of ours, the folded KS test detects a 5 % scale error
# with power > 0.9999 per case: expected D ≈ 0.018 (Laplace) vs a critical
# value ≈ 0.0098 at 60k, and D ≈ 0.024 (Gaussian) vs ≈ 0.012 at 40k.
N_OPENDP = {"laplace": 60_000, "gaussian": 40_000}


# --------------------------------------------------------------------------- OpenDP reference


def _opendp_noise(family: str, scale: float) -> np.ndarray:
    import opendp.prelude as dp  # a missing opendp is an error here, not a skip

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    if family == "laplace":
        meas = dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale)
    else:
        meas = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
    return np.asarray(meas([0.0] * N_OPENDP[family]), dtype=np.float64)


@pytest.fixture(scope="module")
def opendp_noise() -> dict[tuple[str, float], np.ndarray]:
    jobs = [(family, s) for family in ("laplace", "gaussian") for s in SCALES]
    # OpenDP's sampler releases the GIL (ctypes), so two threads halve the wait.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: _opendp_noise(*job), jobs))
    return dict(zip(jobs, results, strict=True))


def _ks_pvalues(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
    signed = stats.ks_2samp(ours, theirs).pvalue
    folded = stats.ks_2samp(np.abs(ours), np.abs(theirs)).pvalue
    return float(signed), float(folded)


def _ours(family: str, scale: float) -> np.ndarray:
    n = 10 * N_OPENDP[family]
    if family == "laplace":
        return secure_sampler.laplace(scale, n)
    return secure_sampler.gaussian(scale, n)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["laplace", "gaussian"])
@pytest.mark.parametrize("scale", SCALES)
def test_matches_opendp(opendp_noise, family, scale):
    theirs = opendp_noise[(family, scale)]
    signed, folded = _ks_pvalues(_ours(family, scale), theirs)
    assert signed > KS_THRESHOLD, f"{family} scale={scale}: signed KS p={signed:.2g}"
    assert folded > KS_THRESHOLD, f"{family} scale={scale}: folded KS p={folded:.2g}"


@pytest.mark.parametrize("family", ["laplace", "gaussian"])
@pytest.mark.parametrize("scale", SCALES)
def test_wrong_scale_is_rejected(opendp_noise, family, scale):
    """The comparison above has power: a sampler 5 % off in scale fails it."""
    theirs = opendp_noise[(family, scale)]
    signed, folded = _ks_pvalues(_ours(family, 1.05 * scale), theirs)
    assert min(signed, folded) < KS_THRESHOLD


# ------------------------------------------------------------- exact small-parameter checks


def _seeded_bytes(seed: int) -> SecureSampler:
    """The secure algorithm driven by reproducible bytes (test-only)."""
    return SecureSampler(random_bytes=np.random.default_rng(seed).bytes)


@pytest.mark.parametrize("t", [0.7, 2.5, 9.0])
def test_discrete_laplace_units_exact_pmf(t):
    """White-box: the geometric-difference construction has pmf ∝ exp(-|z|/t)."""
    z = _seeded_bytes(11)._discrete_laplace_units(t, 200_000).astype(np.int64)
    q = math.exp(-1.0 / t)
    support = np.arange(-int(8 * t) - 2, int(8 * t) + 3)
    pmf = (1 - q) / (1 + q) * q ** np.abs(support)
    observed = np.array([(z == v).sum() for v in support])
    expected = pmf * z.size
    keep = expected >= 20
    # Lump the tails so the chi-square sees the whole distribution.
    obs = np.append(observed[keep], z.size - observed[keep].sum())
    exp = np.append(expected[keep], z.size - expected[keep].sum())
    assert stats.chisquare(obs, exp).pvalue > ALPHA


@pytest.mark.parametrize("sigma", [0.8, 3.0, 10.0])
def test_discrete_gaussian_units_exact_pmf(sigma):
    """White-box: CKS rejection sampling has pmf ∝ exp(-y²/2σ²) even at small σ."""
    y = _seeded_bytes(12)._discrete_gaussian_units(sigma, 200_000).astype(np.int64)
    support = np.arange(-int(7 * sigma) - 2, int(7 * sigma) + 3)
    all_int = np.arange(-int(40 * sigma) - 10, int(40 * sigma) + 11)
    norm = np.exp(-(all_int**2) / (2 * sigma**2)).sum()
    pmf = np.exp(-(support**2) / (2 * sigma**2)) / norm
    observed = np.array([(y == v).sum() for v in support])
    expected = pmf * y.size
    keep = expected >= 20
    obs = np.append(observed[keep], y.size - observed[keep].sum())
    exp = np.append(expected[keep], y.size - expected[keep].sum())
    assert stats.chisquare(obs, exp).pvalue > ALPHA


def test_exponential_fast_path_is_standard_exponential():
    e = _seeded_bytes(13).exponential(300_000)
    assert e.min() >= 0
    assert stats.kstest(e, "expon").pvalue > ALPHA


def test_slow_path_is_the_exponential_tail():
    """Words < 2**53 must give E - 11·ln2 ~ Exp(1) (U uniform on [0, 2**-11))."""
    sampler = _seeded_bytes(14)
    n = 50_000
    w = np.frombuffer(np.random.default_rng(15).bytes(8 * n), dtype="<u8") >> np.uint64(11)
    e = np.zeros(n)
    sampler._slow_path(w, e, np.empty(0, dtype=np.uint64))
    assert stats.kstest(e - 11 * math.log(2), "expon").pvalue > ALPHA


def test_variance_helpers_match_samples():
    for scale in (1.0, 3.0):
        step = secure_sampler.grid_step(scale)
        noise = secure_sampler.laplace(scale, 400_000)
        assert noise.var() == pytest.approx(laplace_variance(scale, step), rel=0.03)
        assert laplace_variance(scale, step) == pytest.approx(2 * scale**2, rel=1e-9)
        g = secure_sampler.gaussian(scale, 400_000)
        assert g.var() == pytest.approx(gaussian_variance(scale, step), rel=0.02)
    assert laplace_variance(2.0, 0.0) == 8.0


# --------------------------------------------------------------------------- floating-point safety


@pytest.mark.parametrize("scale", [1e-3, 0.05, 1.0, 8.0, 1e4])
def test_grid_step_is_power_of_two_below_scale(scale):
    step = secure_sampler.grid_step(scale)
    mantissa, _ = math.frexp(step)
    assert mantissa == 0.5  # a power of two
    assert step <= scale * 2.0**-GRID_BITS < 2 * step


@pytest.mark.parametrize("scale", [1e-3, 0.05, 1.0, 8.0, 1e4])
def test_outputs_are_exact_grid_multiples(scale):
    """(a) For arbitrary float inputs every output is an exact multiple of γ."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(20_000) * 10.0 ** rng.uniform(-12, 3, 20_000)
    x[:4] = [0.1, 1 / 3, -math.pi, 5e-324]
    step = secure_sampler.grid_step(scale)
    for y in (secure_sampler.perturb_laplace(x, scale), secure_sampler.perturb_gaussian(x, scale)):
        units = y / step  # exact: step is a power of two
        assert np.array_equal(units, np.rint(units))
        assert np.all(np.abs(units) < 2.0**53)


@pytest.mark.parametrize(
    ("x0", "x1", "sensitivity"),
    [
        (0.0, 1.0, 1.0),
        (0.1, 0.1 + 0.7 * (1 - 1e-12), 0.7),
        (1 / 3, -2 / 3, 1.0),
        (1e-300, 1.0, 1.0),
    ],
)
def test_reachable_sets_do_not_reveal_the_input(x0, x1, sensitivity):
    """(b) Every observed output has positive probability under both neighbours,
    and the exact (closed-form) pmf ratio is within e^ε."""
    epsilon = 1.0
    scale = sensitivity / epsilon
    step = secure_sampler.grid_step(scale)
    scale = (sensitivity + grid_inflation_l1(step, 1)) / epsilon  # same grid (tiny change)
    assert secure_sampler.grid_step(scale) == step
    t = scale / step
    q = math.exp(-1.0 / t)
    log_norm = math.log((1 - q) / (1 + q))
    y = secure_sampler.perturb_laplace(np.full(100_000, x0), scale)
    n = y / step
    assert np.array_equal(n, np.rint(n))
    k0, k1 = np.rint(x0 / step), np.rint(x1 / step)
    logp0 = log_norm - np.abs(n - k0) / t
    logp1 = log_norm - np.abs(n - k1) / t
    assert np.all(np.isfinite(logp0)) and np.all(np.isfinite(logp1))
    assert np.all(np.exp(logp1) > 0)
    ratio = np.abs(logp0 - logp1)
    assert ratio.max() <= epsilon + 1e-12
    # ... and the bound is attained (the noise is not over-calibrated).
    assert ratio.max() >= epsilon * (1 - 1e-3)


class _Stream:
    """A byte source that yields ``prefix`` first, then OS randomness."""

    def __init__(self, prefix: bytes, tail: Callable[[int], bytes] = os.urandom) -> None:
        self.buffer = bytearray(prefix)
        self.tail = tail
        self.requested = 0

    def __call__(self, n: int) -> bytes:
        self.requested += n
        if len(self.buffer) < n:
            self.buffer += self.tail(n - len(self.buffer))
        out, self.buffer = bytes(self.buffer[:n]), self.buffer[n:]
        return out


def _words(*values: int) -> bytes:
    return np.array(values, dtype="<u8").tobytes()


@pytest.mark.parametrize("zero_words", [3, 200])
def test_support_is_unbounded(zero_words):
    """(c) A tiny uniform (many leading zero bits) reaches |Z| far beyond 53·ln2·t,
    the cap a 53-bit uniform would impose; the exponent is not limited to one word."""
    scale = 1.0
    # Layout for size 1: word 0 drives the added geometric, word 1 the
    # subtracted one (U = 1/2); then the slow path reads further zero words,
    # a word with 63 leading zeros, and a mantissa word.
    prefix = _words(0, 2**63) + _words(*([0] * (zero_words - 1))) + _words(1, 0)
    sampler = SecureSampler(random_bytes=_Stream(prefix))
    z = sampler.laplace(scale, 1)[0] / scale
    e_big = (64 * zero_words + 64) * math.log(2)
    assert z == pytest.approx(e_big - math.log(2), rel=1e-5)
    assert z > 3 * 53 * math.log(2)


def test_broken_source_is_refused_not_truncated():
    sampler = SecureSampler(random_bytes=lambda n: bytes(n))
    with pytest.raises(RuntimeError, match="broken"):
        sampler.laplace(1.0, 1)
    with pytest.raises(RuntimeError, match="random_bytes"):
        SecureSampler(random_bytes=lambda n: bytes(n - 1)).laplace(1.0, 4)


def _naive_candidates(x: float, y: float, scale: float, window: int) -> np.ndarray | None:
    """All outputs the naive sampler can produce from ``x`` with U near the one that
    would give ``y``; None if ``y`` is on the wrong side of ``x`` to say anything."""
    if y == x:
        return None
    sign = 1.0 if y > x else -1.0
    u = math.exp(-abs(y - x) / scale)
    k_centre = round(u * 2.0**53)
    k = np.arange(max(1, k_centre - window), min(2**53 - 1, k_centre + window) + 1)
    noise = -np.log(k.astype(np.float64) * 2.0**-53)
    return x + scale * (sign * noise)


def test_naive_float_laplace_leaks():
    """(d) Mironov 2012: with naive ``x + b·sign·(-ln U)``, U on a 2**-53 grid, outputs
    from x0 that x1 provably cannot produce exist (their reachable float sets differ)."""
    rng = np.random.default_rng(7)
    x0, x1, scale = 0.0, 0.1, 1.0
    k = rng.integers(1, 2**53, size=400)
    sign = np.where(rng.random(400) < 0.5, -1.0, 1.0)
    outputs = x0 + scale * (sign * -np.log(k.astype(np.float64) * 2.0**-53))
    unreachable = 0
    for y in outputs:
        own = _naive_candidates(x0, float(y), scale, 64)
        assert own is not None and np.any(own == y)  # the search finds the true U
        other = _naive_candidates(x1, float(y), scale, 64)
        if other is None or np.any(other == y):
            continue
        # The map k -> output is monotone, so bracketing y with no hit proves no
        # U at all gives y from x1.
        if other.min() < y < other.max():
            unreachable += 1
    assert unreachable > 0.1 * outputs.size


def test_secure_sampler_leaves_numpy_global_state_alone():
    # The legacy global generator is exactly what must stay untouched.
    before = np.random.get_state()  # noqa: NPY002
    secure_sampler.perturb_laplace(np.zeros(256), 1.0)
    secure_sampler.perturb_gaussian(np.zeros(256), 1.0)
    after = np.random.get_state()  # noqa: NPY002
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2:] == after[2:]


def test_all_randomness_comes_from_the_byte_source():
    seed = os.urandom(1 << 16)

    def run() -> tuple[np.ndarray, np.ndarray]:
        stream = _Stream(seed, tail=lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256))
        s = SecureSampler(random_bytes=stream)
        return s.perturb_laplace(np.arange(64.0), 2.0), s.perturb_gaussian(np.arange(64.0), 2.0)

    a, b = run(), run()
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_one_source_call_per_perturb():
    calls: list[int] = []

    def source(n: int) -> bytes:
        calls.append(n)
        return os.urandom(n)

    sampler = SecureSampler(random_bytes=source)
    for _ in range(50):
        sampler.perturb_laplace(np.zeros(128), 1.0)
    # One call each, plus a follow-up only when the slow path outgrows the reserve.
    assert 50 <= len(calls) <= 52


def test_perturb_rejects_non_finite_and_huge_inputs():
    with pytest.raises(ValueError, match="x: expected finite"):
        secure_sampler.perturb_laplace(np.array([0.0, np.nan]), 1.0)
    with pytest.raises(ValueError, match="x: expected finite"):
        secure_sampler.perturb_gaussian(np.array([np.inf]), 1.0)
    with pytest.raises(ValueError, match="x: expected finite"):
        secure_sampler.perturb_laplace(np.array([1e30]), 1.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="scale"):
            secure_sampler.perturb_laplace(np.zeros(2), bad)


def test_shapes_are_preserved():
    x = np.zeros((3, 5))
    assert secure_sampler.perturb_laplace(x, 1.0).shape == (3, 5)
    assert secure_sampler.perturb_gaussian(x, 1.0).shape == (3, 5)
    assert secure_sampler.laplace(1.0, 0).shape == (0,)
    assert secure_sampler.gaussian(1.0, 7).shape == (7,)


def test_secure_perturb_is_fast():
    """Loose guard against accidental Python loops (the target is ~25 µs median)."""
    x = np.random.default_rng(0).random(128)
    times = np.empty(2000)
    for i in range(times.size):
        t0 = time.perf_counter()
        secure_sampler.perturb_laplace(x, 0.125)
        times[i] = time.perf_counter() - t0
    assert np.median(times) < 200e-6


# --------------------------------------------------------------------------- helpers


def test_grid_helpers():
    assert round_to_grid([0.3, -1.74, 2.25], 0.5).tolist() == [0.5, -1.5, 2.0]
    assert round_to_grid([0.3], 0.0).tolist() == [0.3]
    assert grid_inflation_l1(0.25, 8) == 2.0
    assert grid_inflation_l2(0.25, 16) >= 1.0
    assert grid_inflation_l2(0.25, 16) == pytest.approx(1.0, rel=1e-15)
    assert grid_inflation_l2(0.0, 16) == 0.0
    with pytest.raises(ValueError, match="d"):
        grid_inflation_l1(0.25, 0)
    with pytest.raises(ValueError, match="step"):
        grid_inflation_l2(-1.0, 3)


# ------------------------------------------------------------- seeded and check_random_state


def test_seeded_sampler_requires_the_feature():
    with pytest.raises(UnsafeFeatureError, match="seeded-noise"):
        SeededSampler(0)
    with pytest.raises(UnsafeFeatureError):
        check_random_state(42)


def test_seeded_sampler_inside_the_feature():
    with features.enabled("seeded-noise"):
        a, b = SeededSampler(3), SeededSampler(np.random.default_rng(3))
    assert not a.is_secure and a.grid_step(1.0) == 0.0
    assert np.array_equal(a.laplace(1.0, 10), b.laplace(1.0, 10))
    assert a.perturb_gaussian(np.zeros((2, 3)), 1.0).shape == (2, 3)
    assert np.var(a.laplace(2.0, 200_000)) == pytest.approx(8.0, rel=0.05)


def test_check_random_state():
    assert check_random_state(None) is secure_sampler
    assert secure_sampler.is_secure
    mine = SecureSampler()
    assert check_random_state(mine) is mine
    assert isinstance(mine, NoiseSampler)
    with features.enabled("seeded-noise"):
        assert isinstance(check_random_state(1), SeededSampler)
        assert isinstance(check_random_state(np.int64(1)), SeededSampler)
        assert isinstance(check_random_state(np.random.default_rng(1)), SeededSampler)
        for bad in ("1", 1.5, True, np.random.RandomState(0)):
            with pytest.raises(TypeError, match="random_state"):
                check_random_state(bad)
