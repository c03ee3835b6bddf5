"""The Devices page on a real server (TLS, SQLite, the broker on 127.0.0.1:1883): what each device released, as
the ingest ledger counts it, by the transport it came by, apart from what the administrator sent in its name,
and the warning a door's report can carry.

A small site of its own: an enrolment desk (``desk-1``) that enrols people with its own credential, and through
which the administrator enrols the public background (``EnrolSubject`` with the admin credential, as ``peep-edge
enroll-background`` does); a door deciding over gRPC (``door-1``), one deciding over MQTT (``door-2``), and a
camera on MQTT (``cam-3``). Synthetic faces (no LFW), released through the core pipeline with the secure sampler.
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from peep_testing.console import PASSWORDS, ROLES, Console, Faces
from peep_testing.server import (
    ADMIN,
    MQTT_PREFIX,
    SITE,
    auth,
    base_config,
    make_pki,
    mqtt_available,
    sha,
    start_server,
    tls_section,
)

TOKENS = {d: f"tok-{d}-{uuid.uuid4().hex}" for d in ("desk-1", "door-1", "door-2", "cam-3")}
SUBJECTS = ("alice", "bob", "carol", "dave")
BACKGROUND = 3  # identities the administrator enrols through the desk, 8 templates each


def md(device: str) -> list[tuple[str, str]]:
    return auth(TOKENS[device])


@dataclass
class Site:
    console: Console
    faces: Faces
    #: ε per vector of one release of this site's mechanism (every template here has no soft traits).
    epsilon_vector: float
    desk_own: int
    desk_background: int
    #: The server's decision key (signs its claim-check answers) and door-2's own signing key (registered).
    decision_key: Any = None
    door_key: Any = None

    @property
    def server(self) -> Any:
        return self.console.server

    def topic(self, device: str, leaf: str) -> str:
        return f"{MQTT_PREFIX}/{SITE}/{device}/{leaf}"

    def ledger_rows(self, device: str) -> list[dict[str, Any]]:
        """Every ledger row of ``device``, each as a dict of its columns (read from the database file)."""
        self.server.services.ingestor.decisions.flush()
        con = sqlite3.connect(self.server.tmp / "peep.db")
        try:
            cur = con.execute("SELECT * FROM ingest_ledger WHERE device_id = ?", (device,))
            names = [c[0] for c in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        finally:
            con.close()

    def devices_page(self) -> str:
        self.server.services.ingestor.decisions.flush()
        with self.console.login("olga") as c:
            r = c.get("/devices")
        assert r.status_code == 200
        return r.text


def row_of(page: str, device: str) -> str:
    m = re.search(rf"<tr>\s*<td>{re.escape(device)}</td>.*?</tr>", page, re.S)
    assert m, f"no row for {device}: {page[:3000]}"
    return m.group(0)


def cell(row: str, cls: str) -> str:
    m = re.search(rf'<td class="{cls}"[^>]*>(.*?)</td>', row, re.S)
    assert m, f"no {cls} cell: {row}"
    return m.group(1)


def number(html: str) -> float:
    m = re.match(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)", html)
    assert m, html
    return float(m.group(1).replace(",", ""))


def mqtt_device(device: str) -> mqtt.Client:
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=f"{device}-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
    )
    up = threading.Event()
    c.on_connect = lambda *a: up.set()
    c.connect("127.0.0.1", 1883, keepalive=10)
    c.loop_start()
    assert up.wait(5)
    return c


def wait_for(predicate: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    reason = mqtt_available()
    if reason:
        pytest.skip(reason)
    from peep.core.release import TemplateReleaser
    from peep.lab.bench.server import synthetic_bundle
    from peep.server.console import accounts
    from peep.server.console.store import ConsoleStore
    from peep.v1 import recognition_pb2

    tmp = tmp_path_factory.mktemp("devices-page")
    pki = make_pki(tmp_path_factory.mktemp("devices-page-pki"))
    bundle, pub = synthetic_bundle(tmp)
    releaser = TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0)
    rng = np.random.default_rng(1)
    faces = Faces(bundle, releaser, rng.random((len(SUBJECTS) + BACKGROUND, bundle.n_features), dtype=np.float32), rng)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from peep.core.bundle import load_private_key, write_keypair
    from peep.core.signing import public_key_text

    decision_path, _ = write_keypair(tmp / "decisions")
    door_key = Ed25519PrivateKey.generate()
    cfg = base_config(
        tmp,
        pub,
        tmp / "bundle",
        grpc={"tls": tls_section(pki)},
        console={"listen": "127.0.0.1:0"},
        mqtt={
            "enabled": True,
            "share_group": f"g{uuid.uuid4().hex[:8]}",
            "clear_retained": False,
            "decision_signing_key": str(decision_path),
        },
    )
    cfg["auth"]["devices"] = [
        {"id": "desk-1", "site": SITE, "token_sha256": sha(TOKENS["desk-1"]), "enrolment_desk": True},
        *({"id": d, "site": SITE, "token_sha256": sha(TOKENS[d])} for d in ("door-1", "cam-3")),
        # door-2 decides over MQTT: its VERIFY counts only with its own signature.
        {
            "id": "door-2",
            "site": SITE,
            "token_sha256": sha(TOKENS["door-2"]),
            "signing_key": public_key_text(door_key.public_key()),
        },
    ]
    srv = start_server(cfg, pki, tmp, mqtt_wait=10)
    try:
        stub = srv.stub()
        own = [faces.message(k, purpose="enroll", subject=s, device="desk-1") for k, s in enumerate(SUBJECTS)
               for _ in range(8)]  # fmt: skip
        assert stub.IngestStream(iter(own), metadata=md("desk-1"), timeout=60).rejected == 0
        n_background = 0
        for j in range(BACKGROUND):
            subject = f"background:{j}"
            msgs = [faces.message(len(SUBJECTS) + j, purpose="enroll", subject=subject, device="desk-1",
                                  track_id=f"bg{j}-{i}") for i in range(8)]  # fmt: skip
            req = recognition_pb2.EnrolSubjectRequest(subject=subject, templates=msgs)
            n_background += stub.EnrolSubject(req, metadata=ADMIN, timeout=60).templates
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
        store = ConsoleStore(srv.services.store)
        for name, pw in PASSWORDS.items():
            store.add_account(name, ROLES[name], accounts.hash_password(pw), must_change=False)
        eps = own[0].mechanism.epsilon_vector
        assert eps > 0 and all(m.mechanism.epsilon_vector == eps for m in own)
        yield Site(Console(srv, faces, pki), faces, eps, len(own), n_background, load_private_key(decision_path),
                   door_key)  # fmt: skip
    finally:
        srv.app.stop(0)


@pytest.mark.slow
def test_a_doors_claims_over_grpc_are_its_releases_on_devices_and_privacy_from_the_ledger(site: Site):
    """Each claim's VERIFY template, decided by ``Verify`` and forgotten, is a ledger row of the door (ids, times,
    ε; no template) and so on the Devices page; a retried call with the same message id is counted once."""
    from peep.v1 import recognition_pb2

    stub = site.server.stub()
    claims = [("alice", 0), ("bob", 1), ("alice", 2), ("carol", 2)]  # genuine and impostor claims
    sent = []
    for subject, k in claims:
        nonce = secrets.token_hex(16)  # a door's claim nonce is its template's message id
        msg = site.faces.message(k, purpose="verify", subject=subject, device="door-1", message_id=nonce,
                                 track_id=f"door-{nonce[:12]}")  # fmt: skip
        stub.Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject=subject), metadata=md("door-1"),
                    timeout=10)  # fmt: skip
        sent.append(msg)
    # the door retrying its last claim after a lost answer: the same release, not another one
    stub.Verify(recognition_pb2.VerifyRequest(template=sent[-1], claimed_subject=claims[-1][0]),
                metadata=md("door-1"), timeout=10)  # fmt: skip

    rows = site.ledger_rows("door-1")
    assert sorted(r["message_id"] for r in rows) == sorted(m.message_id for m in sent)
    assert {(r["purpose"], r["transport"], r["sent_by"]) for r in rows} == {("verify", "grpc", "device")}
    spent = sum(m.mechanism.epsilon_vector for m in sent)
    assert sum(r["epsilon_vector"] for r in rows) == pytest.approx(spent)
    assert {r["epsilon_coordinate"] for r in rows} == {sent[0].mechanism.epsilon_coordinate}
    # decided, then forgotten: no template of the door's is kept
    con = sqlite3.connect(site.server.tmp / "peep.db")
    try:
        assert con.execute("SELECT COUNT(*) FROM templates WHERE device_id = 'door-1'").fetchone() == (0,)
    finally:
        con.close()

    row = row_of(site.devices_page(), "door-1")
    assert number(cell(row, "releases")) == len(sent)
    assert number(cell(row, "eps-total")) == pytest.approx(spent, rel=1e-3)
    assert cell(row, "transport").startswith("releases: gRPC")
    with site.console.login("olga") as c:
        privacy = c.get("/privacy").text
    mechanisms = re.search(r'<table id="mechanisms">.*?</table>', privacy, re.S)
    assert mechanisms and "door-1" in mechanisms.group(0)


def test_a_door_deciding_over_mqtt_is_counted_and_shown_with_its_transport(site: Site):
    """A VERIFY template on the door's templates topic, signed by the door and carrying the server's answer to
    its claim check: decided by the MQTT consumer, counted like any release."""
    from peep.core.signing import door_statement, sign_statement, sign_template

    door = mqtt_device("door-2")
    try:
        sent = []
        for subject, k in (("bob", 1), ("dave", 0)):
            nonce = secrets.token_hex(16)
            msg = site.faces.message(k, purpose="verify", subject=subject, device="door-2", message_id=nonce,
                                     track_id=f"door-{nonce[:12]}")  # fmt: skip
            asked = door_statement("claim_check", site=SITE, device_id="door-2", nonce=nonce, subject=subject,
                                   verdict=True)  # fmt: skip
            msg.claim_signature = sign_statement(site.decision_key, asked)
            sign_template(site.door_key, msg)
            door.publish(site.topic("door-2", "templates"), msg.SerializeToString(), qos=1).wait_for_publish(5)
            sent.append(msg)
        assert wait_for(lambda: len(site.ledger_rows("door-2")) == len(sent)), site.ledger_rows("door-2")
    finally:
        door.disconnect()
        door.loop_stop()
    rows = site.ledger_rows("door-2")
    assert {(r["purpose"], r["transport"], r["sent_by"]) for r in rows} == {("verify", "mqtt", "device")}
    row = row_of(site.devices_page(), "door-2")
    assert number(cell(row, "releases")) == len(sent)
    assert number(cell(row, "eps-total")) == pytest.approx(sum(m.mechanism.epsilon_vector for m in sent), rel=1e-3)
    assert cell(row, "transport").startswith("releases: MQTT")


def test_an_mqtt_camera_is_shown_with_its_own_transport_after_a_grpc_call_with_its_credential(site: Site):
    """The demo's cam-3: templates and report over MQTT, then its credential used over gRPC (the demo verifies its
    captures by claim). The status says where it was learnt; the transport is the camera's own: MQTT."""
    from peep.core.reports import DeviceReport
    from peep.lab.processes.retained import clear_retained
    from peep.v1 import recognition_pb2

    cam = mqtt_device("cam-3")
    report_topic = site.topic("cam-3", "report")
    try:
        msgs = [site.faces.message(k % len(SUBJECTS), device="cam-3", track_id=f"t{k}") for k in range(3)]
        for m in msgs:
            cam.publish(site.topic("cam-3", "templates"), m.SerializeToString(), qos=1).wait_for_publish(5)
        report = DeviceReport(at=time.time(), bundle_id=msgs[0].bundle_id, mechanism="peep-raw",
                              epsilon_vector=site.epsilon_vector, epsilon_coordinate=8.0,
                              epsilon_vector_per_release=site.epsilon_vector, track_budget_vector=None,
                              device_budget_vector=None, releases=len(msgs),
                              epsilon_vector_spent=len(msgs) * site.epsilon_vector)  # fmt: skip
        cam.publish(report_topic, report.to_json(), qos=1, retain=True).wait_for_publish(5)
        assert wait_for(lambda: len(site.ledger_rows("cam-3")) == len(msgs))
        assert wait_for(lambda: "cam-3" in site.server.app.mqtt.device_reports())
        stub = site.server.stub()
        stub.Verify(recognition_pb2.VerifyRequest(template=msgs[0], claimed_subject="alice"), metadata=md("cam-3"),
                    timeout=10)  # fmt: skip
        assert site.server.app._device_status()()["cam-3"][2] == "grpc"  # the latest contact: a gRPC call
        row = row_of(site.devices_page(), "cam-3")
    finally:
        cam.disconnect()
        cam.loop_stop()
        clear_retained([report_topic])
    transport = cell(row, "transport")
    assert transport.startswith("releases: MQTT") and "report: MQTT (retained)" in transport
    assert "gRPC" not in transport
    assert number(cell(row, "releases")) == len(msgs)  # the claim re-checked one of them: no new release
    assert 'data-via="grpc"' in row and "its gRPC calls" in row  # the status, with its source named


