"""Where the template noise costs a device's model FNIR: in the class means or in the shared covariance.

A model trained on releases decides on a device's clean projection. For a linear discriminant (the ``lda``
preset), the audit's open-set section swaps one of its two learnt parts for the clean model's (fitted on the
same people's clean templates) and measures FNIR again: a gap that closes with the clean means is the cost of
estimating each enrolled person's mean from a few noisy releases, one that closes with the clean covariance
is the noise inflating the covariance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

__all__ = ["NOISE_COST_MODES", "lda_parts", "noise_cost_models", "with_lda_parts"]


#: Modes of the rows that say which part of a linear discriminant the template noise costs FNIR in.
NOISE_COST_MODES = ("clean_means", "clean_covariance")


def lda_parts(fitted: Any) -> tuple[Any, FloatArray, FloatArray, FloatArray] | None:
    """``(lda, means, covariance, priors)`` of a fitted recogniser that is a discriminant analysis, else None."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    if fitted is None:
        return None
    steps = [s for _, s in getattr(fitted.pipeline, "steps", [("clf", fitted.pipeline)])]
    lda = steps[-1]
    if len(steps) != 1 or not isinstance(lda, LinearDiscriminantAnalysis) or getattr(lda, "covariance_", None) is None:
        return None
    return lda, np.asarray(lda.means_), np.asarray(lda.covariance_), np.asarray(lda.priors_)


def with_lda_parts(fitted: Any, means: FloatArray, covariance: FloatArray) -> Any:
    """A copy of a discriminant-analysis recogniser deciding with the given class means and shared covariance.

    The discriminant is recomputed as scikit-learn's ``lsqr`` solver computes it (``coef = Σ⁻¹ μₖ``,
    ``intercept = −½ μₖᵀ Σ⁻¹ μₖ + log πₖ``), with the model's own priors.
    """
    import copy

    parts = lda_parts(fitted)
    if parts is None:
        raise ValueError("fitted: expected a recogniser whose pipeline is one LinearDiscriminantAnalysis")
    lda, _, _, priors = parts
    out = copy.deepcopy(fitted)
    new = lda_parts(out)[0]  # type: ignore[index]  # the copy is the same kind of model
    coef = np.linalg.lstsq(covariance, means.T, rcond=None)[0].T
    new.coef_ = coef
    new.intercept_ = -0.5 * np.einsum("kd,kd->k", means, coef) + np.log(priors)
    new.means_, new.covariance_ = means, covariance
    if len(lda.classes_) == 2:  # scikit-learn keeps one discriminant for two classes
        new.coef_ = (coef[1] - coef[0])[None, :]
        new.intercept_ = np.array([new.intercept_[1] - new.intercept_[0]])
    return out


def noise_cost_models(served: Any, clean: Any) -> dict[str, Any]:
    """The served (release-trained) discriminant with its class means, or its covariance, from the clean model.

    ``clean_means``: the releases' covariance with the means of the clean templates; ``clean_covariance``: the
    clean covariance with the releases' means. Their FNIR beside the served model's and the no-noise model's
    says whether what the template noise costs is in the class means (one mean per person from a few noisy
    releases) or in the covariance (which the noise inflates). Both models must have the same classes.
    """
    a, b = lda_parts(served), lda_parts(clean)
    if a is None or b is None or list(served.class_names) != list(clean.class_names):
        return {}
    return {
        "clean_means": with_lda_parts(served, b[1], a[2]),
        "clean_covariance": with_lda_parts(served, a[1], b[2]),
    }
