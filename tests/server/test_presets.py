"""The recogniser presets: one registry, fitted by one function for the server, the audit and QBBS."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
from peep.server.recognition.export import (
    check_onnx_agreement,
    export_onnx,
    model_meta,
    onnx_probabilities,
    onnx_session,
)
from peep.server.recognition.fitting import fit_recogniser, split_groups
from peep.server.recognition.linear import linear_parts
from peep.server.recognition.presets import (
    DEFAULT_PRESET,
    PRESETS,
    AutoPreset,
    EstimatorPreset,
    FitData,
    LogisticPreset,
    MLPPreset,
    Preset,
    TrainingCancelled,
    TrainingError,
    get_preset,
)


def _blobs(n_classes: int = 4, per_class: int = 30, dim: int = 10, spread: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    X = rng.normal(size=(y.size, dim)) + spread * rng.normal(size=(n_classes, dim))[y]
    return X.astype(np.float32), y.astype(np.int64)


def test_every_registered_preset_names_itself_and_says_what_it_is():
    assert DEFAULT_PRESET in PRESETS
    assert {"paper", "default", "reference", "lda", "logreg", "auto"} <= set(PRESETS)
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
    from peep.server.config.data import DEFAULT_PRESET as CONFIG_DEFAULT
    from peep.server.config.data import PRESET_NAMES

    # The configuration holds the names (it must not import recognition): the same, in the registry's order.
    assert PRESET_NAMES == tuple(PRESETS) and CONFIG_DEFAULT == DEFAULT_PRESET
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
        pipeline, epochs = small.fit_estimator(FitData(X=X, y=y, n_classes=4, random_state=seed))
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


# --------------------------------------------------------------------------- noise-aware presets

NEW = ("lda", "logreg", "auto")


def _people(n_people: int, per: int, dim: int, rng: np.random.Generator, *, spread: float = 1.0, noise: float = 1.0):
    """Templates of ``n_people`` new people: a mean each (the identity) plus isotropic noise per template."""
    means = spread * rng.normal(size=(n_people, dim)) / np.sqrt(dim)
    who = np.repeat(np.arange(n_people), per)
    return (means[who] + noise * rng.normal(size=(who.size, dim)) / np.sqrt(dim)).astype(np.float32), who


def _privunit_people(n_people: int, per: int, dim: int, epsilon: float, seed: int):
    """Unit-vector identities released by PrivUnit (seeded noise: a simulation), as the server receives them."""
    from peep.core import features
    from peep.core.mechanisms import mechanism_class

    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_people, dim))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    who = np.repeat(np.arange(n_people), per)
    with features.enabled("seeded-noise"):
        mech = mechanism_class("privunit")(epsilon=epsilon, n_components=dim, random_state=seed)
        X = np.asarray(mech.release(means[who]), dtype=np.float32)
    return X, who, float(mech.noise_std)


def test_the_noise_aware_presets_are_registered_with_their_parameters():
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    lda = PRESETS["lda"]
    assert isinstance(lda, EstimatorPreset) and lda.standardise is False
    est = lda.build(0)
    assert isinstance(est, LinearDiscriminantAnalysis) and (est.solver, est.shrinkage) == ("lsqr", "auto")
    logreg = PRESETS["logreg"]
    assert isinstance(logreg, LogisticPreset) and logreg.standardise and min(logreg.Cs) < logreg.fallback_C
    auto = PRESETS["auto"]
    assert isinstance(auto, AutoPreset) and auto.candidates == ("lda", "logreg", "default")
    assert json.loads(json.dumps(auto.describe()))["candidates"] == ["lda", "logreg", "default"]


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("n_subjects", [1, 2, 5])
def test_each_new_preset_fits_calibrates_and_exports_on_privunit_templates(name, n_subjects):
    """Enrolled people plus background people, all PrivUnit unit vectors (d = 32, ε = 16: noise std ~0.18)."""
    X, who, noise_std = _privunit_people(n_subjects + 30, 40, 32, 16.0, seed=n_subjects)
    assert 0.1 < noise_std < 0.3
    subjects = [f"s{w}" if w < n_subjects else f"background:{w}" for w in who]
    fitted = fit_recogniser(X, subjects, preset=name, random_state=0)
    assert fitted.preset is PRESETS[name] and fitted.background_index == n_subjects
    assert fitted.metrics["validation_accuracy"] > 0.6 or n_subjects == 1
    cal = fitted.metrics["unknown_calibration"]
    assert cal["rule"] == "background-far" and cal["background_accepted_rate"] <= fitted.target_far
    assert 0.0 < fitted.unknown_threshold <= 1.0 and 0.0 < fitted.verify_threshold < 1.0
    model = export_onnx(fitted, X.shape[1])
    stats = check_onnx_agreement(fitted, model)
    assert stats["onnx_max_abs_diff"] < 1e-5
    fresh, _, _ = _privunit_people(n_subjects + 30, 3, 32, 16.0, seed=99)
    np.testing.assert_allclose(onnx_probabilities(onnx_session(model), fresh), fitted.predict_proba(fresh), atol=1e-5)
    meta = model_meta(fitted, bundle_id="b", kinds=["privunit"], n_components=32, n_templates=len(subjects))
    assert meta["preset"]["name"] == name and meta["metrics"]["unknown_calibration"]["rule"] == "background-far"
    json.dumps(meta)  # model.json


@pytest.mark.parametrize("n_classes", [2, 3, 6])
@pytest.mark.parametrize("clf", ["lda", "lda-svd", "lda-eigen", "logreg", "logreg-raw"])
def test_linear_models_export_as_the_linear_graph_they_are(clf, n_classes):
    """softmax(X W + b) with the scaler folded in is predict_proba, for two classes (logistic) and more (softmax)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _blobs(n_classes=n_classes, per_class=25, dim=12, spread=1.5, seed=n_classes)
    X = X * np.linspace(0.1, 5.0, 12, dtype=np.float32) + 3.0  # scales and offsets the scaler must fold away
    X64 = X.astype(np.float64)  # float64 fit: the identity is then exact to rounding
    est = {
        "lda": LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto"),
        "lda-svd": LinearDiscriminantAnalysis(),
        "lda-eigen": LinearDiscriminantAnalysis(solver="eigen", shrinkage=0.3),
        "logreg": LogisticRegression(C=0.3, max_iter=2000),
        "logreg-raw": LogisticRegression(C=0.3, max_iter=5000),
    }[clf]
    steps = [] if clf in ("lda-svd", "logreg-raw") else [("scaler", StandardScaler())]
    pipeline = Pipeline([*steps, ("clf", est)]).fit(X64, y)
    parts = linear_parts(pipeline)
    assert parts is not None
    W, b = parts
    Z = X64 @ W + b
    P = np.exp(Z - Z.max(1, keepdims=True))
    np.testing.assert_allclose(P / P.sum(1, keepdims=True), pipeline.predict_proba(X64), atol=1e-10)
    fitted = replace(
        fit_recogniser(X, [f"s{v}" for v in y], preset="lda"),
        pipeline=pipeline,
        val_values=X,
        val_probabilities=np.asarray(pipeline.predict_proba(X), dtype=np.float64),
    )
    model = export_onnx(fitted, X.shape[1])
    assert check_onnx_agreement(fitted, model)["onnx_max_abs_diff"] < 1e-5
    sess = onnx_session(model)
    label = sess.run(["label"], {"values": X})[0]
    np.testing.assert_array_equal(label, pipeline.predict_proba(X).argmax(1))


