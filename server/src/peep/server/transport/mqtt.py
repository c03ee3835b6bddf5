"""MQTT side of the server (paho-mqtt 2, MQTT v5).

Topic names come from :mod:`peep.core.topics`, the grammar the devices use
too; ``<root>`` is ``mqtt.device_mount_point`` + ``mqtt.topic_prefix``
(``peep/v1`` by default; ``devices/peep/v1`` with the shipped broker, whose
devices' listener mounts their topics under ``devices/``).

Ingest
    Shared subscription ``$share/<group>/<root>/+/+/templates`` (QoS 1), so
    several replicas split the devices' templates. The paho network thread
    only queues messages; a writer thread validates and stores them in
    batches (one transaction per batch) and acknowledges each message
    (manual PUBACK) *after* its batch committed: a crash never loses a
    template the broker considers delivered (at-least-once, and ingest is
    idempotent). The bounded queue and the broker's receive maximum give
    back-pressure. ``mqtt.connections`` consumer connections (default 4) join
    the share group: the broker limits QoS 1 messages in flight *per
    connection* (to ``mqtt.receive_maximum``, the Receive Maximum this client
    sends; Mosquitto's ``max_inflight_messages`` applies to MQTT 3 clients), and
    an acknowledgement waits for a database commit, so one connection would cap
    ingest at a few thousand templates per second.
Durable sessions
    Each connection has a stable client id (``mqtt.client_id``, default
    ``peep-server-<host name>``; connection *i* > 0 appends ``-<i>``) and a
    persistent MQTT v5 session (clean start off, ``mqtt.session_expiry_s``).
    While the server is stopped, restarting or crash-looping, its sessions stay
    members of the share group and the broker queues their share of the
    templates (Mosquitto: ``persistence``, ``max_queued_messages``); messages
    in flight but not acknowledged when the process died are redelivered when
    the session resumes. A stop therefore never unsubscribes: it stops taking
    messages, commits and acknowledges what it holds, and disconnects.
    An acknowledgement is sent only on the connection that delivered the
    message: after a reconnect the broker redelivers what was unacknowledged,
    and a late PUBACK could otherwise acknowledge a different message that
    reused the packet id.
Sessions no longer used
    A session keeps receiving its share of the templates until it expires,
    connected or not. After ``mqtt.connections`` was lowered, the server finds
    the sessions ``<client_id>-<i>`` for *i* >= ``connections`` at start-up,
    stores what they hold, and ends them (:meth:`MqttBridge.retire_sessions`);
    ``peep mqtt retire`` does the same for every session of a replica taken out
    of service.
Retained messages devices should not leave
    Mosquitto cannot refuse the retain flag. The template subscription asks
    for *retain as published*: a retained template is stored like any other,
    then its retained copy is cleared (an empty retained message). With
    ``mqtt.clear_retained``, any retained status that is not ``online``/``offline``
    from a registered device at its registered site is cleared too.
Device statuses and reports
    Connection 0 subscribes (QoS 0, never queued) to ``<root>/+/+/status`` and
    ``<root>/+/+/report`` with plain filters, outside the share group: every
    replica gets each retained status and report, and keeps the latest per
    device for its console (:meth:`MqttBridge.device_statuses`,
    :meth:`MqttBridge.device_reports`), whatever ``mqtt.clear_retained`` says.
Dead letters
    Every refused template produces a JSON document on ``<root>/deadletter``:
    ``{"topic", "code", "reason", "size"}``, never the payload itself, plus
    ``peep_ingest_rejected{transport="mqtt",reason=...}``.
Events
    Recognition events as JSON on ``<root>/<site>/<device>/events`` (QoS 1).
    With ``mqtt.decision_signing_key`` every VERIFY decision carries the
    server's Ed25519 signature (:mod:`peep.core.signing`): a door deciding
    over MQTT acts on nothing else, whatever the broker lets through.
Claim checks
    A door asks whether a claimed subject is enrolled before it releases a
    template: JSON ``{"nonce", "claimed_subject"}`` on
    ``<root>/<site>/<device>/claims``, consumed through the share group (one
    replica answers) at QoS 0 (a question nobody answered in time is the
    door's ``unreachable``, never queued for later). The answer, signed like a
    decision, goes to the device's events topic: ``{"kind": "claim_check",
    "nonce", "device_id", "site", "claimed_subject", "known",
    "model_version", "signature"}``. Only a registered device at its site is
    answered, within :class:`~peep.server.recognition.claims.ClaimChecker`'s
    rate.
Device models
    Every signed device model the server issues on ``<root>/model``, and a
    device's ``model_request`` answered on its ``model`` topic (QoS 1, never
    retained; :mod:`peep.server.transport.mqtt_device_models`).
Bundle
    The current bundle as a retained ``BundleFiles`` message on
    ``<root>/bundle`` (re-announced after every (re)connect), unless it exceeds
    the maximum packet size the broker announces in CONNACK (then an error is
    logged: the broker would disconnect the server for it).

The socket gets ``TCP_NODELAY``: with Nagle's algorithm the small PUBACKs
wait for delayed ACKs and ingest stalls at a few hundred messages per second.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from peep.core.bundle import ProjectionBundle, load_private_key
from peep.core.exceptions import TopicError, WireError
from peep.core.reports import DeviceReport
from peep.core.signing import door_statement, sign_statement
from peep.core.topics import TopicScheme
from peep.server import __version__
from peep.server.bundles.catalog import bundle_files_message
from peep.server.config import MqttConfig
from peep.server.ingest.events import event_json_bytes, event_to_json
from peep.server.ingest.ingestor import REJECTED, Sender
from peep.server.recognition.claims import ClaimChecksTooFrequent
from peep.server.recognition.recogniser import ModelUnavailable
from peep.server.services import Services
from peep.server.transport.homeassistant import HomeAssistantDiscovery, HomeAssistantPublisher
from peep.server.transport.mqtt_device_models import DeviceModelTopics
from peep.server.transport.mqtt_devices import MAX_CLAIM_CHECK_BYTES, DeviceHeard, read_claim_check, sender_refusal
from peep.v1 import recognition_pb2, template_pb2

__all__ = ["MqttBridge"]

log = logging.getLogger(__name__)

#: MQTT v5 DISCONNECT reason "Session taken over": another client connected with our client id.
_SESSION_TAKEN_OVER = 0x8E


def default_client_id(hostname: str | None = None) -> str:
    """``peep-server-<host name>``, reduced to the characters and length a client id may have.

    >>> default_client_id("db-1.example.org")
    'peep-server-db-1.example.org'
    >>> default_client_id("weird host/name")
    'peep-server-weird-host-name'
    """
    host = re.sub(r"[^A-Za-z0-9_.:@-]+", "-", hostname if hostname is not None else socket.gethostname())
    return f"peep-server-{host.strip('-') or 'unnamed'}"[:96]


@dataclass(frozen=True, slots=True)
class _Item:
    topic: str
    payload: bytes
    mid: int
    qos: int
    conn: int
    gen: int  # the connection's generation that delivered it (acks go to that one only)
    retain: bool


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
        self.topics = TopicScheme(config.device_mount_point + config.topic_prefix)
        self.templates_filter = self.topics.shared_templates_filter(config.share_group)
        self.status_filter = f"{self.topics.root}/+/+/status"
        self.report_filter = f"{self.topics.root}/+/+/report"
        self.claims_filter = self.topics.shared_claims_filter(config.share_group)
        self.model_requests_filter = self.topics.shared_model_requests_filter(config.share_group)
        self._decision_key = None
        if config.decision_signing_key is not None:
            # startup.check has read it already (naming the key on failure); a bridge built without it still
            # says which setting is wrong.
            try:
                self._decision_key = load_private_key(config.decision_signing_key)
            except Exception as exc:
                raise ValueError(f"mqtt.decision_signing_key: {exc}") from None
        self.claim_checks = {"answered": 0, "refused": 0}
        self.heard = DeviceHeard(self.topics, services.devices,
                                 require_registered_device=config.require_registered_device)  # fmt: skip
        self.deadletter_topic = self.topics.deadletter
        self.bundle_topic = self.topics.bundle
        self.client_id = config.client_id or default_client_id()
        self._queue: queue.Queue[_Item] = queue.Queue(config.queue_size)
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._closing = threading.Event()  # stop taking messages (they stay with the broker)
        self._writer: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.processed = 0
        self.deadletters = 0
        self.retained_cleared = 0
        self.max_packet_size: int | None = None  # from CONNACK
        self._state_lock = threading.Lock()
        self._gen: dict[int, int] = dict.fromkeys(range(config.connections), 0)
        self._retiring: dict[int, mqtt.Client] = {}  # sessions being drained and ended, by index
        self._taken: dict[int, int] = {}  # templates a retiring session delivered / had acknowledged
        self._acked: dict[int, int] = {}
        self._up = [False] * config.connections
        self._ready = [False] * config.connections
        self._password = password
        self.clients = [self._make_client(i, password) for i in range(config.connections)]
        self.client = self.clients[0]  # also publishes events, dead letters and the bundle
        services.events.add_sink(self.publish_event)
        services.bundles.add_listener(self.publish_bundle)
        self.device_models = DeviceModelTopics(
            self.topics,
            services,
            publisher=self._publisher,
            max_packet_size=lambda: self.max_packet_size,
            connected=self._connected.is_set,
        )
        services.device_models.add_listener(self.device_models.broadcast)
        ha = services.config.home_assistant
        self.home_assistant = HomeAssistantPublisher(
            HomeAssistantDiscovery(self.topics, prefix=ha.discovery_prefix, version=__version__), services.devices,
            doors=ha.doors, publisher=self._publisher, connected=self._connected.is_set,
            recent_minutes=ha.recent_minutes, stopping=self._stop, people=services.store.home_assistant_people,
        ) if ha.enabled else None  # fmt: skip
        if self.home_assistant is not None:
            services.events.add_sink(self.home_assistant.event)
            self.client.on_publish = self.home_assistant.published  # a refused discovery publish is shown

    def connection_client_id(self, index: int) -> str:
        return self.client_id if index == 0 else f"{self.client_id}-{index}"

    def _make_client(self, index: int, password: str | None) -> mqtt.Client:
        c = self._bare_client(index, password)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        return c

    def _bare_client(self, index: int, password: str | None) -> mqtt.Client:
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.connection_client_id(index),
            protocol=mqtt.MQTTv5,
            manual_ack=True,
            userdata=index,
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
        # A short ceiling: with 30 s, a broker away for 17 s was reached again 14 s after it returned (the
        # soak measured the wait); retrying a broker every few seconds costs nothing.
        c.reconnect_delay_set(1, self.config.reconnect_max_s)
        c.on_socket_open = _nodelay
        return c

    @property
    def durable(self) -> bool:
        return self.config.session_expiry_s > 0

    # ------------------------------------------------------------ lifecycle

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="peep-mqtt-writer", daemon=True)
            self._writer.start()

    def start(self, *, wait: float | None = None) -> None:
        """Connect in the background; with ``wait``, block until subscribed (or raise TimeoutError)."""
        # The writer first: a resumed session delivers its queue right after CONNACK.
        self._start_writer()
        for c in self.clients:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.ReceiveMaximum = self.config.receive_maximum
            props.SessionExpiryInterval = self.config.session_expiry_s
            # Clean start off on every connect, the first of the process included: resume the
            # session (and the templates queued for it) the previous run of this replica left.
            c.connect_async(
                self.config.host,
                self.config.port,
                keepalive=self.config.keepalive_s,
                clean_start=not self.durable,
                properties=props,
            )
            c.loop_start()
        if self.durable:
            threading.Thread(target=self._retire_surplus, name="peep-mqtt-retire", daemon=True).start()
        if wait is not None and not self._subscribed.wait(wait):
            raise TimeoutError(
                f"mqtt: not connected and subscribed to {self.config.host}:{self.config.port} within {wait} s"
            )

    def _retire_surplus(self) -> None:
        # Once this run's connections are in the group (they take the new templates), end the
        # sessions a run with more connections left behind.
        while not self._subscribed.wait(1.0):
            if self._stop.is_set():
                return
        try:
            self.retire_sessions(self.config.connections)
        except Exception:
            log.exception("mqtt: retiring unused sessions failed; they stay until they expire")

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._subscribed.wait(timeout)

    def retire_sessions(
        self, first: int = 0, *, quiet_s: float = 1.0, timeout_s: float = 300.0, settle_s: float = 0.0
    ) -> dict[str, int]:
        """Store what the sessions ``connection_client_id(first)``, ``(first + 1)``, … hold, then end them.

        For each index from ``first`` on, connect resuming the session (clean start off); stop at
        the first index without a session (a replica's sessions are numbered from 0 without
        gaps). Each session found is unsubscribed (new templates go to the group's other
        members), its queued and unacknowledged templates are stored and acknowledged like any
        other, and once nothing arrived for ``quiet_s`` and all are acknowledged, the DISCONNECT
        sets its expiry to 0, which ends it. On a failure or timeout the socket is closed without
        DISCONNECT, so the session and what it still holds stay with the broker. The server of
        this client id must not be running with these indices: it would take the session back
        (RuntimeError). ``settle_s`` waits that long after connecting before unsubscribing, so that
        a running replica, which reconnects within about a second, takes its session back while it
        is still subscribed. Returns ``{client_id: templates stored}``.
        """
        self._start_writer()
        done: dict[str, int] = {}
        for index in range(first, 64):
            cid = self.connection_client_id(index)
            c = self._bare_client(index, self._password)
            up = threading.Event()
            state: dict[str, Any] = {}
            absent = False

            def connected(
                client: Any, u: Any, flags: Any, reason: Any, p: Any, state: Any = state, up: Any = up
            ) -> None:
                state["ok"] = not reason.is_failure
                state["reason"] = str(reason)
                state["present"] = bool(getattr(flags, "session_present", False))
                up.set()

            def disconnected(client: Any, u: Any, flags: Any, reason: Any, p: Any, state: Any = state) -> None:
                state.setdefault("lost", reason)

            c.on_connect = connected
            c.on_disconnect = disconnected
            c.on_message = self._on_retiring_message
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = max(self.config.session_expiry_s, 60)
            props.ReceiveMaximum = self.config.receive_maximum
            self._gen[index] = self._gen.get(index, 0) + 1
            self._taken[index] = self._acked[index] = 0
            self._retiring[index] = c
            try:
                c.connect_async(
                    self.config.host, self.config.port, keepalive=self.config.keepalive_s, clean_start=False,
                    properties=props,
                )  # fmt: skip
                c.loop_start()
                if not up.wait(15.0):
                    raise ConnectionError(
                        f"mqtt: no answer from {self.config.host}:{self.config.port} within 15 s (mqtt.host, "
                        f"mqtt.port, mqtt.tls); session {cid} not retired"
                    )
                if not state["ok"]:
                    raise ConnectionError(
                        f"mqtt: the broker refused {cid} ({state['reason']}; mqtt.username, mqtt.password, the "
                        f"broker ACL); session not retired"
                    )
                absent = not state["present"]
                if not absent:
                    self._drain_retiring(c, cid, index, state, quiet_s, timeout_s, settle_s)
                    done[cid] = self._taken[index]
                    log.info("mqtt session retired", extra={"client_id": cid, "templates": self._taken[index]})
            except BaseException:
                c.loop_stop()  # no DISCONNECT: the session keeps what is not acknowledged
                sock = c.socket()
                if sock is not None:
                    sock.close()
                raise
            else:
                end = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]
                end.SessionExpiryInterval = 0  # the session ends with this connection
                c.disconnect(properties=end)
                c.loop_stop()
            finally:
                self._gen[index] += 1  # anything still queued from it is redelivered, not acknowledged here
                self._retiring.pop(index, None)
            if absent:
                break
        return done

    def _drain_retiring(
        self,
        c: mqtt.Client,
        cid: str,
        index: int,
        state: dict[str, Any],
        quiet_s: float,
        timeout_s: float,
        settle_s: float,
    ) -> None:
        def check() -> None:
            if self._closing.is_set():
                raise RuntimeError(f"mqtt: stopping; session {cid} left in place")
            lost = state.get("lost")
            if lost is None:
                return
            # Mosquitto 2.0 closes the connection of a session taken over without a DISCONNECT
            # (reason "Unspecified error"); other brokers say "Session taken over" (0x8E).
            why = "taken over" if getattr(lost, "value", None) == _SESSION_TAKEN_OVER else str(lost)
            raise RuntimeError(
                f"mqtt: the broker closed the connection retiring {cid} ({why}): is the replica still running? "
                f"Stop it first (it takes its session back); session left in place"
            )

        settled = time.monotonic() + settle_s
        while time.monotonic() < settled:
            check()
            time.sleep(0.05)
        check()
        c.unsubscribe([self.templates_filter, self.status_filter, self.report_filter, self.claims_filter,
                       self.model_requests_filter])  # fmt: skip
        deadline = time.monotonic() + timeout_s
        last, seen = time.monotonic(), -1
        while time.monotonic() < deadline:
            check()
            n = self._taken[index]
            if n != seen:
                last, seen = time.monotonic(), n
            elif time.monotonic() - last >= quiet_s and self._acked[index] >= n:
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(
                f"mqtt: session {cid} still delivering after {timeout_s} s; left in place "
                f"({self._acked[index]} of {self._taken[index]} templates stored)"
            )

    def stop(self, *, drain_timeout: float = 10.0) -> None:
        """Stop taking messages, store and acknowledge what was taken, disconnect.

        The subscription stays: the broker keeps the session for
        ``mqtt.session_expiry_s`` and queues this replica's share of the
        templates until it returns. Whatever is not acknowledged when the
        drain times out is redelivered then (ingest is idempotent).
        """
        self._closing.set()
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
        log.info(
            "mqtt stopped",
            extra={
                "client_id": self.client_id,
                "processed": self.processed,
                "left_with_broker": self._queue.qsize(),
                "session_expiry_s": self.config.session_expiry_s,
            },
        )

    # ------------------------------------------------------------ paho callbacks

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            cid = self.connection_client_id(int(userdata))
            log.error("mqtt connect refused", extra={"reason": str(reason), "client_id": cid})
            return
        index = int(userdata)
        size = getattr(properties, "MaximumPacketSize", None)
        with self._state_lock:
            self._gen[index] += 1
            first = self._gen[index] == 1
            self._up[index] = True
            if size:
                self.max_packet_size = int(size)
            if all(self._up):
                self._connected.set()
                self.s.metrics.mqtt_connected.set(1)
        resumed = bool(getattr(flags, "session_present", False))
        # Subscribe on every connect: a resumed session keeps its subscription (re-subscribing
        # is idempotent), a new or expired one needs it.
        subs: list[tuple[str, SubscribeOptions]] = [
            (self.templates_filter, SubscribeOptions(qos=self.config.qos, retainAsPublished=True))
        ]
        if index == 0:
            # Devices' statuses (the console's Devices page; clear_retained only decides whether bad ones are
            # cleared) and reports (suppressed releases, budgets). Plain filters, not the share group: each is a
            # retained message every replica needs, and the retained latest arrives with every subscription.
            # QoS 0: they are never queued for this session while the server is away.
            subs.append((self.status_filter, SubscribeOptions(qos=0, retainAsPublished=True)))
            subs.append((self.report_filter, SubscribeOptions(qos=0, retainAsPublished=True)))
            # Doors' claim checks: one replica of the group answers; QoS 0, never queued for a replica away.
            subs.append((self.claims_filter, SubscribeOptions(qos=0)))
            # Devices' asks for a device model: the same (a device that heard nothing asks again).
            subs.append((self.model_requests_filter, SubscribeOptions(qos=0)))
            if self.home_assistant is not None:  # its birth (announce again) and the configs retained (clean up)
                subs += self.home_assistant.subscriptions()
        client.subscribe(subs)
        extra = {
            "client_id": self.connection_client_id(index),
            "connection": index,
            "filter": self.templates_filter,
            "session_present": resumed,
            "session_expiry_s": self.config.session_expiry_s,
        }
        if self.durable and not resumed and not first:
            # The broker dropped the session (expired, or restarted without persistence): what
            # it had queued for this connection is gone.
            log.warning("mqtt session not resumed; templates queued for it may be lost", extra=extra)
        else:
            log.info("mqtt connected", extra=extra)
        if index == 0:
            b = self.s.bundles.current()
            if b is not None:
                self.publish_bundle(b)
            if self.home_assistant is not None:
                self.home_assistant.announce()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        if any(rc.is_failure for rc in reason_codes):
            log.error("mqtt subscribe refused (check the broker ACL)", extra={"filter": self.templates_filter})
            return
        with self._state_lock:
            self._ready[int(userdata)] = True
            ready = all(self._ready)
        if ready and not self._subscribed.is_set():
            self._subscribed.set()
            log.info("mqtt subscribed", extra={"client_id": self.client_id, "filter": self.templates_filter})

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        index = int(userdata)
        with self._state_lock:
            self._up[index] = False
            self._ready[index] = False
        self._connected.clear()
        self._subscribed.clear()
        self.s.metrics.mqtt_connected.set(0)
        if self._stop.is_set():
            return
        if getattr(reason, "value", None) == _SESSION_TAKEN_OVER:
            log.error(
                "mqtt session taken over: another client connected with this client id (every replica needs "
                "its own mqtt.client_id)",
                extra={"client_id": self.connection_client_id(index)},
            )
        else:
            log.warning("mqtt disconnected; reconnecting", extra={"reason": str(reason), "connection": index})

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.topic.endswith("/templates"):
            if self.home_assistant is not None and self.home_assistant.take(msg):
                return  # first: Home Assistant's <prefix>/status ends in /status too
            if msg.topic.endswith(("/status", "/report")):
                status = msg.topic.endswith("/status")
                reason = self.heard.take_status(msg) if status else self.heard.take_report(msg)
                if reason is not None and msg.retain and self.config.clear_retained:
                    self._clear_retained(msg.topic, reason, len(msg.payload))
            elif msg.topic.endswith("/claims"):
                self._answer_claim_check(msg)
            elif msg.topic.endswith("/model_request"):
                self.device_models.answer(msg.topic, bytes(msg.payload))
            return
        self._take(client, int(userdata), msg)

    def _on_retiring_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/templates") and self._take(client, int(userdata), msg):
            self._taken[int(userdata)] += 1

    def _take(self, client: mqtt.Client, index: int, msg: mqtt.MQTTMessage) -> bool:
        """Queue a template for the writer; False when it was not queued."""
        if self._closing.is_set():
            return False  # not acknowledged: the broker redelivers it to this session when it resumes
        if msg.retain and not msg.payload:
            # The clearing of a retained template (ours or the device's): nothing to store.
            if msg.qos:
                client.ack(msg.mid, msg.qos)
            return False
        # Blocking put = back-pressure: the broker holds further messages (receive maximum) until the
        # writer catches up. Never past a stop, though: once the writer has stopped nothing empties the
        # queue, and a put blocked for ever would hang paho's loop_stop() and so the process (seen once
        # under load, SIGTERM with a backlog). Not queued = not acknowledged: redelivered on resume.
        item = _Item(msg.topic, bytes(msg.payload), msg.mid, msg.qos, index, self._gen[index], bool(msg.retain))
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                if self._stop.is_set():
                    return False

    # ------------------------------------------------------------ retained messages

    def device_statuses(self) -> dict[str, tuple[str, float]]:
        """``{device_id: (status, when it was received)}`` of the statuses seen (the console's Devices page).

        ``status`` is ``online`` or ``offline`` (retained by the device on connecting and by its last will);
        a status cleared since (by the device, or by this bridge with ``mqtt.clear_retained``) is not listed.
        """
        return self.heard.statuses()

    def device_reports(self) -> dict[str, tuple[DeviceReport, float]]:
        """``{device_id: (report, when it was received)}``: each registered device's latest report."""
        return self.heard.reports()

    def _clear_retained(self, topic: str, reason: str, size: int) -> None:
        self.retained_cleared += 1
        self._publisher().publish(topic, b"", qos=1, retain=True)
        log.warning("mqtt retained message cleared", extra={"topic": topic[:256], "reason": reason, "size": size})

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
                self._acknowledge(items)
                self.processed += len(items)
                break
            if self._queue.empty():
                self._idle.set()

    def _acknowledge(self, items: list[_Item]) -> None:
        for it in items:
            if it.qos and it.gen == self._gen.get(it.conn):
                retiring = self._retiring.get(it.conn)
                (retiring or self.clients[it.conn]).ack(it.mid, it.qos)
                if retiring is not None:
                    self._acked[it.conn] += 1
            if it.retain:
                self._clear_retained(it.topic, "retained_template", len(it.payload))

    def _process(self, items: list[_Item]) -> None:
        # The topic is the transport's to read (it names the sender); the payload is the ingestor's, raw.
        payloads: list[bytes] = []
        senders: list[Sender] = []
        topics: list[_Item] = []
        bad_topics = 0
        for it in items:
            try:
                where = self.topics.parse(it.topic, leaf="templates")
            except TopicError as exc:
                bad_topics += 1
                self._deadletter(it, "bad_topic", str(exc))
                continue
            payloads.append(it.payload)
            senders.append(Sender(topic_site=where.site, topic_device=where.device_id))
            topics.append(it)
        if bad_topics:
            self.s.metrics.count_ingest("mqtt", 0, 0, {"bad_topic": bad_topics})
        if not payloads:
            return
        outcomes = self.s.ingestor.ingest(payloads, "mqtt", senders)
        for it, o in zip(topics, outcomes, strict=True):
            if o.status == REJECTED:
                self._deadletter(it, o.code, o.reason, message_id=o.message_id)

    def _deadletter(self, it: _Item, code: str, reason: str, *, message_id: str = "") -> None:
        """Note a refused template on the dead-letter topic: where it came from, why, and (when it could be
        read) its message id, so a device's own record of that release can be matched with the refusal."""
        self.deadletters += 1
        doc = {"topic": it.topic[:256], "code": code, "reason": reason[:500], "size": len(it.payload)}
        if message_id:  # a decoded template's id, bounded by the validator
            doc["message_id"] = message_id[:128]
        self._publisher().publish(self.deadletter_topic, json.dumps(doc, separators=(",", ":")), qos=1)

    # ------------------------------------------------------------ outgoing

    def _publisher(self) -> mqtt.Client:
        """Connection 0, or a retiring session's while connection 0 is down (``peep mqtt retire`` never starts it)."""
        if not self._up[0]:
            for c in list(self._retiring.values()):
                return c
        return self.client

    def publish_event(self, ev: recognition_pb2.RecognitionEvent) -> None:
        if not self._connected.is_set():
            return
        # Only what the server decided is signed: a door's own access record (decided_on "device") is the door's.
        server_verdict = ev.decided_on != "device"
        if (
            self._decision_key is not None
            and server_verdict
            and ev.purpose == template_pb2.PURPOSE_VERIFY
            and ev.claimed_subject
            and ev.template_sha256
        ):
            doc = event_to_json(ev)
            statement = door_statement("verify", site=ev.site, device_id=ev.device_id, nonce=ev.message_id,
                                       subject=ev.claimed_subject, verdict=bool(ev.accepted),
                                       template_sha256=ev.template_sha256)  # fmt: skip
            doc["signature"] = sign_statement(self._decision_key, statement)
            payload = json.dumps(doc, separators=(",", ":")).encode()
        else:
            payload = event_json_bytes(ev)
        self.client.publish(self.topics.events(ev.site, ev.device_id), payload, qos=1)

    def _answer_claim_check(self, msg: mqtt.MQTTMessage) -> None:
        """Answer a door's "is this subject enrolled?" on its events topic (see the module docstring).

        A question from a topic that is not a registered device's at its site, or that is not exactly a nonce and
        a subject id, gets no answer (the door ends the claim ``unreachable``); it is logged by size only.
        """
        try:
            where = self.topics.parse(msg.topic, leaf="claims")
        except TopicError:
            return
        reason = sender_refusal(self.s.devices, where)
        if reason is None and len(msg.payload) > MAX_CLAIM_CHECK_BYTES:
            reason = "too_large"
        elif reason is None:
            try:
                nonce, subject = read_claim_check(bytes(msg.payload))
                answer = self.s.claim_checks.check(where.device_id, subject)
            except (ValueError, KeyError, TypeError, WireError):
                reason = "bad_payload"
            except ClaimChecksTooFrequent:
                reason = "too_frequent"
            except ModelUnavailable:
                reason = "no_model"
        if reason is not None:
            self.claim_checks["refused"] += 1
            log.warning("mqtt claim check refused", extra={"device": where.device_id, "reason": reason,
                                                           "size": len(msg.payload)})  # fmt: skip
            return
        out: dict[str, Any] = {"kind": "claim_check", "nonce": nonce, "device_id": where.device_id,
                               "site": where.site, "claimed_subject": subject, "known": answer.known,
                               "model_version": answer.model_version}  # fmt: skip
        if self._decision_key is not None:
            statement = door_statement("claim_check", site=where.site, device_id=where.device_id, nonce=nonce,
                                       subject=subject, verdict=answer.known)  # fmt: skip
            out["signature"] = sign_statement(self._decision_key, statement)
        self.claim_checks["answered"] += 1
        self._publisher().publish(self.topics.events(where.site, where.device_id),
                                  json.dumps(out, separators=(",", ":")), qos=1)  # fmt: skip

    def publish_bundle(self, bundle: ProjectionBundle) -> None:
        payload = bundle_files_message(bundle).SerializeToString(deterministic=True)
        # PUBLISH = fixed header (<= 5) + topic (2 + len) + packet id (2) + properties (1): a
        # packet over the broker's maximum would get this connection dropped, again at each retry.
        packet = len(payload) + len(self.bundle_topic.encode()) + 10
        limit = self.max_packet_size
        if limit is not None and packet > limit:
            log.error(
                "bundle not announced: larger than the broker's maximum packet size (raise max_packet_size in "
                "mosquitto.conf); devices keep their bundle",
                extra={"bundle_id": bundle.bundle_id, "bytes": packet, "max_packet_size": limit},
            )
            return
        self.client.publish(self.bundle_topic, payload, qos=1, retain=True)
        log.info("bundle announced", extra={"bundle_id": bundle.bundle_id, "topic": self.bundle_topic})
