"""Ingesting a device's decision instead of a template: over gRPC (TLS) and MQTT (the real Mosquitto), through
the same ingest path (de-duplication, acks, the device's identity), refused by name when its model is not the
one it says, recorded as an event with the subject (or unknown), its ledger ε, and nothing of a stranger."""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

import grpc
import paho.mqtt.client as mqtt
import pytest
from peep.core import wire
from peep.core.devicemodel import DeviceModel, class_id
from peep.v1 import recognition_pb2, template_pb2
from peep_testing.devicemodel import start_trained, verified
from peep_testing.server import (
    ADMIN,
    DEVICE_TOKENS,
    MQTT_PREFIX,
    SITE,
    EventCollector,
    auth,
    mqtt_available,
    rpc_error,
)

CAMERA = auth(DEVICE_TOKENS["cam-2"])  # an ordinary camera: no enrolment right


@pytest.fixture(scope="module")
def deciding(tmp_path_factory, pki, keypair, bundle_dir, templates, model_keys, calibration_path) -> Any:
    tmp = tmp_path_factory.mktemp("decisions")
    mqtt_section: dict[str, Any] = {"enabled": False}
    if mqtt_available() is None:
        mqtt_section = {"enabled": True, "share_group": f"g{uuid.uuid4().hex[:8]}",
                        "client_id": f"srv-{uuid.uuid4().hex[:8]}", "connections": 1}  # fmt: skip
    srv = start_trained(tmp, pki, keypair, bundle_dir, templates, model_keys, calibration_path, mqtt=mqtt_section)
    if srv.app.mqtt is not None:
        assert srv.app.mqtt.wait_ready(10)
    yield srv
    srv.app.stop(0)


@pytest.fixture(scope="module")
def model(deciding, templates, model_keys) -> DeviceModel:
    # As a door holds it: with the class key (a camera's labels are the same ids; the key only names them).
    answer = deciding.services.device_models.answer(templates.bundle_id, "", 0, with_class_key=True)
    return verified(answer, model_keys[1], bundle_id=templates.bundle_id, key_id="")


def decision(model: DeviceModel, *, subject: str | None = None, purpose: str = "identify", device: str = "cam-2",
             **kw: Any) -> Any:  # fmt: skip
    """A device's release of its decision with ``model``: the label of ``subject`` (None: unknown)."""
    fields: dict[str, Any] = dict(device_id=device, site=SITE, bundle_id=model.bundle_id, key_id=model.key_id,
                                  model_serial=model.serial, model_version=model.model_version, purpose=purpose,
                                  track_id=f"t-{uuid.uuid4().hex[:8]}")  # fmt: skip
    if purpose == "identify":
        label = "" if subject is None else class_id(model.class_key, subject)
        fields.update(label=label, epsilon_label=8.0, labels=model.n_subjects + 1)
    else:
        fields.update(subject=subject, accepted=kw.pop("accepted", True))
    fields.update(kw)
    return wire.make_decision(**fields)


def _ledger(srv: Any, message_id: str) -> dict[str, Any]:
    with sqlite3.connect(f"file:{srv.services.config.storage.path}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM ingest_ledger WHERE message_id = ?", (message_id,)).fetchone()
    return dict(row)


@pytest.mark.slow
def test_an_identification_decided_on_the_device_is_an_event_naming_its_subject(deciding, model, templates):
    subject = str(templates.subjects[templates.train[0]])
    named, stranger = decision(model, subject=subject), decision(model)
    with EventCollector(deciding, 2) as events:
        ack = deciding.stub().Ingest(named, metadata=CAMERA, timeout=10)
        assert ack.status == recognition_pb2.INGEST_STATUS_ACCEPTED
        deciding.stub().Ingest(stranger, metadata=CAMERA, timeout=10)
        got = {ev.message_id: ev for ev in events.wait()}
    ev = got[named.message_id]
    assert (ev.subject, ev.unknown, ev.decided_on, ev.model_serial) == (subject, False, "device", model.serial)
    assert ev.epsilon_label == 8.0 and ev.model_version == model.model_version and ev.device_id == "cam-2"
    ev = got[stranger.message_id]
    assert (ev.subject, ev.unknown, ev.decided_on) == ("", True, "device")
    # the ledger: the ε of the label, none for a template (there is none)
    row = _ledger(deciding, named.message_id)
    assert (row["mechanism_kind"], row["epsilon_label"], row["epsilon_vector"], row["epsilon_coordinate"]) == (
        "k-rr",
        8.0,
        0.0,
        0.0,
    )
    assert (row["transport"], row["sent_by"], row["purpose"]) == ("grpc", "device", "identify")
    assert row["epsilon_traits"] == 0
    # the kept decision says the same
    kept = {d.message_id: d for _, d in deciding.services.store.decisions(limit=100_000)}
    assert kept[named.message_id].decided_on == "device" and kept[named.message_id].epsilon_label == 8.0
    assert kept[stranger.message_id].unknown and kept[stranger.message_id].subject == ""


