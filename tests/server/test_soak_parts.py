"""The soak's real parts (peep.server.bench.soak.parts), each on its own and quickly.

The shipped Mosquitto: a restart on the same ports, a persistent session's
queue surviving it, the queue read from $SYS. A test needing Mosquitto skips,
naming the tool, only where it is not installed.
"""

from __future__ import annotations

import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peep.server.bench.cluster import wait_for
from peep.server.bench.soak.parts import (
    PartUnavailable,
    ShippedMosquitto,
    mosquitto_missing,
)

# --------------------------------------------------------------------------- Mosquitto


def _mqtt(port: int, user: str, password: str, ca: Path, client_id: str, **connect: Any) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.username_pw_set(user, password)
    c.tls_set(ca_certs=str(ca))
    up = threading.Event()
    c.on_connect = lambda cl, u, f, rc, p: up.set() if not rc.is_failure else None
    c.connect("localhost", port, **connect)
    c.loop_start()
    assert up.wait(10), f"{user} could not connect to port {port}"
    return c


@pytest.mark.mqtt
def test_the_shipped_broker_restarts_on_its_ports_with_a_sessions_queue(tmp_path: Path, pki: Any) -> None:
    missing = mosquitto_missing()
    if missing:
        pytest.skip(missing)
    device_pw, server_pw = f"cam-pw-{uuid.uuid4().hex[:8]}", f"srv-pw-{uuid.uuid4().hex[:8]}"
    b = ShippedMosquitto(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key,
                         devices={"cam-1": device_pw}, server_password=server_pw, sys_interval_s=1)  # fmt: skip
    session = Properties(PacketTypes.CONNECT)
    session.SessionExpiryInterval = 600
    try:
        b.start()
        # The server's persistent session subscribes, then goes away; the camera publishes into its queue.
        srv = _mqtt(b.srv_port, "peep-server", server_pw, b.ca, "soak-server", clean_start=False, properties=session)
        subscribed = threading.Event()
        srv.on_subscribe = lambda *a: subscribed.set()
        srv.subscribe("devices/peep/v1/+/+/templates", qos=1)
        assert subscribed.wait(5)
        srv.disconnect()
        srv.loop_stop()
        cam = _mqtt(b.dev_port, "cam-1", device_pw, b.ca, "cam-1")
        sent = [b"template %d" % k for k in range(5)]
        infos = [cam.publish("peep/v1/site/cam-1/templates", p, qos=1) for p in sent]
        for info in infos:
            info.wait_for_publish(5)
        assert all(i.is_published() for i in infos)
        cam.disconnect()
        cam.loop_stop()
        assert wait_for(lambda: b.queue_depth(timeout=2) == len(sent), 10, 0.5), b.sys_stats()

        ports = (b.dev_port, b.srv_port)
        b.stop(signal.SIGTERM)  # a clean stop writes the queue to mosquitto.db
        assert b.pid is None and b.queue_depth(timeout=1) is None
        b.start()
        assert (b.dev_port, b.srv_port) == ports

        got: list[bytes] = []
        srv = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="soak-server", protocol=mqtt.MQTTv5)
        srv.username_pw_set("peep-server", server_pw)
        srv.tls_set(ca_certs=str(b.ca))
        srv.on_message = lambda c, u, m: got.append(bytes(m.payload))
        srv.connect("localhost", b.srv_port, clean_start=False, properties=session)
        srv.loop_start()
        try:
            assert wait_for(lambda: len(got) >= len(sent), 10), got
        finally:
            srv.disconnect()
            srv.loop_stop()
        assert sorted(got) == sent
        assert wait_for(lambda: b.queue_depth(timeout=2) == 0, 10, 0.5), b.sys_stats()
        stats = b.sys_stats()
        assert stats is not None and stats["dropped"] == 0
    finally:
        b.stop(signal.SIGKILL)


def test_the_shipped_broker_names_a_missing_tool(tmp_path: Path) -> None:
    missing = mosquitto_missing(tmp_path)
    assert missing is not None  # the tools, or else the shipped files, which tmp_path lacks
    with pytest.raises(PartUnavailable, match=r"not (installed|found)"):
        ShippedMosquitto(
            tmp_path / "b", tmp_path, tmp_path, tmp_path, devices={}, server_password="x", shipped=tmp_path
        )
