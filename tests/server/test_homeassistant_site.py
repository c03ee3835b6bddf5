"""A site as a deployer runs it, seen from a real Home Assistant: a trained server (the people of lfw100 enrolled,
a model trained), a real door (``open_door``: claims decided by the server over MQTT, its lock reported, opening
from Home Assistant allowed) and a real camera (an edge agent releasing templates), on the shipped broker with TLS,
passwords and the shipped ACL plus one line granting Home Assistant's account that door's lock command.

Read back through Home Assistant's REST API: the door's lock following the real lock, the access events after a
genuine and an impostor claim, the camera's recognition event, Home Assistant opening the door (recorded by the
server as an opening Home Assistant asked for), an identity without the grant refused by the broker, a request
refused while a subject is locked out, availability when a device stops, and nothing anywhere naming who is
enrolled. Skips only where the Home Assistant venv or mosquitto is missing (bash scripts/bootstrap.sh makes both).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from peep.lab.processes.control import PartUnavailable, wait_for
from peep.lab.processes.homeassistant import HomeAssistant
from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, ShippedBroker
from peep_testing.door import frames
from peep_testing.server import ADMIN, SITE, base_config, start_server, tls_section, write_edge_config

pytestmark = [pytest.mark.processes, pytest.mark.slow]

HA_PASSWORD = "ha-pw-" + uuid.uuid4().hex[:8]
DOOR_PASSWORD = "door-1-pw-" + uuid.uuid4().hex[:8]
ROOT = "peep/v1"  # what devices write; the broker mounts it under devices/ for the server and Home Assistant
#: The deployer's one added line: Home Assistant's account may write door-1's lock command, and no other topic.
GRANT = f"topic write devices/{ROOT}/{SITE}/door-1/lock_command"
RAW = {"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e6}


@dataclass
class Site:
    broker: ShippedBroker
    server: Any
    ha: HomeAssistant
    door: Any
    door_agent: Any
    pin: Any
    outcomes: list[Any]
    videos: dict[str, tuple[str, str]]
    camera_cfg: Path
    enrolled: list[str]
    locked: bool  # the pin's level with the lock released (a relay board is active low or high)
    heard: list[tuple[str, bytes, bool]] = field(default_factory=list)  # everything Home Assistant's account read

    def entity(self, domain: str, device_id: str, name: str = "") -> str | None:
        for s in self.ha.states():
            eid, friendly = s["entity_id"], s["attributes"].get("friendly_name", "")
            if eid.startswith(f"{domain}.") and device_id in friendly and name.lower() in friendly.lower():
                return str(eid)
        return None

    def kept(self, device_id: str) -> list[Any]:
        """The server's kept decisions of ``device_id``, oldest first."""
        rows = [d for _, d in self.server.services.store.decisions(limit=100_000) if d.device_id == device_id]
        return sorted(rows, key=lambda d: d.at)


def _video(path: Path, photo: Any, n: int = 40) -> str:
    from peep.edge.testing import FaceTrack, compose_video

    compose_video(path, [FaceTrack(image=photo, start=0, stop=n, x0=200, y0=120, amplitude=10, period_frames=40)],
                  n_frames=n, fps=10.0)  # fmt: skip
    return str(path)


