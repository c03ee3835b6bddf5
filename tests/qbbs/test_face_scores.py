"""Face-score providers: the adapters the recognition server plugs into the query module."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from peep.server.qbbs import ClassifierFaceScores, FaceScoreProvider, RecogniserFaceScores
from peep.server.qbbs.face import genuine_impostor_scores


def test_genuine_impostor_split():
    s = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]])
    g, i = genuine_impostor_scores(s, [0, 2])
    assert g.tolist() == [0.9, 0.5] and sorted(i.tolist()) == [0.0, 0.1, 0.2, 0.3]


def test_recogniser_adapter_scores_in_log_space_and_skips_the_background_class():
    P = np.array([[0.7, 0.2, 0.1]])
    fitted = SimpleNamespace(
        class_names=["alice", "bob", ""],
        predict_proba=lambda X: np.repeat(P, len(X), axis=0),
        genuine_scores=np.array([0.9, 0.8]),
        impostor_scores=np.array([0.05, 0.0]),
    )
    scores = RecogniserFaceScores(fitted, model_version="v3")
    assert isinstance(scores, FaceScoreProvider)
    assert scores.face_score("bob", np.zeros(4, np.float32)) == pytest.approx(math.log(0.2))
    with pytest.raises(KeyError):
        scores.face_score("", np.zeros(4, np.float32))
    g, i = scores.validation_scores()
    assert g == pytest.approx(np.log([0.9, 0.8]))
    assert i == pytest.approx([math.log(0.05), math.log(1e-12)])  # floored, finite


def test_classifier_adapter_with_a_real_sklearn_model(rng):
    from sklearn.linear_model import LogisticRegression

    X = np.concatenate([rng.normal(0, 1, (40, 3)), rng.normal(3, 1, (40, 3))]).astype(np.float32)
    y = np.array(["ann"] * 40 + ["ben"] * 40)
    clf = LogisticRegression().fit(X, y)
    scores = ClassifierFaceScores(clf, X[::4], y[::4])
    assert scores.face_score("ben", X[-1]) > scores.face_score("ann", X[-1])
    g, i = scores.validation_scores()
    assert g.size == 20 and i.size == 20 and np.median(g) > np.median(i)
    with pytest.raises(ValueError, match="values"):
        scores.face_score("ann", np.zeros(5, np.float32))
    with pytest.raises(KeyError):
        scores.face_score("cat", X[0])
