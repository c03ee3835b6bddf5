"""What Home Assistant is told by the server: discovery configurations for a site's doors and cameras, and events
that name nobody, checked on the payloads and on the real broker a running server publishes them to."""

from __future__ import annotations

import json

import pytest
from peep.core.topics import TopicScheme
from peep.server.config import DeviceConfig, HomeAssistantConfig
from peep.server.ingest.auth import DeviceRegistry
from peep.server.transport.homeassistant import (
    ACCESS_EVENTS,
    RECOGNITION_EVENTS,
    DiscoveredDevice,
    HomeAssistantDiscovery,
    HomeAssistantPublisher,
    discovered_devices,
)
from peep.v1 import recognition_pb2, template_pb2

ROOT = TopicScheme("devices/peep/v1")
DOOR = DiscoveredDevice(device_id="door-1", site="lobby", door=True)
CAMERA = DiscoveredDevice(device_id="cam-2", site="lobby", door=False)


def _configs(*devices):
    return {t: json.loads(p) for t, p in HomeAssistantDiscovery(ROOT, version="0.1.0").configs(devices).items()}


def test_a_door_is_a_lock_and_an_access_event_that_follow_the_door():
    c = _configs(DOOR)
    assert set(c) == {"homeassistant/lock/peep_lobby_door-1/lock/config",
                      "homeassistant/event/peep_lobby_door-1/access/config"}  # fmt: skip
    lock = c["homeassistant/lock/peep_lobby_door-1/lock/config"]
    assert lock["state_topic"] == "devices/peep/v1/lobby/door-1/lock"
    assert (lock["state_locked"], lock["state_unlocked"], lock["state_jammed"]) == ("locked", "unlocked", "jammed")
    # Home Assistant's lock must name a command topic: the door's own lock_command, which nothing of PEEP acts on
    # (and the shipped ACL does not let Home Assistant write, tests/server/test_homeassistant_live.py).
    assert lock["command_topic"] == "devices/peep/v1/lobby/door-1/lock_command"
    access = c["homeassistant/event/peep_lobby_door-1/access/config"]
    assert access["event_types"] == list(ACCESS_EVENTS) and access["state_topic"].endswith("/door-1/access")
    for entity in c.values():  # availability is the door's own retained status and its last will
        assert entity["availability_topic"] == ROOT.status("lobby", "door-1")
        assert (entity["payload_available"], entity["payload_not_available"]) == ("online", "offline")
        assert entity["device"]["identifiers"] == ["peep_lobby_door-1"] and entity["device"]["model"] == "door"
    assert len({e["unique_id"] for e in c.values()}) == 2


def test_a_camera_is_a_recognition_event_and_ids_home_assistant_cannot_take_are_replaced():
    odd = DiscoveredDevice(device_id="cam.2@hall", site="lobby", door=False)
    c = _configs(CAMERA, odd)
    assert set(c) == {"homeassistant/event/peep_lobby_cam-2/recognition/config",
                      "homeassistant/event/peep_lobby_cam_2_hall/recognition/config"}  # fmt: skip
    rec = c["homeassistant/event/peep_lobby_cam_2_hall/recognition/config"]
    assert rec["event_types"] == list(RECOGNITION_EVENTS)
    assert rec["state_topic"] == "devices/peep/v1/lobby/cam.2@hall/recognition"  # the device's own topic level


def test_the_prefix_is_the_deployer_s():
    d = HomeAssistantDiscovery(ROOT, prefix="ha/discovery")
    assert all(t.startswith("ha/discovery/") for t in d.configs([DOOR, CAMERA]))


def _event(**fields):
    return recognition_pb2.RecognitionEvent(site="lobby", event_id="e1", message_id="m1", probability=0.97,
                                            model_version="v3", decided_on="server", **fields)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "topic", "expected"),
    [
        ({"device_id": "cam-2", "purpose": template_pb2.PURPOSE_IDENTIFY, "subject": "alice", "track_id": "t9"},
         "devices/peep/v1/lobby/cam-2/recognition", {"event_type": "enrolled_person", "track": "t9"}),
        ({"device_id": "cam-2", "purpose": template_pb2.PURPOSE_IDENTIFY, "unknown": True},
         "devices/peep/v1/lobby/cam-2/recognition", {"event_type": "unknown"}),
        ({"device_id": "door-1", "purpose": template_pb2.PURPOSE_VERIFY, "claimed_subject": "alice", "accepted": True,
          "subject": "alice"},
         "devices/peep/v1/lobby/door-1/access", {"event_type": "opened"}),
        ({"device_id": "door-1", "purpose": template_pb2.PURPOSE_VERIFY, "claimed_subject": "bob"},
         "devices/peep/v1/lobby/door-1/access", {"event_type": "refused", "reason": "not_the_claimed_person"}),
    ],
)  # fmt: skip
def test_an_event_says_what_happened_and_names_nobody(fields, topic, expected):
    got_topic, payload = HomeAssistantDiscovery(ROOT).event(_event(**fields))
    doc = json.loads(payload)
    assert got_topic == topic and doc == {**expected, "decided_on": "server"}
    # No name, no probability, no model detail: nothing of who is enrolled or how alike two faces are.
    text = payload.decode()
    assert "alice" not in text and "bob" not in text and "0.97" not in text and "v3" not in text


