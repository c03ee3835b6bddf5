"""MQTT side of the server (paho-mqtt 2, MQTT v5).

Topic names come from :mod:`peep.core.topics`, the grammar the devices use
too; ``<prefix>`` is ``mqtt.topic_prefix`` (``peep/v1`` by default).

Ingest
    Shared subscription ``$share/<group>/<prefix>/+/+/templates`` (QoS 1), so
    several replicas split the devices' templates. The paho network thread
    only queues messages; a writer thread validates and stores them in
    batches (one transaction per batch) and acknowledges each message
    (manual PUBACK) *after* its batch committed: a crash never loses a
    template the broker considers delivered (at-least-once, and ingest is
    idempotent). The bounded queue and the broker's receive maximum give
    back-pressure. ``mqtt.connections`` consumer connections (default 4) join
    the share group: the broker limits QoS 1 messages in flight *per
    connection* (Mosquitto: ``max_inflight_messages``, 20 by default), and an
    acknowledgement waits for a database commit, so one connection would cap
    ingest at a few thousand templates per second.
Dead letters
    Every refused template produces a JSON document on ``<prefix>/deadletter``:
    ``{"topic", "code", "reason", "size"}``, never the payload itself, plus
    ``peep_ingest_rejected{transport="mqtt",reason=...}``.
Events
    Recognition events as JSON on ``<prefix>/<site>/<device>/events`` (QoS 1).
Bundle
    The current bundle as a retained ``BundleFiles`` message on
    ``<prefix>/bundle`` (re-announced after every (re)connect).

The socket gets ``TCP_NODELAY``: with Nagle's algorithm the small PUBACKs
wait for delayed ACKs and ingest stalls at a few hundred messages per second.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peep.core.bundle import EigenfaceBundle
from peep.core.exceptions import TopicError
from peep.core.topics import TopicScheme
from peep.server.bundles.catalog import bundle_files_message
from peep.server.config import MqttConfig
from peep.server.ingest.events import event_json_bytes
from peep.server.ingest.ingestor import REJECTED, Sender
from peep.server.ingest.validation import Rejection
from peep.server.services import Services
from peep.v1 import recognition_pb2, template_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Item:
    topic: str
    payload: bytes
    mid: int
    qos: int
    conn: int


def _nodelay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):
        pass


class MqttBridge:
    """Templates in, events/bundles/dead letters out.

    Parameters
    ----------
    config : MqttConfig
    services : Services
    password : str, optional
    """

    def __init__(self, config: MqttConfig, services: Services, *, password: str | None = None) -> None:
        self.config = config
        self.s = services
        self.topics = TopicScheme(config.topic_prefix)
        self.templates_filter = self.topics.shared_templates_filter(config.share_group)
        self.deadletter_topic = self.topics.deadletter
        self.bundle_topic = self.topics.bundle
        self.client_id = config.client_id or f"peep-server-{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self._queue: queue.Queue[_Item] = queue.Queue(config.queue_size)
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.processed = 0
        self.deadletters = 0
        self.clients = [self._make_client(i, password) for i in range(config.connections)]
        self.client = self.clients[0]  # also publishes events, dead letters and the bundle
        self._n_connected = 0
        self._n_subscribed = 0
        self._state_lock = threading.Lock()
        services.events.add_sink(self.publish_event)
        services.bundles.add_listener(self.publish_bundle)

    def _make_client(self, index: int, password: str | None) -> mqtt.Client:
        cid = self.client_id if index == 0 else f"{self.client_id}-{index}"
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5, manual_ack=True, userdata=index
        )
        if self.config.username:
            c.username_pw_set(self.config.username, password)
        if self.config.tls is not None:
            c.tls_set(
                ca_certs=str(self.config.tls.ca),
                certfile=str(self.config.tls.cert) if self.config.tls.cert else None,
                keyfile=str(self.config.tls.key) if self.config.tls.key else None,
            )
        c.max_inflight_messages_set(1000)
        c.max_queued_messages_set(0)
        c.reconnect_delay_set(1, 30)
        c.on_socket_open = _nodelay
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        return c

    # ------------------------------------------------------------ lifecycle

    def start(self, *, wait: float | None = None) -> None:
        """Connect in the background; with ``wait``, block until subscribed (or raise TimeoutError)."""
        for c in self.clients:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.ReceiveMaximum = self.config.receive_maximum
            c.connect_async(self.config.host, self.config.port, keepalive=self.config.keepalive_s, properties=props)
            c.loop_start()
        self._writer = threading.Thread(target=self._write_loop, name="peep-mqtt-writer", daemon=True)
        self._writer.start()
        if wait is not None and not self._subscribed.wait(wait):
            raise TimeoutError(
                f"mqtt: not connected and subscribed to {self.config.host}:{self.config.port} within {wait} s"
            )

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._subscribed.wait(timeout)

    def stop(self, *, drain_timeout: float = 10.0) -> None:
        """Unsubscribe, store what is queued (and ack it), disconnect."""
        for c in self.clients:
            try:
                c.unsubscribe(self.templates_filter)
            except Exception:  # best effort at shutdown
                pass
        deadline = time.monotonic() + drain_timeout
        while (not self._queue.empty() or not self._idle.is_set()) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=5.0)
        for c in self.clients:
            c.disconnect()
            c.loop_stop()
        self.s.metrics.mqtt_connected.set(0)

    # ------------------------------------------------------------ paho callbacks

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            log.error("mqtt connect refused", extra={"reason": str(reason)})
            return
        with self._state_lock:
            self._n_connected += 1
            if self._n_connected == len(self.clients):
                self._connected.set()
                self.s.metrics.mqtt_connected.set(1)
        client.subscribe(self.templates_filter, qos=self.config.qos)
        log.info(
            "mqtt connected",
            extra={"client_id": self.client_id, "connection": userdata, "filter": self.templates_filter},
        )
        if userdata == 0:
            b = self.s.bundles.current()
            if b is not None:
                self.publish_bundle(b)

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        if all(not rc.is_failure for rc in reason_codes):
            with self._state_lock:
                self._n_subscribed += 1
                if self._n_subscribed >= len(self.clients):
                    self._subscribed.set()
        else:
            log.error("mqtt subscribe refused (check the broker ACL)", extra={"filter": self.templates_filter})

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        with self._state_lock:
            self._n_connected = max(0, self._n_connected - 1)
            self._n_subscribed = max(0, self._n_subscribed - 1)
        self._connected.clear()
        self._subscribed.clear()
        self.s.metrics.mqtt_connected.set(0)
        if not self._stop.is_set():
            log.warning("mqtt disconnected; reconnecting", extra={"reason": str(reason)})

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        # Blocking put = back-pressure: the broker holds further messages
        # (receive maximum) until the writer catches up.
        self._queue.put(_Item(msg.topic, bytes(msg.payload), msg.mid, msg.qos, userdata))

    # ------------------------------------------------------------ writer

    def _write_loop(self) -> None:
        batch_max = self.config.batch
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self._idle.clear()
            items = [first]
            while len(items) < batch_max:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            delay = 0.2
            while True:
                try:
                    self._process(items)
                except Exception:
                    # The database is unavailable: keep the batch (unacknowledged,
                    # so the broker still holds it) and retry; ingest is idempotent.
                    log.exception("mqtt batch failed; retrying", extra={"size": len(items), "retry_in_s": delay})
                    if self._stop.wait(delay):
                        break  # shutting down: unacknowledged, the broker redelivers
                    delay = min(delay * 2, 10.0)
                    continue
                for it in items:
                    if it.qos:
                        self.clients[it.conn].ack(it.mid, it.qos)
                self.processed += len(items)
                break
            if self._queue.empty():
                self._idle.set()

    def _process(self, items: list[_Item]) -> None:
        msgs: list[template_pb2.PerturbedTemplate] = []
        senders: list[Sender] = []
        topics: list[_Item] = []
        early: dict[str, int] = {}
        for it in items:
            try:
                try:
                    where = self.topics.parse(it.topic, leaf="templates")
                except TopicError as exc:
                    raise Rejection("bad_topic", str(exc)) from None
                sender = Sender(topic_site=where.site, topic_device=where.device_id)
                msg = self.s.validator.decode(it.payload)
            except Rejection as exc:
                early[exc.reason] = early.get(exc.reason, 0) + 1
                self._deadletter(it, exc.reason, str(exc))
                continue
            msgs.append(msg)
            senders.append(sender)
            topics.append(it)
        if early:
            self.s.metrics.count_ingest("mqtt", 0, 0, early)
        if not msgs:
            return
        outcomes = self.s.ingestor.ingest(msgs, "mqtt", senders)
        for it, o in zip(topics, outcomes, strict=True):
            if o.status == REJECTED:
                self._deadletter(it, o.code, o.reason)

    def _deadletter(self, it: _Item, code: str, reason: str) -> None:
        self.deadletters += 1
        doc = {"topic": it.topic[:256], "code": code, "reason": reason[:500], "size": len(it.payload)}
        self.client.publish(self.deadletter_topic, json.dumps(doc, separators=(",", ":")), qos=1)

    # ------------------------------------------------------------ outgoing

    def publish_event(self, ev: recognition_pb2.RecognitionEvent) -> None:
        if not self._connected.is_set():
            return
        self.client.publish(self.topics.events(ev.site, ev.device_id), event_json_bytes(ev), qos=1)

    def publish_bundle(self, bundle: EigenfaceBundle) -> None:
        payload = bundle_files_message(bundle).SerializeToString(deterministic=True)
        self.client.publish(self.bundle_topic, payload, qos=1, retain=True)
        log.info("bundle announced", extra={"bundle_id": bundle.bundle_id, "topic": self.bundle_topic})