def test_background_enrolled_by_the_administrator_through_a_desk_is_counted_apart(site: Site):
    """The desk's own releases and ε against what the admin credential sent in its name (its background)."""
    row = row_of(site.devices_page(), "desk-1")
    releases = cell(row, "releases")
    assert number(releases) == site.desk_own
    assert number(cell(row, "eps-total")) == pytest.approx(site.desk_own * site.epsilon_vector, rel=1e-3)
    admin = re.search(r'class="admin-sent">and ([0-9,]+) sent in its name with the administrator', releases)
    assert admin and number(admin.group(1)) == site.desk_background > 0
    # nor in the chart: the desk's series ends at its own spend
    store = site.server.app.console.console.store
    per = store.epsilon_by_device_hour(0.0)
    assert sum(e for d, _, e in per if d == "desk-1") == pytest.approx(site.desk_own * site.epsilon_vector)
    # the ledger says whose credential sent each row
    rows = site.ledger_rows("desk-1")
    assert sum(r["sent_by"] == "device" for r in rows) == site.desk_own
    assert sum(r["sent_by"] == "admin" for r in rows) == site.desk_background


def test_a_door_reporting_an_insecure_broker_is_warned_about_on_devices(site: Site):
    """``insecure_broker`` in a door's report (retained on MQTT): a warning naming the door above the table and in
    its row; a door whose report says nothing of it (over gRPC) gets none."""
    from peep.core.reports import DeviceReport
    from peep.lab.processes.retained import clear_retained
    from peep.v1 import recognition_pb2

    def report() -> DeviceReport:
        return DeviceReport(at=time.time(), bundle_id=site.faces.bundle.bundle_id, mechanism="peep-raw",
                            epsilon_vector=site.epsilon_vector, epsilon_coordinate=8.0,
                            epsilon_vector_per_release=site.epsilon_vector, track_budget_vector=None,
                            device_budget_vector=None, releases=2,
                            epsilon_vector_spent=2 * site.epsilon_vector)  # fmt: skip

    site.server.stub().ReportDevice(
        recognition_pb2.DeviceReportRequest(device_id="door-1", site=SITE, report=report().to_json()),
        metadata=md("door-1"), timeout=10,
    )  # fmt: skip
    door = mqtt_device("door-2")
    topic = site.topic("door-2", "report")
    try:
        # as a door's agent writes it: the report with the key added (true)
        payload = json.dumps({**json.loads(report().to_json()), "insecure_broker": True}).encode()
        door.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
        reports = site.server.app.mqtt.device_reports
        assert wait_for(lambda: "door-2" in reports()), "the server refused the door's report"
        assert wait_for(lambda: reports()["door-2"][0].insecure_broker)
        page = site.devices_page()
    finally:
        door.disconnect()
        door.loop_stop()
        clear_retained([topic])
    banner = re.search(r'<p class="error" id="insecure-brokers">(.*?)</p>', page, re.S)
    assert banner and "door-2" in banner.group(1) and "door-1" not in banner.group(1)
    assert "without TLS or without credentials" in banner.group(1)
    assert "insecure broker" in cell(row_of(page, "door-2"), "transport")
    door_1 = cell(row_of(page, "door-1"), "transport")
    assert "report: gRPC (ReportDevice)" in door_1 and "insecure" not in door_1


