"""Where templates enter, over real gRPC/TLS and the real broker: capture time, soft traits,
the enrolment right, message ids per device.

capture_time inside a window around the server clock, every soft-trait number and string bounded, enrolment a
right of its own (admin or a device registered as an enrolment desk), message ids unique per device.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import grpc
import paho.mqtt.client as mqtt
import pytest
from peep.core import wire
from peep.server.config import parse_config
from peep.server.ingest.auth import DeviceRegistry
from peep.v1 import recognition_pb2, template_pb2
from peep_testing.server import (
    ADMIN,
    DEVICE,
    DEVICE_TOKENS,
    MQTT_PREFIX,
    SITE,
    auth,
    base_config,
    mqtt_available,
    sha,
    start_server,
    tls_section,
)
from peep_testing.server import (
    rpc_error as _code,
)

CAM2 = auth(DEVICE_TOKENS["cam-2"])  # an ordinary camera; cam-1 (DEVICE) is the fixtures' enrolment desk
ACCEPTED = recognition_pb2.INGEST_STATUS_ACCEPTED
DUPLICATE = recognition_pb2.INGEST_STATUS_DUPLICATE
REJECTED = recognition_pb2.INGEST_STATUS_REJECTED


def _rejected(srv, reason: str, transport: str = "grpc") -> float:
    return srv.services.metrics.value("peep_ingest_rejected_total", {"transport": transport, "reason": reason}) or 0


# --------------------------------------------------------------------------- capture_time

BAD_TIMES = [
    ("year 9999", lambda t: setattr(t, "seconds", 253_402_300_799), "capture_time_future",
     "capture_time: expected at most 300 s ahead of the server clock (ingest.max_clock_skew_s), received 9999-12-31"),
    ("year 1", lambda t: setattr(t, "seconds", -62_135_596_800), "capture_time_too_old",
     "capture_time: expected at most 2592000 s before the server clock (ingest.max_age_s), received 0001-01-01"),
    ("zero", lambda t: setattr(t, "seconds", 0), "capture_time_too_old", "received 1970-01-01T00:00:00Z"),
    ("+2^62", lambda t: setattr(t, "seconds", 2**62), "invalid_capture_time",
     "capture_time: expected a timestamp within 0001-01-01..9999-12-31"),
    ("-2^62", lambda t: setattr(t, "seconds", -(2**62)), "invalid_capture_time", "capture_time: expected a timestamp"),
    ("negative nanos", lambda t: setattr(t, "nanos", -1), "invalid_capture_time",
     "capture_time.nanos: expected 0-999999999, received -1"),
]  # fmt: skip


def _with_time(templates, i, mutate, **kw):
    msg = templates.message(i, **kw)
    mutate(msg.capture_time)
    return msg


def test_capture_times_outside_the_window_are_refused_over_grpc(fresh, templates):
    stub = fresh.stub()
    for j, (name, mutate, reason, text) in enumerate(BAD_TIMES):
        code, details = _code(stub.Ingest, _with_time(templates, j, mutate), metadata=DEVICE, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details, (name, details)
        assert _rejected(fresh, reason) >= 1, name
    unset = templates.message(10)
    unset.ClearField("capture_time")
    code, details = _code(stub.Ingest, unset, metadata=DEVICE, timeout=5)
    assert (
        code == grpc.StatusCode.INVALID_ARGUMENT and details == "capture_time: expected the capture time, received none"
    )
    # streamed: each refused by name in its ack, the good one stored
    msgs = [_with_time(templates, 20 + j, mutate) for j, (_, mutate, _, _) in enumerate(BAD_TIMES)]
    good = templates.message(30)
    summary = stub.IngestStream(iter([*msgs, good]), metadata=DEVICE, timeout=10)
    assert (summary.accepted, summary.rejected) == (1, len(BAD_TIMES))
    assert [a.reason.split(":")[0].split(".")[0] for a in summary.acks[:-1]] == ["capture_time"] * len(BAD_TIMES)
    assert fresh.services.store.count_received() == 1


def test_the_window_is_configured_in_the_ingest_section(tmp_path, pki, keypair, bundle_dir, templates):
    cfg = base_config(
        tmp_path,
        keypair[3],
        bundle_dir,
        grpc={"tls": tls_section(pki)},
        ingest={"max_age_s": 3600, "max_clock_skew_s": 5},
    )
    srv = start_server(cfg, pki, tmp_path)
    try:
        stub = srv.stub()
        now = time.time()
        assert stub.Ingest(templates.message(0, capture_time=now - 1800), metadata=DEVICE, timeout=5).status == ACCEPTED
        code, details = _code(stub.Ingest, templates.message(1, capture_time=now - 7200), metadata=DEVICE, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 3600 s before the server clock" in details
        code, details = _code(stub.Ingest, templates.message(2, capture_time=now + 60), metadata=DEVICE, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 5 s ahead of the server clock" in details
    finally:
        srv.app.stop(0)


# --------------------------------------------------------------------------- soft traits, ε, mechanism


def _with_trait(templates, i, **trait):
    msg = templates.message(i)
    msg.soft_traits.add(**trait)
    return msg


def test_unbounded_soft_traits_are_refused_over_grpc_and_never_echoed(fresh, templates):
    stub = fresh.stub()
    age = wire.SOFT_TRAITS["age"]
    cases = [
        (dict(kind=age, value=1e300, epsilon=1.0, mechanism="bounded-laplace"), "soft_traits[0].value: expected age"),
        (dict(kind=age, value=30.0, epsilon=1e-300, mechanism="m" * 5000),
         "soft_traits[0].mechanism: expected 'bounded-laplace' for age, received 'mmmm"),
        (dict(kind=age, value=30.0, epsilon=1e-300, mechanism="bounded-laplace"), "soft_traits[0].epsilon: expected"),
        (dict(kind=wire.SOFT_TRAITS["gender"], value=0.5, epsilon=1.0, mechanism="randomized-response"),
         "soft_traits[0].value: expected 0 or 1"),
    ]  # fmt: skip
    for j, (trait, text) in enumerate(cases):
        code, details = _code(stub.Ingest, _with_trait(templates, j, **trait), metadata=DEVICE, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(text), details
        assert len(details) < 300
    assert _rejected(fresh, "invalid_soft_traits") == len(cases)
    ok = _with_trait(templates, 9, kind=age, value=41.0, epsilon=1.0, mechanism="bounded-laplace")
    assert stub.Ingest(ok, metadata=DEVICE, timeout=5).status == ACCEPTED
    assert fresh.services.store.count_received() == 1


# --------------------------------------------------------------------------- the enrolment right


def test_ordinary_cameras_cannot_enrol_over_grpc(fresh, templates):
    stub = fresh.stub()
    enrol = templates.message(0, device_id="cam-2", purpose="enroll", subject="mallory")
    code, details = _code(stub.Ingest, enrol, metadata=CAM2, timeout=5)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == (
        "purpose: expected IDENTIFY or VERIFY from device 'cam-2' (enrolment needs an admin or a device registered "
        "with auth.devices[].enrolment_desk = true), received ENROLL"
    )
    streamed = [templates.message(i, device_id="cam-2", purpose="enroll", subject="mallory") for i in range(1, 4)]
    ident = templates.message(4, device_id="cam-2")
    summary = stub.IngestStream(iter([*streamed, ident]), metadata=CAM2, timeout=10)
    assert (summary.accepted, summary.rejected) == (1, 3)
    assert all("enrolment_desk" in a.reason for a in summary.acks[:3])
    assert _rejected(fresh, "enrolment_not_permitted") == 4
    # the desk and the admin may
    desk = templates.message(5, purpose="enroll", subject="alice")
    assert stub.Ingest(desk, metadata=DEVICE, timeout=5).status == ACCEPTED
    inline = templates.message(6, device_id="cam-2", purpose="enroll", subject="bob")
    resp = stub.EnrolSubject(recognition_pb2.EnrolSubjectRequest(subject="bob", templates=[inline]), metadata=ADMIN)
    assert resp.templates == 1
    store = fresh.services.store
    assert store.count_templates(purpose="enroll") == 2 and store.count_templates(subject="mallory") == 0


def test_only_the_admin_enrols_background_subjects(fresh, templates):
    # The background teaches "unknown": a desk adding to it could make the model call an enrolled person unknown.
    stub = fresh.stub()
    sneaky = templates.message(0, purpose="enroll", subject="background:alice")
    code, details = _code(stub.Ingest, sneaky, metadata=DEVICE, timeout=5)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == (
        "subject: expected a person's id from device 'cam-1' (subjects starting 'background:' form the 'unknown' "
        "class; only an admin enrols them), received 'background:alice'"
    )
    streamed = [templates.message(i, purpose="enroll", subject=f"background:{i}") for i in range(1, 3)]
    summary = stub.IngestStream(iter([*streamed, templates.message(3, purpose="enroll", subject="alice")]),
                                metadata=DEVICE, timeout=10)  # fmt: skip
    assert (summary.accepted, summary.rejected) == (1, 2)
    assert _rejected(fresh, "background_not_permitted") == 3
    assert fresh.services.store.count_templates(subject="background:alice") == 0
    # the desk's own enrolment of a person is unaffected; the admin may add to the background
    admin = templates.message(4, purpose="enroll", subject="background:7")
    assert stub.Ingest(admin, metadata=ADMIN, timeout=5).status == ACCEPTED
    assert fresh.services.store.count_templates(subject="background:7") == 1


def test_subject_ids_with_control_or_bidi_characters_are_refused_and_others_normalised(fresh, templates):
    stub = fresh.stub()
    cases = [("alice\u202egpj.exe", 0x202E), ("bob\u2066x\u2069", 0x2066), ("carol\u200f", 0x200F),
             ("dave\x85", 0x85), ("eve\u200b", 0x200B)]  # fmt: skip
    for j, (subject, char) in enumerate(cases):
        msg = templates.message(j, purpose="enroll", subject="placeholder")
        msg.subject = subject  # a sender that does not use make_template
        code, details = _code(stub.Ingest, msg, metadata=DEVICE, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("subject: expected 1-128 characters")
        assert f"U+{char:04X} at index" in details
        code, details = _code(
            stub.EnrolSubject, recognition_pb2.EnrolSubjectRequest(subject=subject), metadata=ADMIN, timeout=5
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    nfd = templates.message(9, purpose="enroll", subject="placeholder")
    nfd.subject = "Zoe\u0308"
    code, details = _code(stub.Ingest, nfd, metadata=DEVICE, timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "expected NFC-normalised text" in details
    # an SQL-looking id is an ordinary label (parameters are always bound)
    sql = templates.message(10, purpose="enroll", subject="' OR 1=1 --")
    assert stub.Ingest(sql, metadata=DEVICE, timeout=5).status == ACCEPTED
    store = fresh.services.store
    assert store.count_received() == 1 and store.count_templates(subject="' OR 1=1 --") == 1


def test_the_enrolment_right_comes_from_the_registry_for_tokens_and_certificates():
    cfg = parse_config(
        {
            "bundle": {"public_key": "k.pem"},
            "auth": {
                "allow_insecure": True,
                "devices": [
                    {"id": "desk-1", "token_sha256": sha("t-desk"), "enrolment_desk": True},
                    {"id": "cam-1", "token_sha256": sha("t-cam")},
                    {"id": "desk-off", "token_sha256": sha("t-off"), "enrolment_desk": True, "enabled": False},
                ],
            },
        }
    )
    assert [d.enrolment_desk for d in cfg.auth.devices] == [True, False, True]
    reg = DeviceRegistry(
        cfg.auth.devices, token_sha256={d.id: d.token_sha256 for d in cfg.auth.devices}, admin_token_sha256=sha("a")
    )
    assert reg.by_token("t-desk").may_enrol and not reg.by_token("t-cam").may_enrol
    assert reg.by_token("a").may_enrol  # admin
    assert reg.by_certificate("desk-1").may_enrol and not reg.by_certificate("cam-1").may_enrol
    assert [reg.is_enrolment_desk(d) for d in ("desk-1", "cam-1", "desk-off", "nobody")] == [True, False, False, False]


# --------------------------------------------------------------------------- message ids per device


def test_message_ids_are_unique_per_device_over_grpc(keeping_all, templates):
    fresh = keeping_all  # relabelling below needs the identify templates kept
    stub = fresh.stub()
    mid = "shared-" + uuid.uuid4().hex
    a = templates.message(0, message_id=mid)
    b = templates.message(1, device_id="cam-2", message_id=mid)
    assert stub.Ingest(a, metadata=DEVICE, timeout=5).status == ACCEPTED
    assert stub.Ingest(b, metadata=CAM2, timeout=5).status == ACCEPTED  # was DUPLICATE: b was dropped
    assert stub.Ingest(b, metadata=CAM2, timeout=5).status == DUPLICATE
    summary = stub.IngestStream(iter([a, templates.message(2, message_id="m-2"), a]), metadata=DEVICE, timeout=5)
    assert [x.status for x in summary.acks] == [DUPLICATE, ACCEPTED, DUPLICATE]
    store = fresh.services.store
    assert store.count_received() == 3
    # relabelling names the device's template; a bare id two devices used is ambiguous and refused
    code, details = _code(
        stub.EnrolSubject, recognition_pb2.EnrolSubjectRequest(subject="carol", message_ids=[mid]), metadata=ADMIN
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"sent by 2 devices (cam-1, cam-2); name one as DEVICE_ID/{mid}" in details
    req = recognition_pb2.EnrolSubjectRequest(subject="carol", message_ids=[f"cam-2/{mid}", "m-2"])
    assert stub.EnrolSubject(req, metadata=ADMIN, timeout=5).templates == 2
    assert store.get_template(mid, device_id="cam-2").subject == "carol"
    assert store.get_template(mid, device_id="cam-1").subject is None


# --------------------------------------------------------------------------- MQTT: the same refusals, dead-lettered


class DeadLetters:
    def __init__(self) -> None:
        self.docs: list[dict] = []
        self.cond = threading.Condition()
        ready = threading.Event()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dl-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
        c.on_connect = lambda cl, *a: cl.subscribe(f"{MQTT_PREFIX}/deadletter", qos=1)
        c.on_subscribe = lambda *a: ready.set()
        c.on_message = self._on_message
        c.connect("127.0.0.1", 1883)
        c.loop_start()
        assert ready.wait(5)
        self.client = c

    def _on_message(self, client, userdata, msg):
        with self.cond:
            self.docs.append(json.loads(msg.payload))
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 15.0) -> list[dict]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.docs) >= n, timeout)
            return list(self.docs)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _wait_for(pred, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred():
        time.sleep(0.05)
    return pred()


@pytest.mark.mqtt
@pytest.mark.parametrize("require_registered", [True, False])
def test_mqtt_refuses_the_same_and_dead_letters_the_reason(
    tmp_path, pki, keypair, bundle_dir, templates, require_registered
):
    reason = mqtt_available()
    if reason:
        pytest.skip(reason)
    cfg = base_config(
        tmp_path,
        keypair[3],
        bundle_dir,
        mqtt={
            "enabled": True,
            "share_group": f"g{uuid.uuid4().hex[:8]}",
            "client_id": f"srv-{uuid.uuid4().hex[:8]}",
            "require_registered_device": require_registered,
        },
    )
    cfg["auth"]["allow_insecure"] = True
    dead = DeadLetters()
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", 1883)
    pub.loop_start()

    def topic(device: str) -> str:
        return f"{MQTT_PREFIX}/{SITE}/{device}/templates"

    try:
        mid = "shared-" + uuid.uuid4().hex
        good = [
            (topic("cam-1"), templates.message(0, purpose="enroll", subject="alice")),  # the enrolment desk
            (topic("cam-1"), templates.message(1, message_id=mid)),
            (topic("cam-2"), templates.message(2, device_id="cam-2", message_id=mid)),  # same id, other device
        ]
        bad = [
            (topic("cam-2"), templates.message(3, device_id="cam-2", purpose="enroll", subject="mallory")),
            (topic("cam-1"), _with_time(templates, 4, BAD_TIMES[0][1])),
            (topic("cam-1"), _with_time(templates, 5, BAD_TIMES[1][1])),
            (topic("cam-1"), _with_time(templates, 6, BAD_TIMES[3][1])),
            (topic("cam-1"), _with_trait(templates, 7, kind=wire.SOFT_TRAITS["age"], value=1e300, epsilon=1.0,
                                         mechanism="bounded-laplace")),
            (topic("cam-1"), templates.message(10, purpose="enroll", subject="background:eve")),  # desk, background
        ]  # fmt: skip
        codes = ["enrolment_not_permitted", "capture_time_future", "capture_time_too_old", "invalid_capture_time",
                 "invalid_soft_traits", "background_not_permitted"]  # fmt: skip
        if not require_registered:
            # an unregistered device's identify templates are taken; its enrolments never
            bad.append((topic("cam-9"), templates.message(8, device_id="cam-9", purpose="enroll", subject="eve")))
            codes.append("enrolment_not_permitted")
            good.append((topic("cam-9"), templates.message(9, device_id="cam-9")))
        infos = [pub.publish(t, m.SerializeToString(), qos=1) for t, m in [*good, *bad]]
        for info in infos:
            info.wait_for_publish(10)
        docs = dead.wait(len(bad))
        assert sorted(d["code"] for d in docs) == sorted(codes)
        enrol = next(d for d in docs if d["topic"] == topic("cam-2"))
        assert "enrolment_desk" in enrol["reason"]
        store = srv.services.store
        assert _wait_for(lambda: store.count_received() == len(good))
        assert store.seen([("cam-1", mid), ("cam-2", mid)]) == {("cam-1", mid), ("cam-2", mid)}
        assert store.count_templates(purpose="enroll") == 1 and store.count_templates(subject="mallory") == 0
        assert _rejected(srv, "enrolment_not_permitted", "mqtt") == codes.count("enrolment_not_permitted")
    finally:
        pub.disconnect()
        pub.loop_stop()
        dead.close()
        srv.app.stop(0)


def test_purpose_values_are_the_wire_enum():
    # The enrolment check compares the enum: keep it in step with the wire's names.
    assert wire.PURPOSES["enroll"] == template_pb2.PURPOSE_ENROLL


def test_the_ingest_section_is_bounded_and_its_defaults_are_the_validators():
    from peep.server.config import ConfigError, IngestConfig
    from peep.server.ingest.validation import DEFAULT_MAX_AGE_S, DEFAULT_MAX_CLOCK_SKEW_S

    assert (IngestConfig().max_clock_skew_s, IngestConfig().max_age_s) == (DEFAULT_MAX_CLOCK_SKEW_S, DEFAULT_MAX_AGE_S)
    base = {"bundle": {"public_key": "k.pem"}, "auth": {"allow_insecure": True}}
    for key, value in (("max_clock_skew_s", -1), ("max_age_s", 10), ("max_age_s", 1e12), ("max_ages", 5)):
        with pytest.raises(ConfigError, match=rf"ingest\.{key}"):
            parse_config({**base, "ingest": {key: value}})


def test_an_id_typed_decomposed_names_the_stored_subject(fresh, templates):
    # make_template stores NFC; erasure (CLI, RPC) normalises what the operator typed the same way.
    stub = fresh.stub()
    msg = templates.message(0, purpose="enroll", subject="Zoe\u0308")
    assert msg.subject == "Zo\u00eb" and stub.Ingest(msg, metadata=DEVICE, timeout=5).status == ACCEPTED
    assert fresh.services.erase_subject("Zoe\u0308", retrain=False).templates_deleted == 1
    assert fresh.services.store.count_templates() == 0
