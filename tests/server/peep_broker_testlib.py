"""Our own Mosquitto with the shipped configuration (deploy/mosquitto), for durability and ACL tests.

The shipped ``mosquitto.conf``, ``acl`` and ``make-passwd.sh`` are used as they
are; only paths and ports are swapped in (and ``persistence_location`` added,
which Debian's main configuration sets). Two TLS listeners: ``dev_port``
(``mount_point devices/``, device passwords) and ``srv_port`` (``peep-server``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "mosquitto"
MOSQUITTO = "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
DEVICE_PASSWORDS = {"cam-1": "cam-1-pw-" + uuid.uuid4().hex[:8], "cam-2": "cam-2-pw-" + uuid.uuid4().hex[:8]}
SERVER_PASSWORD = "server-pw-" + uuid.uuid4().hex[:8]
MOUNT = "devices/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class ShippedBroker:
    """mosquitto -c <the shipped mosquitto.conf, paths and ports swapped>; killable and restartable."""

    def __init__(self, workdir: Path, ca: Path, cert: Path, key: Path, devices: dict[str, str] | None = None) -> None:
        for tool in (MOSQUITTO, MOSQUITTO_PASSWD):
            if not os.path.exists(tool):
                pytest.skip(f"{tool} not installed (Debian package mosquitto)")
        self.workdir = workdir
        self._started = False
        etc = workdir / "etc"
        etc.mkdir(parents=True)
        self.creds = workdir / "creds"
        for name, src in (("ca.pem", ca), ("server.pem", cert), ("server.key", key)):
            shutil.copyfile(src, etc / name)
        shutil.copyfile(DEPLOY / "acl", etc / "acl")
        # devices: more device accounts (id -> password) besides cam-1 and cam-2
        devices = [f"{d}={pw}" for d, pw in {**DEVICE_PASSWORDS, **(devices or {})}.items()]
        for passwd, users in (("passwd", devices), ("passwd-server", [f"peep-server={SERVER_PASSWORD}"])):
            subprocess.run(
                ["bash", str(DEPLOY / "make-passwd.sh"), str(etc / passwd), str(self.creds), *users],
                check=True,
                capture_output=True,
            )
        self._shipped = (DEPLOY / "mosquitto.conf").read_text().replace("/etc/mosquitto/peep/", f"{etc}/")
        self.conf = workdir / "mosquitto.conf"
        self._listen_on(free_port(), free_port())
        self.ca = etc / "ca.pem"
        self.proc: subprocess.Popen[bytes] | None = None

    def _listen_on(self, dev_port: int, srv_port: int) -> None:
        self.dev_port, self.srv_port = dev_port, srv_port
        conf, n_dev = re.subn(r"^listener 8883$", f"listener {dev_port} 127.0.0.1", self._shipped, flags=re.M)
        conf, n_srv = re.subn(r"^listener 8884$", f"listener {srv_port} 127.0.0.1", conf, flags=re.M)
        assert n_dev == n_srv == 1, "deploy/mosquitto/mosquitto.conf: expected listeners 8883 and 8884"
        w = self.workdir
        head = [f"persistence_location {w}/", f"log_dest file {w}/mosquitto.log", "log_type all"]
        if os.geteuid() == 0:
            head.append("user root")  # as root mosquitto would drop to `mosquitto`, which cannot read tmp dirs
        self.conf.write_text("\n".join(head) + "\n" + conf)

    def start(self) -> ShippedBroker:
        # A free port is only free when asked: another process may take it before mosquitto binds it (seen
        # once in CI). Before the first successful start, such a collision picks new ports; after it, a
        # restart must keep the ports the clients know, and a collision is an error.
        for attempt in range(3):
            err_at = (self.workdir / "stderr.txt").stat().st_size if (self.workdir / "stderr.txt").exists() else 0
            with open(self.workdir / "stderr.txt", "ab") as err:
                self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    text = (self.workdir / "stderr.txt").read_text()
                    said = text[err_at:] + self.log()  # mosquitto reports the bind in its log or on stderr
                    if "Address already in use" in said and not self._started and attempt < 2:
                        self._listen_on(free_port(), free_port())
                        break
                    raise RuntimeError(f"mosquitto exited: {text} {self.log()}")
                if _port_open(self.dev_port) and _port_open(self.srv_port):
                    self._started = True
                    return self
                time.sleep(0.05)
            else:
                raise RuntimeError("mosquitto did not start")
        raise RuntimeError("mosquitto did not start: its ports were taken three times")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        from peep.server.bench.cluster import stop_process

        stop_process(self.proc, sig)
        self.proc = None

    def log(self) -> str:
        p = self.workdir / "mosquitto.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def server_mqtt_section(self, **overrides: Any) -> dict[str, Any]:
        """server.toml's [mqtt] for this broker (password from PEEP_TEST_MQTT_PASSWORD)."""
        sec: dict[str, Any] = {
            "enabled": True,
            "host": "localhost",
            "port": self.srv_port,
            "username": "peep-server",
            "password": "env:PEEP_TEST_MQTT_PASSWORD",
            "device_mount_point": MOUNT,
            "topic_prefix": "peep/v1",  # the root the shipped ACL names
            "tls": {"ca": str(self.ca)},
        }
        sec.update(overrides)
        return sec


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


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
