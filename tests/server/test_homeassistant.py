"""What Home Assistant is told by the server: discovery configurations for a site's doors and cameras, and events
that name nobody, checked on the payloads and on the real broker a running server publishes them to."""

from __future__ import annotations

import json
import time

import paho.mqtt.client as mqtt
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
from peep_testing.broker import TopicWatcher

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
    events = {t for t in c if "/event/" in t}
    assert events == {"homeassistant/event/peep_lobby_cam-2/recognition/config",
                      "homeassistant/event/peep_lobby_cam_2_hall/recognition/config"}  # fmt: skip
    rec = c["homeassistant/event/peep_lobby_cam_2_hall/recognition/config"]
    assert rec["event_types"] == list(RECOGNITION_EVENTS)
    assert rec["state_topic"] == "devices/peep/v1/lobby/cam.2@hall/recognition"  # the device's own topic level


def test_a_camera_has_a_sensor_of_how_many_people_it_recognised_recently_and_a_door_none():
    c = _configs(CAMERA, DOOR)
    sensors = {t: e for t, e in c.items() if "/sensor/" in t}
    assert list(sensors) == ["homeassistant/sensor/peep_lobby_cam-2/recognised_recently/config"]
    sensor = sensors["homeassistant/sensor/peep_lobby_cam-2/recognised_recently/config"]
    assert sensor["state_topic"] == "devices/peep/v1/lobby/cam-2/recognised_recently"
    assert (sensor["unit_of_measurement"], sensor["state_class"]) == ("people", "measurement")
    # Availability like every entity's: the camera's own retained status.
    assert sensor["availability_topic"] == ROOT.status("lobby", "cam-2") and sensor["payload_available"] == "online"
    assert sensor["unique_id"] == "peep_lobby_cam-2_recognised_recently"
    assert len({e["unique_id"] for e in c.values()}) == len(c) == 4


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
        ({"device_id": "door-1", "purpose": template_pb2.PURPOSE_VERIFY, "accepted": True,
          "requested_by": "home_assistant"},
         "devices/peep/v1/lobby/door-1/access", {"event_type": "opened", "requested_by": "home_assistant"}),
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
    # Each one left out says why (the console lists them).
    assert [why.split(":")[0] for why in left_out] == ["cam-1", "cam-3", "cam-4"]
    assert "enrolment desk" in left_out[0] and "disabled" in left_out[1] and "no site registered" in left_out[2]


class _Client:
    """paho's client as the publisher uses it: each publish noted, answered with what paho returns."""

    def __init__(self):
        self.sent = []
        self.rc = mqtt.MQTT_ERR_SUCCESS
        self.fails: Exception | None = None

    def publish(self, topic, payload, qos=0, retain=False):
        if self.fails is not None:
            raise self.fails
        self.sent.append((topic, payload, qos, retain))
        info = mqtt.MQTTMessageInfo(len(self.sent))
        info.rc = self.rc
        return info


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
    pub.stop()


def test_the_integration_is_off_unless_asked_and_its_prefix_and_doors_are_checked():
    assert HomeAssistantConfig().enabled is False
    with pytest.raises(ValueError, match="discovery_prefix"):
        HomeAssistantConfig(discovery_prefix="home/#")
    with pytest.raises(ValueError, match="doors"):
        HomeAssistantConfig(doors=["door/1"])


@pytest.mark.parametrize("minutes", [0, 1441, 2.5])
def test_the_window_of_the_recent_count_is_whole_minutes_up_to_a_day(minutes):
    assert HomeAssistantConfig().recent_minutes == 15
    with pytest.raises(ValueError, match="recent_minutes"):
        HomeAssistantConfig(recent_minutes=minutes)


class _Clocks:
    """Unix time for what the console shows, and the monotonic clock of the window and the debounce."""

    def __init__(self):
        self.now = 1_700_000_000.0
        self.mono = 100.0

    def advance(self, s):
        self.now += s
        self.mono += s


