"""The one rule that turns a recogniser's probabilities into decisions, wherever it runs.

A served model gives, for each query, class probabilities ``P`` of shape ``(n, C)``: one column per
enrolled subject and, where the server had a public background population, one *background* column that
teaches the model what a face that is not enrolled looks like. The server applies this rule to perturbed
query templates; a device in decision mode applies the same rule to its own clean projection. Nothing
else in PEEP decides.

Identification (open set, 1:N)
    The query is named as the enrolled subject with the largest probability ``p`` when ``p >= t_unknown``,
    and is *unknown* otherwise (the background column never names anyone).
Verification (1:1, a claim)
    The score of a claim is the probability of the claimed subject (0 for a subject the model does not
    know); the claim is accepted iff ``score > t_verify``.

Thresholds are set on scores of people the model never saw, as NIST's FRVT judges 1:N identification
(false-negative identification rate at a fixed false-positive identification rate):

:func:`threshold_at_fpir`
    the smallest ``t`` at which at most a share ``fpir`` of strangers' best scores reach ``t``;
:func:`threshold_at_far`
    the smallest ``t`` at which at most a share ``far`` of impostor scores exceed ``t``.

Where the scores come from decides what the thresholds are good for. On the server they come from held-out
background people's *releases* (noisy, like the queries it decides). A device decides on a *clean*
projection, whose scores have another scale; its thresholds come from clean projections of public faces
(:func:`calibrate_clean`), never from an enrolled person.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.validation import check_real

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class OpenSetDecisions:
    """Decisions of :func:`identify_open_set` for ``n`` queries.

    Attributes
    ----------
    best_class : ndarray of int, shape (n,)
        Column of ``P`` of the most probable enrolled subject (named or not).
    probability : ndarray of float, shape (n,)
        Its probability.
    unknown : ndarray of bool, shape (n,)
        True where that probability is below the threshold: nobody is named.
    """

    best_class: IntArray
    probability: FloatArray
    unknown: NDArray[np.bool_]


def _probabilities(P: ArrayLike) -> FloatArray:
    arr = np.asarray(P, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"P: expected class probabilities of shape (n, n_classes), received {arr.shape}")
    return arr


def _known(known: ArrayLike, n_classes: int) -> IntArray:
    k = np.asarray(known, dtype=np.intp).reshape(-1)
    if k.size == 0 or np.any(k < 0) or np.any(k >= n_classes):
        raise ValueError(f"known: expected 1.. column indices below {n_classes}, received {k[:8].tolist()}")
    return k


def identify_open_set(P: ArrayLike, known: ArrayLike, threshold: float | ArrayLike) -> OpenSetDecisions:
    """Name each query's most probable enrolled subject, or nobody.

    Parameters
    ----------
    P : array-like of shape (n, n_classes)
        Class probabilities (erased subjects already zeroed by the caller).
    known : array-like of int, shape (n_known,)
        The columns of enrolled subjects (every column but the background one).
    threshold : float or array-like of shape (n,)
        ``t_unknown``: a query is named iff its best enrolled probability is ``>= t``
        (one threshold per row where decisions fused from several releases use another).

    Returns
    -------
    OpenSetDecisions
    """
    arr = _probabilities(P)
    k = _known(known, arr.shape[1])
    Pk = arr[:, k]
    j = np.argmax(Pk, axis=1)
    best = Pk[np.arange(arr.shape[0]), j]
    t = np.broadcast_to(np.asarray(threshold, dtype=np.float64), best.shape)
    return OpenSetDecisions(best_class=k[j], probability=best, unknown=best < t)


def claim_scores(P: ArrayLike, claimed: ArrayLike) -> FloatArray:
    """The score of each row's claim: the probability of the claimed column, 0 where ``claimed < 0``.

    Parameters
    ----------
    P : array-like of shape (n, n_classes)
    claimed : array-like of int, shape (n,)
        Column of the claimed subject, ``-1`` for a subject the model does not know.
    """
    arr = _probabilities(P)
    c = np.asarray(claimed, dtype=np.intp).reshape(-1)
    if c.shape[0] != arr.shape[0] or np.any(c >= arr.shape[1]):
        raise ValueError(f"claimed: expected {arr.shape[0]} column indices below {arr.shape[1]} or -1")
    return np.where(c >= 0, arr[np.arange(arr.shape[0]), np.maximum(c, 0)], 0.0)


def accept_claims(scores: ArrayLike, threshold: float) -> NDArray[np.bool_]:
    """Accepted iff the claim's score is above ``threshold`` (strictly: a tie is refused)."""
    return np.asarray(scores, dtype=np.float64) > float(threshold)


