"""The Home Assistant page over real HTTPS: off, it says how to turn the integration on; on, it shows what the
server's discovery published (entities, devices left out and why, configurations removed, events, the last publish
and the last error) with the ε each shown device spent, as the Devices page counts it, and names no one."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import paho.mqtt.client as mqtt
from peep.core.topics import TopicScheme
from peep.server.console.render import format_number
from peep.server.transport.homeassistant import DiscoveredDevice, HomeAssistantDiscovery, HomeAssistantPublisher
from peep.v1 import recognition_pb2, template_pb2


class _Client:
    """paho's client as the publisher uses it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> Any:
        self.sent.append((topic, payload))
        info = mqtt.MQTTMessageInfo(len(self.sent))
        info.rc = mqtt.MQTT_ERR_SUCCESS
        return info


class _Msg:
    def __init__(self, topic: str, payload: bytes) -> None:
        self.topic, self.payload, self.retain = topic, payload, True


@contextmanager
def _configured(console: Any, **values: Any) -> Iterator[None]:
    """The console's server with other values in its configuration for one test (``section.key``)."""
    cfg = console.server.services.config
    old = {}
    for key, value in values.items():
        section, name = key.split(".")
        target = getattr(cfg, section)
        old[key] = getattr(target, name)
        object.__setattr__(target, name, value)
    try:
        yield
    finally:
        for key, value in old.items():
            section, name = key.split(".")
            object.__setattr__(getattr(cfg, section), name, value)


def _page(console: Any) -> str:
    with console.login("olga") as c:
        r = c.get("/home-assistant")
    assert r.status_code == 200, r.text[:500]
    return html.unescape(r.text)


def test_off_the_page_says_so_and_how_to_turn_it_on(console):
    page = _page(console)
    assert 'href="/home-assistant"' in page and 'aria-current="page">Home Assistant<' in page  # in the nav
    assert 'id="ha-disabled"' in page and "[home_assistant] enabled = true" in page and "[mqtt] enabled = true" in page
    assert '<td id="ha-enabled">no</td>' in page and "Entities published" not in page


def test_on_the_page_shows_what_was_published_left_out_removed_and_refused_and_the_epsilon_spent(console, monkeypatch):
    from peep_testing.server import DEVICE_TOKENS, auth

    services = console.server.services
    # cam-2 releases one template of its own: the ε the page shows is the ingest ledger's, as on Devices.
    msg = console.faces.message(1, device="cam-2")
    console.server.stub().Identify(recognition_pb2.IdentifyRequest(template=msg, top_k=1),
                                   metadata=auth(DEVICE_TOKENS["cam-2"]), timeout=10)  # fmt: skip
    services.ingestor.decisions.flush()
    root = TopicScheme(services.config.mqtt.device_mount_point + services.config.mqtt.topic_prefix)
    client = _Client()
    pub = HomeAssistantPublisher(HomeAssistantDiscovery(root), services.devices, publisher=lambda: client,
                                 connected=lambda: True, recent_minutes=20)  # fmt: skip
    stale = HomeAssistantDiscovery(root).configs([DiscoveredDevice(device_id="cam-gone", site="lobby", door=False)])
    try:
        for topic, payload in stale.items():  # an earlier run's camera, unregistered since
            pub.take(_Msg(topic, payload))
        pub.announce()
        pub.event(recognition_pb2.RecognitionEvent(site="lobby", device_id="cam-2", subject="alice", track_id="t1",
                                                   purpose=template_pb2.PURPOSE_IDENTIFY))  # fmt: skip
        refused = mqtt.ReasonCode(mqtt.PacketTypes.PUBACK, identifier=0x87)
        pub.published(client, None, 1, refused, None)  # the broker's ACL refused the first configuration
        monkeypatch.setattr(console.server.app.console.console, "home_assistant", lambda: pub)
        with _configured(console, **{"home_assistant.enabled": True, "mqtt.enabled": True,
                                     "home_assistant.recent_minutes": 20}):  # fmt: skip
            page = _page(console)
    finally:
        pub.stop()
    assert 'id="ha-disabled"' not in page and '<td id="ha-enabled">yes</td>' in page
    state = pub.state()
    for topic in state.entities:
        assert f"<code>{topic}</code>" in page
    assert "homeassistant/sensor/peep_lobby_cam-2/recognised_recently/config" in state.entities
    left_out = re.search(r'<ul id="ha-left-out">(.*?)</ul>', page, re.S)
    assert left_out and "cam-1: an enrolment desk" in left_out.group(1)
    removed = re.search(r'<ul id="ha-removed">(.*?)</ul>', page, re.S)
    assert removed and set(re.findall(r"<code>(.*?)</code>", removed.group(1))) == set(stale)
    assert '<td id="ha-events">1</td>' in page and "<time" in page.split('id="ha-last-publish"')[1][:80]
    errors = re.search(r'<td id="ha-errors"[^>]*>(.*?)</td>', page, re.S)
    assert errors and errors.group(1).startswith("1") and "refused by the broker (Not authorized)" in errors.group(1)
    assert client.sent[0][0] in errors.group(1)  # the topic the broker refused
    # The ε cam-2 spent, as the Devices page counts it; its count (one person), never who.
    row = re.search(r"<tr><td>cam-2</td>.*?</tr>", page, re.S)
    assert row, page[:3000]
    spent = {d.device_id: d for d in console.server.app.console.console.store.devices()}["cam-2"]
    assert spent.epsilon_vector_total > 0
    assert f'<td class="eps-total">{format_number(spent.epsilon_vector_total)}</td>' in row.group(0)
    assert '<td class="n">1</td>' in row.group(0) and "20 minutes" in page
    assert "alice" not in page.split("<main>")[1]
