"""A person's own Home Assistant entity: only for subjects who opted in, emptied when they opt out or are erased;
everyone else's decisions name nobody. On the publisher's payloads, and on the real broker a running server
publishes to."""

from __future__ import annotations

import json
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from peep.core.topics import TopicScheme
from peep.server.config import DeviceConfig
from peep.server.ingest.auth import DeviceRegistry
from peep.server.storage import ShownPerson
from peep.server.transport.homeassistant import HomeAssistantDiscovery, HomeAssistantPublisher
from peep.server.transport.homeassistant_people import person_slug
from peep.v1 import recognition_pb2, template_pb2
from peep_testing.broker import TopicWatcher

ROOT = TopicScheme("devices/peep/v1")
ALICE_CONFIG = "homeassistant/sensor/peep_lobby_person_alice/last_seen/config"
ALICE_STATE = "devices/peep/v1/lobby/people/alice/last_seen"


class _Client:
    """paho's client as the publisher uses it: each publish noted."""

    def __init__(self):
        self.sent: list[tuple[str, bytes, bool]] = []

    def publish(self, topic, payload, qos=0, retain=False):
        self.sent.append((topic, bytes(payload), retain))
        info = mqtt.MQTTMessageInfo(len(self.sent))
        info.rc = mqtt.MQTT_ERR_SUCCESS
        return info

    def retained(self):
        """What the broker would hold: the last retained payload per topic, empty ones dropped."""
        out: dict[str, bytes] = {}
        for topic, payload, retain in self.sent:
            if retain:
                out[topic] = payload
        return {t: p for t, p in out.items() if p}


class _People:
    """The store's ``home_assistant_people``, as a dict the test changes (or makes fail)."""

    def __init__(self, **names):
        self.rows = {s: ShownPerson(s, n, 1000.0) for s, n in names.items()}
        self.fails = False

    def __call__(self):
        if self.fails:
            raise OSError("the database is away")
        return dict(self.rows)


def _publisher(client, people, *, mono=None):
    reg = DeviceRegistry([DeviceConfig(id="cam-2", site="lobby"), DeviceConfig(id="door-1", site="lobby", door=True),
                          DeviceConfig(id="cam-1", site="lobby", enrolment_desk=True)])  # fmt: skip
    mono = mono or [100.0]
    return HomeAssistantPublisher(HomeAssistantDiscovery(ROOT, version="0.1.0"), reg, publisher=lambda: client,
                                  connected=lambda: True, clock=lambda: 1_700_000_000.0, monotonic=lambda: mono[0],
                                  people=people)  # fmt: skip


def _event(subject="", *, device="cam-2", purpose=template_pb2.PURPOSE_IDENTIFY, unknown=False, **kw):
    ev = recognition_pb2.RecognitionEvent(site="lobby", device_id=device, event_id="e1", message_id="m1",
                                          purpose=purpose, subject=subject, unknown=unknown, decided_on="server",
                                          track_id="t9", **kw)  # fmt: skip
    ev.time.FromSeconds(1_700_000_123)
    return ev


def _events(client, device="cam-2"):
    return [json.loads(p) for t, p, r in client.sent if t == f"devices/peep/v1/lobby/{device}/recognition"]


def test_nobody_opted_in_nobody_named_and_no_person_entity():
    client = _Client()
    pub = _publisher(client, _People())
    try:
        pub.announce()
        pub.event(_event("alice"))
        assert not [t for t, _, _ in client.sent if "person" in t or "/people/" in t]
        assert _events(client) == [{"event_type": "enrolled_person", "decided_on": "server", "track": "t9"}]
        assert b"alice" not in b" ".join(p for _, p, _ in client.sent)
    finally:
        pub.stop()


def test_an_opted_in_person_has_a_last_seen_sensor_and_is_named_only_in_their_own_decisions():
    client, people = _Client(), _People(alice="Alice B.")
    pub = _publisher(client, people)
    try:
        pub.announce()
        config = json.loads(client.retained()[ALICE_CONFIG])
        assert config["device"]["name"] == "Alice B." and config["device"]["model"] == "person"
        assert config["state_topic"] == config["json_attributes_topic"] == ALICE_STATE
        assert config["value_template"] == "{{ value_json.camera }}" and config["origin"]["name"] == "PEEP"
        assert config["unique_id"] == "peep_lobby_person_alice_last_seen" and "availability_topic" not in config
        assert ALICE_STATE not in client.retained()  # no state until they are seen
        for ev in [
            _event("alice"),
            _event("bob"),
            _event(unknown=True),
            _event(
                "alice", device="door-1", purpose=template_pb2.PURPOSE_VERIFY, claimed_subject="alice", accepted=True
            ),
            _event("alice", device="cam-1"),
        ]:  # the enrolment desk is not shown: its decisions name nobody
            pub.event(ev)
        state = json.loads(client.retained()[ALICE_STATE])
        assert state == {"camera": "cam-2", "site": "lobby", "at": "2023-11-14T22:15:23+00:00"}
        assert [t for t, _, r in client.sent if t == ALICE_STATE] == [ALICE_STATE]  # once: the one at cam-2
        assert [e.get("person") for e in _events(client)] == ["Alice B.", None, None]
        assert _events(client)[0] == {"event_type": "enrolled_person", "decided_on": "server", "track": "t9",
                                      "person": "Alice B."}  # fmt: skip
        assert b"Alice" not in b" ".join(p for t, p, _ in client.sent if "door-1" in t or "cam-1" in t)
        # Bob did not opt in: nothing anywhere names him or has an entity of his.
        assert not [t for t, p, _ in client.sent if "bob" in t or b"bob" in p]
        assert pub.people.shown == 1
    finally:
        pub.stop()


