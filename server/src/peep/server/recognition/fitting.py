"""Fitting a recogniser on perturbed templates only.

:func:`fit_recogniser` -- what the server's trainer
(:class:`peep.server.recognition.trainer.Trainer`), ``peep audit`` and
``peep qbbs evaluate`` all call -- fits any preset
(:mod:`peep.server.recognition.presets`), calibrates its thresholds
(:mod:`peep.server.recognition.thresholds`) and returns a
:class:`FittedRecogniser`, which
:func:`peep.server.recognition.export.export_onnx` turns into the model the
server serves. In steps:

1. **Classes.** Each enrolled subject with at least
   ``min_templates_per_subject`` templates is a class. Subjects whose id
   starts with ``training.background_prefix`` (default ``"background:"``;
   the rest of the id names the person) are never returned as identities;
   their templates form one extra *background* class, which teaches the
   model what a face that is not enrolled looks like.
2. **Split.** Validation holds out a fifth of each enrolled subject's
   templates (:func:`split_indices`) and, of the background, whole *people*
   (:func:`split_groups`), so that held-out background templates are of
   faces the model never saw -- what a stranger at the camera is.
3. **Fit.** The preset's hook on the training part, the held-out part given
   for early stopping or a hyperparameter (:func:`fit_estimator`).
4. **Held-out scores.** The fitted model's probabilities of the held-out
   templates; a linear model, which has nothing to stop early, is instead
   cross-fitted (out-of-fold probabilities of every template) and served
   fitted on every template.
5. **Thresholds** on those scores
   (:func:`~peep.server.recognition.thresholds.calibrate_thresholds`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.server.recognition.linear import linear_parts
from peep.server.recognition.presets import (
    DEFAULT_PRESET,
    FitData,
    Preset,
    Progress,
    TrainingError,
    get_preset,
    known_accuracy,
)
from peep.server.recognition.thresholds import Thresholds, calibrate_thresholds

__all__ = ["fit_recogniser"]


@dataclass
class FittedRecogniser:
    """A trained pipeline with its calibration.

    Attributes
    ----------
    pipeline : sklearn Pipeline
        What the preset fitted (e.g. ``[scaler,] mlp``); inputs (n, nc) float32, classes ``0..n_classes-1``.
    class_names : list of str
        Name of each class index; the background class is ``""``.
    background_index : int or None
    unknown_threshold : float
        Unknown iff the best enrolled probability is below it.
    verify_threshold : float
        Accept a claim iff its probability is above it.
    metrics : dict
    genuine_scores, impostor_scores : ndarray of shape (n,)
        Validation scores (probability of the true / a wrong enrolled subject).
    """

    pipeline: Any
    class_names: list[str]
    background_index: int | None
    unknown_threshold: float
    verify_threshold: float
    target_far: float
    unknown_reject_rate: float
    metrics: dict[str, Any]
    genuine_scores: NDArray[np.float64]
    impostor_scores: NDArray[np.float64]
    preset: Preset
    n_epochs: int
    val_probabilities: NDArray[np.float64] = field(repr=False)
    val_values: NDArray[np.float32] = field(repr=False)
    #: Class frequencies of the served model (track fusion's product rule).
    class_priors: NDArray[np.float64] | None = field(default=None, repr=False)
    #: Unknown threshold of a decision fused from two releases of a track (None: never fuse).
    unknown_threshold_fused: float | None = None

    @property
    def known_indices(self) -> NDArray[np.intp]:
        return np.array([i for i in range(len(self.class_names)) if i != self.background_index], dtype=np.intp)

    def predict_proba(self, X: NDArray[np.float32]) -> NDArray[np.float64]:
        """Class probabilities from scikit-learn, shape (n, n_classes)."""
        return np.asarray(self.pipeline.predict_proba(np.asarray(X, dtype=np.float32)), dtype=np.float64)


def fit_recogniser(
    X: NDArray[np.float32],
    subjects: Sequence[str],
    *,
    preset: Preset | str = DEFAULT_PRESET,
    background_prefix: str = "background:",
    validation_fraction: float = 0.2,
    target_far: float = 0.01,
    identify_far: float | None = None,
    unknown_reject_rate: float = 0.05,
    min_templates_per_subject: int = 2,
    random_state: int = 0,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    blas_threads: int | None = 1,
) -> FittedRecogniser:
    """Train and calibrate a recogniser on perturbed templates.

    Parameters
    ----------
    X : ndarray of shape (n_templates, n_components)
        Perturbed enrolment templates.
    subjects : sequence of str, length n_templates
        Enrolment labels; ids starting with ``background_prefix`` form the background class
        (the part after the prefix names a background person: validation holds out whole people).
    preset : Preset or str
        A :class:`~peep.server.recognition.presets.Preset` or the name of one in
        :data:`~peep.server.recognition.presets.PRESETS`.
    target_far : float
        False-accept rate of both thresholds: verification (on validation
        impostor scores) and, when background templates exist, identification
        (on held-out background people's templates).
    identify_far : float, optional
        False-positive identification rate of the open-set threshold (held-out
        background people named as someone); ``None`` = ``target_far``.
    unknown_reject_rate : float
        Without background templates only: share of enrolled validation templates called unknown.
    blas_threads : int or None
        BLAS threads while training (see :func:`fit_estimator`).

    Returns
    -------
    FittedRecogniser

    Raises
    ------
    TrainingError
        Fewer than two classes with ``min_templates_per_subject`` templates, or an unknown preset.
    """
    p = get_preset(preset)
    data = _label(X, subjects, background_prefix=background_prefix, min_templates=min_templates_per_subject)
    # One stream for the split and the cross-fitting's folds, in that order.
    rng = np.random.default_rng(random_state)
    split = _split(data, validation_fraction, rng)
    t0 = time.perf_counter()
    fit = FitData(
        X=data.X[split.train],
        y=data.y[split.train],
        n_classes=len(data.class_names),
        X_val=data.X[split.val],
        y_val=data.y[split.val],
        background_index=data.background_index,
        random_state=random_state,
        progress=progress,
        cancel=cancel,
    )
    pipeline, epochs = fit_estimator(p, fit, blas_threads=blas_threads)
    held = _held_out_scores(pipeline, data, split, validation_fraction, rng)
    fit_seconds = time.perf_counter() - t0
    y_val = data.y[held.val]
    # Track fusion's product rule divides by the class frequencies of the model served.
    priors = np.bincount(data.y[held.train], minlength=len(data.class_names)).astype(np.float64)
    priors = np.maximum(priors, 0.5) / priors.sum()
    thresholds = calibrate_thresholds(
        held.P,
        y_val,
        data.subjects[held.val],
        background_index=data.background_index,
        background_people=held.background_people,
        class_priors=priors,
        target_far=target_far,
        identify_far=identify_far,
        unknown_reject_rate=unknown_reject_rate,
        random_state=random_state,
    )
    metrics = _metrics(
        data, held, thresholds, fit.notes, validation_accuracy=known_accuracy(held.P, y_val, data.background_index),
        epochs=epochs, fit_seconds=fit_seconds,
    )  # fmt: skip
    return FittedRecogniser(
        pipeline=held.pipeline,
        class_names=data.class_names,
        background_index=data.background_index,
        unknown_threshold=thresholds.unknown_threshold,
        verify_threshold=thresholds.verify_threshold,
        target_far=target_far,
        unknown_reject_rate=unknown_reject_rate,
        metrics=metrics,
        genuine_scores=thresholds.genuine_scores,
        impostor_scores=thresholds.impostor_scores,
        preset=p,
        n_epochs=epochs,
        val_probabilities=np.asarray(held.pipeline.predict_proba(data.X[held.val]), dtype=np.float64),
        val_values=data.X[held.val],
        class_priors=priors,
        unknown_threshold_fused=thresholds.unknown_threshold_fused,
    )


def fit_estimator(preset: Preset, data: FitData, *, blas_threads: int | None = 1) -> tuple[Any, int]:
    """``preset.fit_estimator(data)`` with the BLAS thread pool capped at ``blas_threads`` (None = the library default).

    On a small, busy server, multi-threaded BLAS spins against the serving
    threads and can make training 10-30x slower.
    """
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with threadpool_limits(limits=blas_threads, user_api="blas"):
        return preset.fit_estimator(data)


@dataclass(frozen=True, kw_only=True)
class _Labelled:
    """The templates that are trained on, with their classes."""

    X: NDArray[np.float32]  # (n, nc)
    y: NDArray[np.int64]  # (n,), 0..len(class_names)-1
    subjects: NDArray[Any]  # (n,), the subject id of each template
    class_names: list[str]
    background_index: int | None
    dropped: list[str]  # enrolled subjects with too few templates


def _label(X: NDArray[np.float32], subjects: Sequence[str], *, background_prefix: str, min_templates: int) -> _Labelled:
    """Step 1: enrolled subjects with ``min_templates`` templates, and the background, as classes."""
    X = np.asarray(X, dtype=np.float32)
    subj = np.asarray(list(subjects), dtype=object)
    if X.ndim != 2 or X.shape[0] != subj.shape[0]:
        raise TrainingError(f"X: expected shape (n, nc) matching {subj.shape[0]} subjects, received {X.shape}")
    is_bg = (
        np.array([s.startswith(background_prefix) for s in subj], dtype=bool)
        if background_prefix
        else np.zeros(len(subj), bool)
    )
    names, counts = np.unique(subj[~is_bg], return_counts=True)
    keep_names = [str(n) for n, c in zip(names, counts, strict=True) if c >= min_templates]
    dropped = [str(n) for n, c in zip(names, counts, strict=True) if c < min_templates]
    class_names = list(keep_names)
    background_index: int | None = None
    if is_bg.sum() >= min_templates:
        background_index = len(class_names)
        class_names.append("")
    if len(keep_names) < 1 or len(class_names) < 2:
        raise TrainingError(
            f"enrolment: expected at least two classes (subjects, or one subject plus background templates) with >= "
            f"{min_templates} templates each, received {len(keep_names)} subject(s) and "
            f"{int(is_bg.sum())} background templates"
        )
    index = {n: i for i, n in enumerate(keep_names)}
    y = np.full(len(subj), -1, dtype=np.int64)
    for i, s in enumerate(subj):
        if is_bg[i]:
            y[i] = -1 if background_index is None else background_index
        else:
            y[i] = index.get(str(s), -1)
    mask = y >= 0
    return _Labelled(
        X=X[mask],
        y=y[mask],
        subjects=subj[mask],
        class_names=class_names,
        background_index=background_index,
        dropped=dropped,
    )


@dataclass(frozen=True, kw_only=True)
class _Split:
    train: NDArray[np.intp]
    val: NDArray[np.intp]
    background_people: int  # background people held out whole


def _split(data: _Labelled, validation_fraction: float, rng: np.random.Generator) -> _Split:
    """Step 2: enrolled subjects stratified; the background by whole people."""
    bg = data.background_index
    enrolled_rows = np.flatnonzero(data.y != (bg if bg is not None else -1))
    tr_e, va_e = split_indices(data.y[enrolled_rows], validation_fraction, rng)
    tr, va = enrolled_rows[tr_e], enrolled_rows[va_e]
    background_people = 0
    if bg is not None:
        bg_rows = np.flatnonzero(data.y == bg)
        groups = data.subjects[bg_rows]
        tr_b, va_b = split_groups(groups, validation_fraction, rng)
        background_people = int(np.unique(groups[va_b]).size)
        tr = np.sort(np.concatenate([tr, bg_rows[tr_b]]))
        va = np.sort(np.concatenate([va, bg_rows[va_b]]))
    return _Split(train=tr, val=va, background_people=background_people)


@dataclass(frozen=True, kw_only=True)
class _HeldOut:
    """The pipeline to serve and the held-out scores its thresholds are set on."""

    pipeline: Any
    P: NDArray[np.float64]  # (val.size, n_classes)
    train: NDArray[np.intp]  # rows the served pipeline was fitted on
    val: NDArray[np.intp]  # rows of P
    background_people: int
    calibration: str
    split_accuracy: float | None  # cross-fitted only: the split model's validation accuracy


def _held_out_scores(
    pipeline: Any, data: _Labelled, split: _Split, validation_fraction: float, rng: np.random.Generator
) -> _HeldOut:
    """Step 4: held-out probabilities of the fitted pipeline, or of its configuration cross-fitted if linear."""
    X, y, bg = data.X, data.y, data.background_index
    if linear_parts(pipeline) is None or not split.val.size:
        P = np.asarray(pipeline.predict_proba(X[split.val]), dtype=np.float64)
        return _HeldOut(
            pipeline=pipeline, P=P, train=split.train, val=split.val, background_people=split.background_people,
            calibration="validation-split", split_accuracy=None,
        )  # fmt: skip
    split_accuracy = known_accuracy(
        np.asarray(pipeline.predict_proba(X[split.val]), dtype=np.float64), y[split.val], bg
    )
    # A linear model has nothing to stop early: calibrate on out-of-fold scores of its
    # configuration (whatever the preset chose on the split) and serve it fitted on every template.
    final, P, folds = _cross_fit(pipeline, X, y, data.subjects, bg, validation_fraction, rng)
    every = np.arange(y.size)
    return _HeldOut(
        pipeline=final,
        P=P,
        train=every,
        val=every,
        background_people=int(np.unique(data.subjects[y == bg]).size) if bg is not None else split.background_people,
        calibration=f"cross-fitted ({folds} folds; final model on every template)",
        split_accuracy=split_accuracy,
    )


def _metrics(
    data: _Labelled,
    held: _HeldOut,
    thresholds: Thresholds,
    notes: dict[str, Any],
    *,
    validation_accuracy: float,
    epochs: int,
    fit_seconds: float,
) -> dict[str, Any]:
    """``metrics`` of ``model.json``: the fit, the held-out scores and what the thresholds cost."""
    unknown = thresholds.unknown_calibration
    metrics: dict[str, Any] = {
        "validation_accuracy": validation_accuracy,
        "calibration": held.calibration,
        **({"split_validation_accuracy": held.split_accuracy} if held.split_accuracy is not None else {}),
        "validation_templates": int(held.val.size),
        "training_templates": int(held.train.size),
        "validation_unknown_rate_enrolled": thresholds.enrolled_rejected_rate,
        "validation_far": thresholds.far,
        "validation_frr": thresholds.frr,
        "unknown_calibration": unknown,
        "verify_calibration": thresholds.verify_calibration,
        "epochs": epochs,
        "fit_seconds": fit_seconds,
        "dropped_subjects": data.dropped,
    }
    if notes:
        metrics["preset_fit"] = notes
    if unknown["rule"] == "background-far":
        metrics["validation_background_accepted_rate"] = unknown["background_accepted_rate"]
    return metrics


def split_indices(
    y: NDArray[np.int64], fraction: float, rng: np.random.Generator
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Stratified split: about ``fraction`` of each class (at least one) to validation.

    Every class keeps at least one training example.
    """
    train: list[int] = []
    val: list[int] = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        k = round(fraction * idx.size)
        k = min(max(k, 1), idx.size - 1)
        val.extend(idx[:k].tolist())
        train.extend(idx[k:].tolist())
    return np.sort(np.array(train, dtype=np.intp)), np.sort(np.array(val, dtype=np.intp))


def split_groups(
    groups: NDArray[Any], fraction: float, rng: np.random.Generator
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Split rows by group: whole groups to validation until about ``fraction`` of the rows are there.

    At least one group goes to validation and at least one stays for
    training. With a single group the rows themselves are split (at least
    one each way, as :func:`split_indices`). Returns positions into ``groups``.
    """
    n = len(groups)
    ids = np.unique(groups)
    if ids.size < 2:
        return split_indices(np.zeros(n, dtype=np.int64), fraction, rng)
    order = rng.permutation(ids)
    target = max(1, round(fraction * n))
    held: list[Any] = []
    count = 0
    for g in order[:-1]:
        if count >= target:
            break
        held.append(g)
        count += int(np.sum(groups == g))
    is_val = np.isin(groups, np.array(held, dtype=groups.dtype))
    return np.flatnonzero(~is_val).astype(np.intp), np.flatnonzero(is_val).astype(np.intp)


def _cross_fit(
    pipeline: Any,
    X: NDArray[np.float32],
    y: NDArray[np.int64],
    subjects: NDArray[Any],
    background_index: int | None,
    validation_fraction: float,
    rng: np.random.Generator,
) -> tuple[Any, NDArray[np.float64], int]:
    """Out-of-fold probabilities of ``pipeline``'s configuration for every template, and the final fit on all.

    ``k = round(1/validation_fraction)`` folds: each enrolled subject's
    templates dealt round-robin over the folds (a subject with two templates
    keeps one for training in every fold), background templates by *person*,
    so a held-out background template is always of someone the fold's model
    never saw. Each fold's model is a clone of ``pipeline`` (same
    hyperparameters) fitted on the other folds; its probabilities fill that
    fold's rows.

    Returns
    -------
    final : fitted clone of ``pipeline`` on every template
    P : ndarray of shape (n_templates, n_classes), out of fold
    k : int
    """
    from sklearn.base import clone

    k = max(2, round(1.0 / validation_fraction))
    fold = np.empty(y.size, dtype=np.int64)
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        if background_index is not None and c == background_index:
            people = rng.permutation(np.unique(subjects[rows]))
            person_fold = {p: i % k for i, p in enumerate(people)}
            fold[rows] = [person_fold[p] for p in subjects[rows]]
        else:
            fold[rng.permutation(rows)] = np.arange(rows.size) % k
    n_classes = int(y.max()) + 1
    P = np.zeros((y.size, n_classes))
    for f in range(k):
        held = fold == f
        if not held.any():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)
            est = clone(pipeline).fit(X[~held], y[~held])
        cols = np.asarray(est.classes_ if hasattr(est, "classes_") else est.steps[-1][1].classes_, dtype=np.intp)
        P[np.ix_(np.flatnonzero(held), cols)] = est.predict_proba(X[held])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        final = clone(pipeline).fit(X, y)
    return final, P, k