def test_a_stream_of_decisions_is_acknowledged_and_deduplicated_like_templates(deciding, model, templates):
    subject = str(templates.subjects[templates.train[1]])
    d = decision(model, subject=subject)
    with EventCollector(deciding, 1) as events:
        summary = deciding.stub().IngestStream(iter([d, d]), metadata=CAMERA, timeout=10)
        assert (summary.accepted, summary.duplicates, summary.rejected) == (1, 1, 0)
        again = deciding.stub().Ingest(d, metadata=CAMERA, timeout=10)
        assert again.status == recognition_pb2.INGEST_STATUS_DUPLICATE
        assert [ev.message_id for ev in events.wait()] == [d.message_id]


def test_a_doors_access_record_is_a_verify_event_with_no_label_epsilon(deciding, model, templates):
    subject = str(templates.subjects[templates.train[2]])
    opened, refused = (
        decision(model, subject=subject, purpose="verify"),
        decision(model, subject=subject, purpose="verify", accepted=False),
    )
    with EventCollector(deciding, 2) as events:
        summary = deciding.stub().IngestStream(iter([opened, refused]), metadata=CAMERA, timeout=10)
        assert summary.accepted == 2, [a.reason for a in summary.acks]
        got = {ev.message_id: ev for ev in events.wait()}
    assert got[opened.message_id].purpose == template_pb2.PURPOSE_VERIFY
    assert (got[opened.message_id].claimed_subject, got[opened.message_id].accepted) == (subject, True)
    assert not got[refused.message_id].accepted and got[refused.message_id].decided_on == "device"
    row = _ledger(deciding, opened.message_id)
    assert (row["mechanism_kind"], row["epsilon_label"], row["epsilon_vector"]) == ("access-record", 0.0, 0.0)


def test_a_door_opened_from_home_assistant_is_kept_as_a_record_naming_nobody_with_who_asked(deciding, model):
    """No face was looked at and no model decided: the record has no subject and no model, says who asked, and
    is kept and read back as such (the ledger row costs no ε)."""
    asked = wire.make_decision(device_id="cam-2", site=SITE, bundle_id=model.bundle_id, key_id=model.key_id,
                               model_serial=0, model_version="", purpose="verify", accepted=True,
                               requested_by="home_assistant", track_id="door-ha")  # fmt: skip
    with EventCollector(deciding, 1) as events:
        ack = deciding.stub().Ingest(asked, metadata=CAMERA, timeout=10)
        assert ack.status == recognition_pb2.INGEST_STATUS_ACCEPTED, ack.reason
        (ev,) = events.wait()
    assert (ev.purpose, ev.accepted, ev.requested_by, ev.claimed_subject, ev.subject, ev.decided_on) == (
        template_pb2.PURPOSE_VERIFY, True, "home_assistant", "", "", "device")  # fmt: skip
    kept = {d.message_id: d for _, d in deciding.services.store.decisions(limit=100_000)}
    assert kept[asked.message_id].requested_by == "home_assistant" and kept[asked.message_id].claimed_subject == ""
    row = _ledger(deciding, asked.message_id)
    assert (row["mechanism_kind"], row["epsilon_label"], row["epsilon_vector"]) == ("access-record", 0.0, 0.0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: setattr(m.decision, "requested_by", "the-neighbour"), "decision.requested_by"),
        (lambda m: setattr(m, "subject", "alice"), "subject"),
        (lambda m: setattr(m.decision, "model_serial", 3), "decision.model_serial"),
        (lambda m: setattr(m.decision, "accepted", False), "decision.accepted"),
        (lambda m: setattr(m, "purpose", template_pb2.PURPOSE_IDENTIFY), "decision.requested_by"),
    ],
)
def test_a_record_of_an_opening_asked_for_is_refused_by_name_when_it_says_more(change, field) -> None:
    msg = wire.make_decision(device_id="door-1", site=SITE, bundle_id="b", key_id="", model_serial=0,
                             model_version="", purpose="verify", accepted=True,
                             requested_by="home_assistant")  # fmt: skip
    change(msg)
    with pytest.raises(wire.WireError, match=field.replace(".", r"\.")):
        wire.validate_template(msg)


