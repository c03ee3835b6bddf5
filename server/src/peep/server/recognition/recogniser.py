"""Identify and verify with the serving model (onnxruntime).

:class:`Recogniser` serves whatever version the model registry's ``CURRENT``
names and notices promotions by other processes (``peep train``) within
``check_interval`` seconds; replicas on PostgreSQL are told instead (the
server's :class:`~peep.server.recognition.watch.ChangeWatcher` calls
:meth:`Recogniser.reload`), and a new version replaces the old one atomically. Inference is batched: one
onnxruntime call for any number of templates.

Accessors for the QBBS module (fusion of face and soft-trait scores):

:meth:`Recogniser.verify_score`
    the face score of a claim (probability of the claimed subject);
:meth:`Recogniser.validation_scores`
    the serving model's genuine and impostor validation scores, for the
    Parzen-window estimate of P(genuine | s);
:class:`ServingFaceScores`
    both, as the QBBS module's ``FaceScoreProvider`` (log-probability scale,
    ``model_version`` follows promotions so the Parzen densities are refitted).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.decision import accept_claims, claim_scores, identify_open_set
from peep.core.mechanisms import mechanism_class
from peep.server.recognition.export import onnx_session
from peep.server.recognition.fusion import TrackFusion, fuse_pairs
from peep.server.recognition.model_registry import AnyRegistry, RegistryError

__all__ = [
    "Identification",
    "LoadedModel",
    "ModelMismatch",
    "ModelUnavailable",
    "Recogniser",
    "ServingFaceScores",
    "Verification",
]

log = logging.getLogger(__name__)


def _domain_of(kind: str) -> str | None:
    try:
        return mechanism_class(kind).domain
    except (TypeError, ValueError):
        return None


class ModelUnavailable(RuntimeError):
    """No model has been trained yet (gRPC FAILED_PRECONDITION)."""


class ModelMismatch(ValueError):
    """The template's bundle, site key or mechanism domain differs from the model's.

    ``field`` names which: ``"bundle_id"``, ``"key_id"`` or ``"mechanism.kind"``.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field or message.partition(":")[0]


@dataclass(frozen=True, slots=True)
class Identification:
    """Result of identifying one template."""

    candidates: list[tuple[str, float]]
    subject: str
    unknown: bool
    probability: float
    model_version: str
    #: Releases of the track this decision was fused from (1: the template alone).
    releases_fused: int = 1


@dataclass(frozen=True, slots=True)
class Verification:
    accepted: bool
    score: float
    threshold: float
    target_far: float
    model_version: str


@dataclass
class LoadedModel:
    """A version loaded for serving."""

    version: str
    meta: dict[str, Any]
    session: Any
    classes: list[str]
    known: NDArray[np.intp]
    class_index: dict[str, int]
    unknown_threshold: float
    verify_threshold: float
    target_far: float
    bundle_id: str
    domain: str
    n_components: int
    trained_at: float
    #: The public id of the site key its templates were released under ("" for none).
    key_id: str
    genuine: NDArray[np.float64] = field(repr=False)
    impostor: NDArray[np.float64] = field(repr=False)
    #: Track fusion (recognition/fusion.py): class frequencies and the fused unknown threshold (None: never fuse).
    priors: NDArray[np.float64] | None = field(default=None, repr=False)
    unknown_threshold_fused: float | None = None

    @property
    def n_subjects(self) -> int:
        return int(self.known.size)


