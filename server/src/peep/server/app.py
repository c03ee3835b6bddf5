"""The running server: gRPC + MQTT + metrics + retention, with graceful shutdown.

``peep serve`` builds a :class:`ServerApp` and calls :meth:`ServerApp.run`,
which returns after SIGTERM/SIGINT once everything has drained:

1. health checking switches to NOT_SERVING (``enter_graceful_shutdown``) so
   load balancers stop sending new work;
2. the MQTT consumer unsubscribes, stores and acknowledges what it queued;
3. ``server.stop(grace)`` lets in-flight RPCs finish for ``grpc.grace_s``;
4. a running training is cancelled (the previous model stays current), the
   database is closed.

systemd's ``TimeoutStopSec`` must exceed ``grpc.grace_s`` plus the MQTT drain.

What is composed where
----------------------
The parts (store, recognition, ingest, device models, the hosted QBBS module
when ``[qbbs]`` is set, ...) are built and wired by the composition root,
:class:`~peep.server.services.Services`; a ServerApp given none builds one that
hosts what the configuration declares (``host_qbbs=True``). What *runs* over
them belongs to the process, so it is here, started by :meth:`ServerApp.start`
in this order and stopped by :meth:`ServerApp.stop`:

* the replica registration and its heartbeat thread (``cluster.replica_id``);
* the gRPC server (:func:`~peep.server.transport.grpc_service.create_server`:
  RecognitionService, health, reflection, and ``QbbsService`` when
  ``services.qbbs`` is hosted), then the MQTT bridge and the metrics endpoint;
* the operator console (``[console]``), given the hosted QBBS module for its
  odometer and this process's view of device statuses and reports;
* the loops: retention (from the start: an upgrade forgets at once what the
  settings no longer allow), track fusion's sweep, and device models' issue
  schedule.

A one-shot command (``peep train``, ``peep erase``) builds Services and none of
this. ``extra_servicers`` add more gRPC services behind the same interceptors.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from secrets import token_hex
from typing import Any

import grpc
from peep.server.config import ResolvedSecrets, ServerConfig
from peep.server.ingest.contacts import ONLINE_WINDOW_S
from peep.server.services import Services
from peep.server.transport.grpc_service import create_server

log = logging.getLogger(__name__)

#: Track fusion's expired releases are forgotten at most this long after their window ends.
SWEEP_INTERVAL_S = 1.0
#: Seconds between two checks that the newest device model is current (issued by whom, and how long ago).
DEVICE_MODEL_CHECK_S = 30.0

Registrar = Callable[[grpc.Server], None]
#: A device's status for the console: ``(status, since, via)``, see :meth:`ServerApp._device_status`.
DeviceStatus = tuple[str, float, str]


class ReplicaIdTaken(RuntimeError):
    """Another live process holds this ``cluster.replica_id``: two replicas under one id would fight over its MQTT
    sessions (and its log lines would mix), so the second refuses to start, naming the first."""


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ServerApp:
    """Everything ``peep serve`` runs.

    Parameters
    ----------
    config : ServerConfig
    secrets : ResolvedSecrets, optional
    services : Services, optional
        Built from ``config`` when omitted, hosting what it declares (``[qbbs]``).
    extra_servicers : sequence of callables adding servicers to the gRPC server
    enable_mqtt : bool, optional
        Overrides ``mqtt.enabled``.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        secrets: ResolvedSecrets | None = None,
        services: Services | None = None,
        extra_servicers: Sequence[Registrar] = (),
        enable_mqtt: bool | None = None,
    ) -> None:
        self.config = config
        self.services = services or Services(config, secrets=secrets, host_qbbs=True)
        self._extra = list(extra_servicers)
        self._mqtt_enabled = config.mqtt.enabled if enable_mqtt is None else enable_mqtt
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.server: grpc.Server | None = None
        self.port = 0
        self.mqtt: Any = None
        self.metrics_server: Any = None
        self.metrics_port = 0
        self._retention: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None
        self._device_models: threading.Thread | None = None
        #: The operator console (``[console]``), when configured: ``.url``, ``.port``.
        self.console: Any = None
        #: (replica id, token) while this process holds its cluster.replica_id.
        self._registration: tuple[str, str] | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self, *, mqtt_wait: float | None = None) -> None:
        s = self.services
        self._register_replica()
        bundle_id = s.publish_configured_bundle()
        self.server, self.port = create_server(
            self.config, s, extra_servicers=self._extra, stopping=self._stopping.is_set
        )
        self.server.start()
        if self._mqtt_enabled:
            from peep.server.transport.mqtt import MqttBridge

            pw = s.secrets.mqtt_password.get_secret_value() if s.secrets.mqtt_password else None
            self.mqtt = MqttBridge(self.config.mqtt, s, password=pw)
            self.mqtt.start(wait=mqtt_wait)
        if self.config.metrics.enabled:
            host, _, port = self.config.metrics.listen.rpartition(":")
            self.metrics_server, self.metrics_port = s.metrics.serve(
                host.strip("[]"), int(port), healthy=lambda: not self._stopping.is_set()
            )
        if self.config.console is not None:
            from peep.server.console import start_console

            self.console = start_console(
                s,
                qbbs=s.qbbs.module if s.qbbs is not None else None,
                device_status=self._device_status(),
                device_reports=self._device_reports,
                home_assistant=lambda: getattr(self.mqtt, "home_assistant", None),
            )
        # What is kept has a stated end: the retention loop enforces it from the start (a first pass now, so an
        # upgrade forgets what the setting no longer allows), and fusion's memory is swept within its window.
        self._retention = threading.Thread(target=self._retention_loop, name="peep-retention", daemon=True)
        self._retention.start()
        if s.ingestor.tracks.fuses:
            self._sweeper = threading.Thread(target=self._sweep_loop, name="peep-fusion-sweep", daemon=True)
            self._sweeper.start()
        if s.device_models.enabled:
            # A first issue now (none yet, or the newest is out of date), then one every reissue_s: a device in
            # touch never holds an expired model.
            self._device_models = threading.Thread(target=self._device_model_loop, name="peep-device-models",
                                                   daemon=True)  # fmt: skip
            self._device_models.start()
        else:
            log.info("device models: none issued", extra={"reason": s.device_models.disabled_reason})
        if self.config.recognition.keep == "all":
            log.warning(
                "recognition.keep = all: the templates of people who never enrolled are written to the database "
                "(kept recognition.keep_days); set keep = none or recognised to keep nothing of them",
                extra={"keep": "all", "keep_days": self.config.recognition.keep_days},
            )
        if self._mqtt_enabled:
            unsigned = [d.id for d in self.config.auth.devices if d.enabled and not d.signing_key]
            if self.config.auth.require_device_signatures and unsigned:
                log.warning(
                    "auth.require_device_signatures: every MQTT template of these devices will be refused, "
                    "they have no signing_key registered (peep-edge device-key prints it)",
                    extra={"devices": unsigned[:20]},
                )
            elif not self.config.auth.require_device_signatures and unsigned:
                log.warning(
                    "auth.require_device_signatures is off: MQTT templates of devices without a signing_key are "
                    "taken on their topic alone, so anyone who can publish there is counted as the device",
                    extra={"devices": unsigned[:20]},
                )
        m = s.recogniser.model
        log.info(
            "server started",
            extra={
                "grpc_port": self.port,
                "tls": self.config.grpc.tls is not None,
                "mqtt": self._mqtt_enabled,
                "metrics_port": self.metrics_port,
                "bundle_id": bundle_id or getattr(s.bundles.current(), "bundle_id", None),
                "model_version": m.version if m else None,
                "store": s.store.dialect,
                "replica": self.config.cluster.replica_id,
                "mqtt_client_id": self.mqtt.client_id if self.mqtt is not None else None,
                "console": self.console.url if self.console is not None else None,
            },
        )

    # ------------------------------------------------------------ one process per replica id

    def _register_replica(self) -> None:
        """Hold ``cluster.replica_id`` in the database for as long as this process runs (see ReplicaIdTaken)."""
        rid = self.config.cluster.replica_id
        if rid is None:
            return
        timeout = self.config.cluster.registration_timeout_s
        token, host = token_hex(8), socket.gethostname()
        holder = self.services.store.register_replica(rid, host=host, pid=os.getpid(), token=token, now=time.time(),
                                                      stale_s=timeout, alive=_pid_alive)  # fmt: skip
        if holder is not None:
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder.started_at))
            message = (
                f"cluster.replica_id: {rid!r} is held by a live replica on host {holder.host[:64]!r} (pid "
                f"{holder.pid}, started {started}, last heartbeat {max(0.0, time.time() - holder.heartbeat_at):.0f} "
                f"s ago); give this replica an id of its own, or stop that one (a registration without a heartbeat "
                f"for cluster.registration_timeout_s = {timeout:g} s is taken over)"
            )
            log.error("replica id taken", extra={"replica": rid, "holder_host": holder.host[:64],
                                                  "holder_pid": holder.pid, "holder_started": started})  # fmt: skip
            raise ReplicaIdTaken(message)
        self._registration = (rid, token)
        log.info("replica registered", extra={"replica": rid, "host": host, "pid": os.getpid()})
        beat = threading.Thread(target=self._heartbeat_loop, args=(rid, token, timeout / 3.0),
                                name="peep-replica-heartbeat", daemon=True)  # fmt: skip
        beat.start()

    def _heartbeat_loop(self, rid: str, token: str, every_s: float) -> None:
        while not self._stopping.wait(every_s):
            try:
                held = self.services.store.heartbeat_replica(rid, token, time.time())
            except Exception as exc:  # the database away: the next beat retries (registration ages meanwhile)
                log.warning("replica heartbeat failed", extra={"replica": rid, "error": str(exc)[:200]})
                continue
            if not held:
                log.error(
                    "replica id taken over: another process registered this replica id after this one's heartbeat "
                    "lapsed (cluster.registration_timeout_s); stop one of them",
                    extra={"replica": rid},
                )
                self._registration = None
                return

    def _release_replica(self) -> None:
        if self._registration is None:
            return
        rid, token = self._registration
        self._registration = None
        try:
            self.services.store.release_replica(rid, token)
        except Exception as exc:  # it ages out after registration_timeout_s instead
            log.warning("replica registration not released", extra={"replica": rid, "error": str(exc)[:200]})

    def _device_status(self, *, window_s: float = ONLINE_WINDOW_S) -> Callable[[], dict[str, DeviceStatus]]:
        """The console's device statuses: ``() -> {device_id: (status, since, via)}``.

        Parameters
        ----------
        window_s : float
            A device heard from over gRPC is ``online`` for this long after its last contact (and while it
            has a call open), then ``offline`` since that contact (tests shorten it).

        Returns
        -------
        callable
            Returning, for every device this replica heard from, ``status`` (``online`` or ``offline``),
            ``since`` (Unix time: when the MQTT status was received, or the last gRPC contact) and ``via``
            (``mqtt`` or ``grpc``). A device known to both takes the more recent, except that silence over
            gRPC does not override an MQTT ``online``: that status stands until the device's will or its own
            ``offline`` replaces it, while a device talking MQTT may have no reason to call over gRPC. Exists
            without MQTT too (gRPC-only servers).
        """
        contacts = self.services.device_contacts

        def statuses() -> dict[str, DeviceStatus]:
            out = contacts.statuses(window_s=window_s)
            mqtt_statuses = getattr(self.mqtt, "device_statuses", None)
            if callable(mqtt_statuses):
                for device, (status, at) in mqtt_statuses().items():
                    grpc_view = out.get(device)
                    if grpc_view is None or at >= grpc_view[1] or (status == "online" and grpc_view[0] == "offline"):
                        out[device] = (status, at, "mqtt")
            return out

        return statuses

    def _device_reports(self) -> dict[str, tuple[Any, float, str]]:
        """Each device's latest report, retained on MQTT or sent over gRPC, whichever arrived last.

        Returns
        -------
        dict of str to (DeviceReport, float, str)
            ``(report, received_at, via)``, ``via`` the transport it came by (``mqtt`` or ``grpc``), which the
            console shows as the device's own.
        """
        out: dict[str, tuple[Any, float, str]] = {
            device: (report, at, "grpc") for device, (report, at) in self.services.device_reports.latest().items()
        }
        mqtt_reports = getattr(self.mqtt, "device_reports", None)
        if callable(mqtt_reports):
            for device, (report, at) in mqtt_reports().items():
                if device not in out or at >= out[device][1]:
                    out[device] = (report, at, "mqtt")
        return out

    def _retention_loop(self) -> None:
        while True:
            try:
                self.services.enforce_retention()
            except Exception:
                log.exception("retention failed")
            if self._stopping.wait(self.config.retention.interval_s):
                return

    def _device_model_loop(self) -> None:
        every = min(DEVICE_MODEL_CHECK_S, self.config.training.device_models.reissue_s / 4)
        reason = "start"
        while True:
            try:
                self.services.device_models.poll(reason=reason)
                reason = "reissue"
            except Exception as exc:  # the database away: the next check tries again
                log.warning("device model check failed", extra={"error": str(exc)[:200]})
            if self._stopping.wait(every):
                return

    def _sweep_loop(self) -> None:
        interval = min(SWEEP_INTERVAL_S, self.config.training.track_fusion_s)
        while not self._stopping.wait(interval):
            try:
                self.services.sweep_fusion_memory()
            except Exception as exc:  # the database (replicas): the next sweep tries again
                log.warning("fusion memory sweep failed", extra={"error": str(exc)[:200]})

    def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown (see module docstring); idempotent."""
        if self._stopping.is_set():
            self._stopped.wait()
            return
        self._stopping.set()
        g = self.config.grpc.grace_s if grace is None else grace
        t0 = time.monotonic()
        log.info("shutting down", extra={"grace_s": g})
        try:
            if self.server is not None:
                self.server.peep_health.enter_graceful_shutdown()
            if self.console is not None:
                self.console.stop()
            if self.mqtt is not None:
                self.mqtt.stop(drain_timeout=max(1.0, g))
            if self.server is not None:
                self.server.stop(g).wait(g + 5.0)
                self.server.peep_streams.close()
            self.services.trainer.cancel(timeout=10.0)
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
            self._release_replica()
            self.services.close()
        finally:
            self._stopped.set()
            log.info("stopped", extra={"seconds": round(time.monotonic() - t0, 3)})

    def run(self) -> int:
        """Start, wait for SIGTERM/SIGINT, stop gracefully; returns the exit code."""
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            log.info("signal received", extra={"signal": signal.Signals(signum).name})
            stop.set()

        old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not stop.wait(1.0):
                pass
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            self.stop()
        return 0