def _refused(srv: Any, msg: Any, metadata: Any = CAMERA) -> tuple[str, str]:
    """A refused decision's (reason of the stream ack, details of the unary call)."""
    summary = srv.stub().IngestStream(iter([msg]), metadata=metadata, timeout=10)
    assert summary.rejected == 1, summary
    code, details = rpc_error(srv.stub().Ingest, msg, metadata=metadata, timeout=10)
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)
    assert summary.acks[0].reason == details
    return summary.acks[0].reason, details


def test_decisions_are_refused_by_name_when_their_model_is_not_the_one_they_say(deciding, model):
    from peep.server.storage.devicemodels import IssuedModel

    s = deciding.services
    reason, _ = _refused(deciding, decision(model, model_serial=10**9))
    assert reason.startswith("decision.model_serial: expected a device model this server issued")
    reason, _ = _refused(deciding, decision(model, model_version="v999999"))
    assert reason.startswith(f"decision.model_version: expected {model.model_version}")
    reason, _ = _refused(deciding, decision(model, key_id="sk-0123456789abcdef"))
    assert reason.startswith("key_id: expected none") and "sk-0123456789abcdef" in reason
    reason, _ = _refused(deciding, decision(model, label="0123456789abcdef01234567"))
    assert reason.startswith("decision.label: expected one of the class ids of device model")

    def fake(bundle_id: str, key_id: str) -> IssuedModel:
        return s.device_models.rows.issue(
            lambda serial: IssuedModel(serial, model.model_version, bundle_id, key_id, 1.0, time.time(),
                                       time.time() + 3600, 5, 0, "cal", "promotion", payload=b"-"),
            bundle_id=bundle_id, key_id=key_id,
        )  # fmt: skip

    other = fake("eb-other-bundle", "")
    reason, _ = _refused(deciding, decision(model, model_serial=other.serial))
    assert reason.startswith("bundle_id: expected eb-other-bundle")
    retired = fake(model.bundle_id, "sk-00000000000000aa")
    s.retire_key("sk-00000000000000aa")
    reason, _ = _refused(deciding, decision(model, model_serial=retired.serial, key_id="sk-00000000000000aa"))
    assert reason.startswith(f"decision.model_serial: device model {retired.serial} was withdrawn")


def test_decisions_come_only_from_the_device_that_decided(deciding, model, templates):
    subject = str(templates.subjects[templates.train[3]])
    _, details = _refused(deciding, decision(model, subject=subject), metadata=ADMIN)
    assert details.startswith("decision: expected the decision of the device that made it")
    _, details = _refused(deciding, decision(model, subject=subject, device="cam-1"))
    assert details.startswith("device_id: expected 'cam-2'")
    # never an enrolment: a decision with purpose ENROLL is not one
    d = decision(model, subject=subject, purpose="verify")
    d.purpose = template_pb2.PURPOSE_ENROLL
    d.decision.accepted = False
    reason, _ = _refused(deciding, d, metadata=auth(DEVICE_TOKENS["cam-1"]))  # an enrolment desk
    assert reason.startswith("purpose: expected 'identify' or 'verify' for a decision")
    # a decision is not a query: Identify and Verify take a template
    code, details = rpc_error(deciding.stub().Identify, recognition_pb2.IdentifyRequest(template=decision(model)),
                              metadata=CAMERA, timeout=10)  # fmt: skip
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("template: expected a perturbed template")


@pytest.mark.mqtt
def test_a_decision_over_mqtt_is_an_event_and_a_bad_one_is_dead_lettered(deciding, model, templates):
    if deciding.app.mqtt is None:
        pytest.skip(str(mqtt_available()))
    subject = str(templates.subjects[templates.train[4]])
    good, bad = decision(model, subject=subject), decision(model, model_serial=10**9)
    dead: list[bytes] = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"cam-{uuid.uuid4().hex[:6]}", protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, u, m: dead.append(bytes(m.payload))
    c.connect("127.0.0.1", 1883)
    c.loop_start()
    try:
        c.subscribe(f"{MQTT_PREFIX}/deadletter", qos=1)
        time.sleep(0.3)
        with EventCollector(deciding, 1) as events:
            for msg in (good, bad):
                c.publish(f"{MQTT_PREFIX}/{SITE}/cam-2/templates", msg.SerializeToString(), qos=1).wait_for_publish(5)
            (ev,) = events.wait()
        deadline = time.monotonic() + 10
        while not dead and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        c.disconnect()
        c.loop_stop()
    assert (ev.message_id, ev.subject, ev.decided_on) == (good.message_id, subject, "device")
    assert _ledger(deciding, good.message_id)["transport"] == "mqtt"
    assert dead and b'"code":"unknown_model_serial"' in dead[0] and good.message_id.encode() not in dead[0]


