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
``peep_console_connections_closed_total{reason}``
    connections the console's listener closed before they delivered a request (header_timeout: not within
    ``console.header_timeout_s``; evicted: the longest waiting, to make room under
    ``console.max_connections_per_address`` / ``console.max_connections``; refused: new ones over a limit
    while every connection was busy with a request).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
            "Console connections closed before delivering a request (header_timeout, evicted, refused)",
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

    def serve(self, host: str, port: int) -> tuple[Any, int]:
        """Start the /metrics HTTP endpoint; returns (server, bound port)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server, int(server.server_address[1])
