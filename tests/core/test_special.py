"""peep.core.special against scipy.special: the accuracy the mechanisms' floating-point argument needs,
over the parameters they use (α = (d − 1)/2 for d up to 2048, cap masses down to e^−500)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.core import special
from scipy import special as ref

ALPHAS = [0.5, 1.0, 1.5, 3.5, 7.5, 8.0, 11.5, 15.5, 63.5, 200.0, 1023.5]


def _rel(got: float, want: float) -> float:
    return abs(got - want) / abs(want)


@pytest.mark.parametrize("a", ALPHAS)
def test_incomplete_beta_matches_scipy(a):
    xs = np.concatenate([np.linspace(0.001, 0.999, 199), 10.0 ** -np.arange(1, 12), [0.5, 0.5 - 1e-9, 0.5 + 1e-9]])
    for b in (a, 2.0, 0.7):
        for x in map(float, xs):
            want = float(ref.betainc(a, b, x))
            if want < 1e-290:  # below that scipy's own value has lost digits (subnormal)
                continue
            # The mechanisms use a = b (1e-12); the far tails of lopsided ones lose a little more.
            tol = 1e-12 if b == a else 1e-11
            assert _rel(special.betainc(a, b, x), want) < tol, (a, b, x)
            assert special.log_betainc(a, b, x) == pytest.approx(math.log(want), rel=tol, abs=tol)
    assert special.betaln(a, a) == pytest.approx(float(ref.betaln(a, a)), rel=1e-14)


@pytest.mark.parametrize("a", ALPHAS)
def test_inverse_incomplete_beta_inverts_it(a):
    ys = np.concatenate([10.0 ** -np.arange(1.0, 300.0, 3.3), np.linspace(0.001, 0.999, 199), [0.5]])
    got = special.betaincinv(a, a, ys)  # the vectorised path
    for y, x in zip(map(float, ys), got, strict=True):
        assert special.betaincinv(a, a, y) == pytest.approx(x, rel=1e-15)  # the scalar path agrees
        if 1e-300 < x < 1.0:
            assert _rel(special.betainc(a, a, float(x)), y) < 1e-12, (a, y)
        want = float(ref.betaincinv(a, a, y))
        if _rel(float(ref.betainc(a, a, want)), y) < 1e-12:  # where scipy's answer holds
            assert _rel(float(x), want) < 1e-12, (a, y)
    assert special.betaincinv(a, a, 0.0) == 0.0 and special.betaincinv(a, a, 1.0) == 1.0


def test_normal_functions_match_scipy():
    for x in map(float, np.linspace(-37.0, 8.0, 2000)):
        assert _rel(special.ndtr(x), float(ref.ndtr(x))) < 1e-12, x
    for x in map(float, np.concatenate([np.linspace(-100.0, 30.0, 3000), [-20.0, -19.99999, -20.00001, 0.0]])):
        assert special.log_ndtr(x) == pytest.approx(float(ref.log_ndtr(x)), rel=1e-12, abs=1e-300), x
    ps = np.concatenate(
        [10.0 ** -np.arange(1.0, 300.0, 0.7), np.linspace(1e-4, 1 - 1e-4, 2001), 1 - 10.0 ** -np.arange(1, 16)]
    )
    got = special.ndtri(ps)
    np.testing.assert_allclose(got, ref.ndtri(ps), rtol=1e-14)
    np.testing.assert_array_equal(got[:10], [special.ndtri(float(p)) for p in ps[:10]])
    assert special.ndtri(0.0) == -math.inf and special.ndtri(1.0) == math.inf


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_probabilities_outside_0_1_are_refused(bad):
    with pytest.raises(ValueError, match="expected a probability"):
        special.betaincinv(2.0, 2.0, bad)
    with pytest.raises(ValueError, match="expected probabilities"):
        special.ndtri(np.full(32, bad))


# -- the mechanisms: the same calibration and the same draws as with scipy.special ---------------------------


class _ScipySpecial:
    """peep.core.special's interface on scipy.special (what privunit.py and calibration.py called before)."""

    @staticmethod
    def log_betainc(a: float, b: float, x: float) -> float:
        v = float(ref.betainc(a, b, x))
        return math.log(v) if v > 0.0 else -math.inf

    betainc = staticmethod(lambda a, b, x: float(ref.betainc(a, b, x)))
    betaln = staticmethod(lambda a, b: float(ref.betaln(a, b)))
    ndtr = staticmethod(lambda x: float(ref.ndtr(x)))
    log_ndtr = staticmethod(lambda x: float(ref.log_ndtr(x)))

    @staticmethod
    def betaincinv(a, b, y):
        return ref.betaincinv(a, b, y) if isinstance(y, np.ndarray) else float(ref.betaincinv(a, b, y))

    @staticmethod
    def ndtri(p):
        return ref.ndtri(p) if isinstance(p, np.ndarray) else float(ref.ndtri(p))


@pytest.fixture
def with_scipy(monkeypatch):
    """A context switch: inside ``with with_scipy():`` the mechanisms use scipy.special."""
    from contextlib import contextmanager

    from peep.core.mechanisms import calibration, privunit

    @contextmanager
    def switch():
        with monkeypatch.context() as m:
            m.setattr(privunit, "special", _ScipySpecial)
            m.setattr(calibration, "log_ndtr", _ScipySpecial.log_ndtr)
            yield

    return switch


