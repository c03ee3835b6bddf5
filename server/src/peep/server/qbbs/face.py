"""Face scores for fused verification: the interface the recognition server implements.

The query module needs two things from a face recogniser:

* the score of one perturbed template against a claimed subject, and
* genuine and impostor scores on validation data, to fit the Parzen-window
  densities behind P(genuine | score) (chapter Eq. 5.5).

:class:`ClassifierFaceScores` adapts any fitted scikit-learn-style classifier
(``predict_proba`` + ``classes_``), e.g. the server's MLP trained on
perturbed templates; the score is ``log P(claimed | template)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "ClassifierFaceScores",
    "FaceScoreProvider",
    "RecogniserFaceScores",
    "StaticFaceScores",
    "genuine_impostor_scores",
]

#: Probabilities are floored here before the log, so scores stay finite.
PROBA_FLOOR = 1e-12


@runtime_checkable
class FaceScoreProvider(Protocol):
    """What the query module asks of a face recogniser.

    ``model_version`` (optional attribute): when it changes, the module refits
    its Parzen densities from :meth:`validation_scores`.
    """

    def face_score(self, claimed_subject: str, values: NDArray[np.float32], *, template: Any = None) -> float:
        """Score of perturbed template ``values`` (shape (nc,)) against ``claimed_subject``.

        Raise ``KeyError`` for an unknown subject and ``ValueError`` for a
        template the recogniser cannot score (wrong bundle or length);
        :class:`~peep.server.qbbs.errors.FaceScoreUnavailableError` when no
        model can score at all right now (gRPC ``FAILED_PRECONDITION``).
        """
        ...

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(genuine, impostor)`` scores of held-out templates, same scale as :meth:`face_score`."""
        ...


def genuine_impostor_scores(scores: ArrayLike, labels: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Split a (n_probes, n_classes) score matrix into genuine and impostor scores.

    ``labels`` holds each probe's true class index.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    mask = np.zeros(s.shape, dtype=bool)
    mask[np.arange(s.shape[0]), y] = True
    return s[mask], s[~mask]


class ClassifierFaceScores:
    """Face scores ``log P(claimed | template)`` from a fitted probabilistic classifier.

    Parameters
    ----------
    classifier : object
        Fitted, with ``predict_proba`` and ``classes_`` (subject ids).
    validation_values : array-like of shape (n, nc)
        Held-out perturbed templates (not used for training).
    validation_labels : sequence of subject ids, length n
    model_version : str, default ""
    """

    def __init__(
        self,
        classifier: Any,
        validation_values: ArrayLike,
        validation_labels: Sequence[Any],
        *,
        model_version: str = "",
    ) -> None:
        self.classifier = classifier
        self.classes = [str(c) for c in classifier.classes_]
        self._index = {c: i for i, c in enumerate(self.classes)}
        self.model_version = model_version
        X = np.asarray(validation_values, dtype=np.float32)
        labels = [str(v) for v in validation_labels]
        unknown = sorted({v for v in labels if v not in self._index})
        if unknown:
            raise ValueError(f"validation_labels: expected subjects the classifier knows, received {unknown[:5]}")
        self._val = (X, np.array([self._index[v] for v in labels], dtype=np.int64))

    def log_proba(self, values: ArrayLike) -> NDArray[np.float64]:
        """log P(class | template), shape (n, n_classes)."""
        X = np.atleast_2d(np.asarray(values, dtype=np.float32))
        p = np.asarray(self.classifier.predict_proba(X), dtype=np.float64)
        out: NDArray[np.float64] = np.log(np.maximum(p, PROBA_FLOOR))
        return out

    def face_score(self, claimed_subject: str, values: NDArray[np.float32], *, template: Any = None) -> float:
        if claimed_subject not in self._index:
            raise KeyError(claimed_subject)
        v = np.asarray(values, dtype=np.float32).ravel()
        expected = getattr(self.classifier, "n_features_in_", v.size)
        if v.size != expected:
            raise ValueError(f"template.values: expected {expected} values, received {v.size}")
        return float(self.log_proba(v)[0, self._index[claimed_subject]])

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        X, y = self._val
        return genuine_impostor_scores(self.log_proba(X), y)


class RecogniserFaceScores:
    """Face scores from the server's trained recogniser (:class:`peep.server.recognition.fitting.FittedRecogniser`).

    The score is ``log P(claimed | template)`` (floored at 1e-12); the
    validation scores are the recogniser's own held-out genuine and impostor
    probabilities, on the same log scale.

    Parameters
    ----------
    fitted : FittedRecogniser-like
        Has ``class_names`` (background class ``""`` ignored), ``predict_proba``,
        ``genuine_scores`` and ``impostor_scores``.
    proba : callable, optional
        ``values (n, nc) float32 -> probabilities (n, n_classes)``, e.g. the
        served ONNX session; defaults to ``fitted.predict_proba``.
    model_version : str
        When it changes the query module refits its Parzen densities.
    """

    def __init__(self, fitted: Any, *, proba: Any = None, model_version: str = "") -> None:
        self.fitted = fitted
        self._proba = proba if proba is not None else fitted.predict_proba
        self._index = {str(n): i for i, n in enumerate(fitted.class_names) if n}
        self.model_version = model_version

    def face_score(self, claimed_subject: str, values: NDArray[np.float32], *, template: Any = None) -> float:
        if claimed_subject not in self._index:
            raise KeyError(claimed_subject)
        v = np.asarray(values, dtype=np.float32).reshape(1, -1)
        p = float(np.asarray(self._proba(v), dtype=np.float64)[0, self._index[claimed_subject]])
        return math.log(max(p, PROBA_FLOOR))

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        g = np.log(np.maximum(np.asarray(self.fitted.genuine_scores, dtype=np.float64), PROBA_FLOOR))
        i = np.log(np.maximum(np.asarray(self.fitted.impostor_scores, dtype=np.float64), PROBA_FLOOR))
        return g, i


class StaticFaceScores:
    """A fixed score table (tests, or scores computed elsewhere).

    Parameters
    ----------
    scores : mapping of subject -> float, or callable(subject, values) -> float
    genuine, impostor : array-like
        Validation scores.
    """

    def __init__(self, scores: Any, genuine: ArrayLike, impostor: ArrayLike, *, model_version: str = "") -> None:
        self._scores = scores
        self._genuine = np.asarray(genuine, dtype=np.float64)
        self._impostor = np.asarray(impostor, dtype=np.float64)
        self.model_version = model_version

    def face_score(self, claimed_subject: str, values: NDArray[np.float32], *, template: Any = None) -> float:
        if callable(self._scores):
            return float(self._scores(claimed_subject, values))
        value = self._scores[claimed_subject]
        if not math.isfinite(value):
            raise ValueError(f"face score of {claimed_subject!r} is not finite")
        return float(value)

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self._genuine, self._impostor
