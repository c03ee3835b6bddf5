"""Our own Mosquitto with the shipped configuration (deploy/mosquitto), for durability and ACL tests.

:class:`ShippedBroker` is the lab's :class:`~peep.lab.processes.mosquitto.ShippedMosquitto`
(the shipped ``mosquitto.conf``, ``acl`` and ``make-passwd.sh`` as they are, paths and
ports swapped) with the accounts these tests use: ``cam-1`` and ``cam-2``
(:data:`DEVICE_PASSWORDS`) and ``peep-server`` (:data:`SERVER_PASSWORD`). Two TLS
listeners: ``dev_port`` (``mount_point devices/``, device passwords) and ``srv_port``
(``peep-server``).

:class:`Mosquitto` is the lab's bare broker (:class:`peep.lab.processes.mosquitto.Mosquitto`) on a free port with a
configuration of the test's own (anonymous by default: what a deployer's open or half-configured broker lets
through).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from peep.lab.processes.control import PartUnavailable
from peep.lab.processes.mosquitto import DEVICE_MOUNT, ShippedMosquitto, mosquitto_missing
from peep.lab.processes.mosquitto import Mosquitto as BareMosquitto

DEVICE_PASSWORDS = {"cam-1": "cam-1-pw-" + uuid.uuid4().hex[:8], "cam-2": "cam-2-pw-" + uuid.uuid4().hex[:8]}
SERVER_PASSWORD = "server-pw-" + uuid.uuid4().hex[:8]
MOUNT = DEVICE_MOUNT


class Mosquitto(BareMosquitto):
    """The lab's bare broker on a free port; skips the test where mosquitto is not installed."""

    def __init__(self, workdir: Path, conf_body: str = "", **kw: Any) -> None:
        try:
            super().__init__(workdir, conf_body, **kw)
        except PartUnavailable as exc:
            pytest.skip(str(exc))


class ShippedBroker(ShippedMosquitto):
    """The shipped broker with the tests' accounts; skips the test where mosquitto is not installed."""

    def __init__(self, workdir: Path, ca: Path, cert: Path, key: Path, devices: dict[str, str] | None = None,
                 server_accounts: dict[str, str] | None = None,
                 acl_grants: dict[str, list[str]] | None = None) -> None:  # fmt: skip
        missing = mosquitto_missing()
        if missing:
            pytest.skip(missing)
        # devices: more device accounts (id -> password) besides cam-1 and cam-2; server_accounts: more accounts on
        # the server's listener besides peep-server (home-assistant)
        super().__init__(workdir, ca, cert, key, devices={**DEVICE_PASSWORDS, **(devices or {})},
                         server_password=SERVER_PASSWORD, server_accounts=server_accounts,
                         acl_grants=acl_grants)  # fmt: skip

    def server_mqtt_section(self, *, password: str = "env:PEEP_TEST_MQTT_PASSWORD", **overrides: Any) -> dict[str, Any]:
        """server.toml's [mqtt] for this broker (password from PEEP_TEST_MQTT_PASSWORD)."""
        return super().server_mqtt_section(password=password, **overrides)


@dataclass
class Client:
    """A paho MQTT v5 client over TLS recording PUBACK reason codes and received messages."""

    port: int
    user: str
    password: str
    ca: Path
    client_id: str = ""
    acks: dict[int, int] = field(default_factory=dict)
    messages: list[tuple[str, bytes, bool]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id or f"{self.user}-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.c.username_pw_set(self.user, self.password)
        self.c.tls_set(ca_certs=str(self.ca))
        self.c.max_inflight_messages_set(100)
        self.c.max_queued_messages_set(0)
        self.c.on_connect = lambda c, u, f, rc, p: self.connected.set() if not rc.is_failure else None
        self.c.on_disconnect = self._on_disconnect
        self.c.on_publish = self._on_publish
        self.c.on_message = self._on_message

    def _on_disconnect(self, c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
        self.connected.clear()
        self.disconnects.append(str(rc))

    def _on_publish(self, c: Any, u: Any, mid: int, rc: Any, p: Any) -> None:
        with self.lock:
            self.acks[mid] = rc.value

    def _on_message(self, c: Any, u: Any, m: Any) -> None:
        with self.lock:
            self.messages.append((m.topic, bytes(m.payload), bool(m.retain)))

    def connect(self, timeout: float = 10.0) -> Client:
        self.c.connect_async("localhost", self.port)
        self.c.loop_start()
        if not self.connected.wait(timeout):
            raise RuntimeError(f"{self.user}: could not connect to port {self.port}")
        return self

    def subscribe(self, *filters: str) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe([(f, 1) for f in filters])
        assert done.wait(5), "no SUBACK"

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def wait_for(pred: Any, timeout: float = 20.0, step: float = 0.05) -> bool:
    """:func:`peep.lab.processes.control.wait_for` with the broker tests' 20 s."""
    from peep.lab.processes.control import wait_for as wait

    return wait(pred, timeout, step)


def session_exists(broker: ShippedBroker, client_id: str) -> bool:
    """Whether the broker holds a session for ``client_id`` (probing it leaves none behind)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    state: dict[str, bool] = {}
    up = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.username_pw_set("peep-server", SERVER_PASSWORD)
    c.tls_set(ca_certs=str(broker.ca))

    def on_connect(cl: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        state["present"] = bool(flags.session_present)
        up.set()

    c.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 0  # a session created by this probe ends with it
    c.connect("localhost", broker.srv_port, clean_start=False, properties=props)
    c.loop_start()
    try:
        assert up.wait(10), "no CONNACK"
    finally:
        c.disconnect()
        c.loop_stop()
    return state["present"]


class TopicWatcher:
    """A client of the shared broker (127.0.0.1:1883) noting every message under ``filters`` (retained ones as
    they arrive): ``got`` the last payload per topic, ``log`` every (topic, payload, retained)."""

    def __init__(self, *filters):
        self.got: dict[str, bytes] = {}
        self.log: list[tuple[str, bytes, bool]] = []
        self.cond = threading.Condition()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"ha-{uuid.uuid4().hex[:8]}",
                             protocol=mqtt.MQTTv5)  # fmt: skip
        self.c.on_message = self._on_message
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.on_connect = lambda cl, *a: cl.subscribe([(f, 1) for f in filters])
        self.c.connect("127.0.0.1", 1883)
        self.c.loop_start()
        assert subscribed.wait(10)

    def _on_message(self, client, userdata, msg):
        with self.cond:
            self.got[msg.topic] = bytes(msg.payload)
            self.log.append((msg.topic, bytes(msg.payload), bool(msg.retain)))
            self.cond.notify_all()

    def wait(self, predicate, timeout=10.0):
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def publish(self, topic, payload, *, retain=True):
        self.c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()
