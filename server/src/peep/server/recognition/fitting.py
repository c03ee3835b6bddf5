"""Training recognisers on perturbed templates only.

:func:`fit_recogniser` -- what the server's trainer
(:class:`peep.server.recognition.trainer.Trainer`), ``peep audit`` and
``peep qbbs evaluate`` all call -- fits any preset
(:mod:`peep.server.recognition.presets`), calibrates it and returns a
:class:`FittedRecogniser`; :func:`export_onnx` turns it into the model the
server serves.

Open set. Subjects whose id starts with ``training.background_prefix``
(default ``"background:"``; the rest of the id names the person) are never
returned as identities; their templates form one extra *background* class,
which teaches the model what a face that is not enrolled looks like. A
template is **unknown** when the largest probability of an enrolled subject
is below ``unknown_threshold``. The validation split holds out a fifth of
each enrolled subject's templates and, of the background, whole *people*
(:func:`split_groups`), so that held-out background templates are of faces
the model never saw -- what a stranger at the camera is. The threshold is
then calibrated for the false-accept rate:

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

The fitted pipeline is exported to ONNX (MLPs by skl2onnx, linear models as
MatMul + Add + Softmax, see :func:`export_onnx`) and served with
onnxruntime; :func:`check_onnx_agreement` refuses a model whose ONNX
predictions disagree with scikit-learn's, and the trainer
(:meth:`peep.server.recognition.trainer.Trainer.train`) does not promote it.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.decision import threshold_at_far, threshold_at_fpir
from peep.server.recognition.fusion import fused_background_scores
from peep.server.recognition.presets import (
    DEFAULT_PRESET,
    FitData,
    Preset,
    Progress,
    TrainingError,
    get_preset,
    known_accuracy,
)


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


def fit_estimator(preset: Preset, data: FitData, *, blas_threads: int | None = 1) -> tuple[Any, int]:
    """``preset.fit_estimator(data)`` with the BLAS thread pool capped at ``blas_threads`` (None = the library default).

    On a small, busy server, multi-threaded BLAS spins against the serving
    threads and can make training 10-30x slower.
    """
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with threadpool_limits(limits=blas_threads, user_api="blas"):
        return preset.fit_estimator(data)


def _rate_upper95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate observed as ``k`` of ``n``."""
    from scipy.stats import beta

    if n == 0:
        return 1.0
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


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


