"""Home Assistant's own web page, in a headless Chromium, lists the entities the server's discovery made: a site's
door (its lock, its access events) and camera (its recognitions, its recent count), and shows no enrolled person's
name although one went through the server's decisions.

The same site as tests/server/test_homeassistant_live.py (the shipped broker with TLS, passwords and ACL; the
read-only ``home-assistant`` account), with Home Assistant's frontend loaded. With ``$PEEP_HA_SCREENSHOT`` naming
a file, the picture is also written there: ``docs/img/home_assistant_entities.png`` is made so
(docs/HOME_ASSISTANT.md, "Screenshot"). Skips where the Home Assistant venv, mosquitto, Chromium or its driver is
missing, naming which.
"""

from __future__ import annotations

import io
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from peep.lab.processes.control import PartUnavailable, wait_for
from peep.lab.processes.homeassistant import FrontendPage, HomeAssistant
from peep.v1 import recognition_pb2, template_pb2
from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, ShippedBroker
from peep_testing.server import SITE, base_config, start_server

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.browser]

HA_PASSWORD = "ha-pw-" + uuid.uuid4().hex[:8]
DOOR_PASSWORD = "door-1-pw-" + uuid.uuid4().hex[:8]
ROOT = "peep/v1"  # what devices write; the broker mounts it under devices/ for the server and Home Assistant
ENROLLED = "alice-enrolled-" + uuid.uuid4().hex[:6]  # decided by the server; nothing on the page may name her
#: The docs' picture is committed: PNG, and small enough not to weigh on a clone.
DOCS_MAX_BYTES = 300_000
#: Wide enough for the longest entity id; high enough for the sidebar's items, not much empty table below.
SIZE = (1440, 720)


@dataclass
class Shot:
    png: bytes
    page: FrontendPage
    entities: dict[str, str]  # what each is (``lock``, ``access``, ``recognition``, ``count``) -> entity id
    friendly: dict[str, str]  # entity id -> its friendly name
    ha: HomeAssistant  # still running, for the tests of what the screenshot refuses


def _entity(ha: HomeAssistant, domain: str, device_id: str) -> str | None:
    """The entity id Home Assistant gave the device's ``domain`` entity (its name follows the device's)."""
    for s in ha.states():
        if s["entity_id"].startswith(f"{domain}.") and device_id in s["attributes"].get("friendly_name", ""):
            return str(s["entity_id"])
    return None


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory, pki: Any, keypair: Any, bundle_dir: Any) -> Iterator[Shot]:
    tmp = tmp_path_factory.mktemp("ha-screenshot")
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
                           ca=broker.ca, frontend=True)  # fmt: skip
    except PartUnavailable as e:
        broker.stop()
        mp.undo()
        pytest.skip(str(e))
    server = start_server(cfg, pki, tmp, mqtt_wait=15)
    door = Client(broker.dev_port, "door-1", DOOR_PASSWORD, broker.ca).connect()
    camera = Client(broker.dev_port, "cam-2", DEVICE_PASSWORDS["cam-2"], broker.ca).connect()
    for dev, c in (("door-1", door), ("cam-2", camera)):  # what an agent says on connecting
        c.c.publish(f"{ROOT}/{SITE}/{dev}/status", "online", qos=1, retain=True).wait_for_publish(10)
    # A door with report_lock states its lock, retained: the picture shows a door as a site has it.
    door.c.publish(f"{ROOT}/{SITE}/door-1/lock", "locked", qos=1, retain=True).wait_for_publish(10)
    ha.start()
    try:
        wanted = {"lock": ("lock", "door-1"), "access": ("event", "door-1"), "recognition": ("event", "cam-2"),
                  "count": ("sensor", "cam-2")}  # fmt: skip
        found: dict[str, str] = {}

        def all_there() -> bool:
            for what, (domain, dev) in wanted.items():
                eid = found.get(what) or _entity(ha, domain, dev)
                if eid:
                    found[what] = eid
            return len(found) == len(wanted)

        assert wait_for(all_there, 30), ([s["entity_id"] for s in ha.states()], ha.log()[-3000:])
        ha.wait_state(found["lock"], lambda s: s is not None and s["state"] == "locked")

        # A decision naming an enrolled person reaches Home Assistant (as "enrolled_person") before the picture.
        # Events are not retained: one sent before the entity subscribed is lost, so send until it is heard.
        def heard() -> bool:
            server.services.events.publish(recognition_pb2.RecognitionEvent(
                site=SITE, device_id="cam-2", purpose=template_pb2.PURPOSE_IDENTIFY, subject=ENROLLED, track_id="t-1",
                decided_on="server", probability=0.93, event_id=uuid.uuid4().hex))  # fmt: skip
            s = ha.state(found["recognition"])
            return s is not None and s["attributes"].get("event_type") == "enrolled_person"

        assert wait_for(heard, 30, 1.0), ha.state(found["recognition"])
        png = tmp / "entities.png"
        try:
            page = ha.screenshot(png, "/config/entities", expect=found.values(), width=SIZE[0], height=SIZE[1],
                                 timeout=60)  # fmt: skip
        except PartUnavailable as e:
            pytest.skip(str(e))
        friendly = {eid: str((ha.state(eid) or {})["attributes"]["friendly_name"]) for eid in found.values()}
        yield Shot(png.read_bytes(), page, found, friendly, ha)
    finally:
        ha.stop()
        door.close()
        camera.close()
        server.app.stop(0)
        broker.stop()
        mp.undo()


