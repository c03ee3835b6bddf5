"""Our own Mosquitto with the shipped configuration (deploy/mosquitto), for durability and ACL tests.

:class:`ShippedBroker` is the soak's :class:`~peep.lab.bench.soak.parts.ShippedMosquitto`
(the shipped ``mosquitto.conf``, ``acl`` and ``make-passwd.sh`` as they are, paths and
ports swapped) with the accounts these tests use: ``cam-1`` and ``cam-2``
(:data:`DEVICE_PASSWORDS`) and ``peep-server`` (:data:`SERVER_PASSWORD`). Two TLS
listeners: ``dev_port`` (``mount_point devices/``, device passwords) and ``srv_port``
(``peep-server``).

:class:`Mosquitto` is a bare broker on a free port with a configuration of the test's own (anonymous by
default: what a deployer's open or half-configured broker lets through).
"""

from __future__ import annotations

import os
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
from peep.lab.bench.ports import free_port, listens_on
from peep.lab.bench.soak.parts import DEVICE_MOUNT, ShippedMosquitto, mosquitto_missing

DEVICE_PASSWORDS = {"cam-1": "cam-1-pw-" + uuid.uuid4().hex[:8], "cam-2": "cam-2-pw-" + uuid.uuid4().hex[:8]}
SERVER_PASSWORD = "server-pw-" + uuid.uuid4().hex[:8]
MOUNT = DEVICE_MOUNT
MOSQUITTO = "/usr/sbin/mosquitto"


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class Mosquitto:
    """Our own mosquitto process on a free port (killable, restartable)."""

    def __init__(
        self, workdir: Path, conf_body: str = "", *, port: int | None = None, persistence: bool = True
    ) -> None:
        if not os.path.exists(MOSQUITTO):
            pytest.skip(f"{MOSQUITTO} not installed (Debian package mosquitto)")
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._chosen_port = port is None  # a port of ours may be replaced if taken before the first start
        self._conf_body = conf_body
        self._persistence = persistence
        self._started = False
        self.conf = workdir / "mosquitto.conf"
        self._listen_on(port or free_port())
        self.proc: subprocess.Popen[bytes] | None = None

    def _listen_on(self, port: int) -> None:
        self.port = port
        workdir, conf_body, persistence = self.workdir, self._conf_body, self._persistence
        lines = [f"listener {self.port} 127.0.0.1"] if "listener" not in conf_body else []
        if "allow_anonymous" not in conf_body:
            lines.append("allow_anonymous true")
        if persistence:
            lines += ["persistence true", f"persistence_location {workdir}/", "autosave_interval 1"]
        lines += [f"log_dest file {workdir}/mosquitto.log", "log_type all"]
        if os.geteuid() == 0:
            # As root mosquitto drops to the `mosquitto` user, which cannot read pytest's tmp dirs.
            lines.append("user root")
        self._written = "\n".join(lines) + "\n" + conf_body.replace("{port}", str(self.port)) + "\n"
        self.conf.write_text(self._written)

    def start(self) -> Mosquitto:
        """Start mosquitto and wait for its listener.

        Before the first successful start, a port this broker chose itself and
        another process took meanwhile is replaced; a restart keeps the port.
        """
        stderr = self.workdir / "stderr.txt"
        for attempt in range(3):
            err_at = stderr.stat().st_size if stderr.exists() else 0
            log_at = len(self.log())
            with open(stderr, "ab") as err:
                self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    said = stderr.read_text(errors="replace")[err_at:] + self.log()[log_at:]
                    ours = self._chosen_port and self.conf.read_text() == self._written  # not rewritten by a test
                    if "Address already in use" in said and ours and not self._started and attempt < 2:
                        self._listen_on(free_port())
                        break
                    raise RuntimeError(f"mosquitto exited: {said[-2000:]}")
                if listens_on(self.proc.pid, self.port):  # its own listener, not a squatter's
                    self._started = True
                    return self
                time.sleep(0.05)
            else:
                self.stop(signal.SIGKILL)
                raise RuntimeError(f"mosquitto did not listen on {self.port} in 10 s: {self.log()[-2000:]}")
        raise RuntimeError("mosquitto did not start: its port was taken three times")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log(self) -> str:
        p = self.workdir / "mosquitto.log"
        return p.read_text(errors="replace") if p.exists() else ""


class ShippedBroker(ShippedMosquitto):
    """The shipped broker with the tests' accounts; skips the test where mosquitto is not installed."""

    def __init__(self, workdir: Path, ca: Path, cert: Path, key: Path, devices: dict[str, str] | None = None) -> None:
        missing = mosquitto_missing()
        if missing:
            pytest.skip(missing)
        # devices: more device accounts (id -> password) besides cam-1 and cam-2
        super().__init__(workdir, ca, cert, key, devices={**DEVICE_PASSWORDS, **(devices or {})},
                         server_password=SERVER_PASSWORD)  # fmt: skip

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
    """:func:`peep.lab.bench.processes.wait_for` with the broker tests' 20 s."""
    from peep.lab.bench.processes import wait_for as wait

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