def _publisher(client, *devices, up=None, clocks=None, **kw):
    reg = DeviceRegistry(list(devices) or [DeviceConfig(id="cam-2", site="lobby"),
                                           DeviceConfig(id="door-1", site="lobby", door=True)])  # fmt: skip
    clocks = clocks or _Clocks()
    up = up or [True]
    return HomeAssistantPublisher(HomeAssistantDiscovery(ROOT), reg, publisher=lambda: client,
                                  connected=lambda: up[0], clock=lambda: clocks.now, monotonic=lambda: clocks.mono,
                                  **kw)  # fmt: skip


class _Msg:
    def __init__(self, topic, payload, retain=True):
        self.topic, self.payload, self.retain = topic, payload, retain


def _count_topic(device="cam-2", site="lobby"):
    return f"devices/peep/v1/{site}/{device}/recognised_recently"


def test_home_assistant_s_birth_announces_again_at_most_once_a_debounce_and_nothing_else_does():
    client, clocks = _Client(), _Clocks()
    pub = _publisher(client, clocks=clocks, debounce_s=5.0)
    try:
        pub.announce()
        configs = len(pub.entities)
        status = "homeassistant/status"
        assert pub.subscriptions()[0][0] == status and pub.subscriptions()[1][0] == "homeassistant/+/+/+/config"
        clocks.advance(2.0)
        assert pub.take(_Msg(status, b"online", retain=False)) and pub.announcements == 1  # within the debounce
        clocks.advance(4.0)
        for other in (b"offline", b"", b"online" * 10, b"ONLINE", b"\xff"):  # its will, noise, a flood: ignored
            assert pub.take(_Msg(status, other, retain=False))
        assert pub.announcements == 1
        client.sent.clear()
        assert pub.take(_Msg(status, b"online", retain=False)) and pub.announcements == 2 and pub.births == 2
        assert {t for t, _, _, r in client.sent if r and t.endswith("/config")} == set(pub.entities)
        assert len(pub.entities) == configs
        assert not pub.birth(b"online")  # at once again: debounced
        assert not pub.take(_Msg("devices/peep/v1/lobby/cam-2/status", b"online"))  # the bridge's, not this one's
    finally:
        pub.stop()


def _stale(device="cam-gone", site="lobby", prefix="homeassistant"):
    """The configurations a previous run published for a camera this run no longer shows."""
    d = DiscoveredDevice(device_id=device, site=site, door=False)
    return HomeAssistantDiscovery(ROOT, prefix=prefix, version="0.0.9").configs([d])


def test_what_a_server_recognises_as_its_own_configuration():
    d = HomeAssistantDiscovery(ROOT)
    (rec, rec_payload), (sensor, sensor_payload) = sorted(_stale().items())
    assert d.ours(rec, rec_payload, {"lobby"}) == ""
    assert d.ours(sensor, sensor_payload, {"lobby"}) == _count_topic("cam-gone")  # its count is emptied with it
    assert d.ours(rec, rec_payload, {"garage"}) is None  # another site's
    # Sanitised node ids coincide (site "a", device "b_c" and site "a_b", device "c"): the availability says which.
    topic, payload = next(iter(_stale(device="c", site="a_b").items()))
    assert topic == "homeassistant/event/peep_a_b_c/recognition/config"
    assert d.ours(topic, payload, {"a"}) is None and d.ours(topic, payload, {"a_b"}) == ""
    doc = json.loads(rec_payload)
    for foreign_topic, foreign in [
        ("homeassistant/sensor/zigbee_0x01/temperature/config", rec_payload),  # another integration's node
        (rec, json.dumps({**doc, "origin": {"name": "Frigate"}}).encode()),  # another origin
        (rec, json.dumps({**doc, "availability_topic": "other/v1/lobby/cam-gone/status"}).encode()),  # another root
        (rec, json.dumps({**doc, "availability_topic": "devices/peep/v1/lobby/cam-x/status"}).encode()),  # mismatch
        (rec, b"not json"),
        (rec, b"[]"),
        (rec, rec_payload + b" " * 20_000),  # larger than any configuration of ours
        ("homeassistant/event/peep_lobby_cam-gone/config", rec_payload),  # not a configuration's topic
    ]:
        assert d.ours(foreign_topic, foreign, {"lobby"}) is None, foreign_topic