#: Fused background pairs needed to calibrate the fused unknown threshold (fewer: the model never fuses).
MIN_FUSED_PAIRS = 20


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
    keep_names = [str(n) for n, c in zip(names, counts, strict=True) if c >= min_templates_per_subject]
    dropped = [str(n) for n, c in zip(names, counts, strict=True) if c < min_templates_per_subject]
    class_names = list(keep_names)
    background_index: int | None = None
    if is_bg.sum() >= min_templates_per_subject:
        background_index = len(class_names)
        class_names.append("")
    if len(keep_names) < 1 or len(class_names) < 2:
        raise TrainingError(
            f"enrolment: expected at least two classes (subjects, or one subject plus background templates) with >= "
            f"{min_templates_per_subject} templates each, received {len(keep_names)} subject(s) and "
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
    X, y, subj = X[mask], y[mask], subj[mask]
    rng = np.random.default_rng(random_state)
    # Enrolled subjects: a stratified split. Background: whole people held out, so the held-out
    # templates are of people the model never saw -- what a stranger at the camera is.
    enrolled_rows = np.flatnonzero(y != (background_index if background_index is not None else -1))
    tr_e, va_e = split_indices(y[enrolled_rows], validation_fraction, rng)
    tr, va = enrolled_rows[tr_e], enrolled_rows[va_e]
    bg_groups = 0
    if background_index is not None:
        bg_rows = np.flatnonzero(y == background_index)
        groups = subj[bg_rows]
        tr_b, va_b = split_groups(groups, validation_fraction, rng)
        bg_groups = int(np.unique(groups[va_b]).size)
        tr = np.sort(np.concatenate([tr, bg_rows[tr_b]]))
        va = np.sort(np.concatenate([va, bg_rows[va_b]]))
    t0 = time.perf_counter()
    fit = FitData(
        X=X[tr], y=y[tr], n_classes=len(class_names), X_val=X[va], y_val=y[va], background_index=background_index,
        random_state=random_state, progress=progress, cancel=cancel,
    )  # fmt: skip
    pipeline, epochs = fit_estimator(p, fit, blas_threads=blas_threads)
    notes = fit.notes
    calibration = "validation-split"
    split_accuracy: float | None = None
    if linear_parts(pipeline) is not None and va.size:
        split_accuracy = known_accuracy(
            np.asarray(pipeline.predict_proba(X[va]), dtype=np.float64), y[va], background_index
        )
        # A linear model has nothing to stop early: calibrate on out-of-fold scores of its
        # configuration (whatever the preset chose on the split) and serve it fitted on every template.
        pipeline, P_all, folds = _cross_fit(pipeline, X, y, subj, background_index, validation_fraction, rng)
        calibration = f"cross-fitted ({folds} folds; final model on every template)"
        va = tr = np.arange(y.size)
        P = P_all
        if background_index is not None:
            bg_groups = int(np.unique(subj[y == background_index]).size)
    else:
        P = np.asarray(pipeline.predict_proba(X[va]), dtype=np.float64)
    fit_s = time.perf_counter() - t0
    yv = y[va]
    known = np.array([i for i in range(len(class_names)) if i != background_index], dtype=np.intp)
    Pk = P[:, known]
    best_known = Pk.max(axis=1)
    gen_rows = yv != (background_index if background_index is not None else -2)
    genuine = P[gen_rows, yv[gen_rows]]
    imp_mask = np.ones_like(Pk, dtype=bool)
    pos = {c: j for j, c in enumerate(known)}
    for r in np.flatnonzero(gen_rows):
        imp_mask[r, pos[int(yv[r])]] = False
    impostor = Pk[imp_mask]
    verify_threshold = threshold_at_far(impostor, target_far)
    genuine_best = best_known[gen_rows]
    bg_best = best_known[~gen_rows]
    unknown: dict[str, Any]
    if bg_best.size:
        fpir = target_far if identify_far is None else identify_far
        unknown_threshold = threshold_at_fpir(bg_best, fpir)
        accepted = int(np.sum(bg_best >= unknown_threshold))
        unknown = {
            "rule": "background-far",
            "target_far": fpir,
            "background_templates": int(bg_best.size),
            "background_subjects": bg_groups,
            "background_accepted_rate": accepted / bg_best.size,
            "background_accepted_upper95": _rate_upper95(accepted, int(bg_best.size)),
        }
    else:
        unknown_threshold = (
            float(np.quantile(genuine_best, unknown_reject_rate, method="lower")) if genuine_best.size else 0.0
        )
        unknown = {
            "rule": "enrolled-reject-rate",
            "unknown_reject_rate": unknown_reject_rate,
            "note": (
                "no background templates: the threshold lets at most unknown_reject_rate of enrolled validation "
                "templates be called unknown; how often strangers are accepted is not calibrated"
            ),
        }
    enrolled_rejected = float(np.mean(genuine_best < unknown_threshold)) if genuine_best.size else 0.0
    unknown["enrolled_rejected_rate"] = enrolled_rejected
    # Track fusion (recognition/fusion.py): the class frequencies of the served model, and the threshold of a
    # decision fused from two releases, calibrated on pairs of held-out background people's templates.
    priors = np.bincount(y[tr], minlength=len(class_names)).astype(np.float64)
    priors = np.maximum(priors, 0.5) / priors.sum()
    unknown_threshold_fused: float | None = None
    if bg_best.size:
        pairing = np.random.default_rng(random_state + 1)  # its own stream: the fit's draws stay as they were
        fused_bg = fused_background_scores(P[~gen_rows], subj[va][~gen_rows], known, priors, pairing)
        if fused_bg.size >= MIN_FUSED_PAIRS:
            unknown_threshold_fused = threshold_at_fpir(fused_bg, fpir)
            unknown["fused_pairs"] = int(fused_bg.size)
            unknown["fused_accepted_rate"] = float(np.mean(fused_bg >= unknown_threshold_fused))
        else:
            unknown["fused_pairs"] = int(fused_bg.size)
            unknown["fused"] = f"off: fewer than {MIN_FUSED_PAIRS} pairs of background templates of one person"
    far_k = int(np.sum(impostor > verify_threshold))
    metrics: dict[str, Any] = {
        "validation_accuracy": known_accuracy(P, yv, background_index),
        "calibration": calibration,
        **({"split_validation_accuracy": split_accuracy} if split_accuracy is not None else {}),
        "validation_templates": int(va.size),
        "training_templates": int(tr.size),
        "validation_unknown_rate_enrolled": enrolled_rejected,
        "validation_far": far_k / impostor.size if impostor.size else 0.0,
        "validation_frr": float(np.mean(genuine <= verify_threshold)) if genuine.size else 0.0,
        "unknown_calibration": unknown,
        "verify_calibration": {
            "target_far": target_far,
            "impostor_scores": int(impostor.size),
            "impostor_scores_background": int(imp_mask[~gen_rows].sum()),
            "far": far_k / impostor.size if impostor.size else 0.0,
            "far_upper95": _rate_upper95(far_k, int(impostor.size)),
        },
        "epochs": epochs,
        "fit_seconds": fit_s,
        "dropped_subjects": dropped,
    }
    if notes:
        metrics["preset_fit"] = notes
    if bg_best.size:
        metrics["validation_background_accepted_rate"] = unknown["background_accepted_rate"]
    return FittedRecogniser(
        pipeline=pipeline,
        class_names=class_names,
        background_index=background_index,
        unknown_threshold=unknown_threshold,
        verify_threshold=verify_threshold,
        target_far=target_far,
        unknown_reject_rate=unknown_reject_rate,
        metrics=metrics,
        genuine_scores=genuine,
        impostor_scores=impostor,
        preset=p,
        n_epochs=epochs,
        val_probabilities=np.asarray(pipeline.predict_proba(X[va]), dtype=np.float64),
        val_values=X[va],
        class_priors=priors,
        unknown_threshold_fused=unknown_threshold_fused,
    )


# ----------------------------------------------------------------- ONNX


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


def _linear_onnx(W: NDArray[np.float64], b: NDArray[np.float64]) -> bytes:
    """``values`` (N, d) float32 -> ``probabilities`` = softmax(values · W + b), ``label`` = argmax (int64)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d, c = W.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["values", "W"], ["z0"]),
            helper.make_node("Add", ["z0", "b"], ["z"]),
            helper.make_node("Softmax", ["z"], ["probabilities"], axis=1),
            helper.make_node("ArgMax", ["z"], ["label"], axis=1, keepdims=0),
        ],
        "peep_linear_recogniser",
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [None, d])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, c]),
        ],
        initializer=[
            numpy_helper.from_array(W.astype(np.float32), "W"),
            numpy_helper.from_array(b.astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="peep")
    model.ir_version = 8
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def export_onnx(fitted: FittedRecogniser, n_components: int) -> bytes:
    """The fitted pipeline as ONNX: input ``values`` (N, nc) float32 -> ``label``, ``probabilities`` (N, C).

    Linear pipelines (see :func:`linear_parts`: shrinkage LDA, logistic
    regression) are written as the graph they are, MatMul + Add + Softmax,
    with the scaler folded into the weights: skl2onnx's converter for LDA
    gets two-class probabilities wrong (measured: 2.4e-4 off, beyond
    :func:`check_onnx_agreement`'s tolerance, for a subject plus background).
    Everything else (the MLPs) goes through skl2onnx.
    """
    parts = linear_parts(fitted.pipeline)
    if parts is not None:
        W, b = parts
        if W.shape[0] != n_components:
            raise TrainingError(f"onnx: expected a model of {n_components} inputs, received one of {W.shape[0]}")
        return _linear_onnx(W, b)
    from skl2onnx import to_onnx

    clf = fitted.pipeline.steps[-1][1]
    sample = np.zeros((1, n_components), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = to_onnx(
            fitted.pipeline,
            sample,
            options={id(clf): {"zipmap": False}},
            target_opset={"": 18, "ai.onnx.ml": 3},
            final_types=None,
        )
    graph = model.graph
    graph.input[0].name, old_in = "values", graph.input[0].name
    for node in graph.node:
        node.input[:] = ["values" if n == old_in else n for n in node.input]
    data: bytes = model.SerializeToString()
    return data


def onnx_session(model: bytes, *, threads: int = 1) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def onnx_probabilities(session: Any, X: NDArray[np.float32]) -> NDArray[np.float32]:
    out = session.run(["probabilities"], {"values": np.ascontiguousarray(X, dtype=np.float32)})[0]
    return np.asarray(out, dtype=np.float32)


def check_onnx_agreement(fitted: FittedRecogniser, model: bytes, *, atol: float = 1e-4) -> dict[str, float]:
    """Compare onnxruntime with scikit-learn on the validation templates.

    Raises :class:`TrainingError` when a probability differs by more than
    ``atol`` or a decision (argmax) differs where scikit-learn's top two
    classes are more than ``10·atol`` apart.
    """
    sess = onnx_session(model)
    X = fitted.val_values
    P_sk = fitted.val_probabilities
    P_ox = onnx_probabilities(sess, X).astype(np.float64)
    if P_ox.shape != P_sk.shape:
        raise TrainingError(f"onnx: expected probabilities of shape {P_sk.shape}, received {P_ox.shape}")
    diff = float(np.max(np.abs(P_ox - P_sk))) if P_sk.size else 0.0
    top2 = np.sort(P_sk, axis=1)[:, -2:] if P_sk.shape[1] >= 2 else np.zeros((len(P_sk), 2))
    clear = (top2[:, 1] - top2[:, 0]) > 10 * atol
    disagree = int(np.sum((P_ox.argmax(1) != P_sk.argmax(1)) & clear))
    if diff > atol or disagree:
        raise TrainingError(
            f"onnx: expected the exported model to match scikit-learn within {atol}, received max |dP| = {diff:.3g} "
            f"and {disagree} differing decisions; not promoted"
        )
    return {"onnx_max_abs_diff": diff, "onnx_checked": float(len(X))}


def model_meta(
    fitted: FittedRecogniser,
    *,
    bundle_id: str,
    kinds: Sequence[str],
    n_components: int,
    n_templates: int,
    key_id: str = "",
) -> dict[str, Any]:
    """What ``model.json`` records next to the ONNX file (``key_id``: the site key's public id, "" for none)."""
    return {
        "format": "peep-model/1",
        "classes": fitted.class_names,
        "background_index": fitted.background_index,
        "unknown_threshold": fitted.unknown_threshold,
        "unknown_threshold_fused": fitted.unknown_threshold_fused,
        "class_priors": None if fitted.class_priors is None else [float(v) for v in fitted.class_priors],
        "verify_threshold": fitted.verify_threshold,
        "target_far": fitted.target_far,
        "unknown_reject_rate": fitted.unknown_reject_rate,
        "bundle_id": bundle_id,
        "key_id": key_id,
        "mechanism_kinds": list(kinds),
        "n_components": n_components,
        "n_templates": n_templates,
        "n_subjects": len(fitted.class_names) - (1 if fitted.background_index is not None else 0),
        "preset": fitted.preset.describe(),
        "metrics": fitted.metrics,
        "trained_at": time.time(),
        # Keys the opaque class ids of the device models made from this version (peep.core.devicemodel):
        # the server maps a device's released label back to a subject with it; devices never see names.
        "device_class_salt": os.urandom(16).hex(),
    }


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
