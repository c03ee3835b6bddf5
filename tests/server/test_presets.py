"""The recogniser presets: one registry, fitted by one function for the server, the audit and QBBS."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from peep.server.recognition.fitting import (
    DEFAULT_PRESET,
    PRESETS,
    EstimatorPreset,
    MLPPreset,
    Preset,
    TrainingError,
    check_onnx_agreement,
    export_onnx,
    fit_recogniser,
    get_preset,
    model_meta,
)


def _blobs(n_classes: int = 4, per_class: int = 30, dim: int = 10, spread: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    X = rng.normal(size=(y.size, dim)) + spread * rng.normal(size=(n_classes, dim))[y]
    return X.astype(np.float32), y.astype(np.int64)


def test_every_registered_preset_names_itself_and_says_what_it_is():
    assert DEFAULT_PRESET in PRESETS
    assert {"paper", "default", "reference"} <= set(PRESETS)
    for name, preset in PRESETS.items():
        assert isinstance(preset, Preset)
        assert preset.name == name and preset.description
        described = preset.describe()
        assert described["name"] == name and described["type"] == type(preset).__name__


def test_an_unknown_preset_is_refused_naming_the_choices():
    with pytest.raises(TrainingError, match=r"preset: expected one of paper, default, reference.*'nope'"):
        get_preset("nope")
    assert get_preset("reference") is PRESETS["reference"]
    own = replace(PRESETS["default"], max_epochs=1)
    assert get_preset(own) is own


def test_the_server_config_takes_its_default_and_choices_from_the_registry():
    from peep.server.config import TrainingConfig

    assert TrainingConfig().preset == DEFAULT_PRESET
    assert TrainingConfig(preset="reference").preset == "reference"
    with pytest.raises(ValueError, match="expected one of paper, default, reference"):
        TrainingConfig(preset="nope")


def test_reference_preset_is_sklearns_default_mlp():
    """The audit's reference recogniser, MLPClassifier(hidden_layer_sizes=(512,)) with defaults, stays reproducible."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    ref = PRESETS["reference"]
    assert isinstance(ref, MLPPreset)
    mlp = MLPClassifier()
    assert ref.hidden_layer_sizes == (512,) and ref.standardise is False and ref.stopping == "train-loss"
    assert (ref.activation, ref.solver, ref.alpha, ref.learning_rate_init) == (
        mlp.activation,
        mlp.solver,
        mlp.alpha,
        mlp.learning_rate_init,
    )
    assert (ref.batch_size, ref.max_epochs, ref.patience, ref.tol) == (200, mlp.max_iter, mlp.n_iter_no_change, mlp.tol)
    # Fitted on the same data it is that estimator: same epochs (including where scikit-learn's
    # stopping rule ends training early), same probabilities up to float32 rounding. A small
    # network and a coarse tolerance keep the test fast and make the stopping rule fire.
    for seed, tol in ((0, 1e-2), (1, 3e-3)):
        X, y = _blobs(seed=seed)
        small = replace(ref, hidden_layer_sizes=(16,), tol=tol)
        pipeline, epochs = small.fit_estimator(
            X, y, n_classes=4, X_val=None, y_val=None, random_state=seed, progress=None, cancel=None
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            sk = MLPClassifier(hidden_layer_sizes=(16,), tol=tol, random_state=seed).fit(X, y)
        assert epochs == sk.n_iter_ < small.max_epochs
        np.testing.assert_allclose(pipeline.predict_proba(X), sk.predict_proba(X), atol=1e-5)


def test_a_new_kind_of_recogniser_is_one_preset_object():
    """What the next presets (shrinkage LDA, logistic regression) need: fit, calibrate, export, check."""
    from sklearn.linear_model import LogisticRegression

    logreg = EstimatorPreset(
        name="logreg-test",
        description="logistic regression on standardised templates",
        build=lambda seed: LogisticRegression(C=0.5, max_iter=500, random_state=seed),
    )
    X, y = _blobs(n_classes=3, per_class=20, dim=8, spread=2.0)
    fitted = fit_recogniser(X, [f"s{v}" for v in y], preset=logreg, random_state=0)
    assert fitted.preset is logreg and fitted.n_epochs == 1
    assert fitted.metrics["validation_accuracy"] > 0.8
    check_onnx_agreement(fitted, export_onnx(fitted, X.shape[1]))
    meta = model_meta(fitted, bundle_id="b", kinds=["peep-raw"], n_components=8, n_templates=len(y))
    assert meta["preset"]["name"] == "logreg-test" and "LogisticRegression" in meta["preset"]["estimator"]
