"""Prometheus metrics of the server (one registry per server instance).

``peep_ingest_templates_total{transport,status}``
    templates received by transport (grpc, mqtt) and outcome (accepted, duplicate, rejected);
    the ingest rate is ``rate(peep_ingest_templates_total{status="accepted"}[1m])``.
``peep_ingest_rejected_total{transport,reason}``
    refusals by reason code (see :mod:`peep.server.ingest.validation`).
``peep_identify_seconds``
    identify latency histogram (RPC handler, inference included).
``peep_model_version``
    number of the serving model version (v000042 -> 42; 0 = none).
``peep_training_runs_total{outcome}`` and ``peep_training_seconds``
    training runs (promoted, failed, cancelled) and their duration.
``peep_events_total{purpose}``
    recognition events published.
``peep_mqtt_connected``
    1 while the MQTT consumer is connected.
``peep_grpc_streams`` and ``peep_grpc_streams_refused_total{reason}``
    streaming RPCs open, and streams refused or ended (per_identity, global: over
    ``grpc.max_streams_per_identity`` / ``grpc.max_streams``; idle: ended after
    ``grpc.stream_idle_timeout_s``).
``/healthz`` (same listener)
    ``200 SERVING`` or, while the server drains, ``503 NOT_SERVING``: a load balancer's HTTP/1.1 check.
``peep_console_connections_closed_total{reason}``
    connections the console's listener closed before they delivered a request (handshake_timeout: TLS not
    done within ``console.tls_handshake_timeout_s``; header_timeout: no request within
    ``console.header_timeout_s``; evicted: the longest waiting, to make room under
    ``console.max_connections_per_address`` / ``console.max_connections``; refused: new ones over a limit
    while every connection was busy with a request).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ingested = Counter(
            "peep_ingest_templates", "Templates received, by transport and outcome", ["transport", "status"], registry=r
        )
        self.rejected = Counter(
            "peep_ingest_rejected", "Templates refused, by transport and reason", ["transport", "reason"], registry=r
        )
        self.identify_latency = Histogram(
            "peep_identify_seconds",
            "Identify latency (handler, inference included)",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.model_version = Gauge("peep_model_version", "Serving model version number (0 = none)", registry=r)
        self.training_runs = Counter("peep_training_runs", "Training runs by outcome", ["outcome"], registry=r)
        self.training_seconds = Histogram(
            "peep_training_seconds", "Training duration", buckets=(1, 5, 15, 30, 60, 120, 300, 900, 3600), registry=r
        )
        self.events = Counter("peep_events", "Recognition events published", ["purpose"], registry=r)
        self.undecided = Counter(
            "peep_ingest_undecided",
            "Templates accepted but not decided because the serving model cannot score them, by what differs "
            "(bundle_id, key_id: a device left on another site key, mechanism.kind)",
            ["reason"],
            registry=r,
        )
        self.mqtt_connected = Gauge("peep_mqtt_connected", "1 while the MQTT consumer is connected", registry=r)
        self.erasures = Counter("peep_erasures", "Subjects erased", registry=r)
        self.retention_deleted = Counter(
            "peep_retention_deleted_templates", "Templates deleted by retention", registry=r
        )
        self.grpc_streams = Gauge("peep_grpc_streams", "Streaming RPCs open", registry=r)
        self.grpc_streams_refused = Counter(
            "peep_grpc_streams_refused",
            "Streams refused (over a limit) or ended (idle), by reason",
            ["reason"],
            registry=r,
        )
        self.console_connections_closed = Counter(
            "peep_console_connections_closed",
            "Console connections closed before delivering a request "
            "(handshake_timeout, header_timeout, evicted, refused)",
            ["reason"],
            registry=r,
        )

    def count_ingest(self, transport: str, accepted: int, duplicates: int, rejected: dict[str, int]) -> None:
        if accepted:
            self.ingested.labels(transport, "accepted").inc(accepted)
        if duplicates:
            self.ingested.labels(transport, "duplicate").inc(duplicates)
        for reason, n in rejected.items():
            self.ingested.labels(transport, "rejected").inc(n)
            self.rejected.labels(transport, reason).inc(n)

    def set_model_version(self, version: str | None) -> None:
        try:
            self.model_version.set(int(version[1:]) if version else 0)
        except ValueError:
            self.model_version.set(0)

    def training_run(self, outcome: str, seconds: float) -> None:
        self.training_runs.labels(outcome).inc()
        self.training_seconds.observe(seconds)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of a sample (tests and the bench)."""
        v = self.registry.get_sample_value(name, labels or {})
        return 0.0 if v is None else float(v)

    def serve(self, host: str, port: int, *, healthy: Callable[[], bool] | None = None) -> tuple[Any, int]:
        """Start the HTTP endpoint: ``/metrics`` and ``/healthz``; returns (server, bound port).

        ``/healthz`` answers ``200 SERVING`` while ``healthy()`` holds and ``503 NOT_SERVING`` otherwise (a
        draining replica): what a load balancer checks over plain HTTP/1.1 when it cannot speak gRPC health
        checking to the replica itself (deploy/cluster/haproxy.cfg).
        """
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            if environ.get("PATH_INFO") == "/healthz":
                ok = healthy() if healthy is not None else True
                body = b"SERVING\n" if ok else b"NOT_SERVING\n"
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])  # fmt: skip
                return [body]
            return metrics_app(environ, start_response)

        server_cls = _ThreadingWSGIServer6 if ":" in host else _ThreadingWSGIServer
        httpd = make_server(host, port, app, server_class=server_cls, handler_class=_QuietHandler)
        threading.Thread(target=httpd.serve_forever, name="peep-metrics", daemon=True).start()
        return httpd, int(httpd.server_address[1])


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingWSGIServer6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape or a check every second: no access log
        pass