def test_an_announcement_empties_the_configurations_of_its_own_devices_no_longer_shown():
    """A previous run's camera (unregistered since), one now disabled, one now a desk: their retained configurations
    and counts are emptied; the current ones, another site's and another integration's are left alone."""
    client = _Client()
    pub = _publisher(client, DeviceConfig(id="cam-2", site="lobby"), DeviceConfig(id="cam-3", site="lobby",
                     enabled=False), DeviceConfig(id="cam-4", site="lobby", enrolment_desk=True))  # fmt: skip
    try:
        before = {**_stale(), **_stale("cam-3"), **_stale("cam-4"), **_stale("cam-9", site="garage"), **_stale("cam-2")}
        foreign = ("homeassistant/sensor/zigbee_0x01/temperature/config", b'{"name":"t"}')
        # The broker's retained configurations arrive with the subscription (here before the first announcement).
        for topic, payload in [*before.items(), foreign]:
            assert pub.take(_Msg(topic, payload))
        pub.announce()
        emptied = {t for t, p, _, r in client.sent if r and p == b""}
        gone = {t for t in before if "cam-gone" in t or "cam-3" in t or "cam-4" in t}
        assert emptied == gone | {_count_topic(d) for d in ("cam-gone", "cam-3", "cam-4")}
        assert pub.removed_total == 6 and set(pub.removed) == gone
        # Arriving after the announcement (a reconnect's subscription): emptied at once; a live one is not acted on.
        client.sent.clear()
        late = _stale("cam-late")
        for topic, payload in late.items():
            pub.take(_Msg(topic, payload, retain=False))
        assert client.sent == []
        for topic, payload in late.items():
            pub.take(_Msg(topic, payload))
        assert {t for t, p, _, _ in client.sent if p == b""} == set(late) | {_count_topic("cam-late")}
        # The emptied topic coming back empty is the removal itself: nothing more.
        client.sent.clear()
        pub.take(_Msg(next(iter(late)), b""))
        pub.announce()
        assert not [t for t, p, _, _ in client.sent if p == b""]
    finally:
        pub.stop()


def _identify(subject="", *, device="cam-2", unknown=False):
    return _event(device_id=device, purpose=template_pb2.PURPOSE_IDENTIFY, subject=subject, unknown=unknown)


def _counts(client, device="cam-2"):
    return [p.decode() for t, p, _, r in client.sent if t == _count_topic(device) and r]


def test_a_camera_s_count_is_of_distinct_enrolled_people_in_the_window_and_names_nobody():
    client, clocks = _Client(), _Clocks()
    pub = _publisher(client, clocks=clocks, recent_minutes=15)
    try:
        pub.announce()
        assert _counts(client) == ["0"]  # retained at once: Home Assistant shows 0, not unknown
        for ev in [_identify("alice"), _identify("alice"), _identify(unknown=True), _identify("bob"),
                   _identify("carol", device="door-1"),  # a door's, and an enrolment's, are no recognition
                   _event(device_id="cam-2", purpose=template_pb2.PURPOSE_ENROLL, subject="dave"),
                   _event(device_id="cam-2", purpose=template_pb2.PURPOSE_VERIFY, subject="erin", accepted=True),
                   _identify("frank", device="cam-unregistered")]:  # fmt: skip
            pub.event(ev)
            clocks.advance(60)
        assert _counts(client) == ["0", "1", "2"]  # alice twice is one person; unknown is nobody
        assert pub.state().recognised_recently == {"lobby/cam-2": 2}
        clocks.advance(15 * 60 - 7 * 60)  # alice's last recognition is 15 minutes old: she leaves the window
        pub.refresh()
        assert _counts(client)[-1] == "1"
        clocks.advance(119)  # bob, two minutes after alice: still in the window for two minutes less a second
        pub.refresh()
        assert _counts(client)[-1] == "1"
        clocks.advance(1)
        pub.refresh()
        pub.refresh()  # unchanged: not published again
        assert _counts(client) == ["0", "1", "2", "1", "0"]
        everything = b" ".join(p for _, p, _, _ in client.sent)
        for name in (b"alice", b"bob", b"carol", b"frank"):
            assert name not in everything
    finally:
        pub.stop()