def test_the_picture_is_a_png_with_something_on_it(shot: Shot) -> None:
    from PIL import Image, ImageStat

    img = Image.open(io.BytesIO(shot.png))
    assert img.format == "PNG" and img.size == SIZE
    # A blank page (the frontend not loaded, a script that failed) is one colour: no variance, one grey level.
    # The entities page is mostly white (a standard deviation of about 18, 0.8 % of the pixels dark).
    grey = img.convert("L")
    assert ImageStat.Stat(grey).stddev[0] > 8, ImageStat.Stat(grey).stddev
    assert len(grey.getcolors(256) or []) > 16  # text and icons, anti-aliased: many grey levels
    dark = sum(grey.histogram()[:128]) / (img.size[0] * img.size[1])
    assert dark > 0.003, dark  # text on it, not just the sidebar's and the table's lines


def test_the_page_lists_the_door_s_and_the_camera_s_entities(shot: Shot) -> None:
    """Read from the rendered DOM through its shadow roots: a row per entity, with its name, id and integration."""
    assert "/auth/" not in shot.page.url, shot.page.url  # logged in: not sent to the login page
    for eid in shot.entities.values():
        rows = [r for r in shot.page.rows if eid in r.split(" | ")]
        assert len(rows) == 1, (eid, shot.page.rows)
        assert shot.friendly[eid] in rows[0] and "MQTT" in rows[0], rows[0]


def test_the_page_names_no_enrolled_person(shot: Shot) -> None:
    assert shot.page.text and shot.entities["recognition"] in shot.page.text
    assert ENROLLED not in shot.page.text and "alice" not in shot.page.text.lower()
    assert "0.93" not in shot.page.text


def test_a_page_that_never_shows_what_is_expected_is_a_timeout_not_a_hang(shot: Shot, tmp_path: Path) -> None:
    # What the rows held after 3 s depends on how fast this machine's Chromium renders (CI's showed none yet):
    # the message must give them, whatever they were, and the call must end near its timeout.
    start = time.monotonic()
    message = r"\['lock.no_such_door'\] not rendered after 3 s; at http://.* rows \["
    with pytest.raises(TimeoutError, match=message) as e:
        shot.ha.screenshot(tmp_path / "never.png", expect=["lock.no_such_door"], timeout=3)
    assert time.monotonic() - start < 3 + 40, "a page load is bounded by the timeout too, plus Chromium's start"
    assert "/config/entities" in str(e.value) and not (tmp_path / "never.png").exists()


def test_without_chromium_the_screenshot_names_what_to_install(
    shot: Shot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peep.lab.processes import homeassistant

    monkeypatch.setattr(homeassistant, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setattr(homeassistant.shutil, "which", lambda name: None)
    with pytest.raises(PartUnavailable, match="apt-get install chromium chromium-driver"):
        shot.ha.screenshot(tmp_path / "none.png")


def test_write_the_docs_picture(shot: Shot) -> None:
    """With ``$PEEP_HA_SCREENSHOT=docs/img/home_assistant_entities.png``: the picture for docs/HOME_ASSISTANT.md,
    re-encoded to a palette PNG (the page has few colours: a fraction of the bytes, nothing visible lost)."""
    out = os.environ.get("PEEP_HA_SCREENSHOT")
    if not out:
        pytest.skip("$PEEP_HA_SCREENSHOT names no file to write the docs' picture to")
    from PIL import Image

    img = Image.open(io.BytesIO(shot.png)).convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    img.save(out, format="PNG", optimize=True)
    assert 0 < Path(out).stat().st_size < DOCS_MAX_BYTES
