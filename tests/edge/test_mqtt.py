"""MQTT delivery with a real Mosquitto: topics, status, exactly-once after dedupe across broker restarts,
bundle updates from the retained topic."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import numpy as np
import pytest
from peep.core.wire import decode_template
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.spool import Spool
from peep_testing.devicemodel import random_device_model
from peep_testing.edge import EDGE_SITE

pytestmark = pytest.mark.mqtt


def released_ids(agent: Agent) -> list[str]:
    """Message ids in release order, from the persistent ledger (what the device spent ε on)."""
    from peep.edge.ledger import SqliteLedger

    ledger = SqliteLedger(agent.cfg.ledger_path)
    try:
        return [s.message_id for s in ledger.entries() if s.key.startswith("track:")]
    finally:
        ledger.close()


@pytest.mark.slow
def test_agent_publishes_templates_status_and_metrics(
    system_broker, make_config, crowd_video, collector_factory, h, edge_bundle
):
    device = f"cam-{uuid.uuid4().hex[:8]}"
    host, port = system_broker
    base = f"peep/v1/{EDGE_SITE}/{device}"
    col = collector_factory(host, port, [f"{base}/#"])
    metrics_port = h.free_port()
    cfg = load_config(
        make_config(
            device={"id": device, "site": EDGE_SITE},
            capture={"source": crowd_video["path"], "max_fps": 40.0},
            privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 2.0, "min_track_frames": 2},
            metrics={"port": metrics_port},
        )
    )
    agent = Agent(cfg, environ={})
    thread, result = h.run_agent_in_thread(agent)
    assert col.wait_for(lambda: len(col.payloads()) >= 1, 30), "no template arrived"

    def scrape() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()

    # The publish latency is observed on the broker's PUBACK, which can reach the agent after the subscriber
    # has the template.
    assert col.wait_for(lambda: "peep_edge_publish_latency_seconds_bucket" in scrape(), 10)
    body = scrape()
    for name in (
        "peep_edge_frames_total",
        "peep_edge_faces_detected_total",
        "peep_edge_releases_total",
        "peep_edge_suppressed_total",
        'peep_edge_epsilon_spent{scope="vector"}',
        'peep_edge_epsilon_spent{scope="coordinate"}',
        "peep_edge_spool_depth",
        "peep_edge_publish_latency_seconds_bucket",
    ):
        assert name in body, name
    thread.join(60)
    assert result.get("rc") == 0, result
    ids = released_ids(agent)
    assert len(ids) >= 10
    assert col.wait_for(lambda: len(col.payloads()) >= len(ids), 10)
    msgs = [decode_template(p) for p in col.payloads()]
    got = [m.message_id for m in msgs]
    assert got == ids, "delivered in release order, each once"
    assert all(m.device_id == device and m.site == EDGE_SITE for m in msgs)
    assert all(len(m.values) == edge_bundle.n_components for m in msgs)
    statuses = col.payloads("/status")
    assert statuses[0] == b"online" and statuses[-1] == b"offline"
    # The device's report: one once connected, the final counts at shutdown (suppressed releases, the budgets).
    from peep.core.reports import parse_device_report

    reports = [parse_device_report(p) for p in col.payloads("/report")]
    assert len(reports) >= 2 and reports[0].releases <= reports[-1].releases
    last = reports[-1]
    assert last.releases == len(ids) and last.track_budget_vector == 1e6 and last.bundle_id == edge_bundle.bundle_id
    assert last.n_suppressed == sum(agent.pipeline.policy.suppressed.values()) > 0
    assert last.epsilon_vector_spent == pytest.approx(len(ids) * last.epsilon_vector_per_release)
    with Spool(cfg.spool_path, destinations=["mqtt"]) as spool:
        assert spool.depth() == 0
    assert agent.metrics.value("peep_edge_published_total", transport="mqtt") == len(ids)


@pytest.mark.slow
def test_broker_down_at_start_and_killed_mid_stream_every_template_arrives_once(
    mosquitto_factory, make_config, crowd_video, collector_factory, h, caplog
):
    caplog.set_level(logging.INFO, logger="peep")
    broker = mosquitto_factory()  # persistent, not started yet: unreachable at agent start
    cfg = load_config(
        make_config(
            capture={"source": crowd_video["path"], "max_fps": 30.0},
            privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 0.2, "min_track_frames": 1},
            mqtt={"port": broker.port, "reconnect_min_s": 1, "reconnect_max_s": 2, "max_inflight": 10},
            spool={"drain_timeout_s": 20.0},
        )
    )
    agent = Agent(cfg, environ={})
    thread, result = h.run_agent_in_thread(agent)
    time.sleep(1.5)
    assert thread.is_alive(), result
    assert agent.spool is not None and agent.spool.depth("mqtt") > 0, "templates wait in the spool"
    assert any(getattr(r, "msg", "") == "mqtt_unreachable" for r in caplog.records)
    broker.start()
    col = collector_factory(
        "127.0.0.1", broker.port, ["peep/v1/lab/cam-1/templates"], client_id="test-sub", persistent=True
    )
    assert col.wait_for(lambda: len(col.payloads()) >= 20, 20)
    broker.stop(signal.SIGTERM)  # mid-stream
    n_before = len(col.payloads())
    time.sleep(1.5)
    broker.start()
    thread.join(60)
    assert result.get("rc") == 0, result
    ids = released_ids(agent)
    assert len(ids) > n_before + 20, "the stream continued across the restart"
    assert col.wait_for(lambda: set(ids) <= {decode_template(p).message_id for p in col.payloads()}, 20)
    received = [decode_template(p).message_id for p in col.payloads()]
    first_seen = list(dict.fromkeys(received))
    assert first_seen == ids, "after dedupe by message_id: none lost, none extra, in order"
    # QoS 1 is at-least-once: only templates in flight at the kill may arrive twice.
    assert len(received) - len(first_seen) <= 2 * cfg.mqtt.max_inflight
    assert agent.metrics.value("peep_edge_reconnects_total", link="mqtt") >= 1
    with Spool(cfg.spool_path, destinations=["mqtt"]) as spool:
        assert spool.depth() == 0


@pytest.mark.slow
def test_bundle_updates_are_taken_only_if_they_verify_and_do_not_raise_epsilon(
    mosquitto_factory, make_config, crowd_video, collector_factory, h, lfw_background, edge_keys, tmp_path
):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from peep.core.bundle import ProjectionBundle, read_bundle_files
    from peep.v1 import recognition_pb2

    broker = mosquitto_factory(persistence=False).start()
    later = time.time() + 3600
    good_dir = h.build_edge_bundle(
        lfw_background, edge_keys["private"], tmp_path / "good", n_faces=500, created_at=later
    )
    wider_dir = h.build_edge_bundle(
        lfw_background, edge_keys["private"], tmp_path / "wider", n_components=96, created_at=later
    )
    foreign_dir = h.build_edge_bundle(
        lfw_background, edge_keys["other_private"], tmp_path / "foreign", n_faces=400, created_at=later
    )

    def announcement(d, tamper: bool = False) -> bytes:
        files = read_bundle_files(d)
        if tamper:
            files["projector.onnx"] = files["projector.onnx"][:-1] + bytes([files["projector.onnx"][-1] ^ 1])
        msg = recognition_pb2.BundleFiles(
            bundle_id="x", files=[recognition_pb2.BundleFile(name=k, content=v) for k, v in files.items()]
        )
        return msg.SerializeToString()

    good_id = ProjectionBundle.load(good_dir, edge_keys["public"]).bundle_id
    col = collector_factory("127.0.0.1", broker.port, ["peep/v1/lab/cam-1/templates"])
    cfg = load_config(
        make_config(
            capture={"source": crowd_video["path"], "max_fps": 25.0},
            privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 0.5, "min_track_frames": 1},
            mqtt={"port": broker.port},
        )
    )
    agent = Agent(cfg, environ={})
    thread, result = h.run_agent_in_thread(agent)
    assert col.wait_for(lambda: len(col.payloads()) >= 3, 20)
    old_id = decode_template(col.payloads()[0]).bundle_id
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bundle-publisher", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    for payload in (
        announcement(good_dir, tamper=True),
        announcement(foreign_dir),
        announcement(wider_dir),
        b"not a protobuf \xff",
    ):
        pub.publish("peep/v1/bundle", payload, qos=1, retain=True).wait_for_publish(5)
        time.sleep(0.4)
    assert agent.metrics.value("peep_edge_bundle_updates_total", result="rejected") == 4
    assert {decode_template(p).bundle_id for p in col.payloads()} == {old_id}
    pub.publish("peep/v1/bundle", announcement(good_dir), qos=1, retain=True).wait_for_publish(5)
    assert col.wait_for(lambda: decode_template(col.payloads()[-1]).bundle_id == good_id, 20)
    pub.publish("peep/v1/bundle", b"", qos=1, retain=True).wait_for_publish(5)  # clear the retained message
    pub.disconnect()
    pub.loop_stop()
    thread.join(60)
    assert result.get("rc") == 0, result
    assert agent.metrics.value("peep_edge_bundle_updates_total", result="accepted") == 1
    # Same mechanism, same per-vector ε under the new bundle; stored for the next start.
    last = decode_template(col.payloads()[-1])
    assert (last.mechanism.epsilon_coordinate, last.mechanism.epsilon_vector) == (4.0, 256.0)
    assert ProjectionBundle.load(cfg.device.state_dir / "bundle", edge_keys["public"]).bundle_id == good_id
    again = Agent(cfg, environ={})
    again.prepare()
    assert again.releaser.bundle_id == good_id


KILLED_AFTER_THE_PUBACK = """
import os, signal, sys, time
from peep.edge.config import MqttConfig
from peep.edge.spool import Spool
from peep.edge.transport.mqtt import MqttForwarder, MqttLink