def _load(version: Any, threads: int) -> LoadedModel:
    meta = version.meta
    classes = [str(c) for c in meta["classes"]]
    bg = meta.get("background_index")
    known = np.array([i for i in range(len(classes)) if i != bg], dtype=np.intp)
    kinds = list(meta.get("mechanism_kinds", []))
    scores = version.scores()
    return LoadedModel(
        version=version.name,
        meta=meta,
        session=onnx_session(version.onnx_bytes(), threads=threads),
        classes=classes,
        known=known,
        class_index={classes[i]: int(i) for i in known},
        unknown_threshold=float(meta["unknown_threshold"]),
        verify_threshold=float(meta["verify_threshold"]),
        target_far=float(meta["target_far"]),
        bundle_id=str(meta["bundle_id"]),
        key_id=str(meta.get("key_id", "")),
        domain=mechanism_class(kinds[0]).domain if kinds else "",
        n_components=int(meta["n_components"]),
        trained_at=float(meta.get("trained_at", 0.0)),
        genuine=scores.get("genuine", np.zeros(0)),
        impostor=scores.get("impostor", np.zeros(0)),
        priors=_priors(meta.get("class_priors"), len(classes)),
        unknown_threshold_fused=(
            float(meta["unknown_threshold_fused"]) if meta.get("unknown_threshold_fused") is not None else None
        ),
    )


def _priors(values: Any, n_classes: int) -> NDArray[np.float64] | None:
    """The model's class frequencies if its metadata holds a usable set (else None: no fusion)."""
    if not isinstance(values, list) or len(values) != n_classes:
        return None
    p = np.asarray(values, dtype=np.float64)
    return p if np.all(np.isfinite(p)) and np.all(p > 0) else None