def test_an_mlp_is_not_a_linear_model_and_goes_through_skl2onnx():
    X, y = _blobs(n_classes=3, per_class=20, dim=6)
    fitted = fit_recogniser(X, [f"s{v}" for v in y], preset=replace(PRESETS["default"], max_epochs=3))
    assert linear_parts(fitted.pipeline) is None
    check_onnx_agreement(fitted, export_onnx(fitted, X.shape[1]))


def test_logreg_chooses_c_by_validation_log_loss():
    X, y = _blobs(n_classes=4, per_class=40, dim=16, spread=0.6, seed=3)
    fitted = fit_recogniser(X, [f"s{v}" for v in y], preset="logreg", random_state=0)
    notes = fitted.metrics["preset_fit"]
    losses = notes["validation_log_loss"]
    assert set(losses) == {f"{c:g}" for c in PRESETS["logreg"].Cs}
    assert notes["C"] == float(min(losses, key=losses.get)) and notes["C_chosen_by"] == "validation log-loss"
    assert fitted.pipeline.steps[-1][1].C == notes["C"]
    # Without validation templates there is nothing to choose on: the documented fallback.
    pipe, _ = PRESETS["logreg"].fit_estimator(data := FitData(X=X, y=y, n_classes=4))
    assert pipe.steps[-1][1].C == PRESETS["logreg"].fallback_C and data.notes["C_chosen_by"].startswith("fallback")


def _heavy_noise(seed: int):
    """Ten linearly separable Gaussian classes, few noisy templates each: the shared-covariance model's home."""
    rng = np.random.default_rng(seed)
    X, y = _people(10, 30, 64, rng, spread=3.0, noise=9.0)
    return X, [f"s{v}" for v in y]


