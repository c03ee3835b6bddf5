"""Mechanisms for unit vectors: ``privunit`` (PrivUnit2) and ``privunit-g`` (PrivUnitG).

The template is a direction: the projector's ``unit`` output (the projected
coefficients divided by their L2 norm), and the mechanism clips any input to
the unit sphere again. Both mechanisms release an unbiased estimate of the
direction.

PrivUnit2 (Bhowmick, Duchi, Freudiger, Kapoor & Rogers 2018, "Protection
against reconstruction and its applications in private federated learning",
Alg. 1). With probability ``p`` draw ``Z`` uniformly from the spherical cap
``{z : ⟨z, x⟩ >= γ}``, otherwise from its complement, and release ``Z/m``.
For ``U`` uniform on the sphere ``S^{d−1}``, ``(1 + ⟨U, x⟩)/2`` is
``Beta(α, α)`` with ``α = (d − 1)/2``, so the cap's surface fraction is
``q = I_{(1−γ)/2}(α, α)`` (the regularised incomplete beta function). The
density of ``Z`` relative to the uniform measure is ``p/q`` on the cap and
``(1 − p)/(1 − q)`` off it, for every input ``x``; the largest ratio of the
densities under two inputs is therefore exactly

    ε = log(p/(1 − p)) + log((1 − q)/q),

which is what :attr:`PrivUnitMechanism.guarantee` states (not the paper's
looser bound). ``m = A·(p − q)/(q·(1 − q))`` with
``A = (1 − γ²)^α / ((d − 1)·2^{d−2}·B(α, α))`` makes ``Z/m`` unbiased;
``E‖Z/m‖² = 1/m²``, so the parameters maximise ``m``: for the configured ε
a one-dimensional search over γ, with ``p`` taking the rest of the budget.

PrivUnitG (Asi, Feldman & Talwar 2022, "Optimal algorithms for mean
estimation under local differential privacy"). The same with a standard
Gaussian ``G`` instead of the uniform direction: ``G`` conditioned on
``⟨G, x⟩ >= γ`` with probability ``p``, on ``⟨G, x⟩ < γ`` otherwise, so
``q = Φ̄(γ)``, the same exact ε, ``m = φ(γ)·(p − q)/(q·(1 − q))`` and
``E‖G/m‖² = (d + γ·m)/m²``, minimised over γ.

Sampling without cancellation
-----------------------------
``⟨Z, x⟩`` is drawn by inverting its conditional law. In the cap the
quantity sampled is ``s = (1 − ⟨Z, x⟩)/2 = betaincinv(α, α, U·q)`` (the
symmetry of ``Beta(α, α)``), never ``1 − I`` computed in floating point:
at large ε the cap is tiny (``q`` down to ``e^{−ε}``) and ``1 − I`` would
round to 0 and return the input unperturbed. ``√(1 − ⟨Z, x⟩²)`` is
``2·√(s(1 − s))``. Off the cap, ``B = betaincinv(α, α, U·(1 − q))`` with
``1 − q = I_{(1+γ)/2}(α, α)`` computed directly. PrivUnitG uses
``ndtri``/``ndtr`` the same way. These special functions are
:mod:`peep.core.special`'s (tested against scipy), so a device never loads scipy. ``U`` comes from the sampler's
full-precision exponential (``U = exp(−E)``); the direction orthogonal to
``x`` from Box–Muller normals built from the same exponentials.

Floating point and the grid
---------------------------
The sample above is computed in floating point, so its low-order bits could
depend on the input (the attack of Mironov 2012 on naive Laplace). The
release is therefore the scaled sample ``v = Z/m`` put through the secure
sampler's :meth:`~peep.core.sampling.SecureSampler.perturb_laplace` with a
tiny scale ``b = R·2**-12`` (``R = 1/m`` for PrivUnit2, ``√d/m`` for
PrivUnitG): the output is ``γ_g·(round(v/γ_g) + N)`` with ``N`` discrete
Laplace of parameter ``β = b/γ_g ∈ [2**20, 2**21)`` grid units per
coordinate. Hence

* every output is a multiple of the power-of-two grid step ``γ_g``, and every
  grid point is reachable under every input (``N`` has full support): the set
  of reachable outputs does not depend on the input (tested);
* compare with the ideal mechanism that rounds an exact PrivUnit sample ``v*``
  and adds the same ``N``: it is ε-LDP (post-processing). The computed ``v``
  is within ``|v − v*| ≲ R·1e−13`` per coordinate of ``v*`` (relative errors
  of ``betaincinv``/``ndtri``, the normalisation and the products), far below
  half a grid step ``γ_g/2 ≈ R·2**-33``, so ``round(v/γ_g)`` differs from
  ``round(v*/γ_g)`` by at most one in each coordinate. Shifting ``N`` by one
  unit in each of ``d`` coordinates changes its pmf by at most ``e^{d/β}``,
  so every output's probability is within ``e^{±d/β}`` of the ideal one and
  the ratio under two inputs is at most ``e^{ε_PU + 2d/β}``. The stated ε
  includes this slack ``2d/β <= 2d·2**-20`` (2.4e−4 at d = 128): the
  mechanism calibrates PrivUnit at ``ε − 2d·2**-20`` so the total never
  exceeds the configured ε;
* the only draws not covered are those where ``U·q`` would underflow below
  the smallest normal double and is clamped to it, with probability below
  ``2**-1022/q <= 1e−90`` at the largest ε allowed (500): a δ of that order.

The extra noise has standard deviation ``√2·b ≈ 3.5e−4·R`` per coordinate,
against PrivUnit's own ``≈ R/√d``: it changes the variance by less than 1e−4.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray
from peep.core import special
from peep.core.domains import unit_rows
from peep.core.mechanisms.base import PrivacyGuarantee, PublicParameters, TemplateMechanism
from peep.core.mechanisms.calibration import check_epsilon
from peep.core.mechanisms.registry import register_mechanism
from peep.core.sampling import GRID_BITS, check_random_state
from peep.core.validation import check_int

__all__ = ["PrivUnitGMechanism", "PrivUnitMechanism", "privunit_parameters", "privunitg_parameters"]

FloatArray = NDArray[np.float64]

#: Largest ε accepted: the cap fraction ``q >= e^{−500}`` stays a normal double,
#: and beyond it a release is the input up to noise far below any useful scale.
MAX_EPSILON: Final = 500.0
#: Largest dimension accepted (the wire format's limit).
MAX_DIMENSION: Final = 2048
# Scale of the smoothing Laplace relative to the release's radius (see the module docstring).
_SMOOTHING: Final = 2.0**-12
_TINY: Final = float(np.finfo(np.float64).tiny)
# Golden-section refinement of γ after a coarse scan; the optimum is smooth.
_SCAN_POINTS: Final = 128
_REFINE_STEPS: Final = 60


def _grid_slack_bound(d: int) -> float:
    """Largest ε the grid can add for dimension ``d``: ``2d/β`` with ``β >= 2**GRID_BITS``."""
    return 2.0 * d * 2.0**-GRID_BITS


def _maximise(f: Any, lo: float, hi: float) -> float:
    """Argmax of a smooth function on [lo, hi]: scan, then golden-section search around the best point."""
    xs = np.linspace(lo, hi, _SCAN_POINTS)
    values = np.array([f(float(x)) for x in xs])
    i = int(np.nanargmax(values))
    a, b = float(xs[max(i - 1, 0)]), float(xs[min(i + 1, _SCAN_POINTS - 1)])
    r = (math.sqrt(5.0) - 1.0) / 2.0
    c, e = b - r * (b - a), a + r * (b - a)
    fc, fe = f(c), f(e)
    for _ in range(_REFINE_STEPS):
        if fc >= fe:
            b, e, fe = e, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, e, fe
            e = a + r * (b - a)
            fe = f(e)
    best = max((fc, c), (fe, e), (float(values[i]), float(xs[i])))
    return best[1]


def _solve_increasing(f: Any, target: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] with f(x) = target for increasing f (bisection; the lower end of the final bracket)."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if f(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def _p_for(epsilon0: float) -> float:
    """``e^{ε0}/(1 + e^{ε0})`` without overflow."""
    return 1.0 / (1.0 + math.exp(-epsilon0))


# --------------------------------------------------------------------------- PrivUnit2 parameters


def _log_cap_fraction(gamma: float, d: int) -> float:
    """``log q``: ``q = P(⟨U, x⟩ >= γ)`` for ``U`` uniform on ``S^{d−1}`` (no cancellation)."""
    a = 0.5 * (d - 1)
    return special.log_betainc(a, a, 0.5 * (1.0 - gamma))


def _cap_epsilon(log_q: float) -> float:
    """``log((1 − q)/q)`` from ``log q``."""
    return math.log(-math.expm1(log_q)) - log_q


def _log_m_privunit(gamma: float, p: float, log_q: float, d: int) -> float:
    a = 0.5 * (d - 1)
    if p <= math.exp(log_q):
        return -math.inf
    log_a = (
        a * math.log1p(-gamma * gamma) - math.log(d - 1) - (d - 2) * math.log(2.0) - special.betaln(a, a)
        if gamma < 1.0
        else -math.inf
    )
    q = math.exp(log_q)
    return log_a + math.log(p - q) - log_q - math.log1p(-q)


def privunit_parameters(epsilon: float, d: int) -> tuple[float, float, float, float]:
    """``(γ, p, q, m)`` of PrivUnit2 with exact privacy loss ``epsilon`` and the least variance.

    Parameters
    ----------
    epsilon : float
        The exact ε to spend (``log(p/(1−p)) + log((1−q)/q)``).
    d : int
        Dimension (>= 2).

    Returns
    -------
    gamma, p, q, m : float
        Cap threshold, cap probability, cap surface fraction and the
        unbiasing factor (the release is ``Z/m``).
    """

    def eps1(gamma: float) -> float:
        lq = _log_cap_fraction(gamma, d)
        return _cap_epsilon(lq) if math.isfinite(lq) else math.inf

    # ε1 grows from 0 at γ = 0 to ∞ as γ → 1; spend at most ε on it.
    gamma_max = _solve_increasing(eps1, epsilon, 0.0, 1.0)

    def objective(gamma: float) -> float:
        lq = _log_cap_fraction(gamma, d)
        e1 = _cap_epsilon(lq)
        if not e1 <= epsilon:
            return -math.inf
        return _log_m_privunit(gamma, _p_for(epsilon - e1), lq, d)

    gamma = _maximise(objective, 0.0, gamma_max)
    log_q = _log_cap_fraction(gamma, d)
    p = _p_for(epsilon - _cap_epsilon(log_q))
    m = math.exp(_log_m_privunit(gamma, p, log_q, d))
    return gamma, p, math.exp(log_q), m


# --------------------------------------------------------------------------- PrivUnitG parameters


def _log_tail(gamma: float) -> float:
    """``log Φ̄(γ)`` (no cancellation)."""
    return special.log_ndtr(-gamma)


def _log_m_privunitg(gamma: float, p: float, log_q: float) -> float:
    q = math.exp(log_q)
    if p <= q:
        return -math.inf
    log_phi = -0.5 * gamma * gamma - 0.5 * math.log(2.0 * math.pi)
    return log_phi + math.log(p - q) - log_q - math.log1p(-q)


def privunitg_parameters(epsilon: float, d: int) -> tuple[float, float, float, float]:
    """``(γ, p, q, m)`` of PrivUnitG with exact privacy loss ``epsilon`` and the least variance.

    The variance ``E‖G/m − x‖² = (d + γ·m)/m² − 1`` is minimised over
    ``γ >= 0`` (in units of the Gaussian's standard deviation, which cancels).
    """

    def eps1(gamma: float) -> float:
        return _cap_epsilon(_log_tail(gamma))

    gamma_max = _solve_increasing(eps1, epsilon, 0.0, 64.0)

    def objective(gamma: float) -> float:
        lq = _log_tail(gamma)
        e1 = _cap_epsilon(lq)
        if not e1 <= epsilon:
            return -math.inf
        log_m = _log_m_privunitg(gamma, _p_for(epsilon - e1), lq)
        if not math.isfinite(log_m):
            return -math.inf
        m = math.exp(log_m)
        return -math.log((d + gamma * m) / (m * m))

    gamma = _maximise(objective, 0.0, gamma_max)
    log_q = _log_tail(gamma)
    p = _p_for(epsilon - _cap_epsilon(log_q))
    m = math.exp(_log_m_privunitg(gamma, p, log_q))
    return gamma, p, math.exp(log_q), m


# --------------------------------------------------------------------------- mechanisms


class _UnitSphereMechanism(TemplateMechanism):
    """Shared by PrivUnit2 and PrivUnitG: validation, guarantee, one draw per release, the grid."""

    domain: ClassVar[str] = "unit"
    frontier: ClassVar[bool] = True
    max_epsilon: ClassVar[float] = MAX_EPSILON
    _family: ClassVar[str]

    gamma: float
    p: float
    q: float
    m: float
    radius: float
    smoothing_scale: float
    epsilon_unit: float

    def __init__(self, *, epsilon: float, n_components: int, random_state: object = None) -> None:
        self.epsilon = check_epsilon(epsilon)
        if self.epsilon > MAX_EPSILON:
            raise ValueError(
                f"epsilon: expected <= {MAX_EPSILON:g} for {self.kind} (beyond it a release is the input up to "
                f"negligible noise and the cap probabilities leave double precision), received {self.epsilon:g}"
            )
        self.n_components = d = check_int(n_components, "n_components", low=2, high=MAX_DIMENSION)
        self.delta = 0.0
        self.random_state = random_state
        self._sampler = check_random_state(random_state)
        slack_bound = _grid_slack_bound(d)
        if self.epsilon <= 2.0 * slack_bound:
            raise ValueError(
                f"epsilon: expected > {2.0 * slack_bound:g} for {self.kind} at dimension {d} (the secure grid "
                f"alone may cost {slack_bound:g}), received {self.epsilon:g}"
            )
        # Calibrate PrivUnit below ε by the largest slack the grid can add, so the total never exceeds ε.
        self.epsilon_unit = self.epsilon - slack_bound
        self.gamma, self.p, self.q, self.m = self._parameters(self.epsilon_unit, d)
        self._off_cap_mass = self._mass_below_threshold()
        # P(E > c) = e^{−c} for an exponential E; the margin keeps it at most p despite rounding.
        self._coin_threshold = -math.log(self.p) + 2.0**-40
        self.radius = self._release_radius()
        self.smoothing_scale = _SMOOTHING * self.radius
        self.grid_step = self._sampler.grid_step(self.smoothing_scale)
        slack = 2.0 * d * self.grid_step / self.smoothing_scale
        unit_variance = self._second_moment() - 1.0
        self.variance = np.full(d, unit_variance / d + 2.0 * self.smoothing_scale**2)
        self.noise_std = math.sqrt(float(np.mean(self.variance)))
        self.is_secure = bool(self._sampler.is_secure)
        total = self.epsilon_unit + slack
        self.guarantee = PrivacyGuarantee(
            epsilon_coordinate=total,
            epsilon_vector=total,
            n_components=d,
            description=(
                f"{self.kind}: {self._family} on the unit sphere, exact loss log(p/(1−p)) + log((1−q)/q) = "
                f"{self.epsilon_unit:.6g} (γ={self.gamma:.6g}, p={self.p:.6g}, q={self.q:.6g}) plus {slack:.3g} "
                "for the secure output grid; a coordinate is post-processing of the vector"
            ),
        )

    @classmethod
    def from_parameters(
        cls, public: PublicParameters, *, epsilon: float, delta: float | None = None, random_state: object = None
    ) -> TemplateMechanism:
        # The unit sphere needs no public bound: every direction is a valid input.
        return cls(epsilon=epsilon, n_components=public.n_components, random_state=random_state)

    # -- per family --------------------------------------------------------------------

    @staticmethod
    def _parameters(epsilon: float, d: int) -> tuple[float, float, float, float]:
        raise NotImplementedError

    def _release_radius(self) -> float:
        raise NotImplementedError

    def _second_moment(self) -> float:
        """``E‖release‖²`` before the smoothing noise (for a unit input)."""
        raise NotImplementedError

    def _mass_below_threshold(self) -> float:
        """``1 − q``, computed directly (never as one minus a float)."""
        raise NotImplementedError

    def _along(self, in_cap: NDArray[np.bool_], u: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(⟨Z, x⟩, |Z − ⟨Z, x⟩x|)`` for each draw, from the cap or off it, by inverting the CDF at ``u``."""
        raise NotImplementedError

    def _orthogonal(self, X: FloatArray, G: FloatArray, norms: FloatArray) -> FloatArray:
        """The part of each draw orthogonal to its row of ``X``, built from normals ``G`` (modified in place)."""
        raise NotImplementedError

    # -- release -----------------------------------------------------------------------

    def domain_box(self) -> tuple[FloatArray, FloatArray]:
        d = self.n_components
        return np.full(d, -1.0), np.ones(d)

    def _clip(self, X: FloatArray) -> FloatArray:
        norms = np.sqrt(np.einsum("...i,...i->...", X, X))
        if np.all(norms > 0.0):
            out: FloatArray = X / norms[..., None]
            return out
        return unit_rows(X)

    def sample_unscaled(self, X: FloatArray) -> tuple[FloatArray, NDArray[np.bool_]]:
        """The mechanism's draw for unit rows ``X`` of shape (n, d), before scaling and the grid.

        Returns ``(Z, in_cap)``: ``Z`` of shape (n, d) (on the unit sphere for
        PrivUnit2, Gaussian for PrivUnitG) and whether each came from the cap.
        All randomness comes from one call to the sampler's
        :meth:`~peep.core.sampling.NoiseSampler.exponential`: the coin
        ``E > −ln p + 2**-40`` (probability at most ``p``: the margin covers
        the rounding of the threshold), the uniform ``exp(−E)`` for the
        inverse CDF, and Box–Muller normals ``√(2E)·(cos, sin)(2π·exp(−E'))``
        for the orthogonal part.
        """
        n, d = X.shape
        h = (d + 1) // 2
        E = self._sampler.exponential(n * (2 + 2 * h)).reshape(n, 2 + 2 * h)
        in_cap = E[:, 0] > self._coin_threshold
        t, ortho_norm = self._along(in_cap, np.exp(-E[:, 1]))
        Z: FloatArray = X * t[:, None] + self._orthogonal(X, self._normals(E[:, 2:], d), ortho_norm)
        return Z, in_cap

    @staticmethod
    def _normals(E: FloatArray, d: int) -> FloatArray:
        """``d`` Box–Muller normals per row from ``2·ceil(d/2)`` exponentials per row.

        ``√(2E)·exp(2πi·exp(−E'))`` as complex numbers, whose real and
        imaginary parts (read interleaved) are independent standard normals.
        """
        h = E.shape[1] // 2
        radius = np.sqrt(2.0 * E[:, :h])
        angle = np.exp(-E[:, h:])
        angle *= 2.0 * math.pi
        z = np.exp(1j * angle)
        z *= radius
        out: FloatArray = z.view(np.float64)[:, :d]
        return out

    def _perturb(self, X: FloatArray) -> FloatArray:
        if X.ndim == 1:
            Z1 = self._sample_one(X)
            Z1 *= 1.0 / self.m
            return self._sampler.perturb_laplace(Z1, self.smoothing_scale)
        Z, _ = self.sample_unscaled(X)
        Z *= 1.0 / self.m
        return self._sampler.perturb_laplace(Z, self.smoothing_scale)

    def _sample_one(self, x: FloatArray) -> FloatArray:
        """:meth:`sample_unscaled` for one unit vector of shape (d,): the same draws, fewer array calls."""
        d = x.shape[0]
        h = (d + 1) // 2
        E = self._sampler.exponential(2 + 2 * h)
        in_cap = bool(E[0] > self._coin_threshold)
        t, ortho = self._along_one(in_cap, math.exp(-float(E[1])))
        G: FloatArray = self._normals(E[None, 2:], d)[0]
        G -= float(G @ x) * x
        G *= self._orthogonal_scale(G, ortho)
        G += t * x
        return G

    def _along_one(self, in_cap: bool, u: float) -> tuple[float, float]:
        t, ortho = self._along(np.array([in_cap]), np.array([u]))
        return float(t[0]), float(ortho[0])

    def _orthogonal_scale(self, G: FloatArray, norm: float) -> float:
        """Factor turning the orthogonal part ``G`` of one draw into the family's (``norm`` = its target length)."""
        raise NotImplementedError


@register_mechanism
class PrivUnitMechanism(_UnitSphereMechanism):
    """``privunit``: PrivUnit2 on the unit sphere, exact ε, unbiased, least variance for (ε, d).

    Parameters
    ----------
    epsilon : float
        ε per vector (the total, including the secure grid's slack), at most 500.
    n_components : int
        Dimension d, 2 <= d <= 2048.
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    gamma, p, q, m : float
        Cap threshold, cap probability, cap surface fraction, unbiasing factor.
    radius : float
        ``1/m``: every release (before the grid noise) has this norm.
    guarantee : PrivacyGuarantee
        ε per vector (and per coordinate: post-processing).

    Examples
    --------
    >>> m = PrivUnitMechanism(epsilon=16.0, n_components=32)
    >>> round(m.guarantee.epsilon_vector, 3), 0.0 < m.gamma < 1.0, m.p > 0.5
    (16.0, True, True)
    """

    kind: ClassVar[str] = "privunit"
    wire_name: ClassVar[str] = "MECHANISM_KIND_PRIVUNIT"
    summary: ClassVar[str] = (
        "PrivUnit2 (Bhowmick et al. 2018) on the unit sphere: a random direction from a cap around the template "
        "or from its complement, scaled to be unbiased; exact ε per template"
    )
    _family = "PrivUnit2"

    @staticmethod
    def _parameters(epsilon: float, d: int) -> tuple[float, float, float, float]:
        return privunit_parameters(epsilon, d)

    def _release_radius(self) -> float:
        return 1.0 / self.m

    def _second_moment(self) -> float:
        return 1.0 / (self.m * self.m)

    def _mass_below_threshold(self) -> float:
        a = 0.5 * (self.n_components - 1)
        return special.betainc(a, a, 0.5 * (1.0 + self.gamma))

    def _along(self, in_cap: NDArray[np.bool_], u: FloatArray) -> tuple[FloatArray, FloatArray]:
        a = 0.5 * (self.n_components - 1)
        # In the cap, s = (1 − t)/2 is Beta(α, α) below (1 − γ)/2, whose mass is q; off it,
        # B = (1 + t)/2 is Beta(α, α) below (1 + γ)/2, whose mass 1 − q was computed directly.
        v = special.betaincinv(a, a, np.maximum(u * np.where(in_cap, self.q, self._off_cap_mass), _TINY))
        t = np.where(in_cap, 1.0 - 2.0 * v, 2.0 * v - 1.0)
        ortho: FloatArray = 2.0 * np.sqrt(v * (1.0 - v))
        return t, ortho

    def _orthogonal(self, X: FloatArray, G: FloatArray, norms: FloatArray) -> FloatArray:
        G -= np.einsum("ij,ij->i", G, X)[:, None] * X
        lengths = np.sqrt(np.einsum("ij,ij->i", G, G))
        G *= (norms / np.maximum(lengths, _TINY))[:, None]
        return G

    def _along_one(self, in_cap: bool, u: float) -> tuple[float, float]:
        a = 0.5 * (self.n_components - 1)
        v = special.betaincinv(a, a, max(u * (self.q if in_cap else self._off_cap_mass), _TINY))
        return (1.0 - 2.0 * v if in_cap else 2.0 * v - 1.0), 2.0 * math.sqrt(v * (1.0 - v))

    def _orthogonal_scale(self, G: FloatArray, norm: float) -> float:
        return norm / max(math.sqrt(float(G @ G)), _TINY)

    def plausible_range(self, sigmas: float) -> tuple[FloatArray, FloatArray]:
        # Every release has norm exactly 1/m before the grid noise: no coordinate exceeds it.
        r = self.radius + float(sigmas) * math.sqrt(2.0) * self.smoothing_scale
        return np.full(self.n_components, -r), np.full(self.n_components, r)


@register_mechanism
class PrivUnitGMechanism(_UnitSphereMechanism):
    """``privunit-g``: PrivUnitG (a conditioned Gaussian), exact ε, unbiased, least variance for (ε, d).

    Parameters
    ----------
    epsilon : float
        ε per vector (the total, including the secure grid's slack), at most 500.
    n_components : int
        Dimension d, 2 <= d <= 2048.
    random_state : None, NoiseSampler, int or Generator

    Attributes
    ----------
    gamma, p, q, m : float
        Threshold (in standard deviations), cap probability, ``Φ̄(γ)``, unbiasing factor.
    guarantee : PrivacyGuarantee
    """

    kind: ClassVar[str] = "privunit-g"
    wire_name: ClassVar[str] = "MECHANISM_KIND_PRIVUNIT_G"
    summary: ClassVar[str] = (
        "PrivUnitG (Asi, Feldman & Talwar 2022): a Gaussian conditioned on its component along the template, "
        "scaled to be unbiased; exact ε per template"
    )
    _family = "PrivUnitG"

    @staticmethod
    def _parameters(epsilon: float, d: int) -> tuple[float, float, float, float]:
        return privunitg_parameters(epsilon, d)

    def _release_radius(self) -> float:
        return math.sqrt(self.n_components) / self.m

    def _second_moment(self) -> float:
        return (self.n_components + self.gamma * self.m) / (self.m * self.m)

    def _mass_below_threshold(self) -> float:
        return special.ndtr(self.gamma)

    def _along(self, in_cap: NDArray[np.bool_], u: FloatArray) -> tuple[FloatArray, FloatArray]:
        # Cap: t = Φ̄⁻¹(U·q) = −Φ⁻¹(U·q); off it: t = Φ⁻¹(U·Φ(γ)), with Φ(γ) = 1 − q computed directly.
        v = special.ndtri(np.maximum(u * np.where(in_cap, self.q, self._off_cap_mass), _TINY))
        t: FloatArray = np.where(in_cap, -v, v)
        return t, np.ones_like(u)

    def _orthogonal(self, X: FloatArray, G: FloatArray, norms: FloatArray) -> FloatArray:
        G -= np.einsum("ij,ij->i", G, X)[:, None] * X
        return G

    def _orthogonal_scale(self, G: FloatArray, norm: float) -> float:
        return 1.0
