"""Distributing device models: gRPC GetDeviceModel (TLS), and MQTT's broadcast and request/answer (the real
Mosquitto on 127.0.0.1:1883, and our own with the shipped ACL for what a device may read and write)."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any

import grpc
import paho.mqtt.client as mqtt
import pytest
from peep.server.rates import CallerRate
from peep.v1 import recognition_pb2
from peep_testing.devicemodel import start_trained, verified
from peep_testing.server import (
    ADMIN,
    DEVICE_TOKENS,
    DOOR_TOKEN,
    MQTT_PREFIX,
    SITE,
    auth,
    mqtt_available,
    rpc_error,
)

CAMERA = auth(DEVICE_TOKENS["cam-2"])  # an ordinary camera (no enrolment right)
DOOR = auth(DOOR_TOKEN)  # a door registered with auth.devices[].door = true


@pytest.fixture(scope="module")
def issuing(tmp_path_factory, pki, keypair, bundle_dir, templates, model_keys, calibration_path) -> Any:
    tmp = tmp_path_factory.mktemp("distribution")
    srv = start_trained(tmp, pki, keypair, bundle_dir, templates, model_keys, calibration_path)
    yield srv
    srv.app.stop(0)


def _ask(srv: Any, bundle_id: str, key_id: str = "", have: int = 0, metadata: Any = CAMERA) -> Any:
    req = recognition_pb2.GetDeviceModelRequest(bundle_id=bundle_id, key_id=key_id, have_serial=have)
    return srv.stub().GetDeviceModel(req, metadata=metadata, timeout=10)


@pytest.mark.slow
def test_a_device_gets_the_newest_model_of_its_bundle_and_key_and_unchanged_once_it_holds_it(
    issuing, templates, model_keys
):
    s = issuing.services
    newest = s.device_models.newest(templates.bundle_id, "")
    got = _ask(issuing, templates.bundle_id, metadata=DOOR)
    assert got.serial == newest.serial and not got.unchanged
    # The four signed files, and the version's class key: only a registered door's call carries it.
    assert {f.name for f in got.files} == {"model.onnx", "calibration.npy", "manifest.json", "signature.json",
                                           "class.key"}  # fmt: skip
    model = verified(got.SerializeToString(), model_keys[1], bundle_id=templates.bundle_id, key_id="", newer_than=0)
    assert model.serial == newest.serial
    assert model.class_key == bytes.fromhex(s.recogniser.model.meta["device_class_salt"])
    # A camera decides without it (its labels are the model's own columns) and so cannot test a name.
    camera = _ask(issuing, templates.bundle_id)
    assert camera.serial == newest.serial and "class.key" not in {f.name for f in camera.files}
    assert verified(camera.SerializeToString(), model_keys[1], bundle_id=templates.bundle_id, key_id="",
                    newer_than=0).class_key is None  # fmt: skip
    assert "class.key" not in {f.name for f in recognition_pb2.DeviceModelFiles.FromString(newest.payload).files}
    for have in (newest.serial, newest.serial + 5):
        same = _ask(issuing, templates.bundle_id, have=have)
        assert same.unchanged and same.serial == newest.serial and len(same.files) == 0
    older = _ask(issuing, templates.bundle_id, have=newest.serial - 1) if newest.serial > 1 else got
    assert not older.unchanged and older.serial == newest.serial
    assert _ask(issuing, templates.bundle_id, metadata=ADMIN).serial == newest.serial  # admins may ask too


def test_get_device_model_needs_a_registered_identity(issuing, templates):
    req = recognition_pb2.GetDeviceModelRequest(bundle_id=templates.bundle_id)
    stub = issuing.stub()
    code, _ = rpc_error(stub.GetDeviceModel, req, timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = rpc_error(stub.GetDeviceModel, req, metadata=auth("not-a-token"), timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_get_device_model_names_what_it_does_not_have_and_bounds_what_it_reads(issuing, templates):
    stub = issuing.stub()

    def refused(**fields: Any) -> tuple[Any, str]:
        return rpc_error(stub.GetDeviceModel, recognition_pb2.GetDeviceModelRequest(**fields), metadata=CAMERA,
                         timeout=5)  # fmt: skip

    code, details = refused(bundle_id="eb-not-published")
    assert code == grpc.StatusCode.NOT_FOUND and "'eb-not-published'" in details and "key none" in details
    code, details = refused(bundle_id=templates.bundle_id, key_id="sk-0123456789abcdef")
    assert code == grpc.StatusCode.NOT_FOUND and templates.bundle_id in details and "sk-0123456789abcdef" in details
    for fields, name in (({"bundle_id": ""}, "bundle_id"), ({"bundle_id": "a/b"}, "bundle_id"),
                         ({"bundle_id": "x" * 5000}, "bundle_id"),
                         ({"bundle_id": templates.bundle_id, "key_id": "sk-nothex"}, "key_id"),
                         ({"bundle_id": templates.bundle_id, "key_id": "k" * 5000}, "key_id")):  # fmt: skip
        code, details = refused(**fields)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{name}: expected"), details
        assert len(details) < 400  # at most 64 characters of what was sent are quoted


def test_get_device_model_is_rate_limited_per_device(issuing, templates):
    s = issuing.services
    saved = s.device_model_requests
    s.device_model_requests = CallerRate("device model requests", rate_per_s=1e-6, burst=2)
    try:
        _ask(issuing, templates.bundle_id, have=10**9)
        _ask(issuing, templates.bundle_id, have=10**9)
        code, details = rpc_error(issuing.stub().GetDeviceModel,
                                  recognition_pb2.GetDeviceModelRequest(bundle_id=templates.bundle_id),
                                  metadata=CAMERA, timeout=5)  # fmt: skip
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "'cam-2'" in details and "bursts of 2" in details
        assert _ask(issuing, templates.bundle_id, have=10**9, metadata=ADMIN).unchanged  # another caller's budget
    finally:
        s.device_model_requests = saved


# --------------------------------------------------------------------------- MQTT (the shared broker)


class Listener:
    """A device-like MQTT v5 client recording (topic, payload, retain) of what it receives."""

    def __init__(self, *topics: str, port: int = 1883, **tls: Any) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.cond = threading.Condition()
        ready = threading.Event()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dm-{uuid.uuid4().hex[:8]}",
                        protocol=mqtt.MQTTv5)  # fmt: skip
        c.on_connect = lambda cl, *a: cl.subscribe([(t, 1) for t in topics])
        c.on_subscribe = lambda *a: ready.set()
        c.on_message = self._on_message
        c.connect("127.0.0.1", port)
        c.loop_start()
        assert ready.wait(5)
        self.client = c

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.cond:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10.0) -> list[tuple[str, bytes, bool]]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.messages) >= n, timeout)
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture(scope="module")
def over_mqtt(tmp_path_factory, pki, keypair, bundle_dir, templates, model_keys, calibration_path) -> Any:
    reason = mqtt_available()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("dm-mqtt")
    mqtt_section = {"enabled": True, "share_group": f"g{uuid.uuid4().hex[:8]}",
                    "client_id": f"srv-{uuid.uuid4().hex[:8]}", "connections": 1}  # fmt: skip
    srv = start_trained(tmp, pki, keypair, bundle_dir, templates, model_keys, calibration_path, mqtt=mqtt_section)
    assert srv.app.mqtt.wait_ready(10)
    yield srv
    srv.app.stop(0)


@pytest.mark.slow
@pytest.mark.mqtt
def test_every_issued_model_is_broadcast_not_retained(over_mqtt, model_keys, templates):
    from peep.lab.processes.retained import retained_topics

    broadcast = f"{MQTT_PREFIX}/model"
    heard = Listener(broadcast)
    try:
        issued = over_mqtt.services.device_models.issue("promotion")

        def serials() -> list[int]:
            return [verified(p, model_keys[1], bundle_id=templates.bundle_id, key_id="").serial
                    for _, p, _ in heard.messages]  # fmt: skip

        # An earlier issue's broadcast may reach this listener first (it subscribed as the server started).
        deadline = time.monotonic() + 10
        while issued.serial not in serials() and time.monotonic() < deadline:
            heard.wait(len(heard.messages) + 1, timeout=0.5)
        assert issued.serial in serials()
        assert all(topic == broadcast and not retain for topic, _, retain in heard.messages)
    finally:
        heard.close()
    assert not [t for t in retained_topics(f"{MQTT_PREFIX}/#") if t.endswith("/model")]
    assert over_mqtt.app.mqtt.device_models.counts["broadcast"] >= 1


@pytest.mark.mqtt
def test_a_device_asks_over_mqtt_and_is_answered_on_its_own_topic(over_mqtt, model_keys, templates):
    from peep.lab.processes.retained import retained_topics

    s = over_mqtt.services
    newest = s.device_models.newest(templates.bundle_id, "")
    answers = Listener(f"{MQTT_PREFIX}/+/+/model")
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"cam-{uuid.uuid4().hex[:6]}", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", 1883)
    pub.loop_start()
    try:

        def ask(device: str, **fields: Any) -> None:
            req = recognition_pb2.GetDeviceModelRequest(**fields).SerializeToString()
            pub.publish(f"{MQTT_PREFIX}/{SITE}/{device}/model_request", req, qos=1).wait_for_publish(5)

        ask("cam-2", bundle_id=templates.bundle_id, have_serial=0)
        (topic, payload, retain), *_ = answers.wait(1)
        assert topic == f"{MQTT_PREFIX}/{SITE}/cam-2/model" and not retain
        assert verified(payload, model_keys[1], bundle_id=templates.bundle_id, key_id="").serial == newest.serial
        ask("cam-2", bundle_id=templates.bundle_id, have_serial=newest.serial)
        msgs = answers.wait(2)
        same = recognition_pb2.DeviceModelFiles.FromString(msgs[1][1])
        assert same.unchanged and same.serial == newest.serial and not same.files
        ask("cam-2", bundle_id="eb-not-published")  # none for that bundle: serial 0, no files
        none = recognition_pb2.DeviceModelFiles.FromString(answers.wait(3)[2][1])
        assert none.serial == 0 and not none.unchanged and not none.files
        # No answer for an unregistered device, another site, or what is not a request
        ask("cam-unregistered", bundle_id=templates.bundle_id)
        pub.publish(f"{MQTT_PREFIX}/elsewhere/cam-2/model_request", b"", qos=1).wait_for_publish(5)
        pub.publish(f"{MQTT_PREFIX}/{SITE}/cam-2/model_request", b"\xff" * 50, qos=1).wait_for_publish(5)
        time.sleep(1.0)
        assert len(answers.messages) == 3
        assert over_mqtt.app.mqtt.device_models.counts["refused"] >= 3
    finally:
        answers.close()
        pub.disconnect()
        pub.loop_stop()
    assert not [t for t in retained_topics(f"{MQTT_PREFIX}/#") if t.endswith("/model")]


# --------------------------------------------------------------------------- the shipped ACL


@pytest.mark.mqtt
def test_the_shipped_acl_lets_a_device_ask_only_for_itself_and_read_only_its_answers_and_the_broadcast(
    tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path, monkeypatch
):
    from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, ShippedBroker, wait_for

    broker = ShippedBroker(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key).start()
    monkeypatch.setenv("PEEP_TEST_MQTT_PASSWORD", SERVER_PASSWORD)
    srv = None
    cams: list[Any] = []
    try:
        mqtt_section = broker.server_mqtt_section(client_id=f"peep-dm-{uuid.uuid4().hex[:6]}", connections=1)
        srv = start_trained(tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path,
                            mqtt=mqtt_section)  # fmt: skip
        assert srv.app.mqtt.wait_ready(15)
        cam1, cam2 = (Client(broker.dev_port, n, DEVICE_PASSWORDS[n], broker.ca).connect() for n in ("cam-1", "cam-2"))
        cams = [cam1, cam2]
        for cam in cams:  # each tries to read every model topic
            cam.subscribe("peep/v1/model", "peep/v1/+/+/model", f"peep/v1/{SITE}/cam-1/model",
                          f"peep/v1/{SITE}/cam-2/model")  # fmt: skip
        req = recognition_pb2.GetDeviceModelRequest(bundle_id=templates.bundle_id).SerializeToString()
        allowed = [f"peep/v1/{SITE}/cam-1/model_request"]
        refused = [f"peep/v1/{SITE}/cam-2/model_request", f"peep/v1/{SITE}/cam-1/model", "peep/v1/model"]
        mids = {t: cam1.c.publish(t, req, qos=1).mid for t in allowed + refused}
        assert wait_for(lambda: all(m in cam1.acks for m in mids.values()), 10)
        codes = {t: cam1.acks[m] for t, m in mids.items()}
        assert all(codes[t] < 0x80 for t in allowed) and all(codes[t] == 0x87 for t in refused), codes
        assert wait_for(lambda: any(t.endswith("/cam-1/model") for t, _, _ in cam1.messages), 10)
        issued = srv.services.device_models.issue("promotion")
        # (Mosquitto names a delivered message's topic with the listener's mount point: devices/peep/v1/...)
        assert wait_for(lambda: all(any(t.endswith("peep/v1/model") for t, _, _ in c.messages) for c in cams), 10)
        # cam-1's answer reached cam-1 only; both heard the broadcast of the new serial
        assert not [t for t, _, _ in cam2.messages if t.endswith("/cam-1/model")]
        assert [t for t, _, _ in cam1.messages if t.endswith("/cam-2/model")] == []
        heard = [p for t, p, _ in cam2.messages if t.endswith("peep/v1/model")]
        assert verified(heard[-1], model_keys[1]).serial == issued.serial
    finally:
        for cam in cams:
            cam.close()
        if srv is not None:
            srv.app.stop(0)
        broker.stop(signal.SIGKILL)


def test_a_retired_keys_model_is_not_found(issuing):
    """After retire-key: NOT_FOUND naming the retired key (the device's copy expires; nothing is re-issued)."""
    from peep.server.storage.devicemodels import IssuedModel

    s = issuing.services
    m = s.recogniser.model
    old_key = "sk-0000000000000bad"

    def build(serial: int) -> IssuedModel:
        return IssuedModel(serial, m.version, m.bundle_id, old_key, 1.0, time.time(), time.time() + 3600, 5, 0,
                           "cal", "promotion", payload=recognition_pb2.DeviceModelFiles(serial=serial)
                           .SerializeToString())  # fmt: skip

    s.device_models.rows.issue(build, bundle_id=m.bundle_id, key_id=old_key)
    assert _ask(issuing, m.bundle_id, key_id=old_key).serial > 0
    s.retire_key(old_key)
    code, details = rpc_error(issuing.stub().GetDeviceModel,
                              recognition_pb2.GetDeviceModelRequest(bundle_id=m.bundle_id, key_id=old_key),
                              metadata=CAMERA, timeout=5)  # fmt: skip
    assert code == grpc.StatusCode.NOT_FOUND and old_key in details and "retired" in details
