"""Prometheus metrics of the agent (own registry, so several agents can live in one test process).

Names (all prefixed ``peep_edge_``):

=====================================  =========  ===========================================
frames_total                           counter    frames processed
faces_detected_total                   counter    face boxes found by the detector
releases_total{purpose}                counter    templates released (spooled)
suppressed_total{reason}               counter    frames where a tracked face was ready but the
                                                  policy refused (``rate``, ``budget``,
                                                  ``device_budget``)
epsilon_spent{scope}                   gauge      ε spent by this device over its lifetime
                                                  (persistent ledger), ``scope`` =
                                                  ``vector`` (per-vector ε, what protects a
                                                  person) or ``coordinate`` (per-coordinate ε)
mechanism_epsilon{scope}               gauge      ε of one release, per vector and per coordinate
spool_depth{transport}                 gauge      templates waiting for an ack
spool_dropped_total{transport,purpose} counter    templates dropped by the spool's bound
publish_latency_seconds{transport}     histogram  spool insert -> broker PUBACK / server ack
published_total{transport}             counter    templates acknowledged
dead_letter_total{transport}           counter    templates the receiver rejected (kept in the
                                                  spool's dead table)
reconnects_total{link}                 counter    reconnects (``mqtt``, ``grpc``, ``capture``)
bundle_updates_total{result}           counter    bundle announcements accepted / rejected
events_received_total                  counter    recognition events received over MQTT
=====================================  =========  ===========================================
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class EdgeMetrics:
    """All metrics of one agent, registered in their own :class:`CollectorRegistry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.frames = Counter("peep_edge_frames", "Frames processed", registry=r)
        self.faces = Counter("peep_edge_faces_detected", "Face boxes found by the detector", registry=r)
        self.releases = Counter("peep_edge_releases", "Templates released", ["purpose"], registry=r)
        self.suppressed = Counter(
            "peep_edge_suppressed", "Ready faces the release policy refused", ["reason"], registry=r
        )
        self.epsilon_spent = Gauge(
            "peep_edge_epsilon_spent",
            "Lifetime ε spent by this device (persistent ledger)",
            ["scope"],
            registry=r,
        )
        self.mechanism_epsilon = Gauge(
            "peep_edge_mechanism_epsilon", "ε of one template release", ["scope"], registry=r
        )
        self.spool_depth = Gauge("peep_edge_spool_depth", "Templates waiting for an ack", ["transport"], registry=r)
        self.spool_dropped = Counter(
            "peep_edge_spool_dropped",
            "Templates dropped by the spool bound",
            ["transport", "purpose"],
            registry=r,
        )
        self.publish_latency = Histogram(
            "peep_edge_publish_latency_seconds",
            "Spool insert to acknowledgement",
            ["transport"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
            registry=r,
        )
        self.published = Counter("peep_edge_published", "Templates acknowledged", ["transport"], registry=r)
        self.dead_letter = Counter(
            "peep_edge_dead_letter", "Templates rejected by the receiver", ["transport"], registry=r
        )
        self.reconnects = Counter("peep_edge_reconnects", "Reconnects", ["link"], registry=r)
        self.bundle_updates = Counter("peep_edge_bundle_updates", "Bundle announcements", ["result"], registry=r)
        self.events = Counter("peep_edge_events_received", "Recognition events received", registry=r)
        self.door_opened = Counter("peep_edge_door_opened", "Claims that opened the door", registry=r)
        self.door_refusals = Counter(
            "peep_edge_door_refusals", "Claims that left the door locked, by reason", ["reason"], registry=r
        )
        self._server: Any = None

    def serve(self, port: int, bind: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint (``port`` 0 = off); returns the port."""
        if port == 0:
            return 0
        server, _thread = start_http_server(port, addr=bind, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (tests and the bench read metrics through this)."""
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else float(v)
