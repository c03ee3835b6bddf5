"""A linear recogniser as one matrix: what the device models and the ONNX export are built from.

Below both :mod:`~peep.server.recognition.fitting` (which asks whether a fitted pipeline is linear) and
:mod:`~peep.server.recognition.export` (which writes it), so that neither imports the other back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


def linear_parts(pipeline: Any) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """``(W, b)`` with ``predict_proba(X) == softmax(X @ W + b)`` for a linear pipeline, else None.

    A linear pipeline is ``[StandardScaler,] clf`` with ``clf`` a
    :class:`~sklearn.discriminant_analysis.LinearDiscriminantAnalysis` or
    :class:`~sklearn.linear_model.LogisticRegression`: their probabilities
    are the softmax of ``decision_function`` (for two classes the logistic
    of the single decision ``z``, which is ``softmax([0, z])``). The scaler is
    folded into ``W`` and ``b``.

    Returns
    -------
    W : ndarray of shape (n_features, n_classes)
    b : ndarray of shape (n_classes,)
    """
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    steps = [s for _, s in getattr(pipeline, "steps", [("clf", pipeline)])]
    clf = steps[-1]
    if not isinstance(clf, LinearDiscriminantAnalysis | LogisticRegression):
        return None
    coef = np.asarray(clf.coef_, dtype=np.float64)
    icpt = np.asarray(clf.intercept_, dtype=np.float64).reshape(-1)
    if coef.shape[0] == 1:
        coef = np.vstack([np.zeros_like(coef), coef])
        icpt = np.concatenate([[0.0], icpt])
    W, b = coef.T.copy(), icpt.copy()
    for step in reversed(steps[:-1]):
        if not isinstance(step, StandardScaler):
            return None
        scale = np.asarray(step.scale_, dtype=np.float64) if step.scale_ is not None else np.ones(W.shape[0])
        mean = np.asarray(step.mean_, dtype=np.float64) if step.mean_ is not None else np.zeros(W.shape[0])
        W = W / scale[:, None]
        b = b - mean @ W
    if W.shape[1] != len(clf.classes_):
        return None
    return W, b
