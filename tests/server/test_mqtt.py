"""MQTT ingest against the real Mosquitto (127.0.0.1:1883): shared subscription, dead letters, events, bundle."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from peep.core.bundle import ProjectionBundle
from peep.server.bundles.catalog import files_from_message
from peep.v1 import recognition_pb2
from peep_testing.server import MQTT_PREFIX, SITE, base_config, mqtt_available, start_server

pytestmark = pytest.mark.mqtt


@pytest.fixture(scope="module", autouse=True)
def _broker():
    reason = mqtt_available()
    if reason:
        pytest.skip(reason)


class Listener:
    """A plain MQTT client collecting messages (what a device or an operator would see)."""

    def __init__(self, *topics: str) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.cond = threading.Condition()
        self.ready = threading.Event()
        c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"listener-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
        )
        c.on_connect = lambda cl, *a: [cl.subscribe(t, qos=1) for t in topics]
        c.on_subscribe = lambda *a: self.ready.set()
        c.on_message = self._on_message
        c.connect("127.0.0.1", 1883)
        c.loop_start()
        assert self.ready.wait(5)
        self.client = c

    def _on_message(self, client, userdata, msg):
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10.0) -> list[mqtt.MQTTMessage]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.messages) >= n, timeout)
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publisher() -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", 1883)
    c.loop_start()
    return c


def topic(site: str = SITE, device: str = "cam-1", leaf: str = "templates") -> str:
    return f"{MQTT_PREFIX}/{site}/{device}/{leaf}"


def publish_all(c: mqtt.Client, items: list[tuple[str, bytes]]) -> None:
    infos = [c.publish(t, p, qos=1) for t, p in items]
    for info in infos:
        info.wait_for_publish(10)


def wait_for(pred, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def mqtt_config(tmp_path, keypair, bundle_dir, group: str | None = None, mqtt_connections: int = 4, **sections):
    cfg = base_config(
        tmp_path,
        keypair[3],
        bundle_dir,
        mqtt={
            "enabled": True,
            "share_group": group or f"g{uuid.uuid4().hex[:8]}",
            "client_id": f"srv-{uuid.uuid4().hex[:8]}",
            "connections": mqtt_connections,
        },
        **sections,
    )
    cfg["auth"]["allow_insecure"] = True
    return cfg


def test_templates_over_mqtt_are_stored_once_and_bad_ones_dead_lettered(tmp_path, pki, keypair, bundle_dir, templates):
    dead = Listener(f"{MQTT_PREFIX}/deadletter")
    srv = start_server(mqtt_config(tmp_path, keypair, bundle_dir), pki, tmp_path, mqtt_wait=10)
    pub = publisher()
    try:
        good = [templates.message(i) for i in range(50)]
        payloads = [(topic(), m.SerializeToString()) for m in good]
        publish_all(pub, payloads + payloads[:10])  # ten redeliveries
        store = srv.services.store
        assert wait_for(lambda: srv.app.mqtt.processed >= 60)
        assert store.count_received() == 50

        nan = templates.message(60)
        nan.values[0] = float("nan")
        bad = [
            (topic(), b"\x0a\xff\xff\xff not protobuf"),
            (topic(device="cam-2"), templates.message(61).SerializeToString()),  # topic says cam-2, message cam-1
            (topic(device="cam-9"), templates.message(62, device_id="cam-9").SerializeToString()),  # unregistered
            (topic(), nan.SerializeToString()),
            (topic(), templates.message(63, values=templates.X[0][:64]).SerializeToString()),
        ]
        publish_all(pub, bad)
        got = dead.wait(len(bad))
        assert len(got) == len(bad)
        docs = [json.loads(m.payload) for m in got]
        assert {d["code"] for d in docs} == {
            "malformed",
            "topic_mismatch",
            "unknown_device",
            "non_finite",
            "wrong_dimension",
        }
        # A template that could be read names its message id: the device's record of it meets the refusal.
        ids = {d["code"]: d.get("message_id") for d in docs}
        assert ids["malformed"] is None
        assert ids["non_finite"] == nan.message_id and ids["unknown_device"] and ids["wrong_dimension"]
        for d in docs:
            assert set(d) - {"message_id"} == {"topic", "code", "reason", "size"}
        sizes = {d["code"]: d["size"] for d in docs}
        assert sizes["malformed"] == len(bad[0][1])
        raw = b"".join(m.payload for m in got)
        assert bad[3][1][-40:] not in raw  # the payload itself is never republished
        assert store.count_received() == 50
        m = srv.services.metrics
        assert m.value("peep_ingest_rejected_total", {"transport": "mqtt", "reason": "topic_mismatch"}) == 1
        assert m.value("peep_ingest_templates_total", {"transport": "mqtt", "status": "accepted"}) == 50
        assert m.value("peep_ingest_templates_total", {"transport": "mqtt", "status": "duplicate"}) == 10
        assert m.value("peep_mqtt_connected") == 1
    finally:
        pub.disconnect()
        dead.close()
        srv.app.stop(0)


def test_bundle_is_announced_retained(tmp_path, pki, keypair, bundle_dir, bundle):
    srv = start_server(mqtt_config(tmp_path, keypair, bundle_dir), pki, tmp_path, mqtt_wait=10)
    try:
        late = Listener(f"{MQTT_PREFIX}/bundle")  # subscribes after the announcement: retained
        msgs = late.wait(1)
        late.close()
        assert msgs and msgs[0].retain
        files = recognition_pb2.BundleFiles.FromString(msgs[-1].payload)
        assert files.bundle_id == bundle.bundle_id
        assert ProjectionBundle.from_files(files_from_message(files), keypair[1]).bundle_id == bundle.bundle_id
    finally:
        srv.app.stop(0)


@pytest.mark.parametrize("require_all", [False, True], ids=["keyed-devices", "require_device_signatures"])
def test_a_template_on_a_devices_topic_counts_only_with_that_devices_signature(
    tmp_path, pki, keypair, bundle_dir, templates, decision_keys, require_all
):
    """Anyone the broker lets publish can write a device's topic: the topic alone names no one.

    cam-1 has a registered key: unsigned, wrongly signed and altered-after-signing templates are dead-lettered
    and counted nowhere; a door's VERIFY also needs the server's signed answer to its claim check for that very
    nonce. cam-2 has none: its identifications are taken on the topic alone unless every device must sign
    (``auth.require_device_signatures``), and its VERIFY never is.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from peep.core.signing import door_statement, public_key_text, sign_statement, sign_template

    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    cfg = mqtt_config(tmp_path, keypair, bundle_dir)
    cfg["mqtt"]["decision_signing_key"] = str(decision_keys[2])
    cfg["auth"]["devices"][0]["signing_key"] = public_key_text(key.public_key())
    cfg["auth"]["require_device_signatures"] = require_all
    dead = Listener(f"{MQTT_PREFIX}/deadletter")
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
    pub = publisher()

    def signed(m, k=key):
        sign_template(k, m)
        return m

    def ticket(m, nonce=None, by=decision_keys[0]):
        q = door_statement("claim_check", site=SITE, device_id=m.device_id, nonce=nonce or m.message_id,
                           subject=m.subject, verdict=True)  # fmt: skip
        m.claim_signature = sign_statement(by, q)
        return m

    try:
        good = signed(templates.message(0))
        altered = signed(templates.message(1))
        altered.values[0] += 0.5  # changed after it was signed (a recorded template re-labelled, say)
        subject = str(templates.subjects[2])
        verify = [
            signed(templates.message(2, purpose="verify", subject=subject)),  # no claim ticket
            signed(ticket(templates.message(3, purpose="verify", subject=subject), nonce="ab" * 16)),  # another nonce
            signed(ticket(templates.message(4, purpose="verify", subject=subject), by=Ed25519PrivateKey.generate())),
        ]
        cam2 = templates.message(5, device_id="cam-2")
        cam2_verify = ticket(templates.message(6, device_id="cam-2", purpose="verify", subject=subject))
        refused = [
            (topic(), templates.message(7).SerializeToString(), "unsigned"),
            (topic(), signed(templates.message(8), other).SerializeToString(), "bad_signature"),
            (topic(), altered.SerializeToString(), "bad_signature"),
            *[(topic(), m.SerializeToString(), "unasked_claim") for m in verify],
            (topic(device="cam-2"), cam2_verify.SerializeToString(), "unsigned"),
        ]
        if require_all:
            refused.append((topic(device="cam-2"), cam2.SerializeToString(), "unsigned"))
        taken = [(topic(), good.SerializeToString())]
        if not require_all:
            taken.append((topic(device="cam-2"), cam2.SerializeToString()))
        publish_all(pub, [(t, p) for t, p, _ in refused] + taken)
        got = dead.wait(len(refused))
        assert sorted(json.loads(m.payload)["code"] for m in got) == sorted(c for _, _, c in refused)
        assert wait_for(lambda: srv.app.mqtt.processed >= len(refused) + len(taken))
        assert srv.services.store.count_received() == len(taken)  # only what its device sent is counted
    finally:
        pub.disconnect()
        dead.close()
        srv.app.stop(0)


