"""``peep qbbs evaluate``'s building blocks: the server's recogniser."""

from __future__ import annotations

import numpy as np
import pytest
from peep.lab.qbbs.evaluation import _train_recogniser
from peep.server.recognition import fitting, presets


@pytest.mark.parametrize("preset", ["reference", None])
def test_the_face_recogniser_is_the_servers_preset(monkeypatch, preset):
    real = fitting.fit_recogniser
    calls: list[dict] = []

    def spy(X, subjects, **kwargs):
        calls.append(kwargs)
        return real(X, subjects, **kwargs)

    monkeypatch.setattr(fitting, "fit_recogniser", spy)
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 12)
    X = (rng.normal(size=(36, 6)) + 3.0 * rng.normal(size=(3, 6))[y]).astype(np.float32)
    subjects = ["s0002", "s0000", "s0001"]
    kwargs = {} if preset is None else {"preset": preset}
    proba, info = _train_recogniser(X, y, subjects, seed=0, **kwargs)
    expected = preset or presets.DEFAULT_PRESET
    assert len(calls) == 1 and calls[0]["preset"] == expected and calls[0]["background_prefix"] == ""
    assert info["preset"] == expected and info["parameters"] == presets.PRESETS[expected].describe()
    P = proba(X)
    assert P.shape == (36, 3)  # columns in the order of ``subjects``
    assert np.mean(P.argmax(axis=1) == y) > 0.9
