"""Training recognisers on perturbed templates only.

The server never sees a face, so the recogniser learns from what devices
release: noisy eigenface coefficients. How a recogniser is built and fitted
is a **preset**: one object in the registry :data:`PRESETS` stating its name,
its description and how it fits its estimator (:meth:`Preset.fit_estimator`).
:func:`fit_recogniser` -- what the server's trainer
(:class:`peep.server.recognition.trainer.Trainer`), ``peep audit`` and
``peep qbbs evaluate`` all call -- fits any preset, calibrates it and returns
a :class:`FittedRecogniser`; :func:`export_onnx` turns it into the model the
server serves. Adding a recogniser is one new entry in :data:`PRESETS`: an
:class:`MLPPreset` (epoch-wise training: progress, cancellation, early
stopping) or an :class:`EstimatorPreset` (any scikit-learn classifier that
skl2onnx can export, fitted in one call).

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

Measured (LFW's five people with >= 100 images, detector-normalised, nc = 128
bundle from the 5-9 image people; 70/30 stratified splits, 5 seeds; both
presets trained by :func:`fit_recogniser` on the same 70 %, test accuracy on
the 30 %, mean ± std):

==================  ===============  ===============
templates           paper            default
==================  ===============  ===============
no noise            0.854 ± 0.015    0.896 ± 0.014
peep-raw, ε = 8     0.811 ± 0.015    0.846 ± 0.008
peep, ε = 8         0.594 ± 0.020    0.609 ± 0.019
==================  ===============  ===============

The default wins on every seed (ties once at peep ε = 8) and trains in about
a second instead of about a minute on this 2-core machine.

Open set. Subjects whose id starts with ``training.background_prefix``
(default ``"background:"``) are never returned as identities; their templates
form one extra *background* class, which teaches the network what a face that
is not enrolled looks like. A template is **unknown** when the largest
probability of an enrolled subject is below a threshold calibrated on the
validation split: at most ``unknown_reject_rate`` of the enrolled subjects'
validation templates fall below it. Without background templates the rule
still holds for enrolled people, but strangers are caught less often.

Verification. The score of a claim is the model's probability of the claimed
subject. The threshold is set on validation *impostor* scores (every
template scored against every subject it is not) so that the false-accept
rate is at most ``target_far``; accept iff ``score > threshold``.

The fitted pipeline is exported to ONNX (skl2onnx) and served with
onnxruntime; :func:`check_onnx_agreement` refuses a model whose ONNX
predictions disagree with scikit-learn's, and the trainer
(:meth:`peep.server.recognition.trainer.Trainer.train`) does not promote it.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


class TrainingError(ValueError):
    """Not enough data to train, or the trained model failed a check (says which)."""


class TrainingCancelled(RuntimeError):
    """Training was stopped (shutdown) before a model was promoted."""


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A recogniser preset: its name, what it is, and how it fits its estimator.

    Subclasses implement :meth:`fit_estimator`; :func:`fit_recogniser` does
    everything around it (labels, the validation split, calibration).
    """

    name: str
    description: str = ""

    def fit_estimator(
        self,
        X: NDArray[np.float32],
        y: NDArray[np.int64],
        *,
        n_classes: int,
        X_val: NDArray[np.float32] | None,
        y_val: NDArray[np.int64] | None,
        random_state: int,
        progress: Progress | None,
        cancel: threading.Event | None,
    ) -> tuple[Any, int]:
        """Fit on ``X`` (n, nc) float32 with classes ``0..n_classes-1`` (each present in ``y``).

        ``X_val``/``y_val`` are held-out templates the preset may use for early
        stopping (never for the weights themselves).

        Returns
        -------
        pipeline : fitted scikit-learn estimator with ``predict_proba``
            Columns in class order ``0..n_classes-1``; exportable by skl2onnx.
        n_epochs : int
            Passes over the data (1 for a one-call fit).
        """
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters (``model.json``, ``audit.json``, ``qbbs.json``)."""
        return {"type": type(self).__name__, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class MLPPreset(Preset):
    """``[StandardScaler,] MLPClassifier`` trained epoch by epoch (see :func:`fit_mlp`)."""

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

    def fit_estimator(
        self,
        X: NDArray[np.float32],
        y: NDArray[np.int64],
        *,
        n_classes: int,
        X_val: NDArray[np.float32] | None,
        y_val: NDArray[np.int64] | None,
        random_state: int,
        progress: Progress | None,
        cancel: threading.Event | None,
    ) -> tuple[Any, int]:
        return _fit_mlp(X, y, preset=self, n_classes=n_classes, X_val=X_val, y_val=y_val,
                        random_state=random_state, progress=progress, cancel=cancel)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class EstimatorPreset(Preset):
    """Any scikit-learn classifier, fitted in one call: ``[StandardScaler,] build(random_state)``.

    ``build`` returns an unfitted classifier with ``predict_proba`` that
    skl2onnx can export (e.g. shrinkage LDA, logistic regression).
    """

    build: Callable[[int], Any]
    standardise: bool = True

    def fit_estimator(
        self,
        X: NDArray[np.float32],
        y: NDArray[np.int64],
        *,
        n_classes: int,
        X_val: NDArray[np.float32] | None,
        y_val: NDArray[np.int64] | None,
        random_state: int,
        progress: Progress | None,
        cancel: threading.Event | None,
    ) -> tuple[Any, int]:
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        if cancel is not None and cancel.is_set():
            raise TrainingCancelled("training cancelled")
        steps: list[tuple[str, Any]] = [("scaler", StandardScaler())] if self.standardise else []
        steps.append(("clf", self.build(random_state)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)
            pipeline = Pipeline(steps).fit(np.asarray(X, dtype=np.float32), y)
        classes = pipeline.steps[-1][1].classes_
        if not np.array_equal(classes, np.arange(n_classes)):
            raise TrainingError(f"{self.name}: expected classes 0..{n_classes - 1} after fitting, received {classes}")
        if progress is not None:
            progress(1, 1)
        return pipeline, 1

    def describe(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "name": self.name,
            "description": self.description,
            "standardise": self.standardise,
            "estimator": repr(self.build(0)),
        }


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


def _log_loss(P: NDArray[np.float64], y: NDArray[np.int64]) -> float:
    p = np.clip(P[np.arange(y.size), y], 1e-12, 1.0)
    return float(-np.mean(np.log(p)))


def fit_mlp(
    X: NDArray[np.float32],
    y: NDArray[np.int64],
    *,
    preset: MLPPreset,
    n_classes: int,
    X_val: NDArray[np.float32] | None = None,
    y_val: NDArray[np.int64] | None = None,
    random_state: int = 0,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    blas_threads: int | None = 1,
) -> tuple[Any, int]:
    """Train ``[StandardScaler,] MLPClassifier`` epoch by epoch.

    Epochs run through ``partial_fit`` so that progress can be reported and a
    shutdown can interrupt training; the optimiser state carries over, so the
    result is what ``fit`` would give with the same stopping rule.

    ``blas_threads`` caps the BLAS thread pool while training (None = the
    library default): on a small, busy server, multi-threaded BLAS spins
    against the serving threads and can make training 10-30x slower.

    Returns
    -------
    pipeline : sklearn Pipeline
    n_epochs : int
    """
    return _fit_estimator(preset, X, y, n_classes=n_classes, X_val=X_val, y_val=y_val, random_state=random_state,
                          progress=progress, cancel=cancel, blas_threads=blas_threads)  # fmt: skip


def _fit_estimator(
    preset: Preset,
    X: NDArray[np.float32],
    y: NDArray[np.int64],
    *,
    blas_threads: int | None,
    **kwargs: Any,
) -> tuple[Any, int]:
    """``preset.fit_estimator`` with the BLAS thread pool capped (see :func:`fit_mlp`)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with threadpool_limits(limits=blas_threads, user_api="blas"):
        return preset.fit_estimator(X, y, **kwargs)


