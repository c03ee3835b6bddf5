"""Recogniser presets: what the server can train, each one object in :data:`PRESETS`.

The server never sees a face, so the recogniser learns from what devices
release: noisy eigenface coefficients. How a recogniser is built and fitted
is a **preset**: one object in the registry :data:`PRESETS` stating its name,
its description and its one fit hook, :meth:`Preset.fit_estimator`, which
takes a :class:`FitData` (the training part, the held-out part, the fit's
controls) and returns the fitted estimator.
:func:`peep.server.recognition.fitting.fit_recogniser` does everything
around the hook (labels, the validation split, calibration). Adding a
recogniser is one new entry in :data:`PRESETS`: an :class:`MLPPreset`
(epoch-wise training: progress, cancellation, early stopping), an
:class:`EstimatorPreset` (any scikit-learn classifier that
:func:`peep.server.recognition.export.export_onnx` can export, fitted in one
call), a :class:`LogisticPreset` or an :class:`AutoPreset` (a choice among
presets); a new kind of preset is a subclass implementing the hook.

This module is what the configuration reads its choices from, so it imports
no scikit-learn until a preset is fitted or described.

The registered presets (:data:`DEFAULT_PRESET` is what a server trains
unless ``training.preset`` says otherwise):

``paper``
    The PEEP paper's configuration: relu, adam, batch 100, hidden layers
    (512, 1024, 2014, 1024, 512), at most 200 epochs, scikit-learn's stopping
    rule (training loss not improving by 1e-4 for 10 epochs), raw inputs.
``default``
    Tuned on LFW templates: inputs standardised with statistics of the
    training templates, one hidden layer of 512 relu units, L2 penalty
    ``alpha`` = 1.0, early stopping on the validation log-loss with the best
    epoch's weights restored. Smaller and much faster than the paper's network
    and more accurate on noisy templates, where a five-layer network mostly
    fits the noise.
``reference``
    The recogniser of the audit's reference measurements: scikit-learn's
    ``MLPClassifier(hidden_layer_sizes=(512,))`` with every other parameter at
    its default (relu, adam, batch min(200, n), alpha 1e-4, at most 200
    epochs, scikit-learn's stopping rule, raw inputs). Fitted on the same data
    it is exactly that estimator (a test pins it).
``lda``
    Shrinkage linear discriminant analysis:
    ``LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")``, raw
    inputs (the Ledoit-Wolf shrinkage target is computed on standardised data
    inside LDA). One covariance shared by all classes, shrunk towards a
    diagonal: the noise a mechanism adds is the same for everybody, so a
    class is its mean plus shared noise, and each mean is averaged over all
    of a subject's noisy enrolments. No hyperparameter, no randomness.
``logreg``
    Standardised inputs, multinomial ``LogisticRegression`` (lbfgs, L2); ``C``
    chosen from (0.003, 0.01, 0.03, 0.1, 0.3, 1) by validation log-loss
    (:class:`LogisticPreset`: the best ``C`` moves with the noise).
``auto``
    Fits ``lda``, ``logreg`` and ``default`` on the same training part and
    keeps the one with the best validation accuracy (ties to the earlier);
    ``metrics["preset_fit"]`` in ``model.json`` names the choice and every
    candidate's validation accuracy (:class:`AutoPreset`). Costs the sum of
    the three fits (a few seconds).

Measured (LFW's five people with >= 100 images, detector-normalised, nc = 128
bundle from the 5-9 image people; 70/30 stratified splits, 5 seeds; both
presets trained by ``fit_recogniser`` on the same 70 %, test accuracy on the
30 %, mean ± std):

==================  ===============  ===============
templates           paper            default
==================  ===============  ===============
no noise            0.854 ± 0.015    0.896 ± 0.014
peep-raw, ε = 8     0.811 ± 0.015    0.846 ± 0.008
peep, ε = 8         0.594 ± 0.020    0.609 ± 0.019
==================  ===============  ===============

The default wins on every seed (ties once at peep ε = 8) and trains in about
a second instead of about a minute on this 2-core machine.

The noise-aware presets, measured with ``peep audit --dataset lfw --repeats 3
--sweep-components none --sweep-images none --preset P`` (LFW-5, 3 splits,
test accuracy mean, balanced accuracy in brackets; majority class 0.465):

=============================  =============  =============  =============  =============
templates                      lda            logreg         auto           default
=============================  =============  =============  =============  =============
eigenfaces nc=128, no noise    0.882 (0.822)  0.901 (0.865)  0.911 (0.883)  0.917 (0.892)
privunit ε=16, eigenfaces 128  0.452 (0.287)  0.474 (0.242)  0.460 (0.275)  0.469 (0.269)
privunit ε=64, eigenfaces 128  0.676 (0.551)  0.661 (0.538)  0.654 (0.533)  0.659 (0.536)
laplace-l1 ε=1024, nc=40       0.827 (0.741)  0.848 (0.795)  0.856 (0.798)  0.869 (0.818)
peep ε=8, nc=128               0.558 (0.407)  0.547 (0.361)  0.556 (0.388)  0.571 (0.413)
privunit ε=8, fisherfaces 32   0.590 (0.469)  0.574 (0.428)  0.579 (0.444)  0.565 (0.417)
privunit ε=16, fisherfaces 32  0.751 (0.689)  0.731 (0.641)  0.751 (0.689)  0.737 (0.650)
privunit ε=64, fisherfaces 32  0.869 (0.844)  0.856 (0.811)  0.866 (0.833)  0.869 (0.832)
=============================  =============  =============  =============  =============

(the fisherfaces rows: ``--projection fisherfaces --basis background
--components 32``, measured on the projection while it was being built.)
On PrivUnit releases of Fisherface templates, ``lda`` is the best recogniser
(balanced accuracy +0.04 to +0.07 over ``default`` at ε = 8 and 16, a tie at
64, on every split); on eigenface coefficients with Laplace noise the
``default`` MLP is (0.04 better than ``lda`` at laplace-l1 ε = 1,024), and
``auto``'s choice on a validation fifth of ~640 templates is too noisy to
beat always taking ``default`` there. No preset is at least as good
everywhere, so :data:`DEFAULT_PRESET` stays ``default``; a deployment
releasing unit vectors with ``privunit`` should set ``training.preset =
"lda"``.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

__all__ = ["DEFAULT_PRESET", "PRESETS", "MLPPreset", "Preset", "Progress", "TrainingError"]

#: ``progress(done, total)``, called as training advances.
Progress = Callable[[int, int], None]


class TrainingError(ValueError):
    """Not enough data to train, or the trained model failed a check (says which)."""


class TrainingCancelled(RuntimeError):
    """Training was stopped (shutdown) before a model was promoted."""


@dataclass(frozen=True, kw_only=True)
class FitData:
    """What a preset's fit hook is given: the training part, the held-out part and the fit's controls.

    Attributes
    ----------
    X : ndarray of shape (n, nc), float32
        Training templates.
    y : ndarray of shape (n,), int64
        Their classes, ``0..n_classes-1``, each present.
    n_classes : int
    X_val : ndarray of shape (m, nc) or None
    y_val : ndarray of shape (m,) or None
        Held-out templates the preset may use for early stopping or to choose
        a hyperparameter (never for the weights themselves).
    background_index : int or None
        The class of background templates (None: no background class); it is
        never an identity, so validation accuracy is measured over the other
        classes (see :func:`known_accuracy`).
    random_state : int
    progress : callable or None
        ``progress(done, total)``.
    cancel : threading.Event or None
        Set to stop training (the hook raises :class:`TrainingCancelled`).
    notes : dict
        Filled by the hook with JSON-able facts about the fit (a chosen
        hyperparameter, candidates' scores);
        :func:`~peep.server.recognition.fitting.fit_recogniser` records them
        as ``metrics["preset_fit"]``.
    """

    X: NDArray[np.float32]
    y: NDArray[np.int64]
    n_classes: int
    X_val: NDArray[np.float32] | None = None
    y_val: NDArray[np.int64] | None = None
    background_index: int | None = None
    random_state: int = 0
    progress: Progress | None = None
    cancel: threading.Event | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def has_validation(self) -> bool:
        """Whether there are held-out templates to stop or choose on."""
        return self.X_val is not None and self.y_val is not None and len(self.y_val) > 0

    def check_cancelled(self) -> None:
        """Raise :class:`TrainingCancelled` if ``cancel`` is set."""
        if self.cancel is not None and self.cancel.is_set():
            raise TrainingCancelled("training cancelled")

    def report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A recogniser preset: its name, what it is, and how it fits its estimator.

    Subclasses implement :meth:`fit_estimator`;
    :func:`~peep.server.recognition.fitting.fit_recogniser` does everything
    around it (labels, the validation split, calibration).
    """

    name: str
    description: str = ""

    def fit_estimator(self, data: FitData) -> tuple[Any, int]:
        """Fit on ``data.X`` with classes ``0..data.n_classes-1`` (see :class:`FitData`).

        Returns
        -------
        pipeline : fitted scikit-learn estimator with ``predict_proba``
            Columns in class order ``0..n_classes-1``; exportable by
            :func:`~peep.server.recognition.export.export_onnx`.
        n_epochs : int
            Passes over the data (1 for a one-call fit).
        """
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters (``model.json``, ``audit.json``, ``qbbs.json``)."""
        return {"type": type(self).__name__, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class MLPPreset(Preset):
    """``[StandardScaler,] MLPClassifier`` trained epoch by epoch.

    Epochs run through ``partial_fit`` so that progress can be reported and a
    shutdown can interrupt training; the optimiser state carries over, so the
    result is what ``fit`` would give with the same stopping rule.
    """

    hidden_layer_sizes: tuple[int, ...]
    activation: str = "relu"
    solver: str = "adam"
    batch_size: int = 100
    max_epochs: int = 200
    alpha: float = 1e-4
    learning_rate_init: float = 1e-3
    standardise: bool = True
    #: "train-loss": scikit-learn's rule (training loss not better than the best by ``tol`` for more
    #: than ``patience`` epochs), last weights. "validation": best validation log-loss, weights of that
    #: epoch restored after ``patience`` epochs without improvement.
    stopping: Literal["train-loss", "validation"] = "validation"
    patience: int = 10
    tol: float = 1e-4

    def fit_estimator(self, data: FitData) -> tuple[Any, int]:
        import sklearn
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        X, y = np.asarray(data.X, dtype=np.float32), data.y
        steps: list[tuple[str, Any]] = []
        scaler = None
        if self.standardise:
            scaler = StandardScaler().fit(X)
            Xt = scaler.transform(X).astype(np.float32)
            steps.append(("scaler", scaler))
        else:
            Xt = X
        Xv = None
        if data.has_validation:
            Xv = (
                scaler.transform(data.X_val).astype(np.float32)
                if scaler is not None
                else np.asarray(data.X_val, dtype=np.float32)
            )
        # A RandomState *instance*: partial_fit re-reads random_state every call,
        # and an int would replay the same shuffle order each epoch.
        mlp = MLPClassifier(
            hidden_layer_sizes=self.hidden_layer_sizes,
            activation=self.activation,
            solver=self.solver,
            batch_size=min(self.batch_size, len(y)),
            alpha=self.alpha,
            learning_rate_init=self.learning_rate_init,
            max_iter=1,
            shuffle=True,
            random_state=np.random.RandomState(data.random_state),
        )
        classes = np.arange(data.n_classes)
        use_val = self.stopping == "validation" and Xv is not None
        best_score = np.inf
        best_weights: tuple[list[NDArray[Any]], list[NDArray[Any]]] | None = None
        stall = 0
        epochs = 0
        if not (np.isfinite(Xt).all() and (Xv is None or np.isfinite(Xv).all())):
            raise ValueError("the training data hold a NaN or an infinity")
        for epoch in range(self.max_epochs):
            data.check_cancelled()
            # The data and the parameters were checked once, above and at construction: scikit-learn would
            # check both again at each epoch's partial_fit and predict_proba (17 % of an epoch's CPU at the
            # audit's sizes; the weights come out identical).
            with warnings.catch_warnings(), sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
                warnings.simplefilter("ignore", category=UserWarning)
                mlp.partial_fit(Xt, y, classes=classes)
            epochs = epoch + 1
            if use_val:
                assert Xv is not None and data.y_val is not None
                with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
                    proba = mlp.predict_proba(Xv)
                score = _log_loss(proba, data.y_val)
                if score < best_score - self.tol:
                    best_score = score
                    stall = 0
                    best_weights = ([c.copy() for c in mlp.coefs_], [b.copy() for b in mlp.intercepts_])
                else:
                    stall += 1
            else:
                # scikit-learn's rule (MLPClassifier._update_no_improvement_count): the best loss follows
                # every decrease, an epoch counts as a stall unless it beats the best by tol.
                score = float(mlp.loss_)
                stall = stall + 1 if score > best_score - self.tol else 0
                best_score = min(best_score, score)
            data.report(epochs, self.max_epochs)
            if stall > self.patience:
                break
        if best_weights is not None:
            mlp.coefs_, mlp.intercepts_ = best_weights
        data.report(self.max_epochs, self.max_epochs)
        steps.append(("mlp", mlp))
        return Pipeline(steps), epochs


@dataclass(frozen=True, kw_only=True)
class EstimatorPreset(Preset):
    """Any scikit-learn classifier, fitted in one call: ``[StandardScaler,] build(random_state)``.

    ``build`` returns an unfitted classifier with ``predict_proba`` that
    :func:`~peep.server.recognition.export.export_onnx` can export: anything
    skl2onnx converts, and linear classifiers
    (:class:`~sklearn.discriminant_analysis.LinearDiscriminantAnalysis`,
    :class:`~sklearn.linear_model.LogisticRegression`), which it writes itself
    as the linear graph they are.
    """

    build: Callable[[int], Any]
    standardise: bool = True

    def fit_estimator(self, data: FitData) -> tuple[Any, int]:
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        data.check_cancelled()
        steps: list[tuple[str, Any]] = [("scaler", StandardScaler())] if self.standardise else []
        steps.append(("clf", self.build(data.random_state)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)
            pipeline = Pipeline(steps).fit(np.asarray(data.X, dtype=np.float32), data.y)
        classes = pipeline.steps[-1][1].classes_
        _check_classes(self, classes, data.n_classes)
        data.report(1, 1)
        return pipeline, 1

    def describe(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "name": self.name,
            "description": self.description,
            "standardise": self.standardise,
            "estimator": repr(self.build(0)),
        }


def _shrinkage_lda(random_state: int) -> Any:
    """Shrinkage LDA: one covariance shared by all classes, Ledoit-Wolf shrunk (deterministic)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    return LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")


@dataclass(frozen=True, kw_only=True)
class LogisticPreset(Preset):
    """``[StandardScaler,] LogisticRegression`` (multinomial), its ``C`` chosen on the validation split.

    One model is fitted on the training part for each ``C`` in ``Cs``; the one
    with the lowest validation log-loss is kept (log-loss rather than
    accuracy: on a few hundred noisy validation templates accuracy ties
    often, and the loss also rewards calibrated probabilities, which the
    thresholds are set on). Without validation templates ``fallback_C`` is
    used. ``C`` is scikit-learn's inverse L2 penalty on the *summed* log-loss,
    so the best value grows with the number of templates and shrinks with
    the noise: measured on LFW's five people (eigenface unit vectors released
    by ``privunit``, d = 128, about 640 training templates) the best fixed
    ``C`` was 0.01 at ε = 16 and 0.1 at ε = 64, and a wrong choice cost up to
    0.09 accuracy; hence the search rather than one value.
    """

    Cs: tuple[float, ...] = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
    fallback_C: float = 0.1
    max_iter: int = 2000
    standardise: bool = True

    def fit_estimator(self, data: FitData) -> tuple[Any, int]:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        if not self.Cs or any(not (c > 0) for c in self.Cs):
            raise TrainingError(f"{self.name}: expected Cs to be values > 0, received {self.Cs}")
        X = np.asarray(data.X, dtype=np.float32)
        use_val = data.has_validation
        grid = self.Cs if use_val else (self.fallback_C,)
        scaler = StandardScaler().fit(X) if self.standardise else None
        Xt = scaler.transform(X) if scaler is not None else X
        Xv = None
        if use_val:
            assert data.X_val is not None
            Xv = scaler.transform(np.asarray(data.X_val, dtype=np.float32)) if scaler is not None else data.X_val
        best: tuple[float, float, Any] | None = None
        losses: dict[str, float] = {}
        for i, C in enumerate(grid):
            data.check_cancelled()
            clf = LogisticRegression(C=C, max_iter=self.max_iter, random_state=data.random_state)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=ConvergenceWarning)
                clf.fit(Xt, data.y)
            _check_classes(self, clf.classes_, data.n_classes)
            loss = 0.0
            if Xv is not None and data.y_val is not None:
                loss = _log_loss(np.asarray(clf.predict_proba(Xv), dtype=np.float64), data.y_val)
            losses[f"{C:g}"] = loss
            if best is None or loss < best[0]:
                best = (loss, C, clf)
            data.report(i + 1, len(grid))
        assert best is not None
        steps: list[tuple[str, Any]] = [("scaler", scaler)] if scaler is not None else []
        steps.append(("clf", best[2]))
        data.notes["C"] = best[1]
        data.notes["C_chosen_by"] = "validation log-loss" if use_val else "fallback (no validation templates)"
        if use_val:
            data.notes["validation_log_loss"] = losses
        return Pipeline(steps), len(grid)