def test_an_opt_out_empties_the_person_s_topics_and_nothing_more_is_published_for_them():
    client, people = _Client(), _People(alice="Alice", carol="Carol")
    pub = _publisher(client, people)
    try:
        pub.announce()
        pub.event(_event("alice"))
        assert {ALICE_CONFIG, ALICE_STATE} <= set(client.retained())
        del people.rows["alice"]
        pub.refresh()  # the publisher's timer re-reads the list
        emptied = [(t, r) for t, p, r in client.sent if p == b""]
        assert emptied == [(ALICE_CONFIG, True), (ALICE_STATE, True)]
        n = len(client.sent)
        pub.event(_event("alice"))
        pub.refresh()
        pub.announce()
        after = client.sent[n:]
        assert not [t for t, p, _ in after if "alice" in t or b"Alice" in p]
        assert [e.get("person") for e in _events(client)] == ["Alice", None]
        assert "homeassistant/sensor/peep_lobby_person_carol/last_seen/config" in client.retained()  # still shown
    finally:
        pub.stop()


def test_a_changed_name_is_published_again_and_an_unchanged_list_is_not():
    client, people = _Client(), _People(alice="Alice")
    pub = _publisher(client, people)
    try:
        pub.announce()
        n = len(client.sent)
        pub.refresh()
        assert not [t for t, _, _ in client.sent[n:] if "person" in t]
        people.rows["alice"] = ShownPerson("alice", "Alice Liddell", 2000.0)
        pub.people.reload()  # what the console does when it changes the list
        assert json.loads(client.retained()[ALICE_CONFIG])["device"]["name"] == "Alice Liddell"
    finally:
        pub.stop()


def test_a_list_that_cannot_be_read_names_nobody_once_it_is_old_and_empties_nothing():
    client, people, mono = _Client(), _People(alice="Alice"), [100.0]
    pub = _publisher(client, people, mono=mono)
    try:
        pub.announce()
        people.fails = True
        mono[0] += 10
        pub.refresh()
        pub.event(_event("alice"))
        assert _events(client)[-1]["person"] == "Alice"  # read 10 s ago: still the list
        mono[0] += 25
        pub.refresh()
        n = len(client.sent)
        pub.event(_event("alice"))
        assert "person" not in _events(client)[-1] and not [t for t, _, _ in client.sent[n:] if t == ALICE_STATE]
        assert not [t for t, p, _ in client.sent if p == b""]  # a database away is not an opt-out
        people.fails = False
        pub.refresh()
        pub.event(_event("alice"))
        assert _events(client)[-1]["person"] == "Alice"
    finally:
        pub.stop()


def _left_over(subject, site="lobby", name="Someone"):
    """A person's configuration as an earlier run published it."""
    client = _Client()
    pub = _publisher(client, _People(**{subject: name}))
    pub.people.announce([site])
    pub.stop()
    return {t: p for t, p in client.retained().items() if t.endswith("/config")}


def test_an_earlier_run_s_entity_of_someone_no_longer_opted_in_is_emptied_and_no_one_else_s():
    class _Msg:
        def __init__(self, topic, payload):
            self.topic, self.payload, self.retain = topic, payload, True

    client = _Client()
    pub = _publisher(client, _People(alice="Alice"))
    try:
        gone = _left_over("carol")
        elsewhere = _left_over("dave", site="garage")  # a site this server registers no device at
        kept = _left_over("alice")
        doc = json.loads(next(iter(gone.values())))
        foreign = {"homeassistant/sensor/peep_lobby_person_erin/last_seen/config":
                   json.dumps({**doc, "origin": {"name": "Frigate"}}).encode()}  # fmt: skip
        for topic, payload in [*gone.items(), *elsewhere.items(), *kept.items(), *foreign.items()]:
            assert pub.take(_Msg(topic, payload))
        pub.announce()
        emptied = {t for t, p, _ in client.sent if p == b""}
        assert emptied == {*gone, "devices/peep/v1/lobby/people/carol/last_seen"}
        assert pub.removed_total == 0  # the devices' removals are counted apart
    finally:
        pub.stop()


