"""The recogniser's thresholds, calibrated on held-out scores for a false-accept rate.

:func:`calibrate_thresholds` takes the class probabilities of the held-out
templates (what :func:`peep.server.recognition.fitting.fit_recogniser`
holds out: a fifth of each enrolled subject's templates and, of the
background, whole people) and sets three thresholds.

Open set. Background templates are never of an identity. A template is
**unknown** when the largest probability of an enrolled subject is below
``unknown_threshold``, calibrated for the false-accept rate:

* with background templates (``metrics["unknown_calibration"]["rule"] ==
  "background-far"``): the smallest threshold at which at most
  ``target_far`` of the held-out background templates are accepted as some
  enrolled subject. Reported: the accepted share, its one-sided 95 %
  Clopper-Pearson upper bound (with ``n`` held-out templates the FAR is
  resolved to about ``1/n``) and the resulting ``enrolled_rejected_rate``
  (enrolled validation templates called unknown) -- the price of the FAR,
  which on noisy templates is high (peep-raw ε = 8, LFW-5, FAR 0.01: about
  0.7 of enrolled captures called unknown; FAR 0.05: about 0.4).
* without (``"enrolled-reject-rate"``, the former rule, kept as the
  fallback and said so in the metadata): at most ``unknown_reject_rate`` of
  the enrolled validation templates fall below it; how often strangers are
  accepted is then not known.

Verification. The score of a claim is the model's probability of the claimed
subject. The threshold is set on held-out *impostor* scores -- every
validation template scored against every enrolled subject it is not,
held-out background people included -- so that the false-accept rate is at
most ``target_far``; accept iff ``score > threshold``.
``metrics["verify_calibration"]`` reports the number of impostor scores
(and how many came from background templates), the FAR reached and its 95 %
upper bound.

Track fusion (:mod:`peep.server.recognition.fusion`). A decision fused from
two releases has its own unknown threshold, calibrated like the single one
on fused pairs of a held-out background person's templates; with fewer than
:data:`MIN_FUSED_PAIRS` pairs there is none and the model never fuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.decision import threshold_at_far, threshold_at_fpir
from peep.server.recognition.fusion import fused_background_scores

__all__ = ["calibration_summary"]

#: Fused background pairs needed to calibrate the fused unknown threshold (fewer: the model never fuses).
MIN_FUSED_PAIRS = 20


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """What :func:`calibrate_thresholds` sets, and what it measured doing so.

    Attributes
    ----------
    unknown_threshold : float
        Unknown iff the best enrolled probability is below it.
    verify_threshold : float
        Accept a claim iff its probability is above it.
    unknown_threshold_fused : float or None
        The unknown threshold of a decision fused from two releases (None: never fuse).
    genuine_scores : ndarray of shape (n_genuine,)
        Probability of the true subject, for each enrolled held-out template.
    impostor_scores : ndarray of shape (n_impostor,)
        Probability of each enrolled subject a held-out template is not.
    unknown_calibration, verify_calibration : dict
        JSON-able reports (``metrics["unknown_calibration"]``, ``metrics["verify_calibration"]``).
    enrolled_rejected_rate : float
        Share of enrolled held-out templates called unknown.
    far, frr : float
        Verification's false-accept and false-reject rates on the held-out templates.
    """

    unknown_threshold: float
    verify_threshold: float
    unknown_threshold_fused: float | None
    genuine_scores: NDArray[np.float64]
    impostor_scores: NDArray[np.float64]
    unknown_calibration: dict[str, Any]
    verify_calibration: dict[str, Any]
    enrolled_rejected_rate: float
    far: float
    frr: float


def calibrate_thresholds(
    P: NDArray[np.float64],
    y: NDArray[np.int64],
    groups: NDArray[Any],
    *,
    background_index: int | None,
    background_people: int,
    class_priors: NDArray[np.float64],
    target_far: float,
    identify_far: float | None,
    unknown_reject_rate: float,
    random_state: int,
) -> Thresholds:
    """Set the unknown, verification and fused thresholds on held-out probabilities.

    Parameters
    ----------
    P : ndarray of shape (n, n_classes)
        Class probabilities of the held-out templates.
    y : ndarray of shape (n,)
        Their classes.
    groups : ndarray of shape (n,)
        Their subject ids: fused pairs are of one background person's templates.
    background_index : int or None
        The background class, if any.
    background_people : int
        How many background people the held-out templates are of (reported).
    class_priors : ndarray of shape (n_classes,)
        Class frequencies of the served model (fusion's product rule).
    target_far : float
        False-accept rate of verification and, with background templates, of identification.
    identify_far : float or None
        False-positive identification rate of the unknown threshold; None = ``target_far``.
    unknown_reject_rate : float
        Without background templates only: share of enrolled templates called unknown.
    random_state : int
        Seeds the pairing of background templates for the fused threshold.
    """
    known = np.array([i for i in range(P.shape[1]) if i != background_index], dtype=np.intp)
    Pk = P[:, known]
    best_known = Pk.max(axis=1)
    genuine_rows = y != (background_index if background_index is not None else -2)
    genuine = P[genuine_rows, y[genuine_rows]]
    impostor_mask = np.ones_like(Pk, dtype=bool)
    pos = {c: j for j, c in enumerate(known)}
    for r in np.flatnonzero(genuine_rows):
        impostor_mask[r, pos[int(y[r])]] = False
    impostor = Pk[impostor_mask]
    verify_threshold = threshold_at_far(impostor, target_far)
    genuine_best = best_known[genuine_rows]
    background_best = best_known[~genuine_rows]
    fpir = target_far if identify_far is None else identify_far
    if background_best.size:
        unknown_threshold, unknown = _unknown_at_fpir(background_best, fpir, background_people)
    else:
        unknown_threshold, unknown = _unknown_at_reject_rate(genuine_best, unknown_reject_rate)
    enrolled_rejected = float(np.mean(genuine_best < unknown_threshold)) if genuine_best.size else 0.0
    unknown["enrolled_rejected_rate"] = enrolled_rejected
    unknown_threshold_fused: float | None = None
    if background_best.size:
        unknown_threshold_fused = _fused_unknown(
            P[~genuine_rows], groups[~genuine_rows], known, class_priors, fpir, random_state, unknown
        )
    far_k = int(np.sum(impostor > verify_threshold))
    far = far_k / impostor.size if impostor.size else 0.0
    return Thresholds(
        unknown_threshold=unknown_threshold,
        verify_threshold=verify_threshold,
        unknown_threshold_fused=unknown_threshold_fused,
        genuine_scores=genuine,
        impostor_scores=impostor,
        unknown_calibration=unknown,
        verify_calibration={
            "target_far": target_far,
            "impostor_scores": int(impostor.size),
            "impostor_scores_background": int(impostor_mask[~genuine_rows].sum()),
            "far": far,
            "far_upper95": _rate_upper95(far_k, int(impostor.size)),
        },
        enrolled_rejected_rate=enrolled_rejected,
        far=far,
        frr=float(np.mean(genuine <= verify_threshold)) if genuine.size else 0.0,
    )


def _unknown_at_fpir(
    background_best: NDArray[np.float64], fpir: float, background_people: int
) -> tuple[float, dict[str, Any]]:
    """The "background-far" rule: at most ``fpir`` of held-out background templates accepted."""
    threshold = threshold_at_fpir(background_best, fpir)
    accepted = int(np.sum(background_best >= threshold))
    return threshold, {
        "rule": "background-far",
        "target_far": fpir,
        "background_templates": int(background_best.size),
        "background_subjects": background_people,
        "background_accepted_rate": accepted / background_best.size,
        "background_accepted_upper95": _rate_upper95(accepted, int(background_best.size)),
    }


def _unknown_at_reject_rate(genuine_best: NDArray[np.float64], rate: float) -> tuple[float, dict[str, Any]]:
    """The fallback without background templates: at most ``rate`` of enrolled templates called unknown."""
    threshold = float(np.quantile(genuine_best, rate, method="lower")) if genuine_best.size else 0.0
    return threshold, {
        "rule": "enrolled-reject-rate",
        "unknown_reject_rate": rate,
        "note": (
            "no background templates: the threshold lets at most unknown_reject_rate of enrolled validation "
            "templates be called unknown; how often strangers are accepted is not calibrated"
        ),
    }


def _fused_unknown(
    P_background: NDArray[np.float64],
    groups: NDArray[Any],
    known: NDArray[np.intp],
    class_priors: NDArray[np.float64],
    fpir: float,
    random_state: int,
    report: dict[str, Any],
) -> float | None:
    """The fused unknown threshold on pairs of one background person's templates (None: too few); adds to ``report``."""
    pairing = np.random.default_rng(random_state + 1)  # its own stream: the fit's draws stay as they were
    fused = fused_background_scores(P_background, groups, known, class_priors, pairing)
    report["fused_pairs"] = int(fused.size)
    if fused.size < MIN_FUSED_PAIRS:
        report["fused"] = f"off: fewer than {MIN_FUSED_PAIRS} pairs of background templates of one person"
        return None
    threshold = threshold_at_fpir(fused, fpir)
    report["fused_accepted_rate"] = float(np.mean(fused >= threshold))
    return threshold


def _rate_upper95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate observed as ``k`` of ``n``."""
    from scipy.stats import beta

    if n == 0:
        return 1.0
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def calibration_summary(metrics: dict[str, Any]) -> str:
    """One line on what the thresholds cost and (for ``auto``) which preset was chosen, from ``metrics``.

    >>> metrics = {"unknown_calibration": {"rule": "enrolled-reject-rate", "enrolled_rejected_rate": 0.04},
    ...            "verify_calibration": {"target_far": 0.01, "far": 0.009}}
    >>> for part in calibration_summary(metrics).split("; "):
    ...     print(part)
    unknown: no background templates, 4.0% of enrolled validation templates called unknown (strangers not calibrated)
    verify: FAR 0.9% (target 1.0%)
    """
    parts: list[str] = []
    chosen = metrics.get("preset_fit", {}).get("chosen")
    if chosen is not None:
        accs = metrics["preset_fit"].get("validation_accuracy", {})
        parts.append(
            f"auto chose {chosen} ("
            + ", ".join(f"{n} {a:.3f}" for n, a in accs.items() if a is not None)
            + " validation accuracy)"
        )
    u = metrics.get("unknown_calibration", {})
    if u.get("rule") == "background-far":
        parts.append(
            f"unknown: {100 * u['background_accepted_rate']:.1f}% of {u['background_templates']} held-out background "
            f"templates accepted (target {100 * u['target_far']:.1f}%, 95% bound "
            f"{100 * u['background_accepted_upper95']:.1f}%), {100 * u['enrolled_rejected_rate']:.1f}% of enrolled "
            "validation templates called unknown"
        )
    elif u:
        parts.append(
            f"unknown: no background templates, {100 * u['enrolled_rejected_rate']:.1f}% of enrolled validation "
            "templates called unknown (strangers not calibrated)"
        )
    v = metrics.get("verify_calibration")
    if v:
        parts.append(f"verify: FAR {100 * v['far']:.1f}% (target {100 * v['target_far']:.1f}%)")
    return "; ".join(parts)
