"""The agent: wires configuration, bundle, pipeline, spool and transports, and runs them.

Start-up order (anything wrong stops the agent before a frame is read):

1. pinned public key and bundle: the bundle must verify (signature, hashes);
   an unsigned, tampered or foreign-key bundle is refused with the
   :class:`~peep.core.exceptions.BundleError` text naming the file;
2. release mechanism from the device config only, on the secure sampler
   (``random_state=None``; asserted);
3. soft-trait extra (if enabled), budgets (must pay for one release),
   secrets, state directory, persistent ledger, spool;
4. metrics endpoint, transports (they connect in the background: an
   unreachable broker or server is logged and retried while templates wait
   in the spool), frame source.

While running, a housekeeping thread calls :meth:`Spool.housekeep
<peep.edge.spool.Spool.housekeep>` every :attr:`Agent.housekeeping_s`
seconds: dead letters past ``spool.dead_letter_days`` are deleted, and the
bytes of delivered templates leave the spool's WAL within that second even
when a burst of acks came faster than one checkpoint per second, or a backlog
keeps the outbox from running empty.

Stop (SIGTERM/SIGINT, or the end of a file/folder source): stop reading
frames, let the forwarders deliver for up to ``spool.drain_timeout_s``,
publish ``offline``, checkpoint and close the spool and the ledger.

Bundle updates from the retained ``peep/v1/bundle`` topic are applied
between frames, only if they pass the checks of :mod:`peep.edge.bundles`.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import cv2
from peep.core.accounting import PrivacyAccountant, ReleaseCost, Spend
from peep.core.exceptions import BudgetError, WireError
from peep.core.release import TemplateReleaser
from peep.core.reports import DeviceReport, ReportError
from peep.core.wire import check_subject_id
from peep.edge import startup
from peep.edge.bundles import BundleGate
from peep.edge.capture import Frame, FrameSource, open_source
from peep.edge.config import EdgeConfig
from peep.edge.credentials import resolve_secret
from peep.edge.detection import build_detector
from peep.edge.device_key import DeviceKey, SecretFileError
from peep.edge.embedding import DescriptorEncoder
from peep.edge.errors import ConfigError, EdgeError
from peep.edge.ledger import SqliteLedger
from peep.edge.logs import log_event
from peep.edge.metrics import EdgeMetrics
from peep.edge.pipeline import EnrollSession, FramePipeline, Released
from peep.edge.policy import ReleasePolicy, check_budget_allows_release
from peep.edge.reporting import device_report, device_summary
from peep.edge.soft import SoftTraitReleaser
from peep.edge.spool import Spool, disk_room
from peep.edge.tracking import Tracker
from peep.edge.transport.base import Forwarder

_log = logging.getLogger("peep.edge.agent")


def _delta_budget(epsilon_budget: float | None, cost: float, delta: float) -> float:
    """δ budget allowing exactly as many releases as the ε budget does."""
    if delta <= 0.0:
        return 0.0
    if epsilon_budget is None or not math.isfinite(epsilon_budget):
        return 1.0
    n = math.floor(epsilon_budget / cost * (1 + 1e-9))
    return min(1.0, (n + 0.5) * delta)


class Agent:
    """The edge agent for one configuration.

    Attributes
    ----------
    housekeeping_s : float
        Seconds between two :meth:`Spool.housekeep <peep.edge.spool.Spool.housekeep>`
        calls while running (one: the bound on how long a delivered template's
        bytes can outlive its ack in the WAL, and the resolution of
        ``spool.dead_letter_days``; a call with nothing to do is two indexed
        reads).

    Parameters
    ----------
    cfg : EdgeConfig
    environ : mapping, optional
        Where secrets are looked up (defaults to ``os.environ``).
    metrics : EdgeMetrics, optional
    on_release : callable, optional
        Passed to :class:`~peep.edge.pipeline.FramePipeline`: called with each
        spooled template and the frame it came from (local observers only).
    """

    housekeeping_s = 1.0

    def __init__(
        self,
        cfg: EdgeConfig,
        *,
        environ: Mapping[str, str] | None = None,
        metrics: EdgeMetrics | None = None,
        on_release: Callable[[Released, Frame], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.on_release = on_release
        self.environ = os.environ if environ is None else environ
        self.metrics = metrics or EdgeMetrics()
        self.stop_event = threading.Event()
        #: A door deciding over MQTT on a broker without TLS or credentials (door.insecure_broker): its report
        #: says so, and the console shows it.
        self.insecure_broker = False
        #: A door's pinned decision key (the server's, door.decision_public_key), read by :meth:`prepare`.
        self.door_decision_key: Any = None
        #: Decision mode: the deployer's key device models must verify against, the held models and the decider.
        self.model_public_key: Any = None
        self.model_store: Any = None
        self.decisions: Any = None
        self.forwarders: list[Forwarder] = []
        self.mqtt_link: Any = None
        self.spool: Spool | None = None
        self.ledger: SqliteLedger | None = None
        self.pipeline: FramePipeline | None = None
        self.accountant: PrivacyAccountant | None = None
        self.soft: SoftTraitReleaser | None = None
        self.encoder: DescriptorEncoder | None = None
        # The spool's dead letters when it was closed (what receivers refused, oldest first).
        self.dead_letters: list[dict[str, Any]] = []
        self._bundle_updates: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._prepared = False
        self._lifetime = [0.0, 0.0]
        self._reporting = False
        self._housekeeping: threading.Thread | None = None
        self._housekeeping_stop = threading.Event()

    # ------------------------------------------------------------------ start-up

    def _cost_of(self, releaser: TemplateReleaser) -> ReleaseCost:
        return ReleaseCost.of(releaser.mechanism, soft_epsilon=self.soft.epsilon if self.soft else 0.0)

    @property
    def cost(self) -> ReleaseCost:
        """What one release costs (template + soft traits) with the current bundle and configuration."""
        return self._cost_of(self.releaser)

    def prepare(self) -> None:
        """Everything that can fail because of the config or the bundle (no network, no frames).

        ``peep-edge run --validate-config`` is this: the pinned key and the bundle
        verified against it, the mechanism on that bundle, the soft-trait extra,
        the budgets, the secrets, the TLS files of each enabled transport
        (:mod:`peep.edge.startup`, which the transports load theirs from), the
        state directory, a door's budgets and decision key, and the detector. Each problem is a
        :class:`~peep.edge.errors.ConfigError` naming its key.
        """
        cfg = self.cfg
        cv2.setNumThreads(cfg.detector.threads)
        self.bundles, self.releaser, self.encoder = BundleGate.open(cfg)
        self.site_key = self.bundles.site_key
        self.soft = (
            SoftTraitReleaser(
                age_epsilon=cfg.soft.age_epsilon,
                gender_epsilon=cfg.soft.gender_epsilon,
                age_max=cfg.soft.age_max,
            )
            if cfg.soft.enabled
            else None
        )
        cost = self.cost
        check_budget_allows_release(
            cfg.privacy,
            release_epsilon_vector=cost.epsilon_vector,
            release_epsilon_coordinate=cost.epsilon_coordinate,
            soft_epsilon=cost.soft_epsilon,
        )
        self.mqtt_password = (
            resolve_secret(
                credential=cfg.mqtt.password_credential,
                env=cfg.mqtt.password_env,
                field="mqtt.password",
                environ=self.environ,
            )
            if cfg.mqtt.enabled
            else None
        )
        self.grpc_token = (
            resolve_secret(
                credential=cfg.grpc.token_credential,
                env=cfg.grpc.token_env,
                field="grpc.token",
                environ=self.environ,
            )
            if cfg.grpc.enabled
            else None
        )
        if cfg.mqtt.enabled:
            startup.mqtt_tls_context(cfg.mqtt)
        if cfg.grpc.enabled:
            startup.grpc_tls_material(cfg.grpc)
        startup.check_state_dir(cfg.device.state_dir)
        if cfg.door.enabled:
            self.door_decision_key = startup.check_door(cfg.door, release_epsilon_vector=cost.total_vector)
        if cfg.decides_on_device:
            self.model_public_key = startup.check_decision_mode(cfg)
        self.detector = build_detector(cfg.detector)
        self._prepared = True

    def report(self) -> DeviceReport:
        """What this device tells the server about itself (:func:`peep.edge.reporting.device_report`)."""
        return device_report(self.cfg, self.cost, self.releaser, ledger=self.ledger, pipeline=self.pipeline,
                             decisions=self.decisions, insecure_broker=self.insecure_broker)  # fmt: skip

    def publish_report(self) -> bool:
        """Publish :meth:`report` on the device's report topic; False when not connected (the next one follows)."""
        if self.mqtt_link is None:
            return False
        try:
            return bool(self.mqtt_link.publish_report(self.report().to_json()))
        except (ReportError, RuntimeError, ValueError) as exc:
            log_event(_log, logging.WARNING, "report_not_published", error=str(exc)[:200])
            return False

    def describe(self) -> dict[str, Any]:
        """What the agent will do (logged at start, printed by ``--validate-config``)."""
        return device_summary(self.cfg, self.cost, self.releaser)

    def _open_state(self, *, budgets: Mapping[str, tuple[float, float]] | None = None) -> PrivacyAccountant:
        cfg = self.cfg
        try:
            cfg.device.state_dir.mkdir(parents=True, exist_ok=True)
            probe = cfg.device.state_dir / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                "device.state_dir: expected a writable directory, received "
                f"{str(cfg.device.state_dir)!r} "
                f"({exc.strerror})"
            ) from None
        try:
            self.signer = DeviceKey(cfg.device_key_path)
        except (SecretFileError, OSError) as exc:
            raise ConfigError(f"device.signing_key: {exc}") from None
        log_event(_log, logging.INFO, "device_key", path=str(self.signer.path), public_key=self.signer.public_text)
        self.ledger = SqliteLedger(cfg.ledger_path)
        vec, coord, n = self.ledger.lifetime()
        self._lifetime = [vec, coord]
        self.metrics.epsilon_spent.labels(scope="vector").set(vec)
        self.metrics.epsilon_spent.labels(scope="coordinate").set(coord)
        log_event(
            _log,
            logging.INFO,
            "ledger_opened",
            path=str(cfg.ledger_path),
            releases=n,
            epsilon_vector_spent=vec,
            epsilon_coordinate_spent=coord,
        )
        p = cfg.privacy
        cost = self.cost.total_vector
        all_budgets = dict(budgets or {})
        self.device_key: str | None = None
        if p.device_budget is not None:
            self.device_key = f"device:{cfg.device.id}"
            all_budgets[self.device_key] = (
                p.device_budget,
                _delta_budget(p.device_budget, cost, p.delta),
            )
        accountant = PrivacyAccountant(
            epsilon_budget=p.track_budget,
            delta_budget=_delta_budget(p.track_budget, cost, p.delta),
            ledger=self.ledger,
            budgets=all_budgets,
        )
        accountant.on_spend(self._on_spend)
        dests = [n for n, on in (("mqtt", cfg.mqtt.enabled), ("grpc", cfg.grpc.enabled)) if on]
        self.spool = Spool(
            cfg.spool_path,
            destinations=dests,
            max_messages=cfg.spool.max_messages,
            synchronous=cfg.spool.synchronous,
            dead_letter_days=cfg.spool.dead_letter_days,
            dead_letter_max=cfg.spool.dead_letter_max,
            on_drop=lambda dest, purpose, _mid: self.metrics.spool_dropped.labels(
                transport=dest, purpose=purpose
            ).inc(),
        )
        return accountant

    def _on_spend(self, spend: Spend) -> None:
        if spend.key.startswith("device:"):
            return
        self._lifetime[0] += spend.epsilon
        self._lifetime[1] += spend.epsilon_coordinate
        self.metrics.epsilon_spent.labels(scope="vector").set(self._lifetime[0])
        self.metrics.epsilon_spent.labels(scope="coordinate").set(self._lifetime[1])

    def start_housekeeping(self) -> None:
        """Start the thread calling ``spool.housekeep()`` every :attr:`housekeeping_s` seconds (until shutdown).

        A thread of its own rather than the frame loop or the acks: the frame
        loop can sit in a camera re-open for minutes and acks stop with the
        network, while the bounds on what the spool keeps must hold regardless.
        """
        assert self.spool is not None
        if self._housekeeping is not None:
            return
        spool = self.spool

        def loop() -> None:
            while not self._housekeeping_stop.wait(self.housekeeping_s):
                try:
                    spool.housekeep()
                except (sqlite3.Error, ValueError) as exc:  # a locked file (the next round retries) or a closed spool
                    log_event(_log, logging.WARNING, "spool_housekeeping_failed", error=str(exc)[:200])

        self._housekeeping_stop.clear()
        self._housekeeping = threading.Thread(target=loop, name="peep-spool-housekeeping", daemon=True)
        self._housekeeping.start()

    def _start_transports(self, *, enroll: bool = False, client_suffix: str = "", events: bool = True) -> None:
        cfg = self.cfg
        assert self.spool is not None
        if cfg.mqtt.enabled:
            from peep.edge.transport.mqtt import MqttForwarder, MqttLink

            self.mqtt_link = MqttLink(
                cfg.mqtt,
                client_id=cfg.mqtt_client_id + ("-enroll" if enroll else client_suffix),
                site=cfg.device.site,
                device_id=cfg.device.id,
                password=self.mqtt_password,
                metrics=self.metrics,
                on_bundle=None if (enroll or not cfg.bundle.accept_updates) else self._bundle_updates.put,
                publish_status=not enroll,
                subscribe_events=events,
                on_model=self._offer_mqtt_model if (self.model_store is not None and not enroll) else None,
                model_request=self._model_request if (self.model_store is not None and not enroll) else None,
            )
            fwd = MqttForwarder(
                self.mqtt_link,
                self.spool,
                metrics=self.metrics,
                retry_min_s=cfg.mqtt.reconnect_min_s,
                retry_max_s=cfg.mqtt.reconnect_max_s,
            )
            self.mqtt_link.start()
            fwd.start()
            self.forwarders.append(fwd)
        if cfg.grpc.enabled:
            from peep.edge.transport.grpc import GrpcForwarder

            # Without MQTT, the device's report travels over gRPC (with MQTT it is the retained message).
            reports = not enroll and not cfg.mqtt.enabled and cfg.grpc.report_interval_s > 0
            gfwd = GrpcForwarder(
                cfg.grpc,
                self.spool,
                token=self.grpc_token,
                metrics=self.metrics,
                report=(lambda: self.report().to_json()) if reports else None,
                device_id=cfg.device.id,
                site=cfg.device.site,
            )
            gfwd.start()
            self.forwarders.append(gfwd)
            if self.model_store is not None and not enroll:
                from peep.edge.decide import GrpcModelPuller
                from peep.edge.transport.grpc import make_channel

                self._model_channel = make_channel(cfg.grpc)
                GrpcModelPuller(self._model_channel, self.grpc_token, self.model_store,
                                interval_s=cfg.recognition.model_check_s,
                                stop=self._housekeeping_stop).start()  # fmt: skip

    def start_transports(self, *, client_suffix: str = "-door-agent") -> None:
        """Connect the device's transports without reading frames (a door): its status, and the reports that
        carry its ε spent to the server's Devices and Privacy views (the last one at :meth:`shutdown`).

        Over gRPC the forwarder sends the reports; over MQTT a thread of its own publishes one every
        ``mqtt.report_interval_s`` (every second until the first one is taken), as :meth:`run`'s loop does.
        The MQTT client id gets ``client_suffix``: a ``peep-edge run`` of the same device keeps its own. This
        connection does not read the events topic: the door's own connection does (:func:`open_door`).
        """
        self._start_transports(client_suffix=client_suffix, events=False)
        interval = self.cfg.mqtt.report_interval_s
        self._reporting = self.mqtt_link is not None and interval > 0
        if not self._reporting:
            return
        stop = self._housekeeping_stop

        def loop() -> None:
            wait = 1.0
            while not stop.wait(wait):
                wait = interval if self.publish_report() else 1.0

        threading.Thread(target=loop, name="peep-edge-report", daemon=True).start()

    def open(self, *, budgets: Mapping[str, tuple[float, float]] | None = None) -> FramePipeline:
        """Open the ledger and the spool and build the frame pipeline (no network).

        ``run`` and ``enroll`` call this; tests and tools can drive the
        returned pipeline with frames directly.
        """
        if not self._prepared:
            self.prepare()
        self.accountant = self._open_state(budgets=budgets)
        if self.cfg.decides_on_device:
            self._open_decisions()
        self.pipeline = self._build_pipeline(self.accountant)
        return self.pipeline

    def _model_request(self) -> bytes:
        from peep.v1 import recognition_pb2

        store = self.model_store
        return recognition_pb2.GetDeviceModelRequest(
            bundle_id=store.bundle_id, key_id=store.key_id, have_serial=store.serial
        ).SerializeToString()

    def _offer_mqtt_model(self, payload: bytes) -> None:
        """A device model heard on the broker: taken only if newer, signed and for this device (else logged)."""
        from peep.core.devicemodel import MAX_BYTES
        from peep.core.exceptions import WireError
        from peep.core.wire import decode_device_model

        try:
            _, files = decode_device_model(payload, max_bytes=MAX_BYTES)
        except WireError as exc:
            log_event(_log, logging.WARNING, "device_model_refused", source="mqtt", error=str(exc)[:200])
            return
        self.model_store.offer(files, source="mqtt")

    def _open_decisions(self) -> None:
        """The held device models (state folder) and the decider a camera or a door decides with."""
        from peep.edge.decide import DecisionSource, ModelStore

        cfg = self.cfg
        self.model_store = ModelStore(
            cfg.device.state_dir / "device-model",
            self.model_public_key,
            bundle_id=self.releaser.bundle_id,
            key_id=self.releaser.key_id,
            needs_class_key=cfg.door.enabled and cfg.door.decision == "device",
        )
        held = self.model_store.load()
        camera = cfg.recognition.decide == "device"
        self.decisions = DecisionSource(
            self.model_store,
            domain=self.releaser.output,
            site_key=self.site_key,
            epsilon_label=cfg.recognition.epsilon_label if camera else None,
            fuse_frames=cfg.recognition.fuse_frames,
            choose_from=cfg.recognition.frames_looked_at,
            min_face_score=cfg.recognition.min_face_score if camera else None,
        )
        log_event(_log, logging.INFO, "device_model_held",
                  serial=held.serial if held is not None else None,
                  detail="" if held is not None else "no valid device model yet: a door stays locked and a camera "
                  "releases nothing until one arrives")  # fmt: skip

    def _build_pipeline(self, accountant: PrivacyAccountant) -> FramePipeline:
        cfg = self.cfg
        assert self.spool is not None
        p = cfg.privacy
        camera = cfg.recognition.decide == "device"
        policy = ReleasePolicy(
            accountant=accountant,
            releases_per_window=p.releases_per_window,
            window_s=p.window_seconds,
            # Deciding on the device fuses frames of a track: it waits until it has looked at them.
            min_hits=max(p.min_track_frames, cfg.recognition.frames_looked_at) if camera else p.min_track_frames,
            cost_epsilon=self.cost.total_vector,
            cost_delta=self.cost.delta,
            device_key=self.device_key,
            on_suppressed=lambda reason: self.metrics.suppressed.labels(reason=reason).inc(),
        )
        tracker = Tracker(
            iou_threshold=cfg.tracker.iou_threshold,
            max_distance=cfg.tracker.max_distance,
            max_age_s=cfg.tracker.max_age_s,
            max_size_ratio=cfg.tracker.max_size_ratio,
            max_appearance=cfg.tracker.max_appearance,
            reid_s=cfg.tracker.reid_s,
            reid_appearance=cfg.tracker.reid_appearance,
            refresh_s=cfg.tracker.refresh_s,
            hold_s=cfg.tracker.hold_s,
            # Each track id is random (peep.edge.tracking): it links the releases of one appearance and nothing
            # else, and a track key in the persistent ledger is never reused.
            id_prefix="t",
        )
        return FramePipeline(
            device_id=cfg.device.id,
            site=cfg.device.site,
            detector=self.detector,
            tracker=tracker,
            policy=policy,
            releaser=self.releaser,
            spool=self.spool,
            refine=cfg.detector.refine,
            soft=self.soft,
            metrics=self.metrics,
            on_release=self.on_release,
            encoder=self.encoder,
            decisions=self.decisions if camera else None,
            # A full state disk stops releases before they are charged (peep.edge.pipeline).
            room=lambda: disk_room((cfg.spool_path, cfg.ledger_path)),
            sign=self.signer.sign,
            track_by_appearance=cfg.tracker.appearance,
        )

    # ------------------------------------------------------------------ bundle updates

    def _apply_bundle_updates(self) -> None:
        """Offer each bundle announced since the last frame to the gate; one that passes replaces the releaser."""
        while True:
            try:
                payload = self._bundle_updates.get_nowait()
            except queue.Empty:
                return
            assert self.pipeline is not None
            self.releaser = self.pipeline.releaser
            self.bundles.offer(payload, self.releaser, cost_of=lambda r: self._cost_of(r).total_vector,
                               switch=self._switch_bundle, metrics=self.metrics)  # fmt: skip

    def _switch_bundle(self, releaser: TemplateReleaser, encoder: DescriptorEncoder | None) -> None:
        assert self.pipeline is not None
        self.pipeline.set_releaser(releaser, encoder)
        self.releaser, self.encoder = releaser, encoder

    # ------------------------------------------------------------------ modes

    def run(self, *, source: FrameSource | None = None) -> int:
        """Identify mode until stopped or the (finite) source ends. Returns the exit code."""
        if not self._prepared:
            self.prepare()
        cfg = self.cfg
        self.open()
        assert self.pipeline is not None
        port = self.metrics.serve(cfg.metrics.port, cfg.metrics.bind)
        log_event(
            _log,
            logging.INFO,
            "starting",
            metrics_port=port,
            spool=str(cfg.spool_path),
            **self.describe(),
        )
        self.start_housekeeping()
        self._start_transports()
        if source is None:
            source = open_source(
                cfg.capture.source,
                max_fps=cfg.capture.max_fps,
                width=cfg.capture.width,
                height=cfg.capture.height,
                reconnect_min_s=cfg.capture.reconnect_min_s,
                reconnect_max_s=cfg.capture.reconnect_max_s,
                reconnect_attempts=cfg.capture.reconnect_attempts,
                stop=self.stop_event,
                on_reconnect=lambda: self.metrics.reconnects.labels(link="capture").inc(),
                loop=cfg.capture.loop,
                rtsp_transport=cfg.capture.rtsp_transport,
            )
        log_event(_log, logging.INFO, "capture_opened", source=source.description, live=source.live)
        self._reporting = self.mqtt_link is not None and cfg.mqtt.report_interval_s > 0
        next_report = time.monotonic()
        try:
            while not self.stop_event.is_set():
                # The next report an interval after the last one published; until the link is up, every frame
                # tries again, so the first report follows the connection instead of a whole interval later.
                if self._reporting and time.monotonic() >= next_report and self.publish_report():
                    next_report = time.monotonic() + cfg.mqtt.report_interval_s
                t0 = time.perf_counter()
                frame = source.read()
                if frame is None:
                    if not self.stop_event.is_set():
                        log_event(_log, logging.INFO, "source_finished", source=source.description)
                    break
                self.pipeline.timer.add("decode", time.perf_counter() - t0)
                self._apply_bundle_updates()
                self.pipeline.process(frame)
        finally:
            source.close()
            self.shutdown()
        return 0

    def enroll(self, *, subject: str, source: int | str, count: int, timeout_s: float = 30.0) -> int:
        """Release ``count`` ENROLL templates of ``subject`` from ``source``; wait for delivery."""
        try:
            # NFC: the form the server stores, and one enrolment budget per person however the id is typed.
            subject = check_subject_id(subject, "--subject")
        except WireError as exc:
            raise ConfigError(str(exc)) from None
        if count < 1:
            raise ConfigError(f"--count: expected >= 1, received {count}")
        if not self._prepared:
            self.prepare()
        p = self.cfg.privacy
        cost = self.cost.total_vector
        key = f"subject:{subject}"
        budget = p.enroll_budget if p.enroll_budget is not None else math.inf
        self.open(budgets={key: (budget, _delta_budget(budget, cost, p.delta))})
        assert self.pipeline is not None and self.accountant is not None and self.spool is not None
        accountant = self.accountant
        # By sequence number, not by count: expiry and the count bound may delete older dead letters meanwhile.
        dead_before = max((int(d["seq"]) for d in self.spool.dead()), default=0)
        session = EnrollSession(self.pipeline, accountant, subject=subject, device_key=self.device_key)
        frames = open_source(
            source,
            max_fps=0.0,
            stop=self.stop_event,
            reconnect_min_s=self.cfg.capture.reconnect_min_s,
            reconnect_max_s=self.cfg.capture.reconnect_max_s,
            reconnect_attempts=self.cfg.capture.reconnect_attempts or 5,
            rtsp_transport=self.cfg.capture.rtsp_transport,
        )
        self.start_housekeeping()
        self._start_transports(enroll=True)
        log_event(
            _log,
            logging.INFO,
            "enroll_starting",
            subject=subject,
            count=count,
            source=frames.description,
            **self.describe(),
        )
        problem = ""
        try:
            while session.released < count and not self.stop_event.is_set():
                frame = frames.read()
                if frame is None:
                    break
                try:
                    session.process(frame)
                except BudgetError as exc:
                    problem = f"privacy.enroll_budget: {exc}"
                    break
        finally:
            frames.close()
        if not problem and session.released < count:
            problem = (
                f"--source: only {session.released} of --count {count} templates; the source "
                "had a detectable "
                "face in too few frames"
            )
        delivered = self.shutdown(drain_timeout=timeout_s)
        log_event(
            _log,
            logging.INFO,
            "enroll_finished",
            subject=subject,
            released=session.released,
            delivered=delivered,
        )
        if problem:
            raise EdgeError(problem)
        refused = [d for d in self.dead_letters if int(d["seq"]) > dead_before]
        if refused:
            # Over gRPC the server answers per template: a refusal (e.g. a camera that is not an
            # enrolment desk) is dead-lettered, which empties the spool as a delivery would.
            reasons = sorted({str(r["reason"])[:200] for r in refused})
            raise EdgeError(
                f"{len(refused)} of {session.released} enrolment templates were refused by the server "
                f"({'; '.join(reasons)}); nothing of them was enrolled"
            )
        if not delivered:
            raise EdgeError(
                f"{session.released} enrolment templates released but not all acknowledged "
                f"within {timeout_s:g} s; "
                f"they stay in the spool {self.cfg.spool_path} and are delivered by the next run"
            )
        return 0

    # ------------------------------------------------------------------ stop

    def request_stop(self) -> None:
        self.stop_event.set()

    def begin_stop(self, drain_timeout: float) -> None:
        """Start draining the forwarders now (the final reports follow), without waiting: what the process
        still does before :meth:`shutdown` (a door releasing its lock) runs alongside."""
        for f in self.forwarders:
            f.stop(drain_timeout, join=False)

    def shutdown(self, *, drain_timeout: float | None = None) -> bool:
        """Drain, say offline, close everything. Returns True if every queue was empty."""
        drain = self.cfg.spool.drain_timeout_s if drain_timeout is None else drain_timeout
        delivered = True
        if self.pipeline is not None and self.pipeline.unspooled and not self.pipeline.flush_unspooled():
            # Charged while the disk was full and still not queued: say which, they are gone with this process.
            log_event(_log, logging.ERROR, "releases_lost_disk_full",
                      message_ids=[m for m, _, _ in self.pipeline.unspooled])  # fmt: skip
        for f in self.forwarders:
            f.stop(drain, join=False)
        self._housekeeping_stop.set()
        channel = getattr(self, "_model_channel", None)
        if channel is not None:
            channel.close()
        for f in self.forwarders:
            f.join(drain + 10.0)
        if self._housekeeping is not None:
            # A round waiting on a locked file ends with the busy timeout; close() checkpoints anyway.
            self._housekeeping.join(35.0)
            self._housekeeping = None
        if self.mqtt_link is not None:
            if self._reporting:
                self.publish_report()  # the final counts, retained for the server's Devices view
            self.mqtt_link.stop()
            self.mqtt_link = None
        remaining = 0
        if self.spool is not None:
            remaining = self.spool.depth()
            delivered = remaining == 0
            self.dead_letters = self.spool.dead()
            self.spool.close()
        if self.ledger is not None:
            self.ledger.close()
        self.forwarders = []
        self.metrics.close()
        log_event(
            _log,
            logging.INFO,
            "stopped",
            spool_remaining=remaining,
            epsilon_vector_spent=self._lifetime[0],
            epsilon_coordinate_spent=self._lifetime[1],
        )
        return delivered
