"""The server's parts wired together from one :class:`~peep.server.config.ServerConfig`: the composition root.

:class:`Services` builds every part the serving process and the one-shot
commands share, and passes each the parts it needs: the store, the bundle
catalogue, validation, the model registry and recogniser, device models,
ingest, events, claim checks, training, and (``host_qbbs``) the hosted QBBS
module. Nothing finds a part by looking for it: a part is constructed here or
passed in. Operations that span parts live here too: erasure of a subject
(templates, then soft-trait hooks, then retraining) and retention.

What *runs* over these parts in ``peep serve`` (the gRPC and MQTT transports,
metrics, the console and the periodic loops: retention, fusion sweep, device
models, the replica heartbeat) is :class:`peep.server.app.ServerApp`'s: a
one-shot command builds Services without starting any of it.

QBBS
----
``Services(config, host_qbbs=True)`` with a ``[qbbs]`` table builds
:class:`~peep.server.qbbs.hosting.HostedQbbs` (``services.qbbs``) on the
serving recogniser, the ingestor and (PostgreSQL) the database, and wires it
as below; ``peep serve`` and ``peep erase`` ask for it, a command that neither
serves nor erases (``peep train``) does not open its store. The gRPC server
adds its ``QbbsService`` and the console shows its odometer.

Hooks (what a hosted module is wired with)
------------------------------------------
``services.recogniser.add_listener(fn)``
    ``fn(model)`` after each promotion (QBBS refits its face-score densities).
``services.add_erasure_hook(fn, holds=...)``
    ``fn(subject) -> int`` deletes that subject's soft traits and returns how
    many; called by every erasure after the templates are gone.
    ``holds(subject) -> bool`` says, deleting nothing, whether ``fn`` would
    delete any: an erasure of a subject nothing holds is refused unchanged.
``services.add_close_hook(fn)``
    ``fn()`` releases a hosted module's resources (its store, its ledger) when
    the services close, before the database does.
``services.ingestor.check(template, Sender(identity=...))``
    the same template checks ingest applies.
``peep.server.ingest.auth.current_identity()``
    the caller of the RPC being handled.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from peep.server import startup
from peep.server.bundles.catalog import BundleCatalog
from peep.server.config import ResolvedSecrets, ServerConfig, resolve_secrets
from peep.server.ingest.auth import DeviceRegistry
from peep.server.ingest.contacts import DeviceContacts
from peep.server.ingest.events import EventBus
from peep.server.ingest.ingestor import Ingestor
from peep.server.ingest.reports import DeviceReportBook
from peep.server.ingest.validation import TemplateValidator
from peep.server.metrics import ServerMetrics
from peep.server.rates import CallerRate
from peep.server.recognition.claims import ClaimChecker
from peep.server.recognition.devicemodels import DeviceModels
from peep.server.recognition.fusion import TrackFusion
from peep.server.recognition.model_registry import AnyRegistry, DatabaseModelRegistry, ModelRegistry
from peep.server.recognition.presets import Progress, TrainingError
from peep.server.recognition.recogniser import Recogniser
from peep.server.recognition.tracks import TrackIdentifier
from peep.server.recognition.trainer import Trainer, TrainingBusy, TrainResult
from peep.server.recognition.watch import ChangeWatcher
from peep.server.storage import KeptCounts, Store, open_store
from peep.server.storage.sql import ERASURES_CHANNEL, EVENTS_CHANNEL, MODELS_CHANNEL

if TYPE_CHECKING:
    from peep.server.qbbs.hosting import HostedQbbs

log = logging.getLogger(__name__)

#: A device may ask for a device model in bursts of this many, then once every 1 / MODEL_REQUESTS_PER_S seconds
#: (a device asks at start, when its broker connection comes back and every few minutes).
MODEL_REQUEST_BURST = 10
MODEL_REQUESTS_PER_S = 0.1

ErasureHook = Callable[[str], int]
#: Whether an erasure hook holds anything of a subject (deletes nothing).
HoldsHook = Callable[[str], bool]


class NoSuchSubject(LookupError):
    """An erasure named a subject nothing holds; nothing was changed (``NOT_FOUND``, exit 1, HTTP 404)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        shown = repr(subject) if len(subject) <= 64 else f"{subject[:64]!r}... ({len(subject)} characters)"
        super().__init__(
            f"subject: no such subject {shown}: expected one that a template, a soft trait, a decision or a "
            "kept model version names; nothing was changed"
        )