def _fit_mlp(
    X: NDArray[np.float32],
    y: NDArray[np.int64],
    *,
    preset: MLPPreset,
    n_classes: int,
    X_val: NDArray[np.float32] | None,
    y_val: NDArray[np.int64] | None,
    random_state: int,
    progress: Progress | None,
    cancel: threading.Event | None,
) -> tuple[Any, int]:
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(X, dtype=np.float32)
    steps: list[tuple[str, Any]] = []
    scaler = None
    if preset.standardise:
        scaler = StandardScaler().fit(X)
        Xt = scaler.transform(X).astype(np.float32)
        steps.append(("scaler", scaler))
    else:
        Xt = X
    Xv = None
    if X_val is not None and y_val is not None and len(y_val):
        Xv = scaler.transform(X_val).astype(np.float32) if scaler is not None else np.asarray(X_val, dtype=np.float32)
    # A RandomState *instance*: partial_fit re-reads random_state every call,
    # and an int would replay the same shuffle order each epoch.
    mlp = MLPClassifier(
        hidden_layer_sizes=preset.hidden_layer_sizes,
        activation=preset.activation,
        solver=preset.solver,
        batch_size=min(preset.batch_size, len(y)),
        alpha=preset.alpha,
        learning_rate_init=preset.learning_rate_init,
        max_iter=1,
        shuffle=True,
        random_state=np.random.RandomState(random_state),
    )
    classes = np.arange(n_classes)
    use_val = preset.stopping == "validation" and Xv is not None
    best_score = np.inf
    best_weights: tuple[list[NDArray[Any]], list[NDArray[Any]]] | None = None
    stall = 0
    epochs = 0
    for epoch in range(preset.max_epochs):
        if cancel is not None and cancel.is_set():
            raise TrainingCancelled("training cancelled")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)
            mlp.partial_fit(Xt, y, classes=classes)
        epochs = epoch + 1
        if use_val:
            assert Xv is not None and y_val is not None
            score = _log_loss(mlp.predict_proba(Xv), y_val)
            if score < best_score - preset.tol:
                best_score = score
                stall = 0
                best_weights = ([c.copy() for c in mlp.coefs_], [b.copy() for b in mlp.intercepts_])
            else:
                stall += 1
        else:
            # scikit-learn's rule (MLPClassifier._update_no_improvement_count): the best loss follows
            # every decrease, an epoch counts as a stall unless it beats the best by tol.
            score = float(mlp.loss_)
            stall = stall + 1 if score > best_score - preset.tol else 0
            best_score = min(best_score, score)
        if progress is not None:
            progress(epochs, preset.max_epochs)
        if stall > preset.patience:
            break
    if best_weights is not None:
        mlp.coefs_, mlp.intercepts_ = best_weights
    if progress is not None:
        progress(preset.max_epochs, preset.max_epochs)
    steps.append(("mlp", mlp))
    return Pipeline(steps), epochs


