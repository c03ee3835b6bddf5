"""The console's device statuses: retained MQTT statuses and gRPC contacts, never "unknown" for a device heard from.

Real parts: the Mosquitto on 127.0.0.1:1883 (statuses retained by a device and by its last will), gRPC over TLS.
"""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import paho.mqtt.client as mqtt
import pytest
from peep.server.ingest.contacts import ONLINE_WINDOW_S, DeviceContacts
from peep.v1 import recognition_pb2
from peep_testing.server import (
    ADMIN,
    DEVICE,
    DEVICE_TOKENS,
    MQTT_PREFIX,
    SITE,
    auth,
    base_config,
    mqtt_available,
    rpc_error,
    start_server,
)

CAM2 = auth(DEVICE_TOKENS["cam-2"])


def wait_for(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


# --------------------------------------------------------------------------- the book itself


def test_contacts_count_open_calls_once_and_judge_on_their_clock():
    now = [1000.0]
    book = DeviceContacts(clock=lambda: now[0])
    call = book.opened("cam-1")
    now[0] = 1500.0
    assert book.statuses() == {"cam-1": ("online", 1500.0, "grpc")}  # open: in contact now, whatever the window
    call.close()
    call.close()  # reported by the handler and by gRPC's termination callback: counted once
    book.opened("cam-1").close()
    assert book.contacts()["cam-1"].open == 0
    now[0] = 1500.0 + ONLINE_WINDOW_S
    assert book.statuses() == {"cam-1": ("online", 1500.0, "grpc")}
    now[0] += 0.001
    assert book.statuses() == {"cam-1": ("offline", 1500.0, "grpc")}
    assert book.statuses(window_s=1e9)["cam-1"][0] == "online"
    with pytest.raises(ValueError, match=r"window_s: expected a number of seconds >= 0, received -1"):
        book.statuses(window_s=-1)
    with pytest.raises(ValueError, match=r"max_devices: expected a number of devices >= 1, received 0"):
        DeviceContacts(max_devices=0)


def test_contacts_are_bounded_and_keep_the_devices_with_a_call_open():
    now = [0.0]
    book = DeviceContacts(max_devices=3, clock=lambda: now[0])
    streaming = book.opened("a")  # heard from first, but still on a call
    for d in ("b", "c"):
        now[0] += 1
        book.opened(d).close()
    now[0] += 1
    book.opened("d").close()
    assert set(book.contacts()) == {"a", "c", "d"}  # b, the oldest without a call open, made room
    streaming.close()
    assert book.contacts()["a"].open == 0 and len(book) == 3


# --------------------------------------------------------------------------- gRPC


def test_a_grpc_device_is_online_while_heard_from_then_offline_since_its_last_contact(fresh, templates):
    status = fresh.app._device_status()
    assert fresh.app.mqtt is None and status() == {}  # the callable exists without MQTT
    stub = fresh.stub()
    code, _ = rpc_error(stub.GetBundle, recognition_pb2.GetBundleRequest(), timeout=5)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    stub.GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=ADMIN, timeout=5)
    assert status() == {}  # neither an unauthenticated caller nor the admin is a device

    t0 = time.time()
    msgs = [templates.message(i, device_id="cam-2") for i in range(5)]
    summary = stub.IngestStream(iter(msgs), metadata=CAM2, timeout=30)
    t1 = time.time()
    assert summary.accepted + summary.duplicates == 5, summary
    st = status()
    assert set(st) == {"cam-2"}
    state, since, via = st["cam-2"]
    assert (state, via) == ("online", "grpc") and t0 <= since <= t1
    last = fresh.services.device_contacts.contacts()["cam-2"]
    assert last.open == 0 and last.last == since

    # Past the window: offline, since the last contact (a shortened window instead of two minutes' wait).
    short = fresh.app._device_status(window_s=0.3)
    assert wait_for(lambda: short()["cam-2"][0] == "offline", 5)
    assert short()["cam-2"] == ("offline", since, "grpc")

    # A call open keeps a device online however long it lasts; its end is its last contact.
    events = stub.StreamEvents(recognition_pb2.StreamEventsRequest(), metadata=DEVICE)
    contacts = fresh.services.device_contacts
    assert wait_for(lambda: contacts.contacts().get("cam-1") is not None and contacts.contacts()["cam-1"].open == 1)
    time.sleep(0.4)
    assert short()["cam-1"][:1] == ("online",) and short()["cam-1"][2] == "grpc"
    events.cancel()
    assert wait_for(lambda: contacts.contacts()["cam-1"].open == 0, 5)
    ended = contacts.contacts()["cam-1"].last
    assert wait_for(lambda: short()["cam-1"] == ("offline", ended, "grpc"), 5)
    assert status()["cam-1"] == ("online", ended, "grpc")  # within the real window


