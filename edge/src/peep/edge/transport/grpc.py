"""gRPC transport: client-streaming ``RecognitionService.IngestStream`` with TLS and a bearer token.

Each round sends up to ``batch_size`` spooled templates in one stream with a
deadline (``deadline_s``) and removes those the summary acknowledges as
``ACCEPTED`` or ``DUPLICATE`` (the server dedupes by message id, so a resend
after a lost summary is harmless). ``REJECTED`` templates move to the
spool's dead-letter table with the server's reason (resending an invalid
template cannot succeed). Failed calls are retried with exponential backoff
(``retry_min_s`` doubling to ``retry_max_s``); authentication failures are
logged as errors and retried at the maximum delay.

With a ``report`` callable (a device without MQTT), the same thread sends the
device's report (:mod:`peep.core.reports`) with ``ReportDevice`` every
``report_interval_s`` (sooner again after a failure) and once more as it
stops, so a slow server never stalls the frame loop.

The token travels in metadata ``authorization: Bearer <token>``; it is only
sent over TLS unless ``grpc.tls = false`` was chosen explicitly (logged as a
warning).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import grpc
from peep.core.wire import decode_template
from peep.edge.config import GrpcConfig
from peep.edge.logs import log_event
from peep.edge.metrics import EdgeMetrics
from peep.edge.spool import Spool
from peep.edge.startup import grpc_tls_material
from peep.edge.transport.base import Forwarder
from peep.v1 import recognition_pb2, recognition_pb2_grpc

_log = logging.getLogger("peep.edge.grpc")

_AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
#: Refusals of a report that pass: the server's one report a second per device, a replica or the path away.
_PASSING_CODES = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: How often the report at shutdown is tried, and how far apart (above the server's one a second).
FINAL_REPORT_ATTEMPTS = 3
FINAL_REPORT_RETRY_S = 1.2
#: The most the report at shutdown may take, all its tries together: a server that accepts the connection but
#: never answers (frozen, overloaded) must not hold a stopping device past its unit's stop timeout.
FINAL_REPORT_BUDGET_S = 2.0
#: The shortest deadline a call made while stopping gets (the drain time left, but never less than this).
_STOPPING_MIN_DEADLINE_S = 0.5


def make_channel(cfg: GrpcConfig, *, reconnect_max_s: float | None = None) -> grpc.Channel:
    """A channel to ``cfg.target`` (TLS unless disabled explicitly).

    ``reconnect_max_s`` caps the wait between reconnection attempts (default ``grpc.reconnect_max_s``, 5 s).
    While the channel waits out its backoff every call fails at once, so the cap is how late templates flow
    again once the server or the network is back: with gRPC's own cap of two minutes (and the earlier one of
    ``grpc.retry_max_s``, 60 s) a camera cut off for 10 s sent again 22 s after the network returned. A door
    sets it to a second: a claim made seconds after the server came back must not find the channel still
    waiting, or it ends ``unreachable``.
    """
    backoff_ms = int((cfg.reconnect_max_s if reconnect_max_s is None else reconnect_max_s) * 1000)
    options: list[tuple[str, Any]] = [
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)),
    ]
    if not cfg.tls:
        log_event(
            _log,
            logging.WARNING,
            "grpc_insecure",
            target=cfg.target,
            detail="grpc.tls = false: the bearer token and templates travel in clear",
        )
        return grpc.insecure_channel(cfg.target, options=options)
    # The files Agent.prepare (and --validate-config) checked; ConfigError naming the key otherwise.
    material = grpc_tls_material(cfg)
    assert material is not None
    root, key, chain = material
    creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
    if cfg.server_name:
        options.append(("grpc.ssl_target_name_override", cfg.server_name))
    return grpc.secure_channel(cfg.target, creds, options=options)


class GrpcForwarder(Forwarder):
    """Spool -> ``IngestStream`` (see the module docstring).

    Parameters
    ----------
    cfg : GrpcConfig
    spool : Spool
    token : str or None
        Bearer token (resolved secret).
    channel_factory : callable() -> grpc.Channel, optional
        Injected for tests; defaults to :func:`make_channel`.
    report : callable() -> bytes, optional
        The device's current report payload; None: no reports over gRPC.
    device_id, site : str
        Who the report describes (the server checks them against the credential).
    """

    dest = "grpc"

    def __init__(
        self,
        cfg: GrpcConfig,
        spool: Spool,
        *,
        token: str | None = None,
        metrics: EdgeMetrics | None = None,
        channel_factory: Callable[[], grpc.Channel] | None = None,
        report: Callable[[], bytes] | None = None,
        device_id: str = "",
        site: str = "",
    ) -> None:
        super().__init__(spool, metrics=metrics)
        self.cfg = cfg
        self._report = report if cfg.report_interval_s > 0 else None
        self._device = (device_id, site)
        self._next_report = 0.0  # monotonic: the first report as soon as the thread runs
        self.reports_sent = 0
        self.report_code: grpc.StatusCode | None = None  # the last report's refusal, None when it went
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = (channel_factory or (lambda: make_channel(cfg)))()
        self._stub = recognition_pb2_grpc.RecognitionServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._failures = 0
        self.calls = 0

    def _backoff(self, code: grpc.StatusCode | None) -> float:
        if code in _AUTH_CODES:
            return self.cfg.retry_max_s
        delay = min(self.cfg.retry_max_s, self.cfg.retry_min_s * 2.0 ** min(self._failures, 20))
        self._failures += 1
        return delay

    def _send(self) -> bool:
        """One round; returns True if the queue may hold more work right away."""
        items = self.spool.peek(self.dest, self.cfg.batch_size)
        if not items:
            return False
        by_id = {it.message_id: it for it in items}
        msgs = [decode_template(it.payload, validate=False) for it in items]
        self.calls += 1
        try:
            summary: recognition_pb2.IngestSummary = self._await(
                self._stub.IngestStream.future(iter(msgs), timeout=self._call_deadline(), metadata=self._metadata)
            )
        except grpc.FutureCancelledError:
            # Stopped while the server did not answer: nothing is acknowledged, every item stays for the next run
            # (the server answers DUPLICATE for any it did store).
            log_event(_log, logging.WARNING, "grpc_ingest_cut_at_stop", target=self.cfg.target, pending=len(items))
            return False
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            delay = self._backoff(code)
            level = logging.ERROR if code in _AUTH_CODES else logging.WARNING
            log_event(
                _log,
                level,
                "grpc_ingest_failed",
                target=self.cfg.target,
                code=getattr(code, "name", str(code)),
                detail=exc.details() if hasattr(exc, "details") else "",
                retry_in_s=delay,
                pending=len(items),
            )
            self.sleep(delay)
            return False
        if self._failures:
            self.metrics.reconnects.labels(link="grpc").inc()
            log_event(_log, logging.INFO, "grpc_ingest_recovered", target=self.cfg.target)
        self._failures = 0
        done: list[str] = []
        now = time.time()
        for ack in summary.acks:
            it = by_id.get(ack.message_id)
            if it is None:
                continue
            if ack.status in (
                recognition_pb2.INGEST_STATUS_ACCEPTED,
                recognition_pb2.INGEST_STATUS_DUPLICATE,
            ):
                done.append(ack.message_id)
                self.metrics.publish_latency.labels(transport=self.dest).observe(max(0.0, now - it.created))
            elif ack.status == recognition_pb2.INGEST_STATUS_REJECTED:
                self.spool.dead_letter(self.dest, ack.message_id, ack.reason or "rejected by the server")
                self.metrics.dead_letter.labels(transport=self.dest).inc()
                log_event(
                    _log,
                    logging.ERROR,
                    "grpc_template_rejected",
                    message_id=ack.message_id,
                    reason=ack.reason,
                )
        self.spool.ack(self.dest, done)
        self.metrics.published.labels(transport=self.dest).inc(len(done))
        self.update_depth()
        acknowledged = len(done) + sum(1 for a in summary.acks if a.status == recognition_pb2.INGEST_STATUS_REJECTED)
        if acknowledged < len(items):
            # The server skipped some: do not spin on them.
            delay = self._backoff(None)
            log_event(
                _log,
                logging.WARNING,
                "grpc_ingest_partial",
                acknowledged=acknowledged,
                sent=len(items),
                retry_in_s=delay,
            )
            self.sleep(delay)
            return False
        return len(items) == self.cfg.batch_size

    def _await(self, call: Any) -> Any:
        """The result of the in-flight ``call``; cancelled once a stop's drain time (at least
        :data:`_STOPPING_MIN_DEADLINE_S`) has passed, since a deadline set before the stop cannot be shortened."""
        while True:
            try:
                return call.result(timeout=0.1)
            except grpc.FutureTimeoutError:
                stop_at = self._stop_at
                if self._halt.is_set() or (
                    stop_at is not None and time.monotonic() >= stop_at + _STOPPING_MIN_DEADLINE_S
                ):
                    call.cancel()

    def _call_deadline(self) -> float:
        """A call's deadline: ``deadline_s``, or while stopping no more than the drain time left."""
        if self._stop_at is None:
            return self.cfg.deadline_s
        left = self._stop_at - time.monotonic()
        return min(self.cfg.deadline_s, max(_STOPPING_MIN_DEADLINE_S, left))

    def send_report(self, *, timeout: float | None = None) -> bool:
        """Send the device's report now; False (logged) when the call fails (its code in :attr:`report_code`).

        ``timeout`` bounds the call (default: ``deadline_s``, at most 10 s).
        """
        self.report_code = None
        if self._report is None:
            return False
        try:
            payload = self._report()
        except Exception as exc:  # the agent's state is closing, or the report does not fit its bounds
            log_event(_log, logging.WARNING, "grpc_report_failed", detail=f"{type(exc).__name__}: {str(exc)[:200]}")
            return False
        stopping = self.stopping  # the final report: its own budget bounds it, a stop must not cancel it
        try:
            call = self._stub.ReportDevice.future(
                recognition_pb2.DeviceReportRequest(device_id=self._device[0], site=self._device[1], report=payload),
                timeout=min(self.cfg.deadline_s, 10.0) if timeout is None else timeout,
                metadata=self._metadata,
            )
            # A periodic report waiting on a server that never answers is cancelled by a stop (as a batch in
            # flight is): its 10 s deadline, set before the stop, once held a stopping door 12.5 s.
            call.result() if stopping else self._await(call)
        except grpc.FutureCancelledError:
            log_event(_log, logging.WARNING, "grpc_report_failed", target=self.cfg.target, code="CANCELLED",
                      detail="the device is stopping")  # fmt: skip
            return False
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            self.report_code = code
            if code == grpc.StatusCode.UNIMPLEMENTED:
                # A server older than ReportDevice: templates still flow; stop asking.
                self._report = None
                log_event(_log, logging.WARNING, "grpc_report_unsupported", target=self.cfg.target)
                return False
            log_event(
                _log,
                logging.WARNING,
                "grpc_report_failed",
                target=self.cfg.target,
                code=getattr(code, "name", str(code)),
                detail=(exc.details() if hasattr(exc, "details") else "")[:200],
            )
            return False
        self.reports_sent += 1
        return True

    def _maybe_report(self) -> None:
        # Stopping, only the final report goes: one sent just before it would make the server refuse that one
        # as too frequent, and the one the server kept would miss the releases made in between.
        if self._report is None or self.stopping or time.monotonic() < self._next_report:
            return
        ok = self.send_report()
        # After a failure, again within 10 s (or the interval, if shorter) rather than a whole interval later.
        self._next_report = time.monotonic() + (
            self.cfg.report_interval_s if ok else min(self.cfg.report_interval_s, 10.0)
        )

    def _final_report(self) -> None:
        """The final counts, which the server's Devices view keeps until the device runs again.

        A refusal that passes (a periodic report less than the server's interval earlier, a replica going away
        under the balancer) is tried again, :data:`FINAL_REPORT_ATTEMPTS` tries in all ``FINAL_REPORT_RETRY_S`` apart:
        otherwise the server would show the last periodic report, which misses the releases since. All tries
        together take at most :data:`FINAL_REPORT_BUDGET_S`: a server that never answers does not hold the stop.
        """
        end = time.monotonic() + FINAL_REPORT_BUDGET_S
        for attempt in range(FINAL_REPORT_ATTEMPTS):
            left = end - time.monotonic()
            if self._report is None or self._halt.is_set() or left <= 0.05:
                return
            if self.send_report(timeout=min(left, self.cfg.deadline_s, 10.0)):
                return
            if self.report_code not in _PASSING_CODES:
                return
            if attempt + 1 < FINAL_REPORT_ATTEMPTS:
                self._halt.wait(min(FINAL_REPORT_RETRY_S, max(0.0, end - time.monotonic())))

    def run(self) -> None:
        try:
            self.update_depth()
            while True:
                idle = self.spool.depth(self.dest) == 0
                if self.should_exit(idle=idle):
                    self._final_report()
                    return
                self._maybe_report()
                try:
                    more = self._send()
                except sqlite3.OperationalError as exc:
                    # The ack or dead letter was refused (a full disk): those rows stay and go again later.
                    self.spool_write_failed(exc)
                    continue
                self.spool_write_ok()
                if not more:
                    self.sleep(0.25 if not self.stopping else 0.05)
        except Exception:
            _log.exception("grpc forwarder failed")
            raise
        finally:
            self._channel.close()