@pytest.fixture(scope="module")
def site(tmp_path_factory, pki, keypair, bundle_dir, templates, decision_keys, lfw100, data_home) -> Iterator[Site]:
    from gpiozero.pins.mock import MockFactory
    from peep.edge.agent import Agent
    from peep.edge.config import load_config
    from peep.edge.device_key import DeviceKey
    from peep.edge.door_session import open_door
    from peep.edge.testing import lfw_people
    from peep.v1 import recognition_pb2

    tmp = tmp_path_factory.mktemp("ha-site")
    broker = ShippedBroker(tmp / "broker", pki.client_ca, pki.server_cert, pki.server_key,
                           devices={"door-1": DOOR_PASSWORD}, server_accounts={"home-assistant": HA_PASSWORD},
                           acl_grants={"home-assistant": [GRANT]}).start()  # fmt: skip
    try:
        ha = HomeAssistant(tmp / "ha", "localhost", broker.srv_port, username="home-assistant", password=HA_PASSWORD,
                           ca=broker.ca)  # fmt: skip
    except PartUnavailable as e:
        broker.stop()
        pytest.skip(str(e))
    # Two enrolled people: one who claims at the door and walks past the camera, one whose face claims her name.
    counts = np.bincount(lfw100.labels)
    genuine, other = (lfw100.target_names[int(i)].replace(" ", "_") for i in np.argsort(counts)[::-1][:2])
    people = lfw_people(data_home)
    videos = {"genuine": (_video(tmp / "genuine.mp4", people[genuine][-1]), genuine),
              "impostor": (_video(tmp / "impostor.mp4", people[other][-1]), genuine),
              "camera": (_video(tmp / "camera.mp4", people[genuine][-2], n=60), genuine)}  # fmt: skip
    mqtt_edge = {"enabled": True, "host": "localhost", "port": broker.dev_port, "tls": True,
                 "ca_file": str(broker.ca), "password_env": "PW", "reconnect_max_s": 1.0}  # fmt: skip
    door_cfg = write_edge_config(
        tmp / "door.toml", port=1, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3], device_id="door-1",
        privacy=RAW, grpc={"enabled": False}, capture={"source": videos["genuine"][0]}, mqtt=mqtt_edge,
        door={"enabled": True, "decision": "mqtt", "decision_public_key": str(decision_keys[3]), "lock": "gpio",
              "open_s": 1.0, "decision_timeout_s": 15.0, "lockout_failures": 2, "report_lock": True,
              "home_assistant_open": True, "epsilon_per_hour": 1e6, "subject_epsilon_per_hour": 1e6},
    )  # fmt: skip
    camera_cfg = write_edge_config(
        tmp / "camera.toml", port=1, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3], device_id="cam-2",
        privacy={**RAW, "window_seconds": 2.0, "min_track_frames": 2}, grpc={"enabled": False},
        capture={"source": videos["camera"][0], "max_fps": 10.0}, mqtt=mqtt_edge,
    )  # fmt: skip
    door_agent = Agent(load_config(door_cfg), environ={"PW": DOOR_PASSWORD})
    mp = pytest.MonkeyPatch()
    mp.setenv("PEEP_TEST_MQTT_PASSWORD", SERVER_PASSWORD)
    mqtt = broker.server_mqtt_section(client_id=f"peep-ha-{uuid.uuid4().hex[:6]}", connections=1,
                                      decision_signing_key=str(decision_keys[2]))  # fmt: skip
    cfg = base_config(tmp, keypair[3], bundle_dir, mqtt=mqtt, grpc={"tls": tls_section(pki)},
                      home_assistant={"enabled": True})  # fmt: skip
    for d in cfg["auth"]["devices"]:  # the door's signing key, registered as an installer would
        if d["id"] == "door-1":
            d["signing_key"] = DeviceKey(door_agent.cfg.device_key_path).public_text
    server = start_server(cfg, pki, tmp, mqtt_wait=15)
    door = None
    listener = Client(broker.srv_port, "home-assistant", HA_PASSWORD, broker.ca).connect()
    try:
        stub = server.stub()
        assert stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
        pins = MockFactory()
        outcomes: list[Any] = []
        door = open_door(door_agent, pin_factory=pins, on_outcome=outcomes.append, face_timeout_s=5.0)
        door_agent.start_transports()  # its access records reach the server
        ha.start()
        listener.subscribe("homeassistant/#")  # what Home Assistant's account can read, recorded throughout
        listener.subscribe(f"devices/{ROOT}/#")
        enrolled = sorted({str(s) for s in templates.subjects[templates.train]})
        yield Site(broker, server, ha, door, door_agent, pins.pin(17), outcomes, videos, camera_cfg, enrolled,
                   pins.pin(17).state, listener.messages)  # fmt: skip
    finally:
        listener.close()
        ha.stop()
        if door is not None:
            door.close()
        door_agent.shutdown(drain_timeout=0)
        server.app.stop(0)
        broker.stop()
        mp.undo()