@dataclass(frozen=True, eq=False)  # compared by identity: one function may be registered twice
class _ErasureHook:
    delete: ErasureHook
    holds: HoldsHook | None


class KeyInUse(ValueError):
    """Retiring the site key the serving model was trained under would leave nothing able to answer."""


@dataclass
class KeyRetirement:
    key_id: str
    templates_deleted: int
    versions_purged: list[str] = field(default_factory=list)
    #: Device models of the key withdrawn (never served or re-issued: the devices' copies expire).
    device_models_withdrawn: int = 0


@dataclass
class ErasureResult:
    subject: str
    templates_deleted: int
    soft_traits_deleted: int
    model_version: str
    versions_purged: list[str] = field(default_factory=list)
    #: Kept decisions that named the subject (identified as, or claimed).
    decisions_deleted: int = 0
    #: Whether the subject had opted in to be shown in Home Assistant (the opt-in is deleted with the rest; the
    #: MQTT bridge then empties their retained entity, transport/homeassistant_people.py).
    home_assistant_opt_in: bool = False


def kept_rows(config: ServerConfig, counts: KeptCounts) -> list[dict[str, Any]]:
    """What the database keeps, per category, with how long (``id``, ``what``, ``n``, ``kept_for``).

    The one wording of the retention rules, for ``peep retention`` and the console's People and Privacy pages.
    """
    rc = config.recognition
    enrol_for = (
        f"{config.retention.days:g} days after receipt (retention.include_enrolment)"
        if config.retention.days is not None and config.retention.include_enrolment
        else "until erased"
    )
    not_kept = f"not kept (recognition.keep = {rc.keep})"
    k = counts
    return [
        {"id": "enrolment", "what": "enrolment templates (consented)", "n": k.enrolment, "kept_for": enrol_for},
        {"id": "background", "what": "background templates (the administrator's public population)",
         "n": k.background, "kept_for": enrol_for},
        {"id": "recognised", "what": "identify/verify templates of people recognised as enrolled",
         "n": k.recognised, "kept_for": f"{rc.keep_days:g} days" if rc.keep != "none" else not_kept},
        {"id": "unknown", "what": "identify/verify templates of everyone else (strangers)", "n": k.unknown,
         "kept_for": f"{rc.keep_days:g} days" if rc.keep == "all" else not_kept},
        {"id": "decisions", "what": f"decisions (recognition events; {k.unknown_decisions} unknown, naming nobody)",
         "n": k.decisions, "kept_for": f"{rc.events_days:g} days"},
        {"id": "ledger", "what": "ledger of received message ids (ids, times, ε; no template)", "n": k.ledger,
         "kept_for": f"{config.ingest.ledger_window_s / 86400:.4g} days (ingest.max_age_s + max_clock_skew_s)"},
        {"id": "track-memory", "what": "track fusion memory (replicas)", "n": k.track_memory,
         "kept_for": f"{config.training.track_fusion_s:g} s"},
    ]  # fmt: skip