spool_path, port, device, site = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
spool = Spool(spool_path, destinations=["mqtt"])
# The broker has the templates and sent its PUBACK: the device dies before its DELETE.
spool.ack = lambda dest, ids: os.kill(os.getpid(), signal.SIGKILL)
link = MqttLink(MqttConfig(host="127.0.0.1", port=port, tls=False), client_id=f"crash-{device}", site=site,
                device_id=device, publish_status=False)
link.start()
MqttForwarder(link, spool).run()
"""


def test_a_crash_after_the_puback_resends_and_the_next_puback_deletes(system_broker, collector_factory, tmp_path):
    from peep.edge.config import MqttConfig
    from peep.edge.transport.mqtt import MqttForwarder, MqttLink

    device = f"cam-{uuid.uuid4().hex[:8]}"
    col = collector_factory(*system_broker, [f"peep/v1/{EDGE_SITE}/{device}/templates"])
    path = tmp_path / "spool.sqlite3"
    ids = [f"m{i}" for i in range(5)]
    with Spool(path, destinations=["mqtt"]) as spool:
        for mid in ids:
            spool.put(message_id=mid, purpose="identify", payload=f"<<{mid}-{device}>>".encode())
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_THE_PUBACK, str(path), str(system_broker[1]), device, EDGE_SITE],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert col.wait_for(lambda: len(col.payloads()) >= 1, 30), "the broker had at least the first one"
    # What the crashed process got out may still be on its way to the collector: counted once it settles.
    first, settled = len(col.payloads()), time.monotonic()
    while time.monotonic() - settled < 1.0:
        time.sleep(0.1)
        if len(col.payloads()) != first:
            first, settled = len(col.payloads()), time.monotonic()
    spool = Spool(path, destinations=["mqtt"])
    assert spool.depth("mqtt") == 5, "nothing was deleted before the crash"
    link = MqttLink(
        MqttConfig(host=system_broker[0], port=system_broker[1], tls=False),
        client_id=f"again-{device}",
        site=EDGE_SITE,
        device_id=device,
        publish_status=False,
    )
    fwd = MqttForwarder(link, spool)
    link.start()
    fwd.start()
    try:
        assert col.wait_for(lambda: spool.depth("mqtt") == 0, 20)
    finally:
        fwd.stop(1.0)
        link.stop()
    # The resends reach the server, which stores each message id once (server tests); the device forgets them.
    assert col.wait_for(lambda: len(col.payloads()) >= first + 5, 30)
    assert len(col.payloads()) == first + 5, "each of the five resent once"
    assert sorted(set(col.payloads())) == sorted(f"<<{mid}-{device}>>".encode() for mid in ids)
    spool.close()
    on_disk = b"".join(p.read_bytes() for p in tmp_path.glob("spool.sqlite3*"))
    assert all(f"<<{mid}-{device}>>".encode() not in on_disk for mid in ids)


@pytest.mark.slow
def test_a_camera_in_decision_mode_asks_for_its_model_on_the_broker_and_publishes_only_labels(
    system_broker, make_config, crowd_video, collector_factory, h, edge_bundle, edge_keys
):
    import paho.mqtt.client as mqtt
    from peep.core.reports import parse_device_report
    from peep.core.wire import device_model_message
    from peep.v1 import recognition_pb2

    device = f"cam-{uuid.uuid4().hex[:8]}"
    host, port = system_broker
    base = f"peep/v1/{EDGE_SITE}/{device}"
    col = collector_factory(host, port, [f"{base}/#"])
    cfg = load_config(
        make_config(
            device={"id": device, "site": EDGE_SITE},
            capture={"source": crowd_video["path"], "max_fps": 20.0},
            privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6, "window_seconds": 2.0,
                     "min_track_frames": 2},
            recognition={"decide": "device", "epsilon_label": 8.0, "fuse_frames": 2},
        )
    )  # fmt: skip
    agent = Agent(cfg, environ={})
    thread, result = h.run_agent_in_thread(agent)
    assert col.wait_for(lambda: col.payloads("/model_request"), 20), "the camera did not ask for a model"
    request = recognition_pb2.GetDeviceModelRequest.FromString(col.payloads("/model_request")[0])
    assert request.bundle_id == edge_bundle.bundle_id and request.have_serial == 0
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"server-{device}", protocol=mqtt.MQTTv5)
    pub.connect(host, port)
    pub.loop_start()
    try:
        # A model signed by another key is refused; the deployer's is taken (answered on the device's own topic).
        forged = random_device_model(edge_bundle, edge_keys["other_private"], serial=9)
        pub.publish(f"{base}/model", device_model_message(forged, 9).SerializeToString(), qos=1).wait_for_publish(5)
        files = random_device_model(edge_bundle, edge_keys["private"], serial=3)
        pub.publish(f"{base}/model", device_model_message(files, 3).SerializeToString(), qos=1).wait_for_publish(5)
        thread.join(120)
    finally:
        pub.disconnect()
        pub.loop_stop()
    assert result.get("rc") == 0, result
    # Other models on the shared broker's broadcast (other tests' servers) are refused as another bundle.
    assert agent.model_store.serial == 3 and agent.model_store.refusals.get("signature") == 1
    ids = released_ids(agent)
    assert len(ids) >= 3
    assert col.wait_for(lambda: len(col.payloads()) >= len(ids), 10)
    msgs = [decode_template(p) for p in col.payloads()]
    assert [m.message_id for m in msgs] == ids
    manifest_ids = set(__import__("json").loads(files["manifest.json"])["classes"]) - {""}
    for m in msgs:
        assert len(m.values) == 0 and not m.HasField("mechanism") and not m.soft_traits
        assert m.decision.label_mechanism == "k-rr" and m.decision.epsilon_label == 8.0 and m.decision.labels == 5
        assert m.decision.label == "" or m.decision.label in manifest_ids
        assert m.decision.model_serial == 3 and 1 <= m.decision.frames_fused <= 2
    from peep.edge.ledger import SqliteLedger

    ledger = SqliteLedger(cfg.ledger_path)
    try:
        spent = [s.epsilon for s in ledger.entries() if s.key.startswith("track:")]
    finally:
        ledger.close()
    assert spent == [8.0] * len(ids)  # the label is the whole release
    report = parse_device_report(col.payloads("/report")[-1])
    assert report.decision["mode"] == "device" and report.decision["model_serial"] == 3
    # The report states what a release costs in this mode (the label), as the ledger charged it.
    assert report.epsilon_vector_per_release == 8.0 and report.epsilon_vector_spent == pytest.approx(8.0 * len(ids))
    assert report.decision["flip_probability"] == pytest.approx(4 / (np.exp(8.0) + 4), rel=1e-6)


def test_a_template_nobody_subscribes_to_is_kept_and_sent_again(system_broker, collector_factory, tmp_path):
    """The broker answers 0x10 (no matching subscribers) and drops the message: to MQTT a success, to the device
    a template that reached nobody. It stays in the spool and goes again after a backoff; once a subscriber
    (the server's session) is there it arrives, and only then is it deleted. A restarted broker the soak's MQTT
    camera reached before the server's sessions lost four templates this way."""
    from peep.edge.config import MqttConfig
    from peep.edge.transport.mqtt import MqttForwarder, MqttLink

    device = f"cam-{uuid.uuid4().hex[:8]}"
    # A topic root of its own: on the shared broker another worker's server (the benches' default root) takes
    # every peep/v1/+/+/templates, and "nobody subscribes" must be true of this one.
    root = f"nobody-{uuid.uuid4().hex[:8]}/v1"
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, destinations=["mqtt"])
    for i in range(3):
        spool.put(message_id=f"m{i}", purpose="identify", payload=f"<<m{i}-{device}>>".encode())
    link = MqttLink(MqttConfig(host=system_broker[0], port=system_broker[1], tls=False, topic_prefix=root),
                    client_id=f"nobody-{device}", site=EDGE_SITE, device_id=device, publish_status=False)  # fmt: skip
    fwd = MqttForwarder(link, spool, retry_min_s=0.2, retry_max_s=0.5)
    link.start()
    fwd.start()
    try:
        time.sleep(2.0)  # several PUBACKs with 0x10 meanwhile
        assert spool.depth("mqtt") == 3, "a template nobody received was deleted"
        col = collector_factory(*system_broker, [f"{root}/{EDGE_SITE}/{device}/templates"])
        assert col.wait_for(lambda: spool.depth("mqtt") == 0, 20), "the spool did not drain once subscribed"
        assert col.wait_for(lambda: len(set(col.payloads())) == 3, 5)
        assert sorted(set(col.payloads())) == sorted(f"<<m{i}-{device}>>".encode() for i in range(3))
    finally:
        fwd.stop(1.0)
        link.stop()
        spool.close()
