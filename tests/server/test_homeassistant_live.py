"""A real Home Assistant on the shipped broker (TLS, passwords, the shipped ACL with its read-only
``home-assistant`` account) takes the server's discovery: a site's door and camera appear with the devices'
availability, the server's decisions arrive as events naming nobody but a person who opted in (whose own "last seen"
sensor shows the camera), and Home Assistant cannot write a door's topics. Skips only where the Home Assistant venv
or mosquitto is missing (bash scripts/bootstrap.sh makes both).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from peep.lab.processes.control import PartUnavailable, wait_for
from peep.lab.processes.homeassistant import HomeAssistant
from peep.v1 import recognition_pb2, template_pb2
from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, ShippedBroker
from peep_testing.server import SITE, base_config, start_server

pytestmark = [pytest.mark.processes, pytest.mark.slow]

HA_PASSWORD = "ha-pw-" + uuid.uuid4().hex[:8]
DOOR_PASSWORD = "door-1-pw-" + uuid.uuid4().hex[:8]
ROOT = "peep/v1"  # what devices write; the broker mounts it under devices/ for the server and Home Assistant
ENROLLED = "alice-enrolled"  # a subject named in the server's decisions: nothing Home Assistant receives names her


@dataclass
class Site:
    broker: ShippedBroker
    server: Any
    ha: HomeAssistant
    door: Client
    camera: Client

    def entity(self, domain: str, device_id: str) -> str | None:
        """The entity id Home Assistant gave the device's ``domain`` entity (its name follows the device's)."""
        for s in self.ha.states():
            if s["entity_id"].startswith(f"{domain}.") and device_id in s["attributes"].get("friendly_name", ""):
                return str(s["entity_id"])
        return None


def _device(broker: ShippedBroker, user: str, password: str) -> Client:
    return Client(broker.dev_port, user, password, broker.ca).connect()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, pki: Any, keypair: Any, bundle_dir: Any) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("ha-live")
    broker = ShippedBroker(tmp / "broker", pki.client_ca, pki.server_cert, pki.server_key,
                           devices={"door-1": DOOR_PASSWORD},
                           server_accounts={"home-assistant": HA_PASSWORD}).start()  # fmt: skip
    mp = pytest.MonkeyPatch()
    mp.setenv("PEEP_TEST_MQTT_PASSWORD", SERVER_PASSWORD)
    cfg = base_config(tmp, keypair[3], bundle_dir, mqtt={**broker.server_mqtt_section(), "connections": 1},
                      home_assistant={"enabled": True})  # fmt: skip
    cfg["auth"]["allow_insecure"] = True
    try:
        ha = HomeAssistant(tmp / "ha", "localhost", broker.srv_port, username="home-assistant", password=HA_PASSWORD,
                           ca=broker.ca)  # fmt: skip
    except PartUnavailable as e:
        broker.stop()
        pytest.skip(str(e))
    server = start_server(cfg, pki, tmp, mqtt_wait=15)
    door = _device(broker, "door-1", DOOR_PASSWORD)
    camera = _device(broker, "cam-2", DEVICE_PASSWORDS["cam-2"])
    for dev, c in (("door-1", door), ("cam-2", camera)):  # what an agent says on connecting, as its last will undoes
        c.c.publish(f"{ROOT}/{SITE}/{dev}/status", "online", qos=1, retain=True).wait_for_publish(10)
    ha.start()
    try:
        yield Site(broker, server, ha, door, camera)
    finally:
        ha.stop()
        door.close()
        camera.close()
        server.app.stop(0)
        broker.stop()
        mp.undo()


def test_the_site_s_door_and_camera_appear_with_their_availability(site: Site) -> None:
    assert wait_for(lambda: all(site.entity(d, dev) for d, dev in
                                (("lock", "door-1"), ("event", "door-1"), ("event", "cam-2"))), 30), (
        [s["entity_id"] for s in site.ha.states()], site.ha.log()[-3000:])  # fmt: skip
    lock = site.entity("lock", "door-1")
    assert lock is not None
    # Online, and no lock state yet: unknown (not unavailable). The enrolment desk is not shown.
    assert site.ha.wait_state(lock, lambda s: s is not None and s["state"] == "unknown")
    assert site.entity("event", "cam-1") is None
    camera = site.entity("event", "cam-2")
    assert camera is not None and site.ha.state(camera)["attributes"]["event_types"] == ["enrolled_person", "unknown"]
    # The door stops (its will, or its own offline on the way out): unavailable; back: available again.
    site.door.c.publish(f"{ROOT}/{SITE}/door-1/status", "offline", qos=1, retain=True).wait_for_publish(10)
    site.ha.wait_state(lock, lambda s: s is not None and s["state"] == "unavailable")
    site.door.c.publish(f"{ROOT}/{SITE}/door-1/status", "online", qos=1, retain=True).wait_for_publish(10)
    site.ha.wait_state(lock, lambda s: s is not None and s["state"] == "unknown")


def _until_heard(site: Site, entity: str, ev: recognition_pb2.RecognitionEvent, event_type: str) -> dict[str, Any]:
    """Hand the server's event bus a decision until Home Assistant's entity shows it (events are not retained:
    one sent before the entity subscribed is lost, as it would be for any MQTT event entity)."""
    seen: dict[str, Any] = {}

    def heard() -> bool:
        ev.event_id = uuid.uuid4().hex
        site.server.services.events.publish(ev)
        s = site.ha.state(entity)
        if s is not None and s["attributes"].get("event_type") == event_type and s["state"] not in ("unknown",):
            seen.update(s)
            return True
        return False

    assert wait_for(heard, 30, 1.0), site.ha.state(entity)
    return seen


def test_decisions_arrive_as_events_that_name_nobody(site: Site) -> None:
    assert wait_for(lambda: site.entity("event", "door-1") and site.entity("event", "cam-2"), 30)
    access, recognition = site.entity("event", "door-1"), site.entity("event", "cam-2")
    assert access is not None and recognition is not None
    common = {"site": SITE, "decided_on": "server", "probability": 0.93, "model_version": "v7"}
    opened = _until_heard(site, access, recognition_pb2.RecognitionEvent(
        device_id="door-1", purpose=template_pb2.PURPOSE_VERIFY, claimed_subject=ENROLLED, subject=ENROLLED,
        accepted=True, **common), "opened")  # fmt: skip
    refused = _until_heard(site, access, recognition_pb2.RecognitionEvent(
        device_id="door-1", purpose=template_pb2.PURPOSE_VERIFY, claimed_subject=ENROLLED, accepted=False,
        **common), "refused")  # fmt: skip
    assert refused["attributes"]["reason"] == "not_the_claimed_person"
    seen = _until_heard(site, recognition, recognition_pb2.RecognitionEvent(
        device_id="cam-2", purpose=template_pb2.PURPOSE_IDENTIFY, subject=ENROLLED, track_id="t-1", **common),
        "enrolled_person")  # fmt: skip
    assert seen["attributes"]["track"] == "t-1" and opened["attributes"]["decided_on"] == "server"
    # Nothing Home Assistant holds names the enrolled person or carries the score.
    everything = json.dumps(site.ha.states())
    assert ENROLLED not in everything and "0.93" not in everything and "v7" not in everything


def test_home_assistant_reads_and_cannot_write_a_door_s_topics(site: Site) -> None:
    """Its account is read-only: a lock state, an access event, a door's events topic or the lock's command topic
    written as Home Assistant is refused by the broker (PUBACK 0x87, not authorised) and reaches no subscriber."""
    ha = Client(site.broker.srv_port, "home-assistant", HA_PASSWORD, site.broker.ca).connect()
    watcher = Client(site.broker.srv_port, "peep-server", SERVER_PASSWORD, site.broker.ca).connect()
    try:
        watcher.subscribe(f"devices/{ROOT}/{SITE}/door-1/#")
        mids = [ha.c.publish(f"devices/{ROOT}/{SITE}/door-1/{leaf}", payload, qos=1).mid
                for leaf, payload in (("lock", "unlocked"), ("access", '{"event_type":"opened"}'),
                                      ("events", "{}"), ("lock_command", "UNLOCK"))]  # fmt: skip
        assert wait_for(lambda: all(m in ha.acks for m in mids), 10)
        assert [ha.acks[m] for m in mids] == [0x87] * 4
        ok = ha.c.publish("homeassistant/status", "online", qos=1).mid  # its birth message it may send
        assert wait_for(lambda: ok in ha.acks, 10) and ha.acks[ok] < 0x80  # success (0x10: nobody subscribed)
        with watcher.lock:
            assert not [m for m in watcher.messages if not m[2]], watcher.messages  # only the retained status
    finally:
        ha.close()
        watcher.close()


def test_a_camera_s_recent_count_is_a_sensor_naming_nobody_and_home_assistant_s_birth_reaches_the_server(
    site: Site,
) -> None:
    """Home Assistant takes the count's discovery (unit, state class), shows the retained count, and then the number of
    distinct enrolled people the camera recognised (one recognised twice is one), never who; its own birth on
    ``homeassistant/status`` reached the server (which announces again on it); the shipped ACL refused nothing."""
    assert wait_for(lambda: site.entity("sensor", "cam-2"), 30), [s["entity_id"] for s in site.ha.states()]
    sensor = site.entity("sensor", "cam-2")
    assert sensor is not None and site.entity("sensor", "door-1") is None
    first = site.ha.wait_state(sensor, lambda s: s is not None and s["state"].isdigit())
    assert first is not None
    assert (first["attributes"]["unit_of_measurement"], first["attributes"]["state_class"]) == ("people", "measurement")
    people = [f"{ENROLLED}-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for subject in (people[0], people[0], people[1]):
        site.server.services.events.publish(recognition_pb2.RecognitionEvent(
            site=SITE, device_id="cam-2", purpose=template_pb2.PURPOSE_IDENTIFY, subject=subject, track_id="t-2",
            decided_on="server", event_id=uuid.uuid4().hex))  # fmt: skip
    expected = str(int(first["state"]) + 2)
    site.ha.wait_state(sensor, lambda s: s is not None and s["state"] == expected)
    ha = site.server.app.mqtt.home_assistant
    assert wait_for(lambda: ha.state().births >= 1, 30), ha.state()
    assert ha.state().errors == 0, ha.state().last_error
    everything = json.dumps(site.ha.states())
    assert not [p for p in people if p in everything]


def test_an_opted_in_person_s_sensor_shows_the_camera_and_no_one_else_appears(site: Site) -> None:
    """A subject who opted in (the store, then this server's publisher re-reading, as the console does) gets a "Last
    seen" sensor under the display name they agreed to, whose state becomes the camera that identified them, through
    the shipped ACL; a subject who did not is never in anything Home Assistant holds; an opt-out removes the entity."""
    shown, other = f"bea-{uuid.uuid4().hex[:6]}", f"carl-{uuid.uuid4().hex[:6]}"
    name = "Bea Liddell"
    ha = site.server.app.mqtt.home_assistant
    site.server.services.store.set_home_assistant_person(shown, name, 1_700_000_000.0)
    ha.people.reload()
    assert wait_for(lambda: site.entity("sensor", name), 30), [s["entity_id"] for s in site.ha.states()]
    sensor = site.entity("sensor", name)
    assert sensor is not None and sensor.endswith("_last_seen")

    def seen() -> bool:
        for subject in (other, shown):
            site.server.services.events.publish(recognition_pb2.RecognitionEvent(
                site=SITE, device_id="cam-2", purpose=template_pb2.PURPOSE_IDENTIFY, subject=subject, track_id="t-3",
                decided_on="server", event_id=uuid.uuid4().hex))  # fmt: skip
        s = site.ha.state(sensor)
        return s is not None and s["state"] == "cam-2"

    assert wait_for(seen, 30, 1.0), site.ha.state(sensor)
    state = site.ha.state(sensor)
    assert state is not None and state["attributes"]["site"] == SITE and state["attributes"]["at"]
    recognition = site.entity("event", "cam-2")
    assert recognition is not None
    everything = json.dumps(site.ha.states())
    assert other not in everything and "carl" not in everything.lower()
    assert ha.state().errors == 0, ha.state().last_error  # the shipped ACL let the server write the person's topics
    site.server.services.store.clear_home_assistant_person(shown)
    ha.people.reload()
    assert wait_for(lambda: site.entity("sensor", name) is None, 30), site.ha.state(sensor)
    # And their decisions name them no more: the camera's next event for them is an enrolled person's, nameless.
    assert site.ha.state(recognition)["attributes"].get("person") == name  # the last one before the opt-out
    _until_heard(site, recognition, recognition_pb2.RecognitionEvent(
        site=SITE, device_id="cam-2", purpose=template_pb2.PURPOSE_IDENTIFY, subject=shown, track_id="t-after",
        decided_on="server"), "enrolled_person")  # fmt: skip
    assert wait_for(lambda: site.ha.state(recognition)["attributes"].get("track") == "t-after", 30)
    after = site.ha.state(recognition)
    assert "person" not in after["attributes"] and name not in json.dumps(site.ha.states())
