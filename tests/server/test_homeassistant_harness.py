"""The Home Assistant harness (peep.lab.processes.homeassistant) runs a real Home Assistant that takes MQTT
discovery from a broker with TLS and passwords, as a site's would, and reads back what it made of it.

A private Mosquitto (TLS, a password file, no anonymous access, no persistence: nothing retained outlives the
module) and one Home Assistant for the module; a second one with a wrong password shows the link depends on the
credentials. Skips only where the Home Assistant venv is missing (bash scripts/bootstrap.sh ha makes it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from peep.lab.processes.control import PartUnavailable, wait_for
from peep.lab.processes.homeassistant import DISCOVERY_PREFIX, HomeAssistant
from peep.lab.processes.mosquitto import MOSQUITTO_PASSWD, Mosquitto
from peep_testing.server import Pki

pytestmark = [pytest.mark.processes, pytest.mark.slow]

USER, PASSWORD = "homeassistant", "ha-secret-1"


class Broker:
    """The module's Mosquitto and a client of it (the account Home Assistant uses), publishing and waiting."""

    def __init__(self, mosquitto: Mosquitto, ca: Path) -> None:
        self.mosquitto, self.port, self.ca = mosquitto, mosquitto.port, ca
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="peep-harness-test")
        self.client.username_pw_set(USER, PASSWORD)
        self.client.tls_set(ca_certs=str(ca))
        self.client.connect("localhost", self.port, keepalive=30)
        self.client.loop_start()

    def publish(self, topic: str, payload: Any, *, retain: bool = False) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.client.publish(topic, data, qos=1, retain=retain).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _home_assistant(workdir: Path, broker: Broker, password: str) -> HomeAssistant:
    try:
        return HomeAssistant(workdir, "localhost", broker.port, username=USER, password=password, ca=broker.ca)
    except PartUnavailable as e:
        pytest.skip(str(e))


def _probe_config(object_id: str) -> dict[str, Any]:
    return {"name": f"probe {object_id}", "unique_id": object_id, "state_topic": f"peep-test/{object_id}"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    d = tmp_path_factory.mktemp("ha-broker")
    passwd = d / "passwd"
    subprocess.run([MOSQUITTO_PASSWD, "-b", "-c", str(passwd), USER, PASSWORD], check=True, capture_output=True)
    conf = (
        "listener {port} 127.0.0.1\n"
        "allow_anonymous false\n"
        f"password_file {passwd}\n"
        f"cafile {pki.client_ca}\ncertfile {pki.server_cert}\nkeyfile {pki.server_key}\n"
    )
    mosquitto = Mosquitto(d, conf, persistence=False).start()
    b = Broker(mosquitto, pki.client_ca)
    try:
        yield b
    finally:
        b.close()
        mosquitto.stop()


@pytest.fixture(scope="module")
def home_assistant(tmp_path_factory: pytest.TempPathFactory, broker: Broker) -> Iterator[HomeAssistant]:
    ha = _home_assistant(tmp_path_factory.mktemp("ha"), broker, PASSWORD)
    with ha:
        # The MQTT entry says "loaded" even when the broker refuses it: an entity made from discovery proves the
        # link. Cleared with an empty retained config, which removes the entity.
        topic = f"{DISCOVERY_PREFIX}/binary_sensor/harness_probe/config"
        broker.publish(topic, _probe_config("harness_probe"), retain=True)
        ha.wait_state("binary_sensor.probe_harness_probe", timeout=30)
        broker.publish(topic, "", retain=True)
        ha.wait_state("binary_sensor.probe_harness_probe", lambda s: s is None)
        yield ha


def test_a_discovered_lock_follows_its_availability_and_state(home_assistant: HomeAssistant, broker: Broker) -> None:
    ha = home_assistant
    broker.publish(
        f"{DISCOVERY_PREFIX}/lock/peep_harness_door/lock/config",
        {
            "name": "Harness door",
            "unique_id": "peep_harness_door_lock",
            "state_topic": "peep-test/door/lock",
            "command_topic": "peep-test/door/lock/set",
            "availability_topic": "peep-test/door/status",
        },
        retain=True,
    )
    # Nothing said on the availability topic yet: unavailable, not unknown.
    lock = ha.wait_state("lock.harness_door")
    assert lock is not None and lock["state"] == "unavailable", lock
    broker.publish("peep-test/door/status", "online", retain=True)
    broker.publish("peep-test/door/lock", "LOCKED", retain=True)
    ha.wait_state("lock.harness_door", lambda s: s is not None and s["state"] == "locked")
    assert any(s["entity_id"] == "lock.harness_door" and s["state"] == "locked" for s in ha.states())
    broker.publish("peep-test/door/status", "offline", retain=True)
    ha.wait_state("lock.harness_door", lambda s: s is not None and s["state"] == "unavailable")


def test_a_discovered_event_carries_the_published_event_type(home_assistant: HomeAssistant, broker: Broker) -> None:
    ha = home_assistant
    broker.publish(
        f"{DISCOVERY_PREFIX}/event/peep_harness_cam/recognition/config",
        {
            "name": "Harness cam recognition",
            "unique_id": "peep_harness_cam_recognition",
            "state_topic": "peep-test/cam/recognition",
            "event_types": ["recognized", "unknown_face"],
        },
        retain=True,
    )
    first = ha.wait_state("event.harness_cam_recognition")
    assert first is not None and first["attributes"]["event_types"] == ["recognized", "unknown_face"], first
    # An event is not retained, and the entity exists a moment before it subscribes to its state topic: one sent
    # in between is lost (as a server's would be), so it is sent again until one arrives.
    seen: list[dict[str, Any]] = []

    def arrived() -> bool:
        broker.publish("peep-test/cam/recognition", {"event_type": "unknown_face", "camera": "cam-1"})
        got = wait_for(lambda: (ha.state("event.harness_cam_recognition") or {}).get("state") != "unknown", 1.0, 0.1)
        seen[:] = [ha.state("event.harness_cam_recognition") or {}]
        return got

    assert wait_for(arrived, 15.0, 0.0), seen
    ev = seen[0]
    assert ev["attributes"]["event_type"] == "unknown_face"
    # The event's other keys become attributes too; its state is when it came.
    assert ev["attributes"]["camera"] == "cam-1"
    assert ev["state"] not in ("unknown", "unavailable")


def test_a_wrong_broker_password_leaves_home_assistant_without_discovery(
    tmp_path: Path, broker: Broker, home_assistant: HomeAssistant
) -> None:
    """Same broker, same CA, one wrong password: nothing discovered (while the right one still is)."""
    topic = f"{DISCOVERY_PREFIX}/binary_sensor/harness_refused/config"
    broker.publish(topic, _probe_config("harness_refused"), retain=True)
    try:
        with _home_assistant(tmp_path / "ha-refused", broker, "not-" + PASSWORD) as refused:
            # The Home Assistant with the right password sees the probe; the refused one never does.
            home_assistant.wait_state("binary_sensor.probe_harness_refused")
            assert wait_for(lambda: "not authorised" in refused.log(), 10.0), refused.log()[-2000:]
            assert not wait_for(lambda: refused.state("binary_sensor.probe_harness_refused") is not None, 10.0, 0.2)
            assert not any(s["entity_id"].startswith("binary_sensor.probe_") for s in refused.states())
    finally:
        broker.publish(topic, "", retain=True)
