"""MQTT transport (paho-mqtt 2.x, callback API v2, MQTT v5).

Topics (docs/DESIGN.md, "Wire and API"; the grammar is :mod:`peep.core.topics`, shared
with the server; ``<root>`` is ``mqtt.topic_prefix``, ``peep/v1`` by default):

- ``<root>/<site>/<device>/templates``: encoded ``PerturbedTemplate``, QoS 1.
- ``<root>/<site>/<device>/status``: retained ``online`` on connect; the
  last will (QoS 1, retained) and a clean stop publish ``offline``.
- ``<root>/<site>/<device>/events``: recognition events from the server
  (JSON), subscribed and logged.
- ``<root>/bundle``: retained signed bundle announcement
  (``peep.v1.BundleFiles``), handed to the agent which verifies it against
  the pinned key before using it.

Delivery: :class:`MqttForwarder` hands spooled templates to paho in order,
at most ``max_inflight`` un-acknowledged at a time, and removes a template
from the spool only when the broker's PUBACK arrives (``on_publish``). paho
keeps handed messages across reconnects and resends them (DUP flag) after
it reconnects with exponential backoff (``reconnect_min_s`` doubling to
``reconnect_max_s``); templates not yet handed stay in the spool. A PUBACK
with a failure reason code (e.g. 0x87 not authorised by the broker's ACL) is
logged and the template is retried after a backoff, never dropped; so is one
with 0x10, no matching subscribers: the broker acknowledged a template it then
dropped because no server session subscribed (a restarted broker the device
reached before the server did, or a server without a persistent session).
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions
from peep.core.topics import TopicScheme
from peep.edge.config import MqttConfig
from peep.edge.logs import log_event
from peep.edge.metrics import EdgeMetrics
from peep.edge.spool import Spool, SpoolItem
from peep.edge.startup import mqtt_tls_context
from peep.edge.transport.base import Forwarder

_log = logging.getLogger("peep.edge.mqtt")
#: Largest lock command a door reads (Home Assistant's are ``LOCK``, ``UNLOCK``, ``OPEN``).
MAX_LOCK_COMMAND = 64
#: PUBACK reason code (MQTT 5) of a message the broker took and then dropped: nobody subscribes to its topic.
NO_MATCHING_SUBSCRIBERS = 0x10


def _is_topic(received: str, ours: str) -> bool:
    """Whether a message the broker sent is on ``ours``, with the broker's listener mount point or without.

    The shipped broker mounts devices under ``devices/`` (deploy/mosquitto/mosquitto.conf); Mosquitto 2.0.11
    (Debian 12) does not strip the mount point from the topics it sends (fixed in 2.0.12). Only messages
    matching this client's own subscriptions arrive, so the suffix identifies them.

    >>> _is_topic("devices/peep/v1/bundle", "peep/v1/bundle"), _is_topic("peep/v1/bundle", "peep/v1/bundle")
    (True, True)
    >>> _is_topic("xpeep/v1/bundle", "peep/v1/bundle")
    False
    """
    return received == ours or received.endswith("/" + ours)


def _nodelay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """TCP_NODELAY: a small publish right after an acknowledgement (a door's claim check after the last
    decision's PUBACK) otherwise waits for the broker's delayed ACK, about 40 ms (Nagle's algorithm)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # not a TCP socket (a test's fake), or the option is not there
        pass


class MqttLink:
    """One paho client: TLS, authentication, last will, status, subscriptions.

    Parameters
    ----------
    cfg : MqttConfig
    client_id : str
        Unique per device (the broker disconnects an older client with the same id).
    site, device_id : str
    password : str or None
        Resolved secret (never from the TOML file).
    on_bundle : callable(bytes), optional
        Raw ``BundleFiles`` payloads from the retained bundle topic.
    on_event : callable(dict or None), optional
        Each message of the device's events topic: the JSON object, or None when it is not one (a door
        counts an unreadable decision).
    publish_status : bool
        Publish ``online``/``offline`` and set the last will (off for ``enroll``,
        which runs next to the agent).
    subscribe_events : bool
        Read (and log) the device's events topic. Off for the door's agent connection, which only carries its
        status and reports: the door's own connection reads the events, and two readers logged each twice.
    on_model : callable(bytes), optional
        Device models (decision mode): raw ``DeviceModelFiles`` payloads from the broadcast of every issued
        model and from the answer to this device's own request.
    model_request : callable() -> bytes, optional
        The ``GetDeviceModelRequest`` to publish at every connection (its bundle, key id, the serial it holds),
        so a device that was away when a model was issued asks for it.
    on_lock_command : callable(bytes), optional
        A door that opens at Home Assistant's request (``door.home_assistant_open``): each live message of its
        ``lock_command`` topic, at most :data:`MAX_LOCK_COMMAND` bytes. Subscribed at QoS 0 and every message
        published retained dropped, so a command is acted on only as it is sent: none is queued for a door that
        is away, and none is replayed on every reconnect.
    """

    def __init__(
        self,
        cfg: MqttConfig,
        *,
        client_id: str,
        site: str,
        device_id: str,
        password: str | None = None,
        metrics: EdgeMetrics | None = None,
        on_bundle: Callable[[bytes], None] | None = None,
        on_event: Callable[[dict[str, Any] | None], None] | None = None,
        publish_status: bool = True,
        subscribe_events: bool = True,
        on_model: Callable[[bytes], None] | None = None,
        model_request: Callable[[], bytes] | None = None,
        on_lock_command: Callable[[bytes], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._on_lock_command = on_lock_command
        self._on_model = on_model
        self._model_request = model_request
        self._subscribe_events = subscribe_events
        self.client_id = client_id
        self.metrics = metrics or EdgeMetrics()
        self.topics = TopicScheme(cfg.topic_prefix)
        self.templates_topic = self.topics.templates(site, device_id)
        self.status_topic = self.topics.status(site, device_id)
        self.lock_command_topic = self.topics.device(site, device_id, "lock_command")
        self.report_topic = self.topics.report(site, device_id)
        self.events_topic = self.topics.events(site, device_id)
        self.bundle_topic = self.topics.bundle
        self.model_topics = (self.topics.model(site, device_id), self.topics.model_broadcast)
        self.model_request_topic = self.topics.model_request(site, device_id)
        self._on_bundle = on_bundle
        self._on_event = on_event
        self._publish_status = publish_status
        self.connected = threading.Event()
        self.acks: queue.SimpleQueue[tuple[int, bool, str]] = queue.SimpleQueue()
        self.ack_listeners: list[Callable[[], None]] = []
        self._ever_connected = False
        self._started = False
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=True,
        )
        # The context Agent.prepare (and --validate-config) checked: certificate and host name verified.
        context = mqtt_tls_context(cfg)
        if context is not None:
            c.tls_set_context(context)
        username = cfg.username or (device_id if password is not None else None)
        if username is not None:
            c.username_pw_set(username, password)
        if publish_status:
            c.will_set(self.status_topic, b"offline", qos=1, retain=True)
        c.reconnect_delay_set(min_delay=cfg.reconnect_min_s, max_delay=cfg.reconnect_max_s)
        c.max_inflight_messages_set(cfg.max_inflight)
        c.on_connect = self._handle_connect
        c.on_connect_fail = self._handle_connect_fail
        c.on_disconnect = self._handle_disconnect
        c.on_publish = self._handle_publish
        c.on_message = self._handle_message
        c.on_socket_open = _nodelay
        self.client = c

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background (retrying with backoff until it works)."""
        self.client.connect_async(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s)
        self.client.loop_start()
        self._started = True

    def wait_connected(self, timeout: float) -> bool:
        return self.connected.wait(timeout)

    def stop(self, *, timeout: float = 3.0) -> None:
        """Publish ``offline`` (retained), then disconnect cleanly."""
        if not self._started:
            return
        try:
            if self._publish_status and self.connected.is_set():
                info = self.client.publish(self.status_topic, b"offline", qos=1, retain=True)
                try:
                    info.wait_for_publish(timeout)
                except (RuntimeError, ValueError):
                    pass
            self.client.disconnect()
        finally:
            self.client.loop_stop()
            self._started = False
            self.connected.clear()

    # -- callbacks (paho's network thread) ----------------------------------------

    def _handle_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: Any,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            log_event(
                _log,
                logging.ERROR,
                "mqtt_connect_refused",
                host=self.cfg.host,
                port=self.cfg.port,
                reason=str(reason_code),
                client_id=self.client_id,
            )
            return
        if self._ever_connected:
            self.metrics.reconnects.labels(link="mqtt").inc()
        self._ever_connected = True
        log_event(
            _log,
            logging.INFO,
            "mqtt_connected",
            host=self.cfg.host,
            port=self.cfg.port,
            client_id=self.client_id,
        )
        if self._publish_status:
            client.publish(self.status_topic, b"online", qos=1, retain=True)
        subs = [(self.events_topic, 1)] if self._subscribe_events else []
        if self._on_bundle is not None:
            subs.append((self.bundle_topic, 1))
        if self._on_model is not None:
            subs.extend((t, 1) for t in self.model_topics)
        if self._on_lock_command is not None:
            # Retain as published: a command sent retained keeps its flag even live, and is dropped either way.
            subs.append((self.lock_command_topic, SubscribeOptions(qos=0, retainAsPublished=True)))
        if subs:
            client.subscribe(subs)
        if self._on_model is not None and self._model_request is not None:
            # Subscribed first (paho sends in order): the answer cannot arrive before the subscription.
            client.publish(self.model_request_topic, self._model_request(), qos=1, retain=False)
        self.connected.set()
        self._notify()

    def _handle_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        log_event(
            _log,
            logging.WARNING,
            "mqtt_unreachable",
            host=self.cfg.host,
            port=self.cfg.port,
            client_id=self.client_id,
        )

    def _handle_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: Any,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        was = self.connected.is_set()
        self.connected.clear()
        if was:
            log_event(
                _log,
                logging.WARNING,
                "mqtt_disconnected",
                host=self.cfg.host,
                port=self.cfg.port,
                reason=str(reason_code),
            )

    def _handle_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        # 0x10 "no matching subscribers" is a success to MQTT and a loss to us: the broker dropped the template
        # (a device reconnecting to a restarted broker before the server's sessions did). Kept and sent again.
        delivered = not reason_code.is_failure and reason_code.value != NO_MATCHING_SUBSCRIBERS
        self.acks.put((mid, delivered, str(reason_code)))
        self._notify()

    def _handle_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if self._on_lock_command is not None and _is_topic(msg.topic, self.lock_command_topic):
            if msg.retain or len(msg.payload) > MAX_LOCK_COMMAND:
                log_event(_log, logging.WARNING, "door_command_ignored", topic=msg.topic, retained=bool(msg.retain),
                          size=len(msg.payload))  # fmt: skip
                return
            self._on_lock_command(bytes(msg.payload))
            return
        if _is_topic(msg.topic, self.bundle_topic) and self._on_bundle is not None:
            if msg.payload:
                self._on_bundle(bytes(msg.payload))
            return
        if self._on_model is not None and any(_is_topic(msg.topic, t) for t in self.model_topics):
            if msg.payload:
                self._on_model(bytes(msg.payload))
            return
        if _is_topic(msg.topic, self.events_topic):
            self.metrics.events.inc()
            try:
                event = json.loads(msg.payload)
                if not isinstance(event, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                log_event(_log, logging.WARNING, "event_unreadable", topic=msg.topic, error=str(exc))
                if self._on_event is not None:
                    self._on_event(None)
                return
            # Nested, so the server's keys can never overwrite the record's own fields.
            log_event(_log, logging.INFO, "recognition_event", payload={k: event[k] for k in list(event)[:20]})
            if self._on_event is not None:
                self._on_event(event)

    def _notify(self) -> None:
        for callback in self.ack_listeners:
            callback()

    def publish_report(self, payload: bytes) -> bool:
        """Publish the device's report, retained (QoS 1: the latest survives a server restart); False if offline."""
        if not self.connected.is_set():
            return False
        info = self.client.publish(self.report_topic, payload, qos=1, retain=True)
        return info.rc == mqtt.MQTT_ERR_SUCCESS

    def publish_template(self, payload: bytes) -> int:
        """Hand one encoded template to paho (QoS 1); returns its message id (mid)."""
        info = self.client.publish(self.templates_topic, payload, qos=1, retain=False)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            raise RuntimeError(f"paho refused the publish: {mqtt.error_string(info.rc)}")
        return int(info.mid)


class MqttForwarder(Forwarder):
    """Spool -> broker, removing templates on PUBACK (see the module docstring)."""

    dest = "mqtt"

    def __init__(
        self,
        link: MqttLink,
        spool: Spool,
        *,
        metrics: EdgeMetrics | None = None,
        retry_min_s: float = 1.0,
        retry_max_s: float = 60.0,
    ) -> None:
        super().__init__(spool, metrics=metrics)
        self.link = link
        link.ack_listeners.append(self.wake.set)
        self.window = link.cfg.max_inflight
        self.inflight: dict[int, SpoolItem] = {}
        self._handed: set[int] = set()
        self._last_seq = 0
        self._unacked: list[str] = []  # PUBACKed, not yet deleted from the spool (a full disk refused it)
        self._paused_until = 0.0
        self._retry_min, self._retry_max = retry_min_s, retry_max_s
        self._failures = 0

    def _process_acks(self) -> None:
        done: list[SpoolItem] = []
        while True:
            try:
                mid, ok, reason = self.link.acks.get_nowait()
            except queue.Empty:
                break
            item = self.inflight.pop(mid, None)
            if item is None:
                continue  # the status message, or a template handed before a restart
            self._handed.discard(item.seq)
            if ok:
                done.append(item)
                self._failures = 0
            else:
                delay = min(self._retry_max, self._retry_min * 2.0 ** min(self._failures, 20))
                self._failures += 1
                self._paused_until = time.monotonic() + delay
                self._last_seq = min(self._last_seq, item.seq - 1)
                log_event(
                    _log,
                    logging.ERROR,
                    "mqtt_publish_refused",
                    message_id=item.message_id,
                    reason=reason,
                    topic=self.link.templates_topic,
                    retry_in_s=delay,
                )
        if done:
            # Latency to the PUBACK, before the delete (which may include a WAL checkpoint: not the broker's time).
            now = time.time()
            for it in done:
                self.metrics.publish_latency.labels(transport=self.dest).observe(max(0.0, now - it.created))
            self.metrics.published.labels(transport=self.dest).inc(len(done))
            self._unacked.extend(it.message_id for it in done)
        if self._unacked:
            # Left inflight and past _last_seq, a PUBACKed template whose delete failed would never be read
            # again: its id is kept here until the spool takes the delete (a full disk refuses it).
            try:
                self.spool.ack(self.dest, self._unacked)
            except sqlite3.OperationalError as exc:
                self.spool_write_failed(exc)
                return
            self._unacked = []
            self.spool_write_ok()
            self.update_depth()

    def _hand_out(self) -> None:
        room = self.window - len(self.inflight)
        if room <= 0 or not self.link.connected.is_set() or time.monotonic() < self._paused_until:
            return
        items = self.spool.peek(self.dest, room + len(self._handed), after_seq=self._last_seq)
        for it in items:
            if room <= 0:
                break
            if it.seq in self._handed:
                self._last_seq = max(self._last_seq, it.seq)
                continue
            mid = self.link.publish_template(it.payload)
            self.inflight[mid] = it
            self._handed.add(it.seq)
            self._last_seq = max(self._last_seq, it.seq)
            room -= 1

    def run(self) -> None:
        try:
            self.update_depth()
            while True:
                self._process_acks()
                idle = not self.inflight and self.spool.depth(self.dest) == 0
                if self.should_exit(idle=idle):
                    return
                self._hand_out()
                self.sleep(0.25)
        except Exception:
            _log.exception("mqtt forwarder failed")
            raise