@pytest.mark.slow
def test_what_a_device_spent_beyond_what_reached_the_server_is_shown_from_its_report(site: Site):
    """A release the server refused (a clock far ahead, say) was still spent: its ε is in the device's ledger and
    report, not in the server's. The row says both, so the ε on the page is never less than the device spent."""
    from peep.core.reports import DeviceReport
    from peep.v1 import recognition_pb2

    stub = site.server.stub()
    time.sleep(1.1)  # another test's report of door-1 may be less than the server's second old
    msg = site.faces.message(0, purpose="identify", device="door-1")
    stub.Identify(recognition_pb2.IdentifyRequest(template=msg), metadata=md("door-1"), timeout=10)
    received = number(cell(row_of(site.devices_page(), "door-1"), "eps-total"))
    spent = received + 3 * site.epsilon_vector  # three more releases that never reached the ledger here
    report = DeviceReport(at=time.time(), bundle_id=site.faces.bundle.bundle_id, mechanism="peep-raw",
                          epsilon_vector=site.epsilon_vector, epsilon_coordinate=8.0,
                          epsilon_vector_per_release=site.epsilon_vector, track_budget_vector=None,
                          device_budget_vector=None, releases=99, epsilon_vector_spent=spent)  # fmt: skip
    stub.ReportDevice(recognition_pb2.DeviceReportRequest(device_id="door-1", site=SITE, report=report.to_json()),
                      metadata=md("door-1"), timeout=10)  # fmt: skip
    total = cell(row_of(site.devices_page(), "door-1"), "eps-total")
    assert number(total) == pytest.approx(received, rel=1e-3)  # what reached the server, as before
    shown = re.search(r'class="eps-reported">spent by the device \(its report\): ([0-9.,]+) over 99 releases', total)
    assert shown and float(shown.group(1).replace(",", "")) == pytest.approx(spent, rel=1e-3), total
    # a report that agrees with the ledger adds nothing
    time.sleep(1.1)  # the server takes one report a second per device
    agreeing = DeviceReport(**{**report.__dict__, "epsilon_vector_spent": received, "at": time.time()})
    stub.ReportDevice(recognition_pb2.DeviceReportRequest(device_id="door-1", site=SITE, report=agreeing.to_json()),
                      metadata=md("door-1"), timeout=10)  # fmt: skip
    assert "eps-reported" not in cell(row_of(site.devices_page(), "door-1"), "eps-total")
    # nor does one older than the latest releases (its final one refused, say): what reached the server is more
    time.sleep(1.1)
    behind = DeviceReport(**{**report.__dict__, "epsilon_vector_spent": received - site.epsilon_vector,
                             "at": time.time()})  # fmt: skip
    stub.ReportDevice(recognition_pb2.DeviceReportRequest(device_id="door-1", site=SITE, report=behind.to_json()),
                      metadata=md("door-1"), timeout=10)  # fmt: skip
    total = cell(row_of(site.devices_page(), "door-1"), "eps-total")
    assert "eps-reported" not in total and number(total) == pytest.approx(received, rel=1e-3)