# --------------------------------------------------------------------------- MQTT


def _device(device: str, *, will: bool = True) -> mqtt.Client:
    """A device's MQTT connection with its last will (``offline``, retained), as the edge agent connects."""
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=f"{device}-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
    )
    if will:
        c.will_set(f"{MQTT_PREFIX}/{SITE}/{device}/status", b"offline", qos=1, retain=True)
    up = threading.Event()
    c.on_connect = lambda *a: up.set()
    c.connect("127.0.0.1", 1883, keepalive=5)
    c.loop_start()
    assert up.wait(5)
    return c


def _mqtt_server(tmp_path, keypair, bundle_dir, pki, group: str, name: str):
    cfg = base_config(
        tmp_path / name,
        keypair[3],
        bundle_dir,
        mqtt={
            "enabled": True,
            "share_group": group,
            "client_id": f"srv-{name}-{uuid.uuid4().hex[:8]}",
            "connections": 2,
            "clear_retained": False,  # statuses are recorded all the same
        },
    )
    cfg["auth"]["allow_insecure"] = True
    (tmp_path / name).mkdir()
    return start_server(cfg, pki, tmp_path / name, mqtt_wait=10)


@pytest.mark.mqtt
def test_every_replica_records_retained_statuses_with_clear_retained_off(tmp_path, pki, keypair, bundle_dir):
    reason = mqtt_available()
    if reason:
        pytest.skip(reason)
    from peep.lab.processes.retained import clear_retained, retained_topics

    status_topic = f"{MQTT_PREFIX}/{SITE}/cam-1/status"
    bad_topic = f"{MQTT_PREFIX}/{SITE}/cam-2/status"
    stranger_topic = f"{MQTT_PREFIX}/{SITE}/cam-9/status"
    dev = _device("cam-1")
    other = _device("cam-2", will=False)
    servers = []
    try:
        # Retained before any server runs: what a server finds when it (re)starts.
        dev.publish(status_topic, b"online", qos=1, retain=True).wait_for_publish(5)
        other.publish(bad_topic, b"rebooting", qos=1, retain=True).wait_for_publish(5)
        other.publish(stranger_topic, b"online", qos=1, retain=True).wait_for_publish(5)
        group = f"g{uuid.uuid4().hex[:8]}"
        servers = [_mqtt_server(tmp_path, keypair, bundle_dir, pki, group, n) for n in ("a", "b")]
        views = [s.app._device_status() for s in servers]
        # Both replicas of one share group: a status is a retained message each of them needs.
        for view in views:
            assert wait_for(lambda view=view: "cam-1" in view()), view()
            state, since, via = view()["cam-1"]
            assert (state, via) == ("online", "mqtt") and since > 0
            assert "cam-2" not in view()  # not online/offline: not a status
            assert "cam-9" not in view()  # not a registered device
        # clear_retained off: the bad one is not cleared (only not believed)
        assert retained_topics(bad_topic).get(bad_topic) == b"rebooting"

        # The device's connection drops: the broker publishes its will.
        dev.loop_stop()
        dev.socket().close()
        for view in views:
            assert wait_for(lambda view=view: view()["cam-1"][0] == "offline"), view()
        assert views[0]()["cam-1"][2] == "mqtt"

        # The same device heard from over gRPC since: the more recent view wins.
        stub = servers[0].stub()
        stub.GetBundle(recognition_pb2.GetBundleRequest(), metadata=DEVICE, timeout=5)
        state, since, via = views[0]()["cam-1"]
        assert (state, via) == ("online", "grpc") and since >= views[1]()["cam-1"][1]
        assert views[1]()["cam-1"][:1] == ("offline",)  # the other replica had no gRPC contact
    finally:
        for s in servers:
            s.app.stop(0)
        other.disconnect()
        other.loop_stop()
        clear_retained([status_topic, bad_topic, stranger_topic])