DIMS = [2, 3, 8, 32, 128, 512, 2048]
EPSILONS = [0.5, 2.0, 8.0, 32.0, 128.0, 500.0]


@pytest.mark.parametrize("family", ["privunit", "privunitg"])
def test_privunit_calibration_is_scipys(family, with_scipy):
    """At any γ, log q, p and log m (ε's two parts and the unbiasing factor) are scipy's to 1e-11; the optimised
    γ is the argmax of a flat objective (rounding moves it by ~1e-7 either way), the variance there is scipy's."""
    from peep.core.mechanisms import privunit as pu

    def at(gamma: float, eps: float, d: int) -> tuple[float, float, float]:
        lq = pu._log_cap_fraction(gamma, d) if family == "privunit" else pu._log_tail(gamma)
        p = pu._p_for(eps - pu._cap_epsilon(lq))
        lm = pu._log_m_privunit(gamma, p, lq, d) if family == "privunit" else pu._log_m_privunitg(gamma, p, lq)
        return lq, p, lm

    solve = pu.privunit_parameters if family == "privunit" else pu.privunitg_parameters
    for d in DIMS:
        for eps in EPSILONS:
            gamma, _, _, m = solve(eps, d)
            with with_scipy():
                gamma_s, _, _, m_s = solve(eps, d)
            assert gamma == pytest.approx(gamma_s, rel=1e-5), (d, eps)
            if family == "privunit":
                assert 1.0 / m**2 == pytest.approx(1.0 / m_s**2, rel=1e-10), (d, eps)  # E‖Z/m‖²
            else:
                assert (d + gamma * m) / m**2 == pytest.approx((d + gamma_s * m_s) / m_s**2, rel=1e-10), (d, eps)
            for g in (0.25 * gamma, gamma, gamma_s):
                ours = at(g, eps, d)
                with with_scipy():
                    theirs = at(g, eps, d)
                # log q: absolute (it is ε's second part); log m: absolute, i.e. relative in m
                assert ours[0] == pytest.approx(theirs[0], rel=1e-11, abs=1e-11), (d, eps, g)
                assert ours[1] == pytest.approx(theirs[1], rel=1e-11), (d, eps, g)
                assert ours[2] == pytest.approx(theirs[2], rel=1e-11, abs=1e-11), (d, eps, g)


def test_analytic_gaussian_sigma_is_scipys(with_scipy):
    from peep.core.mechanisms.calibration import analytic_gaussian_sigma

    for eps in (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0):
        for delta in (1e-3, 1e-6, 1e-12):
            ours = analytic_gaussian_sigma(eps, delta, 1.0)
            with with_scipy():
                assert ours == pytest.approx(analytic_gaussian_sigma(eps, delta, 1.0), rel=1e-12), (eps, delta)


@pytest.mark.parametrize("kind", ["privunit", "privunit-g"])
@pytest.mark.parametrize("d", [2, 8, 32, 128, 1024])
def test_privunit_draws_are_scipys(kind, d, with_scipy):
    """The same mechanism and seed give the same releases (to rounding) with special.* as with scipy's:
    one at a time (the device's path) and in a batch, at moderate and at high ε (a cap of mass e^−ε)."""
    from peep.core import features
    from peep.core.mechanisms import make_mechanism

    x = np.random.default_rng(d).normal(size=d)
    x /= np.linalg.norm(x)
    with features.enabled("seeded-noise"):
        for eps in (2.0, 16.0, 300.0):
            mech = make_mechanism(kind, epsilon=eps, n_components=d, random_state=5)
            twin = make_mechanism(kind, epsilon=eps, n_components=d, random_state=5)
            ours = np.stack([mech.release(x) for _ in range(20)] + list(mech.release(np.tile(x, (200, 1)))))
            with with_scipy():
                theirs = np.stack([twin.release(x) for _ in range(20)] + list(twin.release(np.tile(x, (200, 1)))))
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9 * mech.radius, err_msg=f"{kind} {d} {eps}")


@pytest.mark.parametrize("a", [0.5, 3.5, 15.5, 63.5, 1023.5])
def test_the_inverse_from_the_table_is_the_general_methods(a):
    """The inverse starts from a table built on the first call with (a, b): the same x as from the general start,
    and the same bits whatever was asked before (seeded releases repeat)."""
    ys = np.concatenate([10.0 ** -np.linspace(0.31, 14.0, 300), np.linspace(0.01, 0.99, 99)])
    special._tables.pop((a, a), None)
    first = [special.betaincinv(a, a, float(y)) for y in ys]
    assert (a, a) in special._tables
    special._tables.clear()
    assert [special.betaincinv(a, a, float(y)) for y in ys[::-1]][::-1] == first
    for y, x in zip(map(float, ys), first, strict=True):
        if y > 0.5:  # I_x(a, a) = y there is I_{1−x}(a, a) = 1 − y, both exact
            y, x = 1.0 - y, 1.0 - x
        assert _rel(special.betainc(a, a, x), y) < 1e-12, (a, y)
        assert _rel(x, special._solve(a, a, math.log(y), special._start(a, a, y, math.log(y)))) < 1e-13, (a, y)