def _xor(seed: int):
    """Two classes that no linear model separates (each is two opposite clusters)."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 4, size=240)
    X = 0.3 * rng.normal(size=(c.size, 8))
    X[:, :2] += np.array([[1, 1], [-1, -1], [1, -1], [-1, 1]])[c]
    return X.astype(np.float32), [f"s{int(v >= 2)}" for v in c]


@pytest.mark.slow
@pytest.mark.parametrize(("data", "winner"), [(_heavy_noise, "lda"), (_xor, "default")])
def test_auto_keeps_the_candidate_with_the_best_validation_accuracy(data, winner):
    X, subjects = data(0)
    auto = fit_recogniser(X, subjects, preset="auto", random_state=0)
    notes = auto.metrics["preset_fit"]
    # Each candidate fitted on its own, on the same split, scores what auto recorded for it.
    alone = {n: fit_recogniser(X, subjects, preset=n, random_state=0) for n in PRESETS["auto"].candidates}
    for n, f in alone.items():
        # (a linear model is then cross-fitted: its split accuracy is kept apart from the out-of-fold one)
        split = f.metrics.get("split_validation_accuracy", f.metrics["validation_accuracy"])
        assert notes["validation_accuracy"][n] == pytest.approx(split)
        assert notes["candidates"][n]["validation_accuracy"] == notes["validation_accuracy"][n]
    accs = notes["validation_accuracy"]
    assert notes["chosen"] == winner == max(accs, key=accs.get) and notes["chosen_by"] == "validation accuracy"
    # ... and is a clear winner, so the test says something about the data and not about ties.
    assert accs[winner] > max(a for n, a in accs.items() if n != winner) + 0.03, accs
    assert auto.metrics["validation_accuracy"] == pytest.approx(alone[winner].metrics["validation_accuracy"])
    np.testing.assert_allclose(auto.val_probabilities, alone[winner].val_probabilities, atol=1e-6)
    meta = model_meta(auto, bundle_id="b", kinds=["peep-raw"], n_components=X.shape[1], n_templates=len(subjects))
    assert meta["preset"]["name"] == "auto" and meta["metrics"]["preset_fit"]["chosen"] == winner
    check_onnx_agreement(auto, export_onnx(auto, X.shape[1]))


def test_auto_reports_progress_over_all_candidates_and_can_be_cancelled():
    import threading

    X, subjects = _heavy_noise(1)
    calls: list[tuple[int, int]] = []
    fit_recogniser(X, subjects, preset="auto", progress=lambda d, t: calls.append((d, t)))
    assert {t for _, t in calls} == {3000} and calls[-1] == (3000, 3000)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    ev = threading.Event()
    ev.set()
    with pytest.raises(TrainingCancelled):
        fit_recogniser(X, subjects, preset="auto", cancel=ev)


def test_auto_refuses_itself_as_a_candidate():
    X, subjects = _heavy_noise(2)
    loop = AutoPreset(name="loop", candidates=("lda", "auto"))
    with pytest.raises(TrainingError, match="loop: expected candidates that are not 'auto' presets, received 'auto'"):
        fit_recogniser(X, subjects, preset=loop)


# --------------------------------------------------------------------------- open set: calibrated unknown


def _open_set(seed: int, *, n_background: int = 5000, per_background: int = 1):
    """Five enrolled people and a public background population, plus fresh strangers (never seen anywhere).

    One template per background person and stranger, so that held-out templates are independent and the
    accepted share is binomial (templates of one person are correlated: with several each, the calibration's
    error is that of the number of held-out *people*).
    """
    rng = np.random.default_rng(seed)
    Xe, ye = _people(5, 60, 16, rng, spread=2.0, noise=1.0)
    Xb, yb = _people(n_background, per_background, 16, rng, spread=2.0, noise=1.0)
    Xs, _ = _people(5000, 1, 16, rng, spread=2.0, noise=1.0)
    subjects = [f"s{v}" for v in ye] + [f"background:{v}" for v in yb]
    return np.vstack([Xe, Xb]), subjects, Xs


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["lda", "logreg"])
def test_unknown_is_calibrated_so_about_target_far_of_strangers_are_accepted(preset):
    X, subjects, strangers = _open_set(0)
    thresholds, rejected = [], []
    for far in (0.01, 0.05, 0.1):
        f = fit_recogniser(X, subjects, preset=preset, target_far=far, random_state=0)
        cal = f.metrics["unknown_calibration"]
        n = cal["background_templates"]
        # Linear models are cross-fitted: every background person is held out once (else a fifth of them).
        held = 5000 if f.metrics["calibration"].startswith("cross-fitted") else 1000
        assert cal["rule"] == "background-far" and cal["background_subjects"] == n == held
        # On the held-out people: at most target_far, and the tightest such threshold (within one template).
        assert far - 1.0 / n - 1e-9 <= cal["background_accepted_rate"] <= far
        assert cal["background_accepted_upper95"] > far
        # On 5,000 fresh strangers: target_far within binomial error (calibration on n, test on 5,000), 4 sigma.
        best = f.predict_proba(strangers)[:, f.known_indices].max(1)
        accepted = float(np.mean(best >= f.unknown_threshold))
        sigma = np.sqrt(far * (1 - far) * (1 / n + 1 / strangers.shape[0]))
        assert abs(accepted - far) < 4 * sigma + 1e-3, (far, accepted, sigma)
        assert cal["enrolled_rejected_rate"] == f.metrics["validation_unknown_rate_enrolled"]
        thresholds.append(f.unknown_threshold)
        rejected.append(cal["enrolled_rejected_rate"])
    # A smaller false-accept rate needs a higher threshold, which rejects more enrolled people.
    assert thresholds[0] > thresholds[1] > thresholds[2]
    assert rejected[0] >= rejected[1] >= rejected[2] and rejected[0] > rejected[2]


def test_without_background_the_former_rule_is_kept_and_said_so():
    X, subjects, _ = _open_set(1)
    enrolled = [i for i, s in enumerate(subjects) if not s.startswith("background:")]
    f = fit_recogniser(X[enrolled], [subjects[i] for i in enrolled], preset="lda", unknown_reject_rate=0.1)
    cal = f.metrics["unknown_calibration"]
    assert f.background_index is None and cal["rule"] == "enrolled-reject-rate" and "not calibrated" in cal["note"]
    assert cal["enrolled_rejected_rate"] <= 0.1 and "validation_background_accepted_rate" not in f.metrics


def test_verify_threshold_is_calibrated_on_held_out_impostors_including_background():
    X, subjects, strangers = _open_set(2)
    f = fit_recogniser(X, subjects, preset="lda", target_far=0.05, random_state=0)
    v = f.metrics["verify_calibration"]
    n_bg = f.metrics["unknown_calibration"]["background_templates"]
    assert v["impostor_scores"] == f.impostor_scores.size and v["impostor_scores_background"] == 5 * n_bg
    assert v["far"] == f.metrics["validation_far"] <= 0.05 < v["far_upper95"]
    # Fresh strangers claiming each enrolled person are accepted at about the target rate.
    P = f.predict_proba(strangers)[:, f.known_indices]
    far = float(np.mean(P > f.verify_threshold))
    sigma = np.sqrt(0.05 * 0.95 * (1 / v["impostor_scores"] + 1 / P.size))
    assert abs(far - 0.05) < 4 * sigma + 0.01, far


def test_background_people_are_held_out_whole():
    rng = np.random.default_rng(0)
    groups = np.array([f"p{i}" for i in rng.integers(0, 30, size=300)], dtype=object)
    tr, va = split_groups(groups, 0.2, rng)
    assert not set(groups[tr]) & set(groups[va]) and set(groups[tr]) and set(groups[va])
    assert np.array_equal(np.sort(np.concatenate([tr, va])), np.arange(300))
    assert 0.15 <= va.size / 300 <= 0.3
    one = np.array(["only"] * 10, dtype=object)
    tr, va = split_groups(one, 0.2, rng)  # a single person: its templates are split
    assert tr.size == 8 and va.size == 2


def test_the_calibration_is_summarised_in_one_line_for_peep_train_and_the_log():
    import doctest

    from peep.server.recognition import thresholds

    assert doctest.testmod(thresholds, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
    X, subjects, _ = _open_set(3, n_background=300)
    line = thresholds.calibration_summary(fit_recogniser(X, subjects, preset="auto").metrics)
    assert line.startswith("auto chose ") and "held-out background templates accepted (target 1.0%" in line
    assert "called unknown" in line and "verify: FAR" in line


def test_identification_can_accept_more_strangers_than_verification():
    """identify_far sets the open-set threshold apart from the verification FAR (FPIR vs FAR)."""
    X, subjects, strangers = _open_set(2)
    strict = fit_recogniser(X, subjects, preset="lda", target_far=0.01, random_state=0)
    loose = fit_recogniser(X, subjects, preset="lda", target_far=0.01, identify_far=0.1, random_state=0)
    assert loose.metrics["unknown_calibration"]["target_far"] == 0.1
    assert loose.metrics["verify_calibration"]["target_far"] == 0.01
    assert loose.verify_threshold == strict.verify_threshold
    assert loose.unknown_threshold < strict.unknown_threshold
    best = loose.predict_proba(strangers)[:, loose.known_indices].max(1)
    accepted = float(np.mean(best >= loose.unknown_threshold))
    assert abs(accepted - 0.1) < 0.03, accepted