def _weights(weights: ArrayLike | None, n: int) -> FloatArray | None:
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != n or not np.all(np.isfinite(w)) or np.any(w < 0) or (n and w.sum() <= 0):
        raise ValueError(f"weights: expected {n} finite non-negative weights with a positive sum")
    return w / w.sum() if n else w


def _weighted_threshold(s: FloatArray, w: FloatArray, rate: float, *, strict: bool) -> float:
    """Smallest ``t`` whose tail weight (scores ``> t`` if strict, else ``>= t``) is at most ``rate``."""
    order = np.argsort(s, kind="stable")
    s, w = s[order], w[order]
    # tail[i]: weight of the scores from i upwards. Cut just above the highest score whose tail exceeds the rate.
    tail = np.cumsum(w[::-1])[::-1]
    over = np.flatnonzero(tail > rate + 1e-12)
    if over.size == 0:
        return float(s[0]) if strict else float(np.nextafter(s[0], -np.inf))
    i = int(over[-1])
    return float(s[i]) if strict else float(np.nextafter(s[i], np.inf))


def threshold_at_far(impostor: ArrayLike, far: float, *, weights: ArrayLike | None = None) -> float:
    """Smallest ``t`` with ``mean(impostor > t) <= far`` (verification accepts iff ``score > t``).

    ``weights`` (one per score, e.g. so that every public person counts the same whatever their number of
    photos) make it a weighted share. Without impostor scores the threshold is 0.5: a claim is accepted only
    when its subject is the more probable of any two.
    """
    far = check_real(far, "far", low=0.0, high=1.0)
    s = np.asarray(impostor, dtype=np.float64).reshape(-1)
    if s.size == 0:
        return 0.5
    w = _weights(weights, s.size)
    if w is not None:
        return _weighted_threshold(s, w, far, strict=True)
    return float(np.quantile(s, 1.0 - far, method="higher"))


def threshold_at_fpir(best_scores: ArrayLike, fpir: float, *, weights: ArrayLike | None = None) -> float:
    """Smallest ``t`` with ``mean(best_scores >= t) <= fpir`` (identification names iff best ``>= t``).

    With ``n`` strangers at most ``floor(fpir · n)`` of them reach ``t``: ``t`` is just above the
    ``(n − floor(fpir · n))``-th smallest score, so the target is resolved to about ``1/n``. ``weights``: a
    weighted share (see :func:`threshold_at_far`).
    """
    fpir = check_real(fpir, "fpir", low=0.0, high=1.0)
    s = np.sort(np.asarray(best_scores, dtype=np.float64).reshape(-1))
    n = s.size
    if n == 0:
        return 0.0
    w = _weights(weights, n)
    if w is not None:
        return _weighted_threshold(np.asarray(best_scores, dtype=np.float64).reshape(-1), w, fpir, strict=False)
    k = min(int(np.floor(fpir * n + 1e-9)), n - 1)
    return float(np.nextafter(s[n - k - 1], np.inf))


def resolved_share(target: float, n_people: int) -> float:
    """The share of *new* people a threshold set for ``target`` on ``n_people`` public people lets through.

    :func:`threshold_at_fpir` lets ``floor(target · n)`` of the ``n`` people through; a new person's score
    is, by exchangeability, equally likely to fall in any of the ``n + 1`` gaps, so it passes with probability
    ``(floor(target · n) + 1) / (n + 1)`` — above the target unless ``n`` is well over ``1 / target``
    (52 people give 1.9 % for a 1 % target, 1,000 give 1.1 %, 4,069 give 1.007 %).

    Examples
    --------
    >>> round(resolved_share(0.01, 52), 4), round(resolved_share(0.01, 1000), 4)
    (0.0189, 0.011)
    """
    t = check_real(target, "target", low=0.0, high=1.0)
    if isinstance(n_people, bool) or not isinstance(n_people, int | np.integer) or n_people < 1:
        raise ValueError(f"n_people: expected a whole number >= 1, received {n_people!r}")
    n = int(n_people)
    return float(min(1.0, (np.floor(t * n + 1e-9) + 1.0) / (n + 1.0)))


