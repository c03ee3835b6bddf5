"""Local DP release of a decision: k-ary randomized response over a finite set of labels.

A device in decision mode releases no template, only what it decided: one label among the ``k − 1``
enrolled subjects and *unknown*. The label is a deterministic function of a face, so it is released
through a local DP mechanism for a finite domain, **k-ary randomized response** (Warner 1965; Kairouz,
Oh & Viswanath 2014): the true label with probability ``e^ε / (e^ε + k − 1)``, each other label with
probability ``1 / (e^ε + k − 1)``. For any two faces and any output the probabilities differ by at most
``e^ε``: the release is ε-LDP, per appearance (one label is the whole release: the per-coordinate and
the per-vector ε are the same number).

Why not a "better" mechanism for large ``k``: unary encodings and subset selection beat randomized
response for estimating *frequencies*; for releasing *one decision* that should be right, no ε-LDP
mechanism does better. Any mechanism that releases an enrolled subject's own label with probability
``q`` must release it for a stranger with probability at least ``e^(−ε)·q``, so a stranger the model
calls unknown is named with probability at least ``(k − 1)·e^(−ε)·q`` — randomized response meets that
bound (:attr:`RandomizedResponse.false_positive_floor`). At ε = 8 and ``q`` ≈ 0.95, a 1 % false-positive
identification rate therefore allows at most about 31 enrolled subjects; more need a larger ε_label.

Randomness. Probabilities are integers over ``2**64``: ``n_other = ceil(2**64 / (e^ε + k − 1))`` for
each other label and ``n_keep = 2**64 − (k − 1)·n_other`` for the true one, so ``n_keep / n_other <= e^ε``
holds exactly (:attr:`RandomizedResponse.epsilon_exact` is ``ln(n_keep / n_other)``), and one uniform
64-bit word from the operating system's CSPRNG picks the output. Seeds are for simulations only and need
the ``"seeded-noise"`` feature (:mod:`peep.core.features`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core import features
from peep.core.mechanisms.base import PrivacyGuarantee
from peep.core.validation import check_int, check_real

_SPACE: Final = 1 << 64
#: The mechanism's name on the wire and in the ledger.
KIND: Final = "k-rr"
#: Largest label domain: a deployment's enrolled subjects plus "unknown".
MAX_LABELS: Final = 1 << 20


class RandomizedResponse:
    """k-ary randomized response: ε-LDP release of one label in ``0 .. k − 1``.

    Parameters
    ----------
    k : int
        Number of labels (enrolled subjects plus one for unknown), ``2 <= k <= 2**20``.
    epsilon : float
        ε per release, ``0 < ε <= 40``.
    random_state : None, int or numpy.random.Generator
        ``None`` (the default): the operating system's CSPRNG. A seed or a generator: a simulation, refused
        unless the ``"seeded-noise"`` feature is enabled.
    random_bytes : callable ``int -> bytes``, optional
        Byte source of the secure path (tests drive it; production uses ``os.urandom``).

    Examples
    --------
    >>> rr = RandomizedResponse(11, 8.0)
    >>> round(rr.keep_probability, 4), round(rr.false_positive_floor, 4)
    (0.9967, 0.0033)
    >>> print(rr.guarantee)
    ε=8 per coordinate, ε=8 per vector (nc=1)
    """

    kind: Final = KIND

    def __init__(
        self,
        k: int,
        epsilon: float,
        *,
        random_state: object = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.k = check_int(k, "k", low=2, high=MAX_LABELS)
        self.epsilon = check_real(epsilon, "epsilon", low=0.0, high=40.0)
        if self.epsilon <= 0.0:
            raise ValueError(f"epsilon: expected a value in (0, 40], received {epsilon!r}")
        # Shade e^ε down by 2 ulps so that the float's rounding can never make the ratio exceed e^ε.
        e = Fraction(math.exp(self.epsilon) * (1.0 - 4.0 * 2.0**-53))
        self._n_other = int(-(-(_SPACE * e.denominator) // (e.numerator + (self.k - 1) * e.denominator)))
        self._n_keep = _SPACE - (self.k - 1) * self._n_other
        if self._n_keep < self._n_other:
            raise ValueError(
                f"epsilon: expected a value that keeps a label more often than it moves it, received {epsilon!r}"
            )
        self._rng: np.random.Generator | None = None
        if random_state is not None:
            features.require("seeded-noise", "RandomizedResponse with a seed")
            self._rng = (
                random_state
                if isinstance(random_state, np.random.Generator)
                else np.random.default_rng(check_int(random_state, "random_state", low=0))
            )
        if not callable(random_bytes):
            raise TypeError(f"random_bytes: expected a callable int -> bytes, received {random_bytes!r}")
        self._random_bytes = random_bytes

    def __repr__(self) -> str:
        return f"RandomizedResponse(k={self.k}, epsilon={self.epsilon:g})"

    # ------------------------------------------------------------------ the law

    @property
    def is_secure(self) -> bool:
        """Whether releases draw from the operating system's CSPRNG (False for a seeded simulation)."""
        return self._rng is None

    @property
    def keep_probability(self) -> float:
        """Probability that a label is released as itself."""
        return self._n_keep / _SPACE

    @property
    def other_probability(self) -> float:
        """Probability that a label is released as one given other label."""
        return self._n_other / _SPACE

    @property
    def flip_probability(self) -> float:
        """Probability that a label is released as any other label: ``(k − 1) / (e^ε + k − 1)``."""
        return (self.k - 1) * self._n_other / _SPACE

    @property
    def false_positive_floor(self) -> float:
        """Probability that *unknown* is released as some enrolled subject (the flip probability)."""
        return self.flip_probability

    @property
    def epsilon_exact(self) -> float:
        """``ln(n_keep / n_other)``: the ε the integer probabilities achieve (never above :attr:`epsilon`)."""
        return math.log(self._n_keep / self._n_other)

    @property
    def guarantee(self) -> PrivacyGuarantee:
        """ε per release; one label is the whole release, so per coordinate and per vector are equal."""
        return PrivacyGuarantee(
            epsilon_coordinate=self.epsilon,
            epsilon_vector=self.epsilon,
            n_components=1,
            description=(
                f"k-ary randomized response over {self.k} labels: the true label with probability "
                f"{self.keep_probability:.6g}, each other with {self.other_probability:.6g}"
            ),
        )

    def output_law(self, label: int) -> NDArray[np.float64]:
        """The distribution of the release of ``label``, shape (k,)."""
        label = check_int(label, "label", low=0, high=self.k - 1)
        p = np.full(self.k, self.other_probability)
        p[label] = self.keep_probability
        return p

    def describe(self) -> dict[str, Any]:
        """What a report or a start-up line shows about the mechanism."""
        return {
            "kind": self.kind,
            "labels": self.k,
            "epsilon": self.epsilon,
            "keep_probability": self.keep_probability,
            "flip_probability": self.flip_probability,
        }

    # ------------------------------------------------------------------ releasing

    def _words(self, n: int) -> NDArray[np.uint64]:
        if self._rng is not None:
            return self._rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
        buf = self._random_bytes(8 * n)
        if len(buf) != 8 * n:
            raise RuntimeError(f"random_bytes: expected {8 * n} bytes, received {len(buf)}; broken random source")
        return np.frombuffer(buf, dtype="<u8", count=n).astype(np.uint64)

    def release(self, labels: ArrayLike) -> NDArray[np.int64]:
        """Randomise each label independently.

        Parameters
        ----------
        labels : int or array-like of int, shape (n,)
            True labels in ``0 .. k − 1``.

        Returns
        -------
        ndarray of int64, shape (n,)
        """
        y = np.asarray(labels).reshape(-1)
        if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= self.k):
            raise ValueError(f"labels: expected integers in 0..{self.k - 1}, received {y[:8].tolist()}")
        y = y.astype(np.int64)
        w = self._words(y.size)
        moved = w >= np.uint64(self._n_keep)
        # The moved words are uniform on [n_keep, 2**64), which is (k − 1) blocks of n_other: one per other label.
        j = ((w[moved] - np.uint64(self._n_keep)) // np.uint64(self._n_other)).astype(np.int64)
        out = y.copy()
        out[moved] = j + (j >= y[moved])  # skip the true label
        return out

    def release_one(self, label: int) -> int:
        """Randomise one label (see :meth:`release`)."""
        return int(self.release(np.array([check_int(label, "label", low=0, high=self.k - 1)]))[0])


def fpir_floor(enrolled: int, epsilon_label: float, fnir: float = 0.0) -> float:
    """The least share of strangers any ε-LDP label mechanism names: ``enrolled · e^(−ε) · (1 − FNIR)``.

    An enrolled subject's own label is released with probability at least ``1 − FNIR`` (the model names
    them, the label survives); ε-LDP then releases it for a stranger with probability at least ``e^(−ε)``
    times that, for each of the ``enrolled`` labels. No threshold can bring the released FPIR below this
    (k-ary randomized response meets it up to the ``e^ε + k − 1`` in its denominator), so a target under it
    is refused rather than missed.

    Parameters
    ----------
    enrolled : int
        Subjects the model may name (>= 1).
    epsilon_label : float
        ε of one released label (> 0).
    fnir : float, default=0.0
        The share of enrolled people the model misses (0: the floor of a model that never misses).

    Returns
    -------
    float
        In [0, 1] (capped).

    Examples
    --------
    >>> round(fpir_floor(10, 8.0), 5), round(fpir_floor(100, 8.0), 4)
    (0.00335, 0.0335)
    """
    n = check_int(enrolled, "enrolled", low=1, high=MAX_LABELS)
    eps = _positive(epsilon_label, "epsilon_label", 40.0)
    miss = check_real(fnir, "fnir", low=0.0, high=1.0)
    return float(min(1.0, n * math.exp(-eps) * (1.0 - miss)))


def epsilon_label_for(enrolled: int, fpir: float, fnir: float = 0.0) -> float:
    """The least ε_label whose :func:`fpir_floor` is at most ``fpir``: ``ln(enrolled · (1 − FNIR) / fpir)``.

    At that ε the floor *equals* the target and no stranger named by the model is left to spare: a
    deployment needs more (docs/DECISIONS.md gives the table).

    Examples
    --------
    >>> round(epsilon_label_for(10, 0.01), 2), round(epsilon_label_for(1000, 0.001), 2)
    (6.91, 13.82)
    """
    n = check_int(enrolled, "enrolled", low=1, high=MAX_LABELS)
    target = _positive(fpir, "fpir", 1.0)
    miss = check_real(fnir, "fnir", low=0.0, high=1.0)
    return float(max(0.0, math.log(max(n * (1.0 - miss), 1e-300) / target)))


def _positive(value: float, name: str, high: float) -> float:
    """``value`` checked to lie in ``(0, high]`` (a ValueError naming ``name`` otherwise)."""
    v = check_real(value, name, low=0.0, high=high)
    if v <= 0.0:
        raise ValueError(f"{name}: expected a value in (0, {high:g}], received {value!r}")
    return v