def test_an_id_home_assistant_cannot_take_gets_a_slug_of_its_own():
    assert person_slug("alice") == "alice" and person_slug("a_b-2") == "a_b-2"
    odd = ["a.b", "a b", "a@b", "zoë", "a_b"]
    assert len({person_slug(s) for s in odd}) == len(odd)
    assert all(set(person_slug(s)) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-") for s in odd)


# ------------------------------------------------------------ a running server and the real broker


@pytest.mark.mqtt
def test_a_server_names_an_opted_in_person_and_never_anyone_else_on_the_broker(tmp_path, pki, keypair, bundle_dir):
    """The running server and the real broker: alice opted in before it started, bob never did. Every retained topic
    and every message under the prefix and the root names alice only, on her entity and her own decisions; after
    her opt-out (the console's path: the store, then the publisher re-reads at once) her topics are empty and a
    fresh subscriber finds nothing of her."""
    from peep_testing.server import MQTT_PREFIX, SITE, base_config, mqtt_available, start_server

    if (reason := mqtt_available()) is not None:
        pytest.skip(reason)
    prefix = f"hap-test-{uuid.uuid4().hex[:8]}"
    config_topic = f"{prefix}/sensor/peep_{SITE}_person_alice-{prefix[-8:]}/last_seen/config"
    alice = f"alice-{prefix[-8:]}"  # the shared broker's root is every test's: a subject of this test's own
    bob = f"bob-{prefix[-8:]}"
    state_topic = f"{MQTT_PREFIX}/{SITE}/people/{alice}/last_seen"
    filters = (f"{prefix}/#", f"{MQTT_PREFIX}/{SITE}/+/recognition", f"{MQTT_PREFIX}/{SITE}/people/#")
    w = TopicWatcher(*filters)
    srv = None
    try:
        cfg = base_config(tmp_path, keypair[3], bundle_dir,
                          mqtt={"enabled": True, "share_group": f"g{uuid.uuid4().hex[:8]}", "connections": 1},
                          home_assistant={"enabled": True, "discovery_prefix": prefix})  # fmt: skip
        cfg["auth"]["allow_insecure"] = True
        from peep.server.storage.sqlite import SqliteStore

        seed = SqliteStore(tmp_path / "peep.db")
        seed.set_home_assistant_person(alice, "Alice Liddell", time.time())
        seed.close()
        srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
        ha = srv.app.mqtt.home_assistant
        assert w.wait(lambda: config_topic in w.got), sorted(w.got)
        config = json.loads(w.got[config_topic])
        assert config["device"]["name"] == "Alice Liddell" and config["state_topic"] == state_topic

        for subject in (alice, bob, ""):
            ev = _event(subject, unknown=not subject)
            ev.site = SITE
            srv.services.events.publish(ev)
        recognition = f"{MQTT_PREFIX}/{SITE}/cam-2/recognition"
        assert w.wait(lambda: len([t for t, _, _ in w.log if t == recognition]) == 3 and state_topic in w.got)
        events = [json.loads(p) for t, p, _ in w.log if t == recognition]
        assert [(e["event_type"], e.get("person")) for e in events] == [
            ("enrolled_person", "Alice Liddell"), ("enrolled_person", None), ("unknown", None),
        ]  # fmt: skip
        assert json.loads(w.got[state_topic])["camera"] == "cam-2"
        # Bob: no topic, no payload, retained or not, says anything of him.
        assert not [t for t, p, _ in w.log if "bob" in t or b"bob" in p]
        # Only alice's own entity and state name her (and her own event).
        naming = {t for t, p, _ in w.log if b"Alice" in p or "alice" in t}
        assert naming == {config_topic, state_topic, recognition}

        # What a Home Assistant connecting now reads: her two retained topics, nobody else's.
        fresh = TopicWatcher(*filters)
        try:
            assert fresh.wait(lambda: {config_topic, state_topic} <= set(fresh.got))
            time.sleep(0.3)
            assert {t for t in fresh.got if "person" in t or "/people/" in t} == {config_topic, state_topic}
        finally:
            fresh.close()

        # Her opt-out: emptied, retained, at once; nothing more of her.
        srv.services.store.clear_home_assistant_person(alice)
        ha.people.reload()
        assert w.wait(lambda: w.got.get(config_topic) == b"" and w.got.get(state_topic) == b"")
        n = len(w.log)
        ev = _event(alice)
        ev.site = SITE
        srv.services.events.publish(ev)
        assert w.wait(lambda: len([t for t, _, _ in w.log[n:] if t == recognition]) == 1)
        assert not [t for t, p, _ in w.log[n:] if b"Alice" in p or t in (config_topic, state_topic)]
        fresh = TopicWatcher(*filters)
        try:
            time.sleep(0.5)
            assert not [t for t in fresh.got if "person" in t or "/people/" in t], fresh.got
        finally:
            fresh.close()
    finally:
        if srv is not None:
            srv.app.stop()
        for t, p in list(w.got.items()):  # the shared broker keeps nothing of this test
            if p:
                w.publish(t, b"")
        w.close()