@dataclass(frozen=True, slots=True)
class CleanThresholds:
    """A device's thresholds for clean queries, from public faces the model never saw.

    Attributes
    ----------
    unknown_threshold : float
        Names a query iff its best enrolled probability reaches it.
    verify_threshold : float
        Accepts a claim iff its score exceeds it.
    fpir_target, far_target : float
        What the whole decision (label mechanism included) is calibrated for.
    fpir_model_target : float
        The share of strangers the *model* may name, so that after the label mechanism at most
        ``fpir_target`` are named (equal to ``fpir_target`` without a label mechanism).
    fpir_public, far_public : float
        Shares of the public faces named / impostor scores accepted at these thresholds.
    public_faces, impostor_scores : int
        How many public faces and impostor scores (each face against each enrolled subject) set them.
    """

    unknown_threshold: float
    verify_threshold: float
    fpir_target: float
    far_target: float
    fpir_model_target: float
    fpir_public: float
    far_public: float
    public_faces: int
    impostor_scores: int


def calibrate_clean(
    P_public: ArrayLike,
    known: ArrayLike,
    *,
    fpir: float,
    far: float,
    label_false_positive: float = 0.0,
    label_keep: float = 1.0,
    weights: ArrayLike | None = None,
) -> CleanThresholds:
    """Thresholds for clean queries from the model's probabilities on clean projections of public faces.

    Parameters
    ----------
    P_public : array-like of shape (n_public, n_classes)
        The model's probabilities for clean projections of public people it was never trained on.
    known : array-like of int
        Columns of enrolled subjects.
    fpir : float
        Target share of strangers named as someone, after the label mechanism.
    far : float
        Target share of impostor claims accepted (a door decides locally, nothing randomised).
    label_false_positive, label_keep : float
        Of the label mechanism (:class:`peep.core.labels.RandomizedResponse`): the probability that a
        stranger the model calls unknown is released as some enrolled subject, and the probability that a
        label is released as itself. ``0`` and ``1`` (the default): no label mechanism.
    weights : array-like of shape (n_public,), optional
        Each public face's weight (e.g. ``1 / photos of that person``, so every person counts the same).

    Raises
    ------
    ValueError
        When the label mechanism alone names more than ``fpir`` of strangers: no threshold can meet the
        target (raise ``epsilon_label`` or enrol fewer subjects; the message gives both numbers).
    """
    fpir = check_real(fpir, "fpir", low=0.0, high=1.0)
    far = check_real(far, "far", low=0.0, high=1.0)
    floor = check_real(label_false_positive, "label_false_positive", low=0.0, high=1.0)
    keep = check_real(label_keep, "label_keep", low=0.0, high=1.0)
    arr = _probabilities(P_public)
    k = _known(known, arr.shape[1])
    if arr.shape[0] == 0:
        raise ValueError("P_public: expected clean projections of at least one public face, received none")
    if floor >= fpir:
        raise ValueError(
            f"fpir: expected a target above the label mechanism's own false-positive rate {floor:.4g} "
            f"(a stranger the model calls unknown is released as someone that often), received {fpir:g}"
        )
    # A stranger is released as someone when the model names them and the label survives or moves to
    # another enrolled subject, or when the model calls them unknown and the label moves: with the model
    # naming a share m, the released rate is m·(1 − keep_unknown) + (1 − m)·floor where 1 − keep_unknown is
    # the probability that a named label is released as any enrolled subject, i.e. keep + floor − per_other.
    per_other = floor / max(1, k.size)  # k-RR: each of the other outputs equally likely
    named_stays_named = keep + floor - per_other if floor else 1.0
    model_target = (fpir - floor) / max(named_stays_named - floor, 1e-12) if floor else fpir
    model_target = float(min(max(model_target, 0.0), 1.0))
    Pk = arr[:, k]
    best = Pk.max(axis=1)
    w = _weights(weights, arr.shape[0])
    unknown_threshold = threshold_at_fpir(best, model_target, weights=w)
    impostor = Pk.reshape(-1)
    w_imp = None if w is None else np.repeat(w, k.size)
    verify_threshold = threshold_at_far(impostor, far, weights=w_imp)
    return CleanThresholds(
        unknown_threshold=unknown_threshold,
        verify_threshold=verify_threshold,
        fpir_target=fpir,
        far_target=far,
        fpir_model_target=model_target,
        fpir_public=float(np.average(best >= unknown_threshold, weights=w)),
        far_public=float(np.average(impostor > verify_threshold, weights=w_imp)),
        public_faces=int(arr.shape[0]),
        impostor_scores=int(impostor.size),
    )
