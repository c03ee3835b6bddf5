"""From stored enrolment templates to a promoted model version.

:class:`Trainer` selects the current bundle's labelled enrolment templates,
fits a recogniser (:func:`peep.server.recognition.fitting.fit_recogniser`), exports it
to ONNX, checks ONNX against scikit-learn, and promotes it atomically in the
model registry (a directory, or the database for replicas). One training at a time
per process, and one across the processes sharing the registry (the registry's
training lease: an advisory lock on PostgreSQL, a file lock on a directory); the
Train RPC may run it in the background while the previous model keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from peep.core.mechanisms import mechanism_class
from peep.server.bundles.catalog import BundleCatalog
from peep.server.config import TrainingConfig
from peep.server.recognition.export import check_onnx_agreement, export_onnx, model_meta
from peep.server.recognition.fitting import fit_recogniser
from peep.server.recognition.model_registry import AnyRegistry
from peep.server.recognition.presets import PRESETS, Progress, TrainingError
from peep.server.recognition.thresholds import calibration_summary
from peep.server.storage import Store

__all__ = ["TrainResult", "Trainer", "TrainingBusy"]

log = logging.getLogger(__name__)


class TrainingBusy(RuntimeError):
    """A training run is already in progress in this process, or on another replica."""


_BUSY_ELSEWHERE = (
    "a training run is already in progress on another replica (or `peep train`); its model is served "
    "everywhere when it is promoted"
)


@dataclass
class TrainResult:
    version: str
    validation_accuracy: float
    n_templates: int
    n_subjects: int
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)


class Trainer:
    """Train and promote model versions.

    Parameters
    ----------
    store, bundles, registry
    config : TrainingConfig
    on_run : callable(outcome: str, seconds: float), optional
        Called after each run with ``"promoted"``, ``"failed"`` or ``"cancelled"`` (metrics).
    on_promoted : callable(), optional
        Called after a promotion (the recogniser reloads).
    """

    def __init__(
        self,
        store: Store,
        bundles: BundleCatalog,
        registry: AnyRegistry,
        config: TrainingConfig,
        *,
        on_run: Callable[[str, float], None] | None = None,
        on_promoted: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.bundles = bundles
        self.registry = registry
        self.config = config
        self._on_run = on_run
        self._on_promoted = on_promoted
        self._busy = threading.Lock()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self.progress = 0.0
        self.last_error: str | None = None
        self.last_result: TrainResult | None = None

    @property
    def training(self) -> bool:
        return self._busy.locked()

    def select_kinds(self, bundle_id: str) -> list[str]:
        """Mechanism kinds to train on: the configured one, or the domain with most templates."""
        counts = self.store.enrolment_kinds(bundle_id)
        if self.config.mechanism_kind is not None:
            domain = mechanism_class(self.config.mechanism_kind).domain
        else:
            if not counts:
                raise TrainingError(
                    f"enrolment: expected labelled enrolment templates for bundle {bundle_id}, found none"
                )
            per_domain: Counter[str] = Counter()
            for kind, n in counts.items():
                per_domain[mechanism_class(kind).domain] += n
            domain = per_domain.most_common(1)[0][0]
        return sorted(k for k in counts if mechanism_class(k).domain == domain) or [self.config.mechanism_kind or ""]

    def select_key_id(self, bundle_id: str, kinds: list[str]) -> str:
        """The site key (public id, "" for none) to train under: the configured one, or the only one stored.

        Templates released under two keys are rotated differently: a model fitted on both would score
        neither. While a rotation leaves both stored, training refuses until told which key it is for.
        """
        counts = self.store.enrolment_key_ids(bundle_id, kinds)
        wanted = self.config.site_key_id
        if wanted is not None:
            if wanted not in counts:
                held = ", ".join(f"{k or 'none'}: {n}" for k, n in sorted(counts.items())) or "none"
                raise TrainingError(
                    f"training.site_key_id: expected a key with enrolment templates of bundle {bundle_id}, "
                    f"received {wanted} (stored: {held})"
                )
            return wanted
        if len(counts) > 1:
            held = ", ".join(f"{k or 'none'}: {n}" for k, n in sorted(counts.items()))
            raise TrainingError(
                f"enrolment: templates of bundle {bundle_id} were released under {len(counts)} site keys ({held}); "
                "a model is trained under one: set training.site_key_id to the key in use, or erase the retired "
                "key's templates"
            )
        return next(iter(counts), "")

    def train(self, preset: str | None = None, *, progress: Progress | None = None) -> TrainResult:
        """Train synchronously and promote; raises :class:`TrainingBusy`, :class:`TrainingError`."""
        if not self._busy.acquire(blocking=False):
            raise TrainingBusy("a training run is already in progress; poll GetModelStatus")
        try:
            with self.registry.training_lease() as held:
                if not held:
                    raise TrainingBusy(_BUSY_ELSEWHERE)
                return self._train_locked(preset, progress)
        finally:
            self._busy.release()

    def start_background(self, preset: str | None = None) -> bool:
        """Start training in a thread; False when one is already running."""
        if not self._busy.acquire(blocking=False):
            return False
        lease = ExitStack()
        try:
            held = lease.enter_context(self.registry.training_lease())
        except BaseException:
            self._busy.release()
            raise
        if not held:
            lease.close()
            self._busy.release()
            return False

        def run() -> None:
            try:
                self._train_locked(preset, None)
            except Exception as exc:  # reported through status/logs; serving continues
                log.error("background training failed", extra={"error": str(exc)})
            finally:
                lease.close()
                self._busy.release()

        self._thread = threading.Thread(target=run, name="peep-train", daemon=True)
        self._thread.start()
        return True

    def cancel(self, timeout: float | None = None) -> None:
        """Stop a running training at the next epoch (nothing is promoted)."""
        self._cancel.set()
        t = self._thread
        if t is not None:
            t.join(timeout)

    def _train_locked(self, preset: str | None, progress: Progress | None) -> TrainResult:
        name = preset or self.config.preset
        if name not in PRESETS:
            raise TrainingError(f"preset: expected one of {sorted(PRESETS)}, received {name!r}")
        self._cancel.clear()
        self.progress = 0.0
        self.last_error = None
        t0 = time.perf_counter()
        outcome = "failed"
        try:
            bundle = self.bundles.current()
            if bundle is None:
                raise TrainingError("bundle: expected a published bundle to train for, found none")
            kinds = self.select_kinds(bundle.bundle_id)
            key_id = self.select_key_id(bundle.bundle_id, kinds)
            data = self.store.enrolment_set(bundle.bundle_id, kinds, key_id)
            if len(data) == 0:
                raise TrainingError(f"enrolment: no enrolment templates of kinds {kinds} for bundle {bundle.bundle_id}")

            def report(done: int, total: int) -> None:
                self.progress = 0.9 * done / max(total, 1)
                if progress is not None:
                    progress(done, total)

            log.info(
                "training started",
                extra={
                    "preset": name,
                    "bundle_id": bundle.bundle_id,
                    "kinds": kinds,
                    "key_id": key_id,
                    "templates": len(data),
                },
            )
            fitted = fit_recogniser(
                data.values,
                list(data.subjects),
                preset=name,
                background_prefix=self.config.background_prefix,
                validation_fraction=self.config.validation_fraction,
                target_far=self.config.target_far,
                identify_far=self.config.identify_far,
                unknown_reject_rate=self.config.unknown_reject_rate,
                min_templates_per_subject=self.config.min_templates_per_subject,
                random_state=self.config.random_state,
                progress=report,
                cancel=self._cancel,
                blas_threads=self.config.blas_threads,
            )
            onnx_model = export_onnx(fitted, bundle.n_components)
            fitted.metrics.update(check_onnx_agreement(fitted, onnx_model))
            self.progress = 0.95
            meta = model_meta(
                fitted,
                bundle_id=bundle.bundle_id,
                kinds=kinds,
                n_components=bundle.n_components,
                n_templates=len(data),
                key_id=key_id,
            )
            version = self.registry.publish(
                onnx_model=onnx_model,
                meta=meta,
                scores={"genuine": fitted.genuine_scores, "impostor": fitted.impostor_scores},
                keep=self.config.keep_versions,
            )
            self.progress = 1.0
            outcome = "promoted"
            result = TrainResult(
                version=version.name,
                validation_accuracy=float(fitted.metrics["validation_accuracy"]),
                n_templates=len(data),
                n_subjects=int(meta["n_subjects"]),
                seconds=time.perf_counter() - t0,
                metrics=fitted.metrics,
            )
            self.last_result = result
            log.info(
                "model promoted",
                extra={
                    "version": version.name,
                    "validation_accuracy": result.validation_accuracy,
                    "seconds": round(result.seconds, 2),
                    "calibration": calibration_summary(fitted.metrics),
                },
            )
            if self._on_promoted is not None:
                self._on_promoted()
            return result
        except Exception as exc:
            if type(exc).__name__ == "TrainingCancelled":
                outcome = "cancelled"
            self.last_error = str(exc)
            raise
        finally:
            if self._on_run is not None:
                self._on_run(outcome, time.perf_counter() - t0)