class Recogniser:
    """Serve the registry's current model.

    Parameters
    ----------
    registry : ModelRegistry or DatabaseModelRegistry
    threads : int
        onnxruntime intra-op threads.
    erasures : callable returning {subject: erased_at}, optional
        Subjects erased after a model was trained are never returned by it
        (their probability is zeroed) until a retrained model is promoted.
    check_interval : float
        Seconds between checks of the registry's ``CURRENT`` pointer.
    erasure_interval : float
        Seconds between re-reads of the erasure list.
    """

    def __init__(
        self,
        registry: AnyRegistry,
        *,
        threads: int = 1,
        erasures: Callable[[], Mapping[str, float]] | None = None,
        check_interval: float = 1.0,
        erasure_interval: float = 5.0,
    ) -> None:
        self.registry = registry
        self.threads = threads
        self._erasures_fn = erasures
        self._erasures: Mapping[str, float] = {}
        self.check_interval = check_interval
        self.erasure_interval = erasure_interval
        self._erasures_checked = time.monotonic()
        self._lock = threading.Lock()
        self._model: LoadedModel | None = None
        self._mask: NDArray[np.bool_] | None = None
        self._stamp: tuple[int, int] | tuple[int, float] | None = None
        self._checked = -np.inf
        self._listeners: list[Callable[[LoadedModel], None]] = []
        self.reload()

    def add_listener(self, fn: Callable[[LoadedModel], None]) -> None:
        """Call ``fn(model)`` whenever a new version starts serving."""
        self._listeners.append(fn)

    # ------------------------------------------------------------ loading

    def reload(self) -> LoadedModel | None:
        """Load the version ``CURRENT`` names, if it changed."""
        with self._lock:
            self._checked = time.monotonic()
            stamp = self.registry.pointer_stamp()
            if stamp == self._stamp and self._model is not None:
                return self._model
            try:
                version = self.registry.current()
            except RegistryError as exc:
                log.error("model registry unreadable; keeping the serving model", extra={"error": str(exc)})
                return self._model
            if version is None:
                self._stamp = stamp
                return None
            if self._model is not None and self._model.version == version.name:
                self._stamp = stamp
                return self._model
            try:
                model = _load(version, self.threads)
            except Exception as exc:  # a broken version must not take serving down
                log.error(
                    "could not load model version; keeping the serving model",
                    extra={"version": version.name, "error": str(exc)},
                )
                return self._model
            self._model = model
            self._stamp = stamp
            self._refresh_mask_locked()
        log.info(
            "model serving",
            extra={"version": model.version, "subjects": model.n_subjects, "bundle_id": model.bundle_id},
        )
        for fn in self._listeners:
            try:
                fn(model)
            except Exception:
                log.exception("model listener failed")
        return model

    def refresh_erasures(self) -> None:
        """Re-read the erasure list (after an erasure)."""
        with self._lock:
            self._refresh_mask_locked()

    def _refresh_mask_locked(self) -> None:
        if self._erasures_fn is not None:
            self._erasures = dict(self._erasures_fn())
        m = self._model
        if m is None:
            self._mask = None
            return
        masked = [m.class_index[s] for s, at in self._erasures.items() if s in m.class_index and at >= m.trained_at]
        if masked:
            mask = np.zeros(len(m.classes), dtype=bool)
            mask[masked] = True
            self._mask = mask
        else:
            self._mask = None

    def erased_at(self, subject: str) -> float | None:
        """When ``subject`` was erased, as last read (None: not erased); any model trained before never names them."""
        at = self._erasures.get(subject)
        return None if at is None else float(at)

    def is_masked(self, subject: str, model: LoadedModel) -> bool:
        """Whether ``subject`` was erased after ``model`` was trained (so it never names them)."""
        mask = self._mask if model is self._model else None
        idx = model.class_index.get(subject)
        return bool(mask is not None and idx is not None and mask[idx])

    @property
    def model(self) -> LoadedModel | None:
        """The serving model (checks for a promotion every ``check_interval`` s).

        The erasure list is re-read every ``erasure_interval`` s too, so an
        erasure made by another process (``peep erase``, another replica)
        takes effect here without a restart.
        """
        now = time.monotonic()
        if now - self._checked > self.check_interval:
            if self._erasures_fn is not None and now - self._erasures_checked > self.erasure_interval:
                self._erasures_checked = now
                try:
                    self.refresh_erasures()
                except Exception as exc:  # the store being down must not stop recognition
                    log.warning("could not re-read erasures", extra={"error": str(exc)})
            return self.reload()
        return self._model

    def require_model(self) -> LoadedModel:
        m = self.model
        if m is None:
            raise ModelUnavailable("no model has been trained yet: enrol subjects and run Train (or `peep train`)")
        return m

    def check_compatible(self, bundle_id: str, kind: str, *, key_id: str) -> LoadedModel:
        """Raise :class:`ModelMismatch` unless the model can score templates of ``bundle_id``/``kind``/``key_id``.

        ``key_id`` is the public id of the site key the template was released under ("" for none): a model
        trained under one key scores nothing released under another (the rotation differs, so would every
        score: chance, not an answer).
        """
        m = self.require_model()
        if bundle_id != m.bundle_id:
            raise ModelMismatch(
                f"bundle_id: expected {m.bundle_id} (the bundle model {m.version} was trained on), "
                f"received {bundle_id!r}"
            )
        if key_id != m.key_id:
            raise ModelMismatch(
                f"key_id: expected {m.key_id or 'none'} (the site key model {m.version} was trained under), "
                f"received {key_id[:64] or 'none'}"
            )
        if _domain_of(kind) != m.domain:
            raise ModelMismatch(
                f"mechanism.kind: expected a mechanism releasing {m.domain!r} coefficients like "
                f"{', '.join(m.meta.get('mechanism_kinds', []))} (model {m.version}), received {kind!r}"
            )
        return m

    # ------------------------------------------------------------ inference

    def probabilities(
        self, values: ArrayLike, model: LoadedModel | None = None
    ) -> tuple[LoadedModel, NDArray[np.float32]]:
        """Class probabilities, shape (n, n_classes), with erased subjects zeroed."""
        m = model or self.require_model()
        X = np.asarray(values, dtype=np.float32)
        if X.ndim == 1:
            X = X.reshape(1, -1)
        if X.ndim != 2 or X.shape[1] != m.n_components:
            raise ValueError(f"values: expected shape (n, {m.n_components}), received {X.shape}")
        P = m.session.run(["probabilities"], {"values": np.ascontiguousarray(X)})[0]
        mask = self._mask if m is self._model else None
        if mask is not None and mask.shape[0] == P.shape[1]:
            P = P.copy()
            P[:, mask] = 0.0
        return m, P

    def identify_batch(
        self, values: ArrayLike, *, top_k: int = 5, model: LoadedModel | None = None
    ) -> list[Identification]:
        """Identify each row of ``values`` (shape (n, nc))."""
        m, P = self.probabilities(values, model)
        decided = identify_open_set(P, m.known, m.unknown_threshold)
        Pk = P[:, m.known]
        k = max(1, min(int(top_k), Pk.shape[1]))
        order = np.argsort(-Pk, axis=1, kind="stable")[:, :k]
        out = []
        for i in range(Pk.shape[0]):
            cands = [(m.classes[m.known[j]], float(Pk[i, j])) for j in order[i]]
            unknown = bool(decided.unknown[i])
            out.append(
                Identification(
                    candidates=cands,
                    subject="" if unknown else m.classes[decided.best_class[i]],
                    unknown=unknown,
                    probability=float(decided.probability[i]),
                    model_version=m.version,
                )
            )
        return out

    def identify_tracks(
        self,
        values: ArrayLike,
        tracks: Sequence[tuple[str, str, str] | None],
        fusion: TrackFusion,
        *,
        model: LoadedModel | None = None,
        recall: Callable[[list[int]], dict[int, NDArray[np.float32]]] | None = None,
        releases: Sequence[str] | None = None,
    ) -> list[Identification]:
        """Identify each row, fusing it with its track's previous release where the model allows.

        ``tracks[i]`` is the (site, device, track) of row ``i`` (None: no track, never fused). A model
        without ``unknown_threshold_fused`` (or class frequencies) decides on each row alone.
        ``recall(rows)``, for rows whose track this process does not remember, returns
        ``{row: values of the track's previous release}`` where one is stored (another replica took it).
        ``releases[i]`` names row ``i``'s release (its message id): a release is never fused with itself.
        """
        m, P = self.probabilities(values, model)
        P = np.asarray(P, dtype=np.float64)
        n = P.shape[0]
        threshold = np.full(n, m.unknown_threshold)
        fused = np.ones(n, dtype=np.int64)
        if m.unknown_threshold_fused is not None and m.priors is not None:
            later, previous = [], []
            forgotten = []
            for i, key in enumerate(tracks):
                release = releases[i] if releases is not None else None
                prev = fusion.add(key, m.version, P[i], release=release) if key is not None else None
                if prev is not None:
                    later.append(i)
                    previous.append(prev)
                elif key is not None:
                    forgotten.append(i)
            if forgotten and recall is not None:
                stored = recall(forgotten)
                rows = [i for i in forgotten if i in stored]
                if rows:  # posteriors of the stored releases under this model, in one batch
                    _, Pp = self.probabilities(np.stack([stored[i] for i in rows]), m)
                    later.extend(rows)
                    previous.extend(np.asarray(Pp, dtype=np.float64))
            if later:  # a track's later releases: decided from both, in one batch
                P[later] = fuse_pairs(np.vstack(previous), P[later], m.priors)
                threshold[later], fused[later] = m.unknown_threshold_fused, 2
        decided = identify_open_set(P, m.known, threshold)
        out = []
        for i in range(n):
            name = m.classes[decided.best_class[i]]
            unknown = bool(decided.unknown[i])
            out.append(
                Identification(
                    candidates=[(name, float(decided.probability[i]))],
                    subject="" if unknown else name,
                    unknown=unknown,
                    probability=float(decided.probability[i]),
                    model_version=m.version,
                    releases_fused=int(fused[i]),
                )
            )
        return out

    def identify(self, values: ArrayLike, *, top_k: int = 5) -> Identification:
        return self.identify_batch(np.asarray(values, dtype=np.float32).reshape(1, -1), top_k=top_k)[0]

    def verify_scores(
        self, values: ArrayLike, claimed: list[str], model: LoadedModel | None = None
    ) -> tuple[LoadedModel, NDArray[np.float64]]:
        """Score of each row's claim: probability of the claimed subject (0 when not enrolled)."""
        m, P = self.probabilities(values, model)
        idx = np.array([m.class_index.get(c, -1) for c in claimed], dtype=np.intp)
        return m, claim_scores(P, idx)

    def verify_batch(
        self, values: ArrayLike, claimed: Sequence[str], *, model: LoadedModel | None = None
    ) -> list[Verification]:
        """Decide each row's claim: where every Verify is decided, a call's or a batch of MQTT templates'.

        Parameters
        ----------
        values : array-like of shape (n, n_components)
            Validated perturbed templates.
        claimed : sequence of n str
            The subject each row claims to be (a subject not enrolled scores 0 and is refused).
        model : LoadedModel, optional
            The version to decide with (default: the serving one), so a batch is decided by one version.

        Returns
        -------
        list of n Verification
        """
        m, scores = self.verify_scores(values, list(claimed), model)
        accepted = accept_claims(scores, m.verify_threshold).tolist()
        return [
            Verification(
                accepted=bool(a),
                score=float(s),
                threshold=m.verify_threshold,
                target_far=m.target_far,
                model_version=m.version,
            )
            for s, a in zip(scores.tolist(), accepted, strict=True)
        ]

    def verify(self, values: ArrayLike, claimed_subject: str) -> Verification:
        return self.verify_batch(np.asarray(values, dtype=np.float32).reshape(1, -1), [claimed_subject])[0]

    # ------------------------------------------------------------ QBBS hooks

    def verify_score(self, values: ArrayLike, claimed_subject: str) -> float:
        """Face score of a claim for fusion: P(claimed subject | template), in [0, 1].

        Parameters
        ----------
        values : array-like of shape (n_components,)
            A validated perturbed template's values.
        claimed_subject : str
            0.0 when the subject is not enrolled in the serving model.

        Raises
        ------
        ModelUnavailable
            No model yet.
        """
        return float(self.verify_scores(np.asarray(values, dtype=np.float32).reshape(1, -1), [claimed_subject])[1][0])

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(genuine, impostor) scores of the serving model on its validation split.

        Genuine: probability of the true subject for each enrolled validation
        template. Impostor: probability of each *other* enrolled subject for
        every validation template (background templates included). The same
        score :meth:`verify_score` returns.
        """
        m = self.require_model()
        return m.genuine.copy(), m.impostor.copy()


class ServingFaceScores:
    """The serving model as the QBBS module's face-score provider.

    Implements ``peep.server.qbbs.face.FaceScoreProvider`` structurally: the
    score of a claim is ``log max(P(claimed | template), 1e-12)``, the
    validation scores are on the same scale, and ``model_version`` names the
    serving version (the QBBS module refits its Parzen densities when it
    changes).

    Raises
    ------
    KeyError
        The claimed subject is not enrolled in the serving model (or was erased).
    ValueError
        The template cannot be scored by this model (other bundle or domain, wrong length).
    ModelUnavailable
        No model has been trained yet.
    """

    FLOOR = 1e-12

    def __init__(self, recogniser: Recogniser) -> None:
        self.recogniser = recogniser

    @property
    def model_version(self) -> str:
        m = self.recogniser.model
        return m.version if m is not None else ""

    def face_score(self, claimed_subject: str, values: NDArray[np.float32], *, template: Any = None) -> float:
        m = self.recogniser.require_model()
        if template is not None:
            from peep.core.wire import mechanism_kind_name

            m = self.recogniser.check_compatible(
                template.bundle_id, mechanism_kind_name(template.mechanism.kind), key_id=template.key_id
            )
        if claimed_subject not in m.class_index:
            raise KeyError(claimed_subject)
        _, scores = self.recogniser.verify_scores(
            np.asarray(values, dtype=np.float32).reshape(1, -1), [claimed_subject], model=m
        )
        if self.recogniser.is_masked(claimed_subject, m):
            raise KeyError(claimed_subject)  # erased, not yet retrained
        return math.log(max(float(scores[0]), self.FLOOR))

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        genuine, impostor = self.recogniser.validation_scores()
        return np.log(np.maximum(genuine, self.FLOOR)), np.log(np.maximum(impostor, self.FLOOR))