@dataclass(frozen=True, kw_only=True)
class AutoPreset(Preset):
    """Fit each of ``candidates`` (registered preset names) and keep the best on the validation split.

    Every candidate is fitted on the same training part; the one with the
    highest validation accuracy (enrolled validation templates, argmax over
    enrolled subjects, as ``metrics["validation_accuracy"]``) is kept, ties
    going to the earlier candidate (listed simplest first). Which one won and
    every candidate's validation accuracy and log-loss are recorded in
    ``notes`` (``metrics["preset_fit"]`` in ``model.json``).

    The validation split also chose the MLP's stopping epoch and the logistic
    regression's ``C``, and is then used for the thresholds, so the chosen
    model's validation accuracy is slightly optimistic (a maximum of a few
    noisy estimates); the thresholds are quantiles of scores, which the
    choice barely moves.
    """

    candidates: tuple[str, ...] = ("lda", "logreg", "default")

    def fit_estimator(self, data: FitData) -> tuple[Any, int]:
        if not self.candidates:
            raise TrainingError(f"{self.name}: expected at least one candidate preset, received none")
        subs: list[Preset] = []
        for name in self.candidates:
            sub = get_preset(name)
            if isinstance(sub, AutoPreset):
                raise TrainingError(f"{self.name}: expected candidates that are not 'auto' presets, received {name!r}")
            subs.append(sub)
        use_val = data.has_validation
        if not use_val:
            subs = subs[:1]  # nothing to choose on: the first candidate
        k = len(subs)
        results: dict[str, dict[str, Any]] = {}
        best: tuple[float, str, Any, int] | None = None
        for i, sub in enumerate(subs):
            data.check_cancelled()

            def step(done: int, total: int, i: int = i) -> None:
                # each candidate is one k-th of the bar
                data.report(i * 1000 + round(1000 * done / max(total, 1)), k * 1000)

            sub_data = replace(data, progress=step, notes={})
            t0 = time.perf_counter()
            pipeline, epochs = sub.fit_estimator(sub_data)
            row: dict[str, Any] = {"epochs": epochs, "fit_seconds": time.perf_counter() - t0}
            acc = -1.0
            if use_val:
                assert data.X_val is not None and data.y_val is not None
                P = np.asarray(pipeline.predict_proba(np.asarray(data.X_val, dtype=np.float32)), dtype=np.float64)
                acc = known_accuracy(P, data.y_val, data.background_index)
                row["validation_accuracy"] = acc
                row["validation_log_loss"] = _log_loss(P, data.y_val)
            if sub_data.notes:
                row["preset_fit"] = sub_data.notes
            results[sub.name] = row
            if best is None or acc > best[0]:
                best = (acc, sub.name, pipeline, epochs)
        assert best is not None
        data.notes["chosen"] = best[1]
        data.notes["chosen_by"] = "validation accuracy" if use_val else "first candidate (no validation templates)"
        data.notes["validation_accuracy"] = {n: r.get("validation_accuracy") for n, r in results.items()}
        data.notes["candidates"] = results
        return best[2], best[3]