def _threshold_far(impostor: NDArray[np.float64], far: float) -> float:
    """Smallest t with mean(impostor > t) <= far."""
    if impostor.size == 0:
        return 0.5
    return float(np.quantile(impostor, 1.0 - far, method="higher"))


def fit_recogniser(
    X: NDArray[np.float32],
    subjects: Sequence[str],
    *,
    preset: Preset | str = DEFAULT_PRESET,
    background_prefix: str = "background:",
    validation_fraction: float = 0.2,
    target_far: float = 0.01,
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
        Enrolment labels; ids starting with ``background_prefix`` form the background class.
    preset : Preset or str
        A :class:`Preset` or the name of one in :data:`PRESETS`.
    blas_threads : int or None
        BLAS threads while training (see :func:`fit_mlp`).

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
    X, y = X[mask], y[mask]
    rng = np.random.default_rng(random_state)
    tr, va = split_indices(y, validation_fraction, rng)
    t0 = time.perf_counter()
    pipeline, epochs = _fit_estimator(
        p, X[tr], y[tr], n_classes=len(class_names), X_val=X[va], y_val=y[va],
        random_state=random_state, progress=progress, cancel=cancel, blas_threads=blas_threads,
    )  # fmt: skip
    fit_s = time.perf_counter() - t0
    P = np.asarray(pipeline.predict_proba(X[va]), dtype=np.float64)
    yv = y[va]
    known = np.array([i for i in range(len(class_names)) if i != background_index], dtype=np.intp)
    Pk = P[:, known]
    best_known = Pk.max(axis=1)
    pred_known = known[Pk.argmax(axis=1)]
    gen_rows = yv != (background_index if background_index is not None else -2)
    genuine = P[gen_rows, yv[gen_rows]]
    imp_mask = np.ones_like(Pk, dtype=bool)
    pos = {c: j for j, c in enumerate(known)}
    for r in np.flatnonzero(gen_rows):
        imp_mask[r, pos[int(yv[r])]] = False
    impostor = Pk[imp_mask]
    verify_threshold = _threshold_far(impostor, target_far)
    genuine_best = best_known[gen_rows]
    unknown_threshold = (
        float(np.quantile(genuine_best, unknown_reject_rate, method="lower")) if genuine_best.size else 0.0
    )
    metrics: dict[str, Any] = {
        "validation_accuracy": float(np.mean(pred_known[gen_rows] == yv[gen_rows])) if gen_rows.any() else 0.0,
        "validation_templates": int(va.size),
        "training_templates": int(tr.size),
        "validation_unknown_rate_enrolled": float(np.mean(genuine_best < unknown_threshold))
        if genuine_best.size
        else 0.0,
        "validation_far": float(np.mean(impostor > verify_threshold)) if impostor.size else 0.0,
        "validation_frr": float(np.mean(genuine <= verify_threshold)) if genuine.size else 0.0,
        "epochs": epochs,
        "fit_seconds": fit_s,
        "dropped_subjects": dropped,
    }
    if background_index is not None and (~gen_rows).any():
        metrics["validation_background_accepted_rate"] = float(np.mean(best_known[~gen_rows] >= unknown_threshold))
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
        val_probabilities=P,
        val_values=X[va],
    )


# ----------------------------------------------------------------- ONNX


def export_onnx(fitted: FittedRecogniser, n_components: int) -> bytes:
    """The fitted pipeline as ONNX: input ``values`` (N, nc) float32 -> ``label``, ``probabilities`` (N, C)."""
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
    fitted: FittedRecogniser, *, bundle_id: str, kinds: Sequence[str], n_components: int, n_templates: int
) -> dict[str, Any]:
    """What ``model.json`` records next to the ONNX file."""
    return {
        "format": "peep-model/1",
        "classes": fitted.class_names,
        "background_index": fitted.background_index,
        "unknown_threshold": fitted.unknown_threshold,
        "verify_threshold": fitted.verify_threshold,
        "target_far": fitted.target_far,
        "unknown_reject_rate": fitted.unknown_reject_rate,
        "bundle_id": bundle_id,
        "mechanism_kinds": list(kinds),
        "n_components": n_components,
        "n_templates": n_templates,
        "n_subjects": len(fitted.class_names) - (1 if fitted.background_index is not None else 0),
        "preset": fitted.preset.describe(),
        "metrics": fitted.metrics,
        "trained_at": time.time(),
    }