def test_nothing_of_a_stranger_is_kept_but_the_ledger_row_and_the_unknown_decision(deciding, model):
    """Read every table, every column: a stranger's decision left its message id in the ledger and the decision
    (which names nobody) only; the kept-category counts and the decisions' retention cover them."""
    s = deciding.services
    before = s.store.kept_counts(s.config.training.background_prefix)
    msgs = [decision(model, track_id=f"stranger-{k}") for k in range(5)]
    with EventCollector(deciding, len(msgs)) as events:
        summary = deciding.stub().IngestStream(iter(msgs), metadata=CAMERA, timeout=10)
        assert summary.accepted == len(msgs)
        assert all(ev.unknown and ev.subject == "" for ev in events.wait())
    ids = {m.message_id for m in msgs}
    where: dict[str, set[str]] = {}
    with sqlite3.connect(f"file:{s.config.storage.path}?mode=ro", uri=True) as conn:
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for row in conn.execute(f"SELECT * FROM {table}"):  # the database's own table names
                for cell in row:
                    if isinstance(cell, str) and cell in ids:
                        where.setdefault(table, set()).add(cell)
                    elif isinstance(cell, str) and cell.startswith("stranger-"):
                        where.setdefault(table, set()).add(cell)
    named = ids | {m.track_id for m in msgs}
    assert where == {"ingest_ledger": named, "recognition_events": named}
    after = s.store.kept_counts(s.config.training.background_prefix)
    assert after.unknown_decisions == before.unknown_decisions + len(msgs) and after.unknown == before.unknown
    assert after.recognised == before.recognised  # no template of any decision
    # the decisions' retention (recognition.events_days) and the ledger's window forget them like any other
    gone = s.enforce_retention(now=time.time() + s.config.recognition.events_days_s + 3600)
    assert gone["decisions"] >= len(msgs)
    assert not ids & {d.message_id for _, d in s.store.decisions(limit=100_000)}


def test_an_erased_subjects_label_is_recorded_as_unknown(deciding, model, templates):
    """Erasure issues a model without them, but a device may still send a decision of the one before: the server
    records it as unknown, naming nobody."""
    subject = str(templates.subjects[templates.train[5]])
    deciding.services.erase_subject(subject, retrain=False)
    late = decision(model, subject=subject)
    with EventCollector(deciding, 1) as events:
        deciding.stub().Ingest(late, metadata=CAMERA, timeout=10)
        (ev,) = events.wait()
    assert ev.unknown and ev.subject == "" and ev.decided_on == "device"
    assert not deciding.services.store.names_subject(subject)


@pytest.mark.slow
def test_on_postgresql_a_decision_is_ledgered_and_kept_like_on_sqlite(
    tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path, pg_dsn
):
    """Replicas' store: the registry and the device models in the database, the same ledger ε and event."""
    srv = start_trained(tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path,
                        storage={"backend": "postgres", "dsn": pg_dsn, "pool_size": 2})  # fmt: skip
    try:
        s = srv.services
        assert s.clustered and s.store.dialect == "postgres"
        answer = s.device_models.answer(templates.bundle_id, "", 0, with_class_key=True)
        model = verified(answer, model_keys[1], bundle_id=templates.bundle_id, key_id="")
        subject = str(templates.subjects[templates.train[0]])
        named, stranger = decision(model, subject=subject), decision(model)
        summary = srv.stub().IngestStream(iter([named, stranger]), metadata=CAMERA, timeout=10)
        assert summary.accepted == 2, [a.reason for a in summary.acks]
        kept = {d.message_id: d for _, d in s.store.decisions(limit=1000)}
        assert (kept[named.message_id].subject, kept[named.message_id].decided_on) == (subject, "device")
        assert kept[named.message_id].model_serial == model.serial and kept[stranger.message_id].unknown
        with s.store._session() as conn:
            rows = dict(conn.execute("SELECT message_id, epsilon_label FROM ingest_ledger WHERE message_id = ANY(%s)",
                                     ([named.message_id, stranger.message_id],)).fetchall())  # fmt: skip
        assert rows == {named.message_id: 8.0, stranger.message_id: 8.0}
    finally:
        srv.app.stop(0)