def test_the_count_falls_with_no_decision_on_the_publisher_s_own_timer_until_it_is_stopped():
    import threading

    client, clocks, up = _Client(), _Clocks(), [True]
    stopping = threading.Event()
    pub = _publisher(client, clocks=clocks, up=up, refresh_s=0.02, stopping=stopping)
    pub.announce()  # starts the timer
    pub.event(_identify("alice"))
    assert _counts(client) == ["0", "1"]
    clocks.advance(15 * 60 + 1)
    deadline = time.monotonic() + 5
    while _counts(client) != ["0", "1", "0"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _counts(client) == ["0", "1", "0"]
    up[0] = False  # disconnected: counted still, published on the next announcement
    pub.event(_identify("bob"))
    assert _counts(client) == ["0", "1", "0"] and pub.state().recognised_recently == {"lobby/cam-2": 1}
    stopping.set()  # the bridge stops: so does the timer
    pub._timer.join(5)
    assert not pub._timer.is_alive()


def test_a_publish_that_raises_is_not_sent_or_is_refused_is_an_error_the_console_shows():
    client, clocks = _Client(), _Clocks()
    pub = _publisher(client, clocks=clocks)
    try:
        pub.announce()
        assert pub.state().errors == 0 and pub.state().last_error == ""
        client.rc = mqtt.MQTT_ERR_NO_CONN
        pub.event(_identify("alice"))
        state = pub.state()
        assert state.errors == 2 and "not sent" in state.last_error and state.last_error_at == clocks.now
        assert state.last_error.startswith(_count_topic())
        client.rc, client.fails = mqtt.MQTT_ERR_SUCCESS, ValueError("Invalid topic.")
        pub.announce()
        assert pub.state().errors == 2 + 5 and "ValueError: Invalid topic." in pub.state().last_error
        client.fails = None
        client.sent.clear()
        pub.announce()
        # The broker's PUBACK refusing one of them (its ACL), and a success: only the refusal is an error.
        refused = mqtt.ReasonCode(mqtt.PacketTypes.PUBACK, identifier=0x87)
        ok = mqtt.ReasonCode(mqtt.PacketTypes.PUBACK, identifier=0)
        pub.published(client, None, 1, refused, None)
        pub.published(client, None, 2, ok, None)
        pub.published(client, None, 999, refused, None)  # not this publisher's (an event of the bridge's): kept aside
        state = pub.state()
        assert state.errors == 8 and "refused by the broker (Not authorized)" in state.last_error
        assert state.last_error.startswith(client.sent[0][0])
    finally:
        pub.stop()


@pytest.mark.mqtt
def test_a_server_announces_its_site_s_devices_retained_and_removes_what_an_earlier_run_left(
    tmp_path, pki, keypair, bundle_dir
):
    """The running server, the real broker. Before it starts, the broker holds what an earlier run published for a
    camera since unregistered (its configurations and its retained count), another site's camera and another
    integration's sensor, as they would be. The server announces its site's devices retained, empties the earlier
    run's camera, and leaves the other two; Home Assistant's ``online`` announces again (once per debounce), and a
    camera's count of the people it recognised is retained on the broker, naming nobody."""
    import uuid

    from peep_testing.server import MQTT_PREFIX, SITE, base_config, mqtt_available, start_server

    if (reason := mqtt_available()) is not None:
        pytest.skip(reason)
    prefix = f"ha-test-{uuid.uuid4().hex[:8]}"
    root = TopicScheme(MQTT_PREFIX)
    count = root.device(SITE, "cam-2", "recognised_recently")
    earlier = HomeAssistantDiscovery(root, prefix=prefix, version="0.0.9")
    gone = earlier.configs([DiscoveredDevice(device_id="cam-gone", site=SITE, door=False)])
    elsewhere = earlier.configs([DiscoveredDevice(device_id="cam-9", site="garage", door=False)])
    foreign = {f"{prefix}/sensor/zigbee_0x01/temperature/config": b'{"name":"t","state_topic":"zigbee/t"}'}
    gone_count = root.device(SITE, "cam-gone", "recognised_recently")
    w = TopicWatcher(f"{prefix}/#", f"{MQTT_PREFIX}/+/+/recognised_recently")
    srv = None
    try:
        for topic, payload in [*gone.items(), *elsewhere.items(), *foreign.items(), (gone_count, b"3")]:
            w.publish(topic, payload)
        cfg = base_config(tmp_path, keypair[3], bundle_dir,
                          mqtt={"enabled": True, "share_group": f"g{uuid.uuid4().hex[:8]}", "connections": 1},
                          home_assistant={"enabled": True, "discovery_prefix": prefix})  # fmt: skip
        cfg["auth"]["allow_insecure"] = True
        srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
        ha = srv.app.mqtt.home_assistant
        node = f"peep_{SITE}_door-1"
        ours = {f"{prefix}/lock/{node}/lock/config", f"{prefix}/event/{node}/access/config",
                f"{prefix}/event/peep_{SITE}_cam-2/recognition/config",
                f"{prefix}/sensor/peep_{SITE}_cam-2/recognised_recently/config"}  # fmt: skip
        assert w.wait(lambda: all(w.got.get(t) == b"" for t in [*gone, gone_count]) and ours <= set(w.got)), w.got
        # What a Home Assistant connecting now reads: a fresh subscription's retained messages.
        fresh = TopicWatcher(f"{prefix}/#", f"{MQTT_PREFIX}/+/+/recognised_recently")
        try:
            assert fresh.wait(lambda: set(fresh.got) >= ours | set(elsewhere) | set(foreign) | {count}), fresh.got
            time.sleep(0.3)  # anything else retained would have arrived with them
            assert set(fresh.got) == ours | set(elsewhere) | set(foreign) | {count}
            assert {t: fresh.got[t] for t in [*elsewhere, *foreign]} == {**elsewhere, **foreign}  # untouched
            assert fresh.got[count] == b"0"
        finally:
            fresh.close()
        lock = json.loads(w.got[f"{prefix}/lock/{node}/lock/config"])
        assert lock["availability_topic"] == f"{MQTT_PREFIX}/{SITE}/door-1/status"
        state = ha.state()
        assert list(state.entities) == sorted(ours) and state.last_publish is not None and state.errors == 0
        assert set(state.removed) == set(gone) and state.removed_total == 2
        assert state.left_out == ("cam-1: an enrolment desk, which is never shown",)

        # Home Assistant restarted: its birth announces again; its will, and a second birth at once, do not.
        ha.debounce_s = 0.2
        time.sleep(0.3)
        n = len(w.log)
        w.publish(f"{prefix}/status", b"offline", retain=False)
        w.publish(f"{prefix}/status", b"online", retain=False)
        assert w.wait(lambda: {t for t, _, _ in w.log[n:]} >= ours), w.log[n:]
        ha.debounce_s = 30.0
        w.publish(f"{prefix}/status", b"online", retain=False)
        assert w.wait(lambda: ha.state().births == 2)
        time.sleep(0.3)
        assert ha.state().announcements == 2 and len([t for t, _, _ in w.log[n:] if t in ours]) == len(ours)

        # A recognition at the camera: its count, retained; nobody named on anything the broker holds.
        ev = _identify("alice-enrolled")
        ev.site = SITE
        srv.services.events.publish(ev)
        assert w.wait(lambda: w.got.get(count) == b"1"), w.got.get(count)
        assert not [t for t, p, _ in w.log if b"alice" in p]
    finally:
        if srv is not None:
            srv.app.stop()
        for t, p in list(w.got.items()):  # the shared broker keeps nothing of this test
            if p:
                w.publish(t, b"")
        w.close()