def test_an_enrolment_is_not_an_event_for_home_assistant():
    ev = _event(device_id="cam-1", purpose=template_pb2.PURPOSE_ENROLL, subject="alice")
    assert HomeAssistantDiscovery(ROOT).event(ev) is None


def test_the_devices_shown_are_the_registered_ones_at_a_site_desks_and_disabled_ones_aside():
    reg = DeviceRegistry([
        DeviceConfig(id="cam-1", site="lobby", enrolment_desk=True),
        DeviceConfig(id="cam-2", site="lobby"),
        DeviceConfig(id="door-1", site="lobby", door=True),
        DeviceConfig(id="door-2", site="lobby"),
        DeviceConfig(id="cam-3", site="lobby", enabled=False),
        DeviceConfig(id="cam-4"),
    ])  # fmt: skip
    shown, left_out = discovered_devices(reg, doors=["door-2"])
    assert shown == [CAMERA, DOOR, DiscoveredDevice(device_id="door-2", site="lobby", door=True)]
    assert len(left_out) == 1 and left_out[0].startswith("cam-4: no site registered")


class _Client:
    def __init__(self):
        self.sent = []

    def publish(self, topic, payload, qos=0, retain=False):
        self.sent.append((topic, payload, qos, retain))


def test_the_publisher_announces_retained_and_sends_events_only_while_connected():
    client, up = _Client(), [True]
    reg = DeviceRegistry([DeviceConfig(id="door-1", site="lobby", door=True)])
    pub = HomeAssistantPublisher(HomeAssistantDiscovery(ROOT), reg, publisher=lambda: client,
                                 connected=lambda: up[0], clock=lambda: 42.0)  # fmt: skip
    assert pub.announce() == 2 and all(qos == 1 and retain for _, _, qos, retain in client.sent)
    assert pub.entities == sorted(t for t, *_ in client.sent) and pub.last_publish == 42.0
    client.sent.clear()
    pub.event(_event(device_id="door-1", purpose=template_pb2.PURPOSE_VERIFY, accepted=True))
    assert [(t, r) for t, _, _, r in client.sent] == [("devices/peep/v1/lobby/door-1/access", False)]
    up[0] = False
    pub.event(_event(device_id="door-1", purpose=template_pb2.PURPOSE_VERIFY, accepted=True))
    assert len(client.sent) == 1 and pub.events_published == 1


def test_the_integration_is_off_unless_asked_and_its_prefix_and_doors_are_checked():
    assert HomeAssistantConfig().enabled is False
    with pytest.raises(ValueError, match="discovery_prefix"):
        HomeAssistantConfig(discovery_prefix="home/#")
    with pytest.raises(ValueError, match="doors"):
        HomeAssistantConfig(doors=["door/1"])


@pytest.mark.mqtt
def test_a_server_announces_its_site_s_devices_retained_on_the_broker(tmp_path, pki, keypair, bundle_dir):
    """The running server, the real broker: what Home Assistant would read on connecting is there, retained, and
    names no enrolled person (the fixture's server has none yet; its devices are ids, never people)."""
    import threading
    import uuid

    import paho.mqtt.client as mqtt
    from peep_testing.server import MQTT_PREFIX, SITE, base_config, mqtt_available, start_server

    if (reason := mqtt_available()) is not None:
        pytest.skip(reason)
    prefix = f"ha-test-{uuid.uuid4().hex[:8]}"
    cfg = base_config(tmp_path, keypair[3], bundle_dir,
                      mqtt={"enabled": True, "share_group": f"g{uuid.uuid4().hex[:8]}", "connections": 1},
                      home_assistant={"enabled": True, "discovery_prefix": prefix})  # fmt: skip
    cfg["auth"]["allow_insecure"] = True
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
    got: dict[str, bytes] = {}
    cond = threading.Condition()

    def on_message(client, userdata, msg):
        with cond:
            got[msg.topic] = bytes(msg.payload)
            cond.notify_all()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"ha-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
    c.on_message = on_message
    c.on_connect = lambda cl, *a: cl.subscribe(f"{prefix}/#", qos=1)
    c.connect("127.0.0.1", 1883)
    c.loop_start()
    try:
        with cond:
            assert cond.wait_for(lambda: len(got) >= 3, 10), got
        node = f"peep_{SITE}_door-1"
        assert set(got) == {f"{prefix}/lock/{node}/lock/config", f"{prefix}/event/{node}/access/config",
                            f"{prefix}/event/peep_{SITE}_cam-2/recognition/config"}  # fmt: skip
        lock = json.loads(got[f"{prefix}/lock/{node}/lock/config"])
        assert lock["availability_topic"] == f"{MQTT_PREFIX}/{SITE}/door-1/status"
        ha = srv.app.mqtt.home_assistant
        assert ha.entities == sorted(got) and ha.last_publish is not None and ha.left_out == []
    finally:
        for t in list(got):  # the shared broker keeps nothing of this test
            c.publish(t, b"", qos=1, retain=True).wait_for_publish(5)
        c.disconnect()
        c.loop_stop()
        srv.app.stop()
