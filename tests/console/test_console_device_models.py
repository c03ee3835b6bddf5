"""The console's view of decisions made on devices, on a real server (TLS, SQLite) issuing device models:
the Models page lists the issued models and the calibration set, the Devices page each device's decision mode
and device model from its report; a server issuing none says why."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pytest
from peep_testing.console import PASSWORDS, ROLES, Console, Faces
from peep_testing.server import ADMIN, DEVICE_TOKENS, SITE, auth, base_config, make_pki, start_server, tls_section

SUBJECTS = ("alice", "bob", "carol", "dave")


@pytest.fixture(scope="module")
def issuing(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from peep.core.bundle import write_keypair
    from peep.core.release import TemplateReleaser
    from peep.lab.bench.server import synthetic_bundle
    from peep.server.bundles.calibrate import write_calibration
    from peep.server.console import accounts
    from peep.server.console.store import ConsoleStore
    from peep.v1 import recognition_pb2

    tmp = tmp_path_factory.mktemp("console-dm")
    pki = make_pki(tmp_path_factory.mktemp("console-dm-pki"))
    bundle, pub = synthetic_bundle(tmp)
    releaser = TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0)
    rng = np.random.default_rng(1)
    faces = Faces(bundle, releaser, rng.random((len(SUBJECTS) + 3, bundle.n_features), dtype=np.float32), rng)
    key_path, _ = write_keypair(tmp / "models")
    public = rng.random((40, bundle.n_features), dtype=np.float32)  # public people no model is trained on
    cal = write_calibration(tmp / "cal.npz", projections=bundle.project(public, "box_clipped"),
                            people=[f"public-{i // 4}" for i in range(40)], bundle_id=bundle.bundle_id,
                            domain="box_clipped", mechanism="peep-raw")  # fmt: skip
    device_models = {"signing_key": str(key_path), "calibration": str(tmp / "cal.npz")}
    cfg = base_config(tmp, pub, tmp / "bundle", grpc={"tls": tls_section(pki)}, console={"listen": "127.0.0.1:0"},
                      training={"model_dir": str(tmp / "models"), "device_models": device_models})  # fmt: skip
    srv = start_server(cfg, pki, tmp)
    try:
        msgs = [faces.message(k, purpose="enroll", subject=s) for k, s in enumerate(SUBJECTS) for _ in range(12)]
        for j in range(3):
            msgs += [faces.message(len(SUBJECTS) + j, purpose="enroll", subject=f"background:{j}") for _ in range(12)]
        stub = srv.stub()
        assert stub.IngestStream(iter(msgs), metadata=ADMIN, timeout=60).rejected == 0
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
        store = ConsoleStore(srv.services.store)
        for name, pw in PASSWORDS.items():
            store.add_account(name, ROLES[name], accounts.hash_password(pw), must_change=False)
        yield Console(srv, faces, pki), cal
    finally:
        srv.app.stop(0)


def _report(device: str, decision: dict[str, Any] | None, srv: Any) -> None:
    from peep.core.reports import DeviceReport
    from peep.v1 import recognition_pb2

    rep = DeviceReport(at=time.time(), bundle_id="eb-1", mechanism="k-rr", epsilon_vector=8.0, epsilon_coordinate=8.0,
                       epsilon_vector_per_release=8.0, track_budget_vector=None, device_budget_vector=None,
                       releases=3, epsilon_vector_spent=24.0, decision=decision)  # fmt: skip
    srv.stub().ReportDevice(
        recognition_pb2.DeviceReportRequest(device_id=device, site=SITE, report=rep.to_json()),
        metadata=auth(DEVICE_TOKENS[device]), timeout=5,
    )  # fmt: skip


def _row(html: str, device: str) -> str:
    m = re.search(rf"<tr>\s*<td>{re.escape(device)}</td>.*?</tr>", html, re.S)
    assert m, f"no row of {device}"
    return m.group(0)


def test_the_models_page_lists_the_issued_device_models_and_the_calibration_set(issuing):
    console, cal = issuing
    s = console.server.services
    s.device_models.issue("erasure")  # a second serial, as an erasure issues one
    with console.login("root") as c:
        html = c.get("/models").text
    m = re.search(r'<table id="device-models">.*?</table>', html, re.S)
    assert m, html[-2000:]
    table = m.group(0)
    assert table.count("<tr") == 3  # the header and two serials, the newest first
    assert "newest (served)" in table and "superseded" in table
    assert ">promotion<" in table and ">erasure<" in table and "v000001" in table
    assert f"{len(SUBJECTS)} (0)" in table
    assert f"<code>{cal.sha256[:16]}</code>: 40 faces of 10 public people" in html
    assert 'id="device-models-off"' not in html and 'id="device-models-error"' not in html


def test_the_devices_page_shows_each_devices_decision_mode_and_its_model(issuing):
    console, _ = issuing
    srv = console.server
    now = time.time()
    _report("cam-1", {"mode": "device", "model_serial": 7, "model_version": "v000001", "model_trained_at": now - 7200,
                      "model_expires_at": now + 3 * 86400, "subjects": 4, "epsilon_label": 8.0,
                      "flip_probability": 0.0033, "fpir_target": 0.01, "fpir_floor": 0.0033}, srv)  # fmt: skip
    problem = "fpir: the model's target 0.001 is at or below the FPIR floor of this device's labels <b>"
    _report("cam-2", {"mode": "device", "model_serial": None, "model_version": None, "model_trained_at": None,
                      "model_expires_at": None, "subjects": None, "epsilon_label": 8.0, "flip_probability": None,
                      "problem": problem}, srv)  # fmt: skip
    with console.login("olga") as c:
        html = c.get("/devices").text
    cam1, cam2 = _row(html, "cam-1"), _row(html, "cam-2")
    assert 'data-mode="device"' in cam1 and "model 7 (v000001), trained 2.0 h ago; expires in 3.0 days" in cam1
    assert "label ε 8, flip probability 0.3 %" in cam1
    assert "strangers named: target 1.0 %, floor of the labels 0.3 %" in cam1 and "does not decide" not in cam1
    # Why a device holding no usable model does not decide, as it reported it (escaped).
    assert "no valid device model" in cam2 and "FPIR floor of this device&#39;s labels &lt;b&gt;" in cam2
    assert 'class="error decision-problem">does not decide: fpir:' in cam2


def test_an_expired_device_model_is_shown_as_such(issuing):
    console, _ = issuing
    srv = console.server
    book = srv.services.device_reports
    from peep.core.reports import DeviceReport

    rep = DeviceReport(at=time.time(), bundle_id="eb-1", mechanism="k-rr", epsilon_vector=8.0, epsilon_coordinate=8.0,
                       epsilon_vector_per_release=8.0, track_budget_vector=None, device_budget_vector=None,
                       releases=3, epsilon_vector_spent=24.0,
                       decision={"mode": "device", "model_serial": 3, "model_version": "v000001",
                                 "model_trained_at": time.time() - 9 * 86400,
                                 "model_expires_at": time.time() - 86400})  # fmt: skip
    srv.services.store.put_device_report("desk-9", SITE, rep.to_json(), time.time())
    book_reports = book.latest()
    assert "desk-9" in book_reports
    with console.login("olga") as c:
        row = _row(c.get("/devices").text, "desk-9")
    assert '<strong class="error expired">expired 24.0 h ago</strong>' in row and "model 3 (v000001)" in row


def test_a_server_issuing_no_device_model_says_why_on_the_models_page(console):
    with console.login("root") as c:
        html = c.get("/models").text
    assert 'id="device-models-off"' in html and "training.device_models.signing_key is not set" in html
