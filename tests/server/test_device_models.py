"""Issuing signed device models: on promotion, on erasure, on a schedule; withdrawn with a retired site key.

Real parts: a TLS gRPC server on SQLite (and the serial sequence on PostgreSQL), the real trainer and registry,
the real calibration command on LFW photos.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from typing import Any

import numpy as np
import pytest
from peep.core.devicemodel import class_id
from peep_testing.devicemodel import device_model_section, start_trained, verified
from peep_testing.server import ADMIN, PEEP, base_config, start_server, tls_section


@pytest.fixture
def issuing(tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path) -> Any:
    srv = start_trained(tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path)
    yield srv
    srv.app.stop(0)


def _manifest_text(payload: bytes) -> str:
    from peep.core.wire import decode_device_model

    _, files = decode_device_model(payload, max_bytes=1 << 26)
    return files["manifest.json"].decode()


def test_a_promotion_issues_a_signed_device_model_that_names_nobody(issuing, templates, model_keys, calibration_path):
    from peep.server.bundles.calibrate import load_calibration
    from peep.v1 import recognition_pb2

    s = issuing.services
    m = s.recogniser.model
    newest = s.device_models.newest(m.bundle_id, m.key_id)
    assert newest is not None and newest.reason == "promotion" and newest.model_version == "v000001"
    broadcast = verified(newest.payload, model_keys[1], bundle_id=templates.bundle_id, key_id="")
    subjects = sorted(set(templates.subjects.tolist()))
    # What the broker carries holds no class key: its ids map no claim to a column.
    assert broadcast.class_key is None and not any(broadcast.column_of(sub) >= 0 for sub in subjects)
    # A door's authenticated call gets the key beside the files.
    answer = s.device_models.answer(m.bundle_id, m.key_id, 0, with_class_key=True)
    model = verified(answer, model_keys[1], bundle_id=templates.bundle_id, key_id="")
    salt = bytes.fromhex(m.meta["device_class_salt"])
    assert model.class_key == salt and model.model_version == "v000001"
    assert model.n_subjects == len(subjects) and all(model.column_of(sub) >= 0 for sub in subjects)
    assert {model.classes[model.column_of(sub)] for sub in subjects} == {class_id(salt, sub) for sub in subjects}
    # opaque: neither an enrolled name nor a background subject is in the signed manifest
    text = _manifest_text(newest.payload)
    assert not any(sub in text for sub in subjects) and "background:" not in text
    cal = load_calibration(calibration_path)
    np.testing.assert_array_equal(model.calibration, cal.projections)
    assert model.manifest["calibration_sha256"] == cal.sha256
    assert (model.fpir, model.far) == (0.01, 0.001)
    assert model.expires_at - model.issued_at == pytest.approx(7 * 86400.0)
    st = issuing.stub().GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=ADMIN, timeout=5)
    assert st.device_model_serial == newest.serial and st.device_models_status == ""


@pytest.mark.slow
def test_serials_increase_and_a_stale_model_is_reissued(issuing, model_keys):
    s = issuing.services
    dm = s.device_models
    m = s.recogniser.model
    first = dm.newest(m.bundle_id, m.key_id)
    assert dm.poll(now=first.issued_at + 60.0) is None  # current: nothing to issue
    again = dm.issue("promotion")
    assert again.serial == first.serial + 1
    stale = dm.poll(now=again.issued_at + s.config.training.device_models.reissue_s)
    assert stale is not None and stale.serial == again.serial + 1 and stale.reason == "reissue"
    model = verified(dm.newest(m.bundle_id, m.key_id).payload, model_keys[1], newer_than=again.serial)
    assert model.issued_at == pytest.approx(stale.issued_at)
    # only the newest keeps its files; the older rows stay (a device may still spool decisions made with them)
    assert dm.rows.payload(first.serial) is None and dm.get(first.serial).model_version == "v000001"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_serials_are_unique_and_increasing_across_processes_sharing_the_database(kind, tmp_path, request):
    """Two stores on one database (two replicas) issuing at once: every serial once, increasing, kept durably."""
    from peep.server.storage.devicemodels import DeviceModelStore, IssuedModel
    from peep.server.storage.postgres import PostgresStore
    from peep.server.storage.sqlite import SqliteStore

    def opened() -> Any:
        if kind == "sqlite":
            return SqliteStore(tmp_path / "peep.db")
        return PostgresStore(request.getfixturevalue("pg_dsn"), pool_size=2)

    stores = [opened(), opened()]
    got: list[int] = []
    lock = threading.Lock()

    def build(serial: int) -> IssuedModel:
        return IssuedModel(serial, "v000001", "eb-1", "", 1.0, 2.0, 3.0, 5, 0, "cal", "promotion", payload=b"x" * 10)

    def run(store: Any) -> None:
        rows = DeviceModelStore(store)
        for _ in range(10):
            issued = rows.issue(build, bundle_id="eb-1", key_id="")
            with lock:
                got.append(issued.serial)

    try:
        threads = [threading.Thread(target=run, args=(st,)) for st in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(got) == list(range(1, 21))
    finally:
        for st in stores:
            st.close()
    reopened = opened()
    try:
        rows = DeviceModelStore(reopened)
        assert rows.newest("eb-1", "").serial == 20 and rows.payload(20) == b"x" * 10 and rows.payload(19) is None
        # retention never forgets the largest serial, so a serial is never issued twice
        assert rows.delete_expired_before(1e12) == 19 and rows.newest("eb-1", "").serial == 20
        assert rows.issue(build, bundle_id="eb-1", key_id="").serial == 21
    finally:
        reopened.close()


@pytest.mark.slow
def test_erasing_a_subject_issues_at_once_a_model_that_never_names_them(issuing, templates, model_keys):
    s = issuing.services
    m = s.recogniser.model
    before = s.device_models.newest(m.bundle_id, m.key_id)
    subject = str(templates.subjects[templates.train[0]])
    s.erase_subject(subject, retrain=False)
    after = s.device_models.newest(m.bundle_id, m.key_id)
    assert after.serial > before.serial and after.reason == "erasure" and after.erased == 1
    assert after.model_version == before.model_version  # no retraining needed
    model = verified(s.device_models.answer(m.bundle_id, m.key_id, 0, with_class_key=True), model_keys[1],
                     newer_than=before.serial)  # fmt: skip
    salt = bytes.fromhex(m.meta["device_class_salt"])
    assert model.erased == frozenset({class_id(salt, subject)}) and model.column_of(subject) == -1
    assert model.n_subjects == before.subjects - 1
    # the schedule does not undo it: the erased count is part of what is current
    assert s.device_models.poll(now=after.issued_at + 1.0) is None


def test_a_retired_site_key_withdraws_its_device_models_for_good(issuing):
    """Models of a retired key are never served or re-issued; those of the serving key are untouched."""
    from peep.server.storage.devicemodels import IssuedModel

    s = issuing.services
    dm = s.device_models
    m = s.recogniser.model
    old_key = "sk-00112233445566aa"

    def build(serial: int) -> IssuedModel:
        return IssuedModel(serial, "v000001", m.bundle_id, old_key, 1.0, 2.0, 9e12, 5, 0, "cal", "promotion",
                           payload=b"old")  # fmt: skip

    old = dm.rows.issue(build, bundle_id=m.bundle_id, key_id=old_key)
    assert dm.newest(m.bundle_id, old_key).serial == old.serial
    serving = dm.newest(m.bundle_id, m.key_id)
    r = s.retire_key(old_key)
    assert r.device_models_withdrawn == 1
    assert dm.newest(m.bundle_id, old_key) is None and dm.get(old.serial).withdrawn
    assert dm.rows.payload(old.serial) is None
    assert dm.poll(now=serving.issued_at + 1e6) is not None  # the serving key's schedule goes on
    assert dm.newest(m.bundle_id, old_key) is None  # nothing was issued for the retired one


def test_a_calibration_set_holding_a_person_trained_on_is_refused_by_name(issuing, templates, bundle):
    """A background subject background:<tag> (and an enrolled one) in the calibration set: no model is issued,
    the error lists them, the model status says it, and the serving model goes on answering."""
    from peep.server.bundles.calibrate import read_calibration
    from peep.v1 import recognition_pb2

    s = issuing.services
    dm = s.device_models
    tag = str(templates.background_people[0])  # enrolled as background:<tag>
    enrolled = str(templates.subjects[0])
    buf = io.BytesIO()
    people = np.array([tag, enrolled, "Someone_Else"])
    arrays = {"bundle_id": np.array(bundle.bundle_id), "domain": np.array("box_clipped"), "mechanism": np.array("peep")}
    np.savez(buf, projections=dm.calibration.projections[:3], people=people, **arrays)
    good = dm.calibration
    dm.calibration = read_calibration(buf.getvalue())
    try:
        m = s.recogniser.model
        before = dm.newest(m.bundle_id, m.key_id)
        assert dm.issue("promotion") is None
        assert dm.newest(m.bundle_id, m.key_id).serial == before.serial
        assert f"'{tag}'" in dm.last_error and f"'{enrolled}'" in dm.last_error and "Someone_Else" not in dm.last_error
        assert "--exclude" in dm.last_error
        st = issuing.stub().GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=ADMIN, timeout=5)
        assert st.device_models_status == dm.last_error and st.device_model_serial == before.serial
    finally:
        dm.calibration = good
    assert dm.issue("promotion") is not None and dm.last_error is None


def test_without_a_signing_key_or_calibration_none_is_issued_and_the_status_says_why(fresh):
    from peep.v1 import recognition_pb2

    dm = fresh.services.device_models
    assert not dm.enabled and dm.disabled_reason == "training.device_models.signing_key is not set"
    assert dm.issue() is None and dm.poll() is None
    st = fresh.stub().GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=ADMIN, timeout=5)
    assert st.device_model_serial == 0 and "signing_key is not set" in st.device_models_status


def test_the_configuration_names_a_bad_key_calibration_or_schedule(tmp_path, pki, keypair, bundle_dir):
    from peep.server import startup
    from peep.server.config import ConfigError, parse_config

    (tmp_path / "junk.npz").write_bytes(b"not a numpy file")
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)},
                      training={"device_models": {"signing_key": str(keypair[3]),  # a public key: not a signing key
                                                  "calibration": str(tmp_path / "junk.npz")}})  # fmt: skip
    with pytest.raises(ConfigError) as e:
        startup.check(parse_config(cfg))
    keys = {p.key for p in e.value.errors}
    assert {"training.device_models.signing_key", "training.device_models.calibration"} <= keys
    cfg["training"]["device_models"] = {"valid_s": 3600, "reissue_s": 7200}
    with pytest.raises(ConfigError, match=r"training\.device_models.*reissue_s: expected less than valid_s"):
        parse_config(cfg)


@pytest.mark.slow
def test_peep_bundle_calibrate_projects_public_faces_as_a_device_does(tmp_path, lfw_folder, bundle_dir, keypair, bundle,
                                                                       data_home):  # fmt: skip
    """The command's projections are the bundle's bounded output for the faces the dataset loader finds; an
    excluded person is absent; the file reads back as the server reads it."""
    from peep.server.bundles.calibrate import load_calibration
    from peep.server.datasets import load_dataset

    people = {"Ahmed_Chalabi": 4, "Ai_Sugiyama": 4, "Al_Gore": 4}
    folder = lfw_folder(people)
    (tmp_path / "background.txt").write_text("# the server's background population\nAi_Sugiyama\n")
    out = tmp_path / "cal.npz"
    r = subprocess.run(
        [PEEP, "bundle", "calibrate", "--bundle", str(bundle_dir), "--public-key", str(keypair[3]), "--dataset",
         str(folder), "--exclude", str(tmp_path / "background.txt"), "--mechanism", "peep-raw", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={"SCIKIT_LEARN_DATA": data_home, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    cal = load_calibration(out)
    assert cal.bundle_id == bundle.bundle_id and cal.domain == "box_clipped" and cal.mechanism == "peep-raw"
    assert set(cal.people) == {"Ahmed_Chalabi", "Al_Gore"}
    ds = load_dataset(str(folder), min_faces=1, geometry=bundle.geometry, people=["Ahmed_Chalabi", "Al_Gore"])
    np.testing.assert_allclose(cal.projections, bundle.project(ds.images, "box_clipped"), rtol=0, atol=1e-6)
    assert f"calibration {cal.sha256[:16]}" in r.stdout
    # Two people resolve a 1 % target to (0 + 1) / 3 of new people, and the output says so.
    assert "lets through about 33.33% of new people for a 1 % target" in r.stdout
    bad = subprocess.run([PEEP, "bundle", "calibrate", "--bundle", str(bundle_dir), "--public-key", str(out),
                          "--dataset", str(folder), "--out", str(tmp_path / "x.npz")], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--public-key" in bad.stderr and not (tmp_path / "x.npz").exists()


@pytest.mark.slow
def test_peep_train_issues_a_device_model_and_says_so(tmp_path, pki, keypair, bundle_dir, templates, model_keys,
                                                      calibration_path):  # fmt: skip
    """`peep train` (another process than the server) promotes and issues; the running server announces it."""
    from peep_testing.server import to_toml

    srv = start_trained(tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path)
    try:
        announced: list[int] = []
        srv.services.device_models.add_listener(lambda model: announced.append(model.serial))
        toml = tmp_path / "server.toml"
        cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)},
                          training={"model_dir": str(tmp_path / "models"),
                                    "device_models": device_model_section(model_keys, calibration_path)})  # fmt: skip
        toml.write_text(to_toml(cfg))
        r = subprocess.run([PEEP, "train", "--config", str(toml)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "device model serial 2 issued" in r.stdout
        srv.services.recogniser.reload()
        srv.services.device_models.poll()
        assert announced == [2]
    finally:
        srv.app.stop(0)


@pytest.mark.slow
def test_a_model_trained_before_device_models_is_refused_by_name(issuing, tmp_path):
    """A version without device_class_salt (trained before) cannot be issued: the error says to train again."""
    s = issuing.services
    m = s.recogniser.model
    salt = m.meta.pop("device_class_salt")
    try:
        assert s.device_models.issue() is None
        assert "no device_class_salt" in s.device_models.last_error and "train again" in s.device_models.last_error
    finally:
        m.meta["device_class_salt"] = salt


@pytest.mark.slow
def test_start_issues_when_none_is_current(tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path):
    """A server configured for device models after its model was trained issues one at start (reason start)."""
    srv = start_server(base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}), pki, tmp_path)
    try:
        stub = srv.stub()
        from peep.v1 import recognition_pb2

        stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60)
        stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
    finally:
        srv.app.stop(0)
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)},
                      training={"model_dir": str(tmp_path / "models"),
                                "device_models": device_model_section(model_keys, calibration_path)})  # fmt: skip
    srv = start_server(cfg, pki, tmp_path)
    try:
        dm = srv.services.device_models
        m = srv.services.recogniser.model
        deadline = time.monotonic() + 10
        while dm.newest(m.bundle_id, m.key_id) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        newest = dm.newest(m.bundle_id, m.key_id)
        assert newest is not None and newest.reason == "start" and newest.serial == 1
    finally:
        srv.app.stop(0)