def test_recognition_events_are_published_per_device(
    tmp_path, pki, keypair, bundle_dir, templates, trained_server, decision_keys
):
    """An identification and a door's VERIFY (signed by the device, carrying the server's answer to its claim
    check) each get their event on the device's events topic; the VERIFY's names the template it decided."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from peep.core.signing import door_statement, public_key_text, sign_statement, sign_template
    from peep.core.wire import template_digest

    device_key = Ed25519PrivateKey.generate()
    cfg = mqtt_config(tmp_path, keypair, bundle_dir, training={"model_dir": str(trained_server.tmp / "models")})
    cfg["mqtt"]["decision_signing_key"] = str(decision_keys[2])
    cfg["auth"]["devices"][0]["signing_key"] = public_key_text(device_key.public_key())
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
    events = Listener(topic(leaf="events"))
    pub = publisher()
    try:
        assert srv.services.recogniser.model is not None
        i = int(templates.test[5])
        ident = templates.message(i, track_id="t-42")
        ver = templates.message(i, purpose="verify", subject=str(templates.subjects[i]))
        asked = door_statement("claim_check", site=SITE, device_id="cam-1", nonce=ver.message_id, subject=ver.subject,
                               verdict=True)  # fmt: skip
        ver.claim_signature = sign_statement(decision_keys[0], asked)
        for m in (ident, ver):
            sign_template(device_key, m)
        publish_all(pub, [(topic(), ident.SerializeToString()), (topic(), ver.SerializeToString())])
        got = events.wait(2)
        docs = {d["message_id"]: d for d in (json.loads(m.payload) for m in got)}
        e = docs[ident.message_id]
        assert e["purpose"] == "identify" and e["track_id"] == "t-42" and e["model_version"] == "v000001"
        assert e["site"] == SITE and e["device_id"] == "cam-1" and 0 <= e["probability"] <= 1
        assert e["unknown"] == (e["subject"] == "")
        v = docs[ver.message_id]
        assert v["purpose"] == "verify" and v["claimed_subject"] == ver.subject and isinstance(v["accepted"], bool)
        assert v["template_sha256"] == template_digest(ver) and v["signature"]
    finally:
        pub.disconnect()
        events.close()
        srv.app.stop(0)


def test_edge_and_server_agree_on_a_non_default_topic_root(tmp_path, pki, keypair, bundle_dir, bundle, templates):
    """Same mqtt.topic_prefix on both sides (not the default): templates reach the server, bundle and events the device.

    The edge's MqttLink and the server's MqttBridge both take their topics from peep.core.topics.
    """
    from peep.core.topics import DEFAULT_ROOT
    from peep.edge.config import MqttConfig as EdgeMqttConfig
    from peep.edge.transport.mqtt import MqttLink
    from peep.server.ingest.events import new_event

    assert MQTT_PREFIX != DEFAULT_ROOT
    srv = start_server(mqtt_config(tmp_path, keypair, bundle_dir), pki, tmp_path, mqtt_wait=10)
    bundles: list[bytes] = []
    events: list[dict] = []
    link = MqttLink(
        EdgeMqttConfig(host="127.0.0.1", port=1883, tls=False, topic_prefix=MQTT_PREFIX),
        client_id=f"edge-{uuid.uuid4().hex[:8]}",
        site=SITE,
        device_id="cam-1",
        on_bundle=bundles.append,
        on_event=events.append,
        publish_status=False,  # no retained status left on the shared broker
    )
    link.start()
    try:
        assert link.wait_connected(10)
        assert link.templates_topic == topic()
        msg = templates.message(0)
        link.publish_template(msg.SerializeToString())
        assert wait_for(lambda: srv.services.store.count_received() == 1)
        assert srv.app.mqtt.deadletters == 0
        assert wait_for(lambda: bool(bundles)), "the retained bundle announcement reached the device"
        assert recognition_pb2.BundleFiles.FromString(bundles[-1]).bundle_id == bundle.bundle_id
        ev = new_event(site=SITE, device_id="cam-1", message_id=msg.message_id)
        srv.app.mqtt.publish_event(ev)
        assert wait_for(lambda: any(e.get("event_id") == ev.event_id for e in events))
    finally:
        link.stop()
        srv.app.stop(0)


def test_replicas_split_the_load_through_the_shared_subscription(tmp_path, pki, keypair, bundle_dir, templates, pg_dsn):
    group = f"g{uuid.uuid4().hex[:8]}"
    storage = {"backend": "postgres", "dsn": pg_dsn}
    a = start_server(
        mqtt_config(tmp_path / "a", keypair, bundle_dir, group, storage=storage), pki, tmp_path, mqtt_wait=10
    )
    b = start_server(
        mqtt_config(tmp_path / "b", keypair, bundle_dir, group, storage=storage), pki, tmp_path, mqtt_wait=10
    )
    pub = publisher()
    try:
        msgs = [templates.message(i) for i in range(300)]
        publish_all(pub, [(topic(), m.SerializeToString()) for m in msgs])
        assert wait_for(lambda: a.app.mqtt.processed + b.app.mqtt.processed >= 300)
        assert a.app.mqtt.processed > 0 and b.app.mqtt.processed > 0  # both replicas took a share
        assert a.services.store.count_received() == 300  # one PostgreSQL, every template once
    finally:
        pub.disconnect()
        b.app.stop(0)
        a.app.stop(0)


def test_stop_stores_and_acks_everything_already_received(tmp_path, pki, keypair, bundle_dir, templates):
    srv = start_server(mqtt_config(tmp_path, keypair, bundle_dir), pki, tmp_path, mqtt_wait=10)
    pub = publisher()
    msgs = [templates.message(i) for i in range(400)]
    publish_all(pub, [(topic(), m.SerializeToString()) for m in msgs])
    wait_for(lambda: srv.app.mqtt.processed > 0, 10)
    srv.app.stop(5.0)  # graceful: whatever was delivered is committed before disconnecting
    pub.disconnect()
    from peep.server.storage.sqlite import SqliteStore

    s = SqliteStore(tmp_path / "peep.db")
    try:
        assert s.count_received() == srv.app.mqtt.processed > 0
    finally:
        s.close()
    assert os.path.exists(tmp_path / "peep.db")


def test_a_failing_database_is_retried_without_losing_templates(tmp_path, pki, keypair, bundle_dir, templates):
    from peep.server.storage import StoreError

    srv = start_server(mqtt_config(tmp_path, keypair, bundle_dir, mqtt_connections=1), pki, tmp_path, mqtt_wait=10)
    real = srv.services.ingestor.store
    failures = {"left": 2}

    class Flaky:
        def __getattr__(self, name):
            return getattr(real, name)

        def commit_ingest(self, batch):
            if failures["left"]:
                failures["left"] -= 1
                raise StoreError("database unavailable (test)")
            return real.commit_ingest(batch)

    srv.services.ingestor.store = Flaky()
    pub = publisher()
    try:
        msgs = [templates.message(i) for i in range(10)]
        publish_all(pub, [(topic(), m.SerializeToString()) for m in msgs])
        assert wait_for(lambda: srv.app.mqtt.processed >= 10)
        assert failures["left"] == 0 and real.count_received() == 10
    finally:
        pub.disconnect()
        srv.app.stop(0)


def test_a_take_blocked_on_a_full_queue_gives_up_at_the_stop():
    """Back-pressure blocks paho's thread while the writer's queue is full, but never past a stop: once the writer
    has stopped nothing empties the queue, and a put blocked for ever hung loop_stop() and the process on
    SIGTERM with a backlog. The message is then not queued (not acknowledged: redelivered on resume)."""
    import queue
    from types import SimpleNamespace

    from peep.server.transport.mqtt import MqttBridge

    bridge = MqttBridge.__new__(MqttBridge)  # only what _take reads: no broker, no services
    bridge._closing, bridge._stop = threading.Event(), threading.Event()
    bridge._queue = queue.Queue(1)
    bridge._queue.put("the writer's backlog")
    bridge._gen = [1]
    msg = SimpleNamespace(topic="peep/v1/lobby/cam-1/templates", payload=b"t", mid=7, qos=1, retain=False)
    result: list[bool] = []
    taker = threading.Thread(target=lambda: result.append(bridge._take(None, 0, msg)), daemon=True)
    taker.start()
    taker.join(0.5)
    assert taker.is_alive(), "back-pressure: the put waits while the writer runs"
    bridge._stop.set()
    taker.join(2.0)
    assert not taker.is_alive() and result == [False]
    assert bridge._queue.qsize() == 1