def _check_classes(preset: Preset, classes: Any, n_classes: int) -> None:
    if not np.array_equal(classes, np.arange(n_classes)):
        raise TrainingError(f"{preset.name}: expected classes 0..{n_classes - 1} after fitting, received {classes}")


def _log_loss(P: NDArray[np.float64], y: NDArray[np.int64]) -> float:
    p = np.clip(P[np.arange(y.size), y], 1e-12, 1.0)
    return float(-np.mean(np.log(p)))


def known_accuracy(P: NDArray[np.float64], y: NDArray[np.int64], background_index: int | None) -> float:
    """Identification accuracy of enrolled templates: argmax over the enrolled classes only.

    Parameters
    ----------
    P : ndarray of shape (n, n_classes)
        Class probabilities.
    y : ndarray of shape (n,)
        True classes; rows of class ``background_index`` are not counted.
    background_index : int or None
        The background class (never an identity), if any.
    """
    known = np.array([c for c in range(P.shape[1]) if c != background_index], dtype=np.intp)
    rows = y != (background_index if background_index is not None else -1)
    if not rows.any():
        return 0.0
    pred = known[P[rows][:, known].argmax(axis=1)]
    return float(np.mean(pred == y[rows]))


def _registry(*presets: Preset) -> dict[str, Preset]:
    out: dict[str, Preset] = {}
    for p in presets:
        if p.name in out:
            raise ValueError(f"preset: expected unique names, received {p.name!r} twice")
        out[p.name] = p
    return out