def _last_event(site: Site, entity: str) -> tuple[str, dict[str, Any]]:
    s = site.ha.state(entity) or {}
    return s.get("state", ""), s.get("attributes", {})


def _next_event(site: Site, entity: str, since: str, timeout: float = 30.0) -> dict[str, Any]:
    """The attributes of the first event Home Assistant's ``entity`` shows after the one stamped ``since``."""
    got: dict[str, Any] = {}

    def arrived() -> bool:
        stamp, attrs = _last_event(site, entity)
        if stamp not in ("", "unknown", since):
            got.update(attrs)
            return True
        return False

    assert wait_for(arrived, timeout, 0.5), (site.ha.state(entity), site.ha.log()[-2000:])
    return got


def _claim(site: Site, which: str) -> Any:
    video, name = site.videos[which]
    return site.door.session.handle(name, frames(video))


def test_the_door_and_camera_appear_with_the_real_lock_s_state(site: Site) -> None:
    assert wait_for(lambda: all(site.entity(d, dev) for d, dev in
                                (("lock", "door-1"), ("event", "door-1"), ("event", "cam-2"))), 60), (
        [s["entity_id"] for s in site.ha.states()], site.ha.log()[-3000:])  # fmt: skip
    lock = site.entity("lock", "door-1")
    assert lock is not None
    # The door released its lock at start and said so, retained: Home Assistant shows it locked.
    assert site.ha.wait_state(lock, lambda s: s is not None and s["state"] == "locked", timeout=30)


def test_home_assistant_opens_the_door_it_was_granted_and_the_server_records_who_asked(site: Site) -> None:
    lock, access = site.entity("lock", "door-1"), site.entity("event", "door-1", "access")
    assert lock is not None and access is not None
    stamp, _ = _last_event(site, access)
    opened = site.door.controller.opened
    site.ha.call_service("lock", "unlock", {"entity_id": lock})
    assert wait_for(lambda: site.door.controller.opened == opened + 1, 15), site.outcomes[-3:]
    asked = [o for o in site.outcomes if o.requested_by]
    assert asked[-1].opened and asked[-1].requested_by == "home_assistant"
    # The real lock moved and Home Assistant saw it: unlocked, then locked again after open_s.
    assert site.ha.wait_state(lock, lambda s: s is not None and s["state"] == "unlocked", timeout=15)
    assert site.ha.wait_state(lock, lambda s: s is not None and s["state"] == "locked", timeout=15)
    # The access record the door spooled reached the server: kept as an opening Home Assistant asked for.
    assert wait_for(lambda: any(d.requested_by == "home_assistant" for d in site.kept("door-1")), 30)
    record = next(d for d in site.kept("door-1") if d.requested_by == "home_assistant")
    assert (record.purpose, record.accepted, record.claimed_subject) == ("verify", True, "")
    assert record.decided_on == "device"  # the door's own action, decided by no model
    heard = _next_event(site, access, stamp)
    assert (heard["event_type"], heard["requested_by"]) == ("opened", "home_assistant")


def test_an_identity_without_the_grant_opens_nothing(site: Site) -> None:
    """The server's account and a camera's are refused by the broker (PUBACK 0x87); the door never hears them."""
    opened = site.door.controller.opened
    server = Client(site.broker.srv_port, "peep-server", SERVER_PASSWORD, site.broker.ca).connect()
    camera = Client(site.broker.dev_port, "cam-2", DEVICE_PASSWORDS["cam-2"], site.broker.ca).connect()
    try:
        mids = [(server, server.c.publish(f"devices/{ROOT}/{SITE}/door-1/lock_command", "UNLOCK", qos=1).mid),
                (camera, camera.c.publish(f"{ROOT}/{SITE}/door-1/lock_command", "UNLOCK", qos=1).mid)]  # fmt: skip
        assert wait_for(lambda: all(m in c.acks for c, m in mids), 10)
        assert [c.acks[m] for c, m in mids] == [0x87, 0x87]
        time.sleep(1.0)
        assert site.door.controller.opened == opened and site.pin.state == site.locked
    finally:
        server.close()
        camera.close()