class Services:
    """All server parts (see module docstring).

    Parameters
    ----------
    config : ServerConfig
    secrets : ResolvedSecrets, optional
        Resolved from the environment / ``CREDENTIALS_DIRECTORY`` when omitted.
    store : Store, optional
        Opened from ``config.storage`` when omitted.
    metrics : ServerMetrics, optional
    host_qbbs : bool, default False
        Host the QBBS module ``[qbbs]`` configures (``services.qbbs``; ``None`` without the table): what a
        process that serves or erases does. Its configuration is checked before anything is opened.

    Raises
    ------
    peep.server.config.ConfigError
        With ``host_qbbs``: ``[qbbs]`` lacks the files it needs (:func:`~peep.server.qbbs.hosting.hosted_config`).
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        secrets: ResolvedSecrets | None = None,
        store: Store | None = None,
        metrics: ServerMetrics | None = None,
        host_qbbs: bool = False,
    ) -> None:
        qbbs_config = None
        if host_qbbs:
            # Imported only when asked for: a process that does not host QBBS never loads it.
            from peep.server.qbbs.hosting import hosted_config

            qbbs_config = hosted_config(config)
        self.config = config
        self.secrets = secrets if secrets is not None else resolve_secrets(config)
        self.metrics = metrics or ServerMetrics()
        db_password = self.secrets.db_password.get_secret_value() if self.secrets.db_password else None
        rid = config.cluster.replica_id
        app_name = f"peep-server-{rid}" if rid else "peep-server"  # tells replicas apart in pg_stat_activity
        self.store = (
            store if store is not None else open_store(config.storage, password=db_password, application_name=app_name)
        )
        self.bundles = BundleCatalog(
            self.store, startup.pinned_key(config), trusted_models=config.bundle.trusted_descriptor_models
        )
        self.validator = TemplateValidator(
            self.bundles,
            plausibility_sigmas=config.bundle.plausibility_sigmas,
            max_clock_skew_s=config.ingest.max_clock_skew_s,
            max_age_s=config.ingest.max_age_s,
        )
        #: Replicas on one PostgreSQL share the model registry in the database and learn of each other's
        #: promotions and erasures through LISTEN/NOTIFY; a single node on SQLite keeps the
        #: directory registry and checks it (and the erasure list) on the recognition path.
        self.clustered = self.store.dialect == "postgres" and hasattr(self.store, "connect")
        self.registry: AnyRegistry
        if self.clustered:
            self.registry = DatabaseModelRegistry(self.store)
            self.recogniser = Recogniser(
                self.registry,
                threads=config.training.threads,
                erasures=self.store.erasures,
                check_interval=math.inf,  # the watcher below reloads, off the recognition path
                erasure_interval=math.inf,
            )
        else:
            self.registry = ModelRegistry(config.training.model_dir)
            self.recogniser = Recogniser(self.registry, threads=config.training.threads, erasures=self.store.erasures)
        #: Signed device models of the serving model (none without training.device_models' key and calibration).
        self.device_models = DeviceModels(
            config.training.device_models,
            startup.device_model_material(config),
            self.store,
            self.registry,
            self.recogniser,
            background_prefix=config.training.background_prefix,
            # Replicas each hear of a model another issued; only the one that issued it broadcasts it.
            announce_others=not self.clustered,
        )
        # Decisions made on devices are checked against the models issued to them.
        self.validator.device_models = self.device_models
        #: Devices' asks for a device model (gRPC GetDeviceModel and MQTT model_request), per device: an answer
        #: may be megabytes, and costs the asker nothing.
        self.device_model_requests = CallerRate(
            "device model requests", rate_per_s=MODEL_REQUESTS_PER_S, burst=MODEL_REQUEST_BURST
        )
        self.recogniser.add_listener(lambda m: self.metrics.set_model_version(m.version))
        self.metrics.set_model_version(self.recogniser.model.version if self.recogniser.model else None)
        self.devices = DeviceRegistry(
            config.auth.devices,
            token_sha256=self.secrets.device_token_sha256,
            admin_token_sha256=self.secrets.admin_token_sha256,
            admin_common_names=config.auth.admin_common_names,
            require_signatures=config.auth.require_device_signatures,
        )
        #: The replica that decides, kept with each decision ("" for a single server).
        self.origin = (config.cluster.replica_id or socket.gethostname()) if self.clustered else ""
        self.events = EventBus(
            self.store.decisions,
            self.store.last_decision_id,
            self.store.first_decision_id,
            origin=self.origin if self.clustered and not config.cluster.events else None,
            check_interval=config.cluster.check_interval_s,
        ).start()
        self.ingestor = Ingestor(
            self.store,
            self.validator,
            self.recogniser,
            self.events,
            self.metrics,
            self.devices,
            require_registered_device=config.mqtt.require_registered_device,
            tracks=TrackIdentifier(
                self.recogniser,
                TrackFusion(ttl_s=config.training.track_fusion_s) if config.training.track_fusion_s > 0 else None,
                memory=self.store if self.clustered else None,
            ),
            background_prefix=config.training.background_prefix,
            keep=config.recognition.keep,
            origin=self.origin,
            claim_key=_claim_key(config),
        )
        #: Doors' questions before they release anything: is the claimed subject enrolled?
        self.claim_checks = ClaimChecker(
            self.recogniser,
            background_prefix=config.training.background_prefix,
            rate_per_s=config.recognition.claim_checks_per_s,
            burst=config.recognition.claim_checks_burst,
        )
        #: Devices' reports sent over gRPC (the MQTT bridge keeps the retained ones).
        self.device_reports = DeviceReportBook(self.store)
        #: Each device's last authenticated gRPC contact and open calls (in memory, this replica's).
        self.device_contacts = DeviceContacts()
        self.trainer = Trainer(
            self.store,
            self.bundles,
            self.registry,
            config.training,
            on_run=self.metrics.training_run,
            on_promoted=self._promoted,
        )
        self._erasure_hooks: list[_ErasureHook] = []
        self._close_hooks: list[Callable[[], None]] = []
        self._erase_lock = threading.Lock()
        self.watcher: ChangeWatcher | None = None
        if self.clustered:
            self.watcher = ChangeWatcher(
                self.store.connect,  # type: ignore[attr-defined]
                {
                    MODELS_CHANNEL: self._model_notified,
                    ERASURES_CHANNEL: self._erasure_notified,
                    EVENTS_CHANNEL: lambda _payload: self.events.committed(),
                },
                on_check=self._check_changes,
                interval=config.cluster.check_interval_s,
                name="peep-models",
            ).start()
        #: QBBS hosted in this process (``host_qbbs`` and a ``[qbbs]`` table), else ``None``.
        self.qbbs: HostedQbbs | None = None
        if qbbs_config is not None:
            self.qbbs = self._host_qbbs(qbbs_config)

    def _host_qbbs(self, qbbs_config: Any) -> HostedQbbs:
        """Build QBBS on the parts it needs and wire it like the other parts (see the module docstring)."""
        from peep.server.qbbs.hosting import HostedQbbs

        # On PostgreSQL the soft traits and the odometer are in the server's database, shared by replicas.
        connect = self.store.connect if self.clustered else None  # type: ignore[attr-defined]
        hosted = HostedQbbs.build(qbbs_config, recogniser=self.recogniser, ingestor=self.ingestor, connect=connect)
        self.add_close_hook(hosted.close)
        self.add_erasure_hook(hosted.erase, holds=hosted.holds)
        self.recogniser.add_listener(hosted.refit)
        return hosted

    def _model_notified(self, _payload: str) -> None:
        self.recogniser.reload()

    def _erasure_notified(self, _payload: str) -> None:
        self.recogniser.refresh_erasures()

    def _check_changes(self) -> None:
        self.events.committed()  # after a reconnection: read the decisions committed while not listening
        self.recogniser.refresh_erasures()
        self.recogniser.reload()

    def _promoted(self) -> None:
        self.recogniser.reload()
        # Every promotion goes to the devices that decide themselves (the trainer, `peep train`, the Train call).
        self._issue_device_model("promotion")

    def _issue_device_model(self, reason: str) -> None:
        """Issue a device model of the serving one; a failure is logged and never fails what caused it (a
        promotion, an erasure): the schedule (:meth:`DeviceModels.poll`) issues it once the database answers."""
        try:
            self.device_models.issue(reason)
        except Exception as exc:
            log.error("device model not issued", extra={"reason": reason, "error": str(exc)[:200]})

    # ------------------------------------------------------------ bundles

    def publish_configured_bundle(self) -> str | None:
        """Publish ``bundle.dir`` (if configured); returns its id.

        Raises :class:`~peep.server.config.ConfigError` naming ``bundle.dir`` if it
        does not verify against the pinned key (:func:`peep.server.startup.configured_bundle`).
        """
        bundle = startup.configured_bundle(self.config, self.bundles.public_key)
        if bundle is None:
            return None
        return self.bundles.publish(bundle.files).bundle_id

    # ------------------------------------------------------------ training

    def train(self, preset: str | None = None, *, progress: Progress | None = None) -> TrainResult:
        return self.trainer.train(preset, progress=progress)

    def make_current(self, name: str) -> str:
        """Serve the kept model version ``name`` (roll back to an older one, or forward again).

        Refused with :class:`ValueError` naming why: no such version kept, a
        training run in progress (it would promote over the choice), or a
        version that knows a subject erased after it was trained -- erasure
        deletes such versions, and one is never served again if any survived.
        Returns the serving version's name.
        """
        from peep.server.recognition.model_registry import RegistryError

        if not isinstance(name, str) or len(name) > 32:
            raise ValueError("version: expected a version name like v000001")
        if self.trainer.training:
            raise ValueError("version: a training run is in progress; it will promote its own version when done")
        kept = self.registry.versions()
        if name not in kept:
            raise ValueError(f"version: no version {name[:32]!r} is kept (kept: {', '.join(kept) or 'none'})")
        try:
            version = self.registry.get(name)
        except RegistryError as exc:
            raise ValueError(f"version: {name} cannot be served ({exc})") from None
        trained = float(version.meta.get("trained_at", version.meta.get("created_at", 0.0)))
        erased = self.store.erasures()
        knows = sorted(c for c in version.meta.get("classes", []) if c in erased and erased[c] >= trained)
        if knows:
            raise ValueError(
                f"version: {name} was trained before {len(knows)} of its subjects were erased; it is never served again"
            )
        with self._erase_lock:  # not while an erasure decides which versions to purge
            self.registry.make_current(name)
        self.recogniser.reload()
        self._issue_device_model("rollback")
        log.info("model version made current", extra={"version": name})
        return name

    # ------------------------------------------------------------ erasure

    def add_erasure_hook(self, fn: ErasureHook, *, holds: HoldsHook | None = None) -> None:
        """Register ``fn(subject) -> n_deleted`` (a hosted module's: QBBS's soft traits).

        Parameters
        ----------
        fn : callable
            Deletes what it holds of a subject; returns how many items it deleted.
        holds : callable, optional
            ``holds(subject) -> bool``, deleting nothing: whether ``fn`` would delete anything. Without it, an
            erasure of a subject nothing else holds can only find out by running ``fn`` (deleting nothing of a
            subject it does not hold, so the refusal of an unknown subject still changes nothing).
        """
        self._erasure_hooks.append(_ErasureHook(fn, holds))

    def add_close_hook(self, fn: Callable[[], None]) -> None:
        """Register ``fn()`` to run in :meth:`close` (a hosted module closing its store)."""
        self._close_hooks.append(fn)

    @property
    def n_erasure_hooks(self) -> int:
        return len(self._erasure_hooks)

    def retire_key(self, key_id: str) -> KeyRetirement:
        """Forget a rotated-out site key: every template released under it and every kept model trained under it.

        ``key_id`` is the key's public id ("" for templates released without a key). Refused with
        :class:`KeyInUse` while the serving model was trained under that key: train under the new key first.
        """
        model = self.recogniser.model
        if model is not None and model.key_id == key_id:
            raise KeyInUse(
                f"--key-id: the serving model {model.version} was trained under {key_id or 'no key'}; train under "
                "the new key first (training.site_key_id), then retire this one"
            )
        n = self.store.delete_key_templates(key_id)
        purged = self.registry.purge_key(key_id)
        withdrawn = self.device_models.withdraw_key(key_id)
        self.device_models.forget_versions()
        log.info(
            "site key retired",
            extra={"key_id": key_id, "templates": n, "versions": purged, "device_models": withdrawn},
        )
        return KeyRetirement(key_id, n, purged, device_models_withdrawn=withdrawn)

    def erase_subject(self, subject: str, *, retrain: bool = True) -> ErasureResult:
        """Erase a subject: templates, then soft traits (hooks), then retrain.

        Until a retrained model serves, the current model never names the
        subject (its probability is zeroed). After retraining, older model
        versions that know the subject are deleted.

        A subject nothing holds (no template, soft trait or decision names it,
        and neither the serving model nor a kept version knows it) raises
        :class:`NoSuchSubject` with nothing changed: no erasure is recorded and
        no version trained, so erasing an unknown or already erased id cannot
        push the versions kept for roll-back out of ``training.keep_versions``.
        Retraining happens only when templates were deleted or the serving
        model knows the subject (otherwise it would train the same model again).
        """
        from peep.core.wire import check_subject_id

        subject = check_subject_id(subject, "subject")  # NFC: the form stored
        with self._erase_lock:
            model = self.recogniser.model
            served = model is not None and subject in model.classes
            known = served or self.store.names_subject(subject) or bool(self.registry.versions_knowing(subject))
            known = known or any(h.holds is not None and h.holds(subject) for h in self._erasure_hooks)
            n_traits = 0
            probed: list[_ErasureHook] = []
            if not known:
                # A hook that cannot be asked is asked the only way it can be; with nothing else
                # holding the subject, no model names it, so masking it first would protect no one.
                probed = [h for h in self._erasure_hooks if h.holds is None]
                n_traits = sum(int(h.delete(subject)) for h in probed)
                if not n_traits:
                    raise NoSuchSubject(subject)
            self.store.record_erasure(subject, time.time())
            self.recogniser.refresh_erasures()
            n_templates = self.store.delete_subject(subject)
            n_decisions = self.store.delete_subject_decisions(subject)
            shown = self.store.clear_home_assistant_person(subject)
            for hook in self._erasure_hooks:
                if hook not in probed:
                    n_traits += int(hook.delete(subject))
            self.metrics.erasures.inc()
            log.info(
                "subject erased", extra={"templates": n_templates, "soft_traits": n_traits, "decisions": n_decisions}
            )
            if served:
                # Devices deciding themselves stop naming the subject now: a new serial of the serving model lists
                # them among its erased ids, before (and whether or not) a retrained model is promoted.
                self._issue_device_model("erasure")
            version = model.version if model else ""
            purged: list[str] = []
            needs_training = served or n_templates > 0
            if retrain and needs_training and model is not None:
                try:
                    result = self.trainer.train()
                    version = result.version
                except (TrainingError, TrainingBusy) as exc:
                    log.warning(
                        "retraining after erasure failed; the erased subject stays masked", extra={"error": str(exc)}
                    )
                purged = self.registry.purge_subject(subject)
            elif not served:  # the serving model is already without the subject: only older versions know it
                purged = self.registry.purge_subject(subject)
            if purged:
                self.device_models.forget_versions()
            return ErasureResult(subject, n_templates, n_traits, version, purged, n_decisions, shown)

    # ------------------------------------------------------------ retention

    def apply_retention(self, days: float, *, include_enrolment: bool | None = None, now: float | None = None) -> int:
        """Delete templates received more than ``days`` days ago; returns how many."""
        if not days > 0:
            raise ValueError(f"days: expected a number > 0, received {days}")
        incl = self.config.retention.include_enrolment if include_enrolment is None else include_enrolment
        cutoff = (time.time() if now is None else now) - days * 86400.0
        n = self.store.delete_received_before(cutoff, include_enrolment=incl)
        self.metrics.retention_deleted.inc(n)
        log.info("retention applied", extra={"days": days, "deleted": n, "include_enrolment": incl})
        return n

    def enforce_retention(self, *, now: float | None = None) -> dict[str, int]:
        """Delete everything past its stated retention (``[recognition]``, ``[retention]``, the ledger's window).

        Identify/verify templates that ``recognition.keep`` does not allow
        (all of them with ``none``, unknown ones with ``recognised``: left by an
        earlier version or setting) and kept ones older than
        ``recognition.keep_days``; with ``retention.days``, templates older than
        that; decisions and console alerts older than
        ``recognition.events_days``; ledger entries older than
        ``ingest.max_age_s + ingest.max_clock_skew_s``; expired track memory.
        Returns the rows deleted per kind.
        """
        at = time.time() if now is None else now
        rc = self.config.recognition
        if rc.keep == "none":
            gone = self.store.delete_recognition_templates()
        else:
            gone = self.store.delete_recognition_templates(before=at - rc.keep_days_s)
            if rc.keep == "recognised":
                more = self.store.delete_recognition_templates(unknown_only=True)
                gone = {k: gone[k] + more[k] for k in gone}
        out = {"recognised_templates": gone["recognised"], "unknown_templates": gone["unknown"]}
        if self.config.retention.days is not None:
            cutoff = at - self.config.retention.days * 86400.0
            out["templates"] = self.store.delete_received_before(
                cutoff, include_enrolment=self.config.retention.include_enrolment
            )
        out["decisions"] = self.store.delete_decisions_before(at - rc.events_days_s)
        out["alerts"] = self.store.delete_alerts_before(at - rc.events_days_s)
        out["ledger"] = self.store.delete_ledger_before(at - self.config.ingest.ledger_window_s)
        out["track_memory"] = self.store.expire_track_memory(at)
        # A device model's row checks the decisions made with it for as long as a device may spool one.
        out["device_models"] = self.device_models.delete_expired_before(at - self.config.ingest.ledger_window_s)
        templates = out["recognised_templates"] + out["unknown_templates"] + out.get("templates", 0)
        self.metrics.retention_deleted.inc(templates)
        if any(out.values()):
            log.info("retention applied", extra={"deleted": out, "keep": rc.keep})
        return out

    def purge_recognition(self) -> dict[str, int]:
        """Delete every stored identify/verify template, whatever ``recognition.keep`` says; returns counts."""
        gone = self.store.delete_recognition_templates()
        self.metrics.retention_deleted.inc(gone["recognised"] + gone["unknown"])
        log.info("identify/verify templates purged", extra={"deleted": gone})
        return gone

    def sweep_fusion_memory(self, *, now: float | None = None) -> int:
        """Forget track fusion's expired releases, in this process and (replicas) in ``track_memory``."""
        return self.ingestor.tracks.expire(now=now)

    def close(self) -> None:
        self.trainer.cancel(timeout=5.0)
        if self.watcher is not None:
            self.watcher.stop()
        self.ingestor.close()
        self.events.close()
        for fn in self._close_hooks:
            try:
                fn()
            except Exception:  # one module failing to close must not keep the database open
                log.exception("close hook failed")
        self.store.close()


def _claim_key(config: ServerConfig) -> Any:
    """The public half of the server's decision key: what a door's VERIFY over MQTT shows it was asked."""
    key = startup.decision_signing_key(config)
    return None if key is None else key.public_key()