#: Every recogniser the server can train, and the audit and the QBBS evaluation measure.
PRESETS: dict[str, Preset] = _registry(
    MLPPreset(
        name="paper",
        hidden_layer_sizes=(512, 1024, 2014, 1024, 512),
        batch_size=100,
        max_epochs=200,
        alpha=1e-4,
        standardise=False,
        stopping="train-loss",
        patience=10,
        description="PEEP paper: MLP relu/adam, batch 100, hidden (512, 1024, 2014, 1024, 512), 200 iterations",
    ),
    MLPPreset(
        name="default",
        hidden_layer_sizes=(512,),
        batch_size=100,
        max_epochs=200,
        alpha=1.0,
        standardise=True,
        stopping="validation",
        patience=10,
        description=(
            "tuned: standardised inputs, MLP relu/adam, hidden (512,), alpha 1.0, early stopping on validation log-loss"
        ),
    ),
    MLPPreset(
        name="reference",
        hidden_layer_sizes=(512,),
        batch_size=200,
        max_epochs=200,
        alpha=1e-4,
        standardise=False,
        stopping="train-loss",
        patience=10,
        description=(
            "the audit's reference recogniser: sklearn MLPClassifier(hidden_layer_sizes=(512,)), other "
            "parameters default (raw inputs, batch min(200, n), alpha 1e-4, scikit-learn's stopping rule)"
        ),
    ),
    EstimatorPreset(
        name="lda",
        build=_shrinkage_lda,
        standardise=False,  # the Ledoit-Wolf target is computed on standardised data inside LDA already
        description=(
            "shrinkage LDA: LinearDiscriminantAnalysis(solver='lsqr', shrinkage='auto'), one Ledoit-Wolf "
            "shrunk covariance shared by all classes; class means averaged over many noisy templates"
        ),
    ),
    LogisticPreset(
        name="logreg",
        description=(
            "standardised inputs, multinomial LogisticRegression, C in (0.003, 0.01, 0.03, 0.1, 0.3, 1) "
            "chosen by validation log-loss"
        ),
    ),
    AutoPreset(
        name="auto",
        candidates=("lda", "logreg", "default"),
        description="fits lda, logreg and default on the training part and keeps the best validation accuracy",
    ),
)

#: The preset a server trains unless ``training.preset`` names another; the audit's and the QBBS evaluation's default.
DEFAULT_PRESET = "default"


def get_preset(preset: Preset | str) -> Preset:
    """The registered preset called ``preset`` (a :class:`Preset` is returned as is)."""
    if isinstance(preset, Preset):
        return preset
    try:
        return PRESETS[preset]
    except KeyError:
        raise TrainingError(f"preset: expected one of {', '.join(PRESETS)}, received {preset!r}") from None