def test_a_genuine_and_an_impostor_claim_arrive_as_the_server_decided_them(site: Site) -> None:
    access = site.entity("event", "door-1", "access")
    assert access is not None
    stamp, _ = _last_event(site, access)
    out = _claim(site, "genuine")
    assert out.opened or out.reason == "rejected", out  # the server's decision, whichever it was
    heard = _next_event(site, access, stamp)
    assert heard["event_type"] == ("opened" if out.opened else "refused") and heard["decided_on"] == "server"
    stamp, _ = _last_event(site, access)
    out = _claim(site, "impostor")
    assert not out.opened and out.reason == "rejected", out  # another enrolled person's face, claiming her name
    heard = _next_event(site, access, stamp)
    assert (heard["event_type"], heard["reason"]) == ("refused", "not_the_claimed_person")
    assert wait_for(lambda: site.pin.state == site.locked, 5)  # locked again once the genuine opening's open_s passed


def test_the_camera_s_recognition_arrives_and_its_stop_makes_it_unavailable(site: Site) -> None:
    from peep.edge.agent import Agent
    from peep.edge.config import load_config

    recognition = site.entity("event", "cam-2", "recognition")
    assert recognition is not None
    stamp, _ = _last_event(site, recognition)
    camera = Agent(load_config(site.camera_cfg), environ={"PW": DEVICE_PASSWORDS["cam-2"]})
    runner = threading.Thread(target=camera.run, daemon=True)
    runner.start()
    heard = _next_event(site, recognition, stamp, timeout=60)
    kept = site.kept("cam-2")
    assert kept, "the server decided nothing of the camera's releases"
    assert heard["event_type"] in ("enrolled_person", "unknown") and heard["decided_on"] == "server"
    assert any(heard["event_type"] == ("unknown" if d.unknown else "enrolled_person") for d in kept)
    runner.join(60)
    assert not runner.is_alive(), "the camera did not finish its video"
    # The camera stopped (its own offline on the way out): Home Assistant shows it unavailable.
    assert site.ha.wait_state(recognition, lambda s: s is not None and s["state"] == "unavailable", timeout=30)


def test_while_a_subject_is_locked_out_home_assistant_cannot_open_the_door(site: Site) -> None:
    lock = site.entity("lock", "door-1")
    assert lock is not None
    while not any(o.reason == "locked_out" for o in site.outcomes if o.claim is not None):
        out = _claim(site, "impostor")  # the impostor again, until the door locks her claims out
        assert not out.opened, out
    opened = site.door.controller.opened
    refused = len([o for o in site.outcomes if o.requested_by and not o.opened])
    site.ha.call_service("lock", "unlock", {"entity_id": lock})
    assert wait_for(lambda: len([o for o in site.outcomes if o.requested_by and not o.opened]) == refused + 1, 15)
    assert [o.reason for o in site.outcomes if o.requested_by][-1] == "locked_out"
    time.sleep(1.0)
    assert site.door.controller.opened == opened and site.pin.state == site.locked
    assert (site.ha.state(lock) or {}).get("state") == "locked"


def test_nothing_home_assistant_holds_or_could_read_names_anyone_enrolled(site: Site) -> None:
    """Every state in Home Assistant, and every message (retained or live) its account could read on the broker
    during these tests: no enrolled person's name, no probability."""
    everything = json.dumps(site.ha.states()) + "\n".join(
        f"{t} {p.decode(errors='replace')}" for t, p, _ in list(site.heard)
    )
    assert site.heard, "Home Assistant's account read nothing"
    for name in site.enrolled:
        assert name not in everything and name.replace("_", " ") not in everything, name
    assert '"probability"' not in everything
