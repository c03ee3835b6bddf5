"""Site keys on the server: it holds key ids only; a model is trained under one key and answers only it."""

from __future__ import annotations

import ast
import os
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from peep.core import features
from peep.core.release import TemplateReleaser
from peep.core.sitekey import SiteKey
from peep.v1 import recognition_pb2
from peep_testing.server import ADMIN, DEVICE, Templates, base_config, rpc_error, start_server, tls_section

REPO = Path(__file__).resolve().parents[2]
KEY_A = SiteKey(bytes(range(32)))
KEY_B = SiteKey(bytes(range(1, 33)))


def _keyed(bundle, lfw100, lfw_background, key: SiteKey | None, seed: int) -> Templates:
    """privunit ε = 200 templates (plumbing, not privacy: the audit measures accuracy) of lfw100 (70 % to enrol)
    and a background half, released under ``key``."""
    with features.enabled("seeded-noise"):
        r = TemplateReleaser(bundle, kind="privunit", epsilon=200.0, random_state=seed, site_key=key)
        X = r.release(lfw100.images)
        Xb = r.release(lfw_background.images)
    subjects = np.array([lfw100.target_names[k].replace(" ", "_") for k in lfw100.labels], dtype=object)
    rng = np.random.default_rng(3)
    train = np.sort(rng.permutation(len(X))[: round(0.7 * len(X))])
    test = np.setdiff1d(np.arange(len(X)), train)
    people = np.unique(lfw_background.labels)[::2]
    in_bg = np.isin(lfw_background.labels, people)
    return Templates(r, bundle.bundle_id, X, subjects, train, test, Xb[in_bg], Xb[~in_bg],
                     background_people=lfw_background.labels[in_bg])  # fmt: skip


@pytest.fixture(scope="module")
def keyed_a(bundle, lfw100, lfw_background):
    return _keyed(bundle, lfw100, lfw_background, KEY_A, 11)


_OPENED: list[str] | None = None


def _record_opens(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)  # audit hooks stay for the process: it records only while _OPENED is a list


@pytest.mark.slow
def test_a_model_is_trained_under_one_key_and_refuses_templates_of_another(
    tmp_path, pki, keypair, bundle_dir, bundle, lfw100, lfw_background, keyed_a
):
    global _OPENED
    # A key file lies next to the server's data; nothing the server opens while it serves is one.
    KEY_A.write(tmp_path / "site.key")
    _OPENED = []
    srv = start_server(base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}), pki, tmp_path)
    try:
        stub = srv.stub()
        summary = stub.IngestStream(iter(keyed_a.enrolment_messages()), metadata=ADMIN, timeout=60)
        assert summary.rejected == 0
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
        model = srv.services.recogniser.require_model()
        assert model.key_id == KEY_A.key_id and model.meta["key_id"] == KEY_A.key_id

        # Under the model's key: answered, and mostly right.
        right = 0
        for i in keyed_a.test[:40]:
            resp = stub.Identify(recognition_pb2.IdentifyRequest(template=keyed_a.message(int(i))),
                                 metadata=DEVICE, timeout=5)  # fmt: skip
            right += resp.candidates[0].subject == keyed_a.subjects[i]
        assert right >= 28, right

        # The same values without a key id, and a template of another key: refused, the key named.
        i = int(keyed_a.test[0])
        for key_id, received in (("", "none"), (KEY_B.key_id, KEY_B.key_id)):
            msg = keyed_a.message(i, key_id=key_id)
            code, details = rpc_error(stub.Identify, recognition_pb2.IdentifyRequest(template=msg), metadata=DEVICE,
                                      timeout=5)  # fmt: skip
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert details == f"key_id: expected {KEY_A.key_id} (the site key model v000001 was trained under), " \
                              f"received {received}"  # fmt: skip
            code, details = rpc_error(stub.Verify, recognition_pb2.VerifyRequest(
                template=msg, claimed_subject=str(keyed_a.subjects[i])), metadata=DEVICE, timeout=5)  # fmt: skip
            assert code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("key_id: expected")

        # Over the streaming ingest (what MQTT and IngestStream devices use), another key's identify template is
        # accepted and left undecided: no event, counted by what differs.
        stray = keyed_a.message(i, key_id=KEY_B.key_id)
        assert stub.IngestStream(iter([stray]), metadata=DEVICE, timeout=10).rejected == 0
        metrics = srv.services.metrics
        deadline = time.monotonic() + 5
        while metrics.undecided.labels("key_id")._value.get() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metrics.undecided.labels("key_id")._value.get() == 1
        assert metrics.undecided.labels("bundle_id")._value.get() == 0

        # Enrolments under a second key (a rotation under way): training refuses to mix them.
        keyed_b = _keyed(bundle, lfw100, lfw_background, KEY_B, 12)
        assert stub.IngestStream(iter(keyed_b.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
        code, details = rpc_error(stub.Train, recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)  # as every training refusal
        assert "released under 2 site keys" in details and KEY_A.key_id in details and KEY_B.key_id in details
        assert srv.services.recogniser.require_model().version == "v000001"
    finally:
        srv.app.stop(0)
        opened, _OPENED = _OPENED, None
    assert opened, "the audit hook saw no file opened"
    keys = [p for p in set(opened) if os.path.isfile(p) and Path(p).read_bytes()[:400].find(b"peep-site-key-v1:") >= 0]
    assert keys == [] and str(tmp_path / "site.key") not in opened


@pytest.mark.slow
def test_training_takes_the_configured_key_while_two_are_stored(tmp_path, pki, keypair, bundle_dir, bundle, lfw100,
                                                                 lfw_background, keyed_a):  # fmt: skip
    keyed_b = _keyed(bundle, lfw100, lfw_background, KEY_B, 12)
    for key, other in ((KEY_B, KEY_A), (KEY_A, KEY_B)):
        d = tmp_path / key.key_id
        d.mkdir()
        cfg = base_config(d, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)},
                          training={"site_key_id": key.key_id})  # fmt: skip
        srv = start_server(cfg, pki, d)
        try:
            stub = srv.stub()
            for t in (keyed_a, keyed_b):
                assert stub.IngestStream(iter(t.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
            stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
            m = srv.services.recogniser.require_model()
            assert m.key_id == key.key_id and m.n_subjects == 5
            # Trained on that key's templates only: as many as one key enrolled.
            assert m.meta["n_templates"] == len(keyed_a.enrolment_messages())
            assert other.key_id != m.key_id
        finally:
            srv.app.stop(0)


def test_the_server_configuration_has_no_key_and_the_server_never_reads_one():
    """No setting holds a key (only a public key id), and no module of the server imports the key code."""
    from peep.server.config import parse_config

    with pytest.raises(Exception, match="site_key"):
        parse_config({"training": {"site_key": "/etc/peep/site.key"}})
    with pytest.raises(Exception, match="site_key_id"):
        parse_config({"training": {"site_key_id": "0123"}})
    # The audit simulates sites' keys in memory, and the demo and the benchmarks play the devices and the
    # administrator's tool (each offline, never a serving path): every other module of the server is clean.
    offenders = []
    for path in sorted((REPO / "server" / "src" / "peep" / "server").rglob("*.py")):
        if {"audit", "demo", "bench"} & set(path.relative_to(REPO / "server" / "src" / "peep" / "server").parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.startswith("peep.core.sitekey") or n.endswith(".SiteKey") for n in names):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


@pytest.mark.slow
def test_a_key_rotation_retires_the_old_key(tmp_path, pki, keypair, bundle_dir, bundle, lfw100, lfw_background,
                                            keyed_a):  # fmt: skip
    """Re-enrol under the new key, train under it, retire the old: its templates and models go, its captures refused."""
    from peep.server.services import KeyInUse

    keyed_b = _keyed(bundle, lfw100, lfw_background, KEY_B, 12)
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)})
    srv = start_server(cfg, pki, tmp_path)
    try:
        stub = srv.stub()
        assert stub.IngestStream(iter(keyed_a.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
        stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
        # The desks re-enrol everyone under the new key while the cameras still use the old one.
        assert stub.IngestStream(iter(keyed_b.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
        with pytest.raises(KeyInUse, match="serving model v000001 was trained under " + KEY_A.key_id):
            srv.services.retire_key(KEY_A.key_id)
    finally:
        srv.app.stop(0)
    # Training under the new key (named in the configuration while both are stored), on the same database.
    cfg["training"] = {**cfg.get("training", {}), "site_key_id": KEY_B.key_id}
    srv = start_server(cfg, pki, tmp_path)
    try:
        stub = srv.stub()
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000002"
        n_a = len(keyed_a.enrolment_messages())
        r = srv.services.retire_key(KEY_A.key_id)
        assert r.templates_deleted == n_a and r.versions_purged == ["v000001"]
        assert srv.services.store.enrolment_key_ids(bundle.bundle_id, ["privunit"]) == {KEY_B.key_id: n_a}
        i = int(keyed_a.test[0])
        code, details = rpc_error(stub.Identify, recognition_pb2.IdentifyRequest(template=keyed_a.message(i)),
                                  metadata=DEVICE, timeout=5)  # fmt: skip
        assert code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(f"key_id: expected {KEY_B.key_id}")
        ok = stub.Identify(recognition_pb2.IdentifyRequest(template=keyed_b.message(i)), metadata=DEVICE, timeout=5)
        assert ok.candidates
    finally:
        srv.app.stop(0)


def test_retire_key_names_a_malformed_id(tmp_path, capsys):
    from peep.server.cli import main

    cfg = tmp_path / "server.toml"
    cfg.write_text("")
    assert main(["retire-key", "--config", str(cfg), "--key-id", "sk-XYZ"]) == 2
    assert "--key-id: expected 'sk-' and 16 hex digits" in capsys.readouterr().err


def test_the_administrators_tool_enrols_a_keyed_background(tmp_path, pki, keypair, bundle_dir, lfw_folder,
                                                           monkeypatch):  # fmt: skip
    """peep-edge enroll-background: public faces released under the site key, enrolled as numbered background."""
    from peep.edge.cli import main as edge_main
    from peep_testing.server import ADMIN_TOKEN, write_edge_config

    folder = lfw_folder({"Ahmed_Chalabi": 5, "Ai_Sugiyama": 5, "Al_Gore": 5}, name="public")
    key_file = KEY_A.write(tmp_path / "site.key")
    srv = start_server(base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}), pki, tmp_path)
    try:
        edge_toml = write_edge_config(
            tmp_path / "admin.toml", port=srv.port, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3],
            device_id="admin-desk",
            privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1000.0, "site_key": str(key_file)},
        )  # fmt: skip
        monkeypatch.setenv("PEEP_ADMIN_TOKEN", ADMIN_TOKEN)
        assert edge_main(["enroll-background", "--config", str(edge_toml), "--dataset", str(folder)]) == 0
        store = srv.services.store
        with store._session() as conn:  # the rows as stored: subjects, key ids, no folder name
            rows = conn.execute("SELECT subject, key_id, purpose FROM templates").fetchall()
        assert {r[0] for r in rows} == {"background:0", "background:1", "background:2"}
        assert {(r[1], r[2]) for r in rows} == {(KEY_A.key_id, "enroll")} and 12 <= len(rows) <= 15
        # Without the admin token nothing is enrolled, and the tool says which variable it read.
        monkeypatch.delenv("PEEP_ADMIN_TOKEN")
        assert edge_main(["enroll-background", "--config", str(edge_toml), "--dataset", str(folder)]) == 2
    finally:
        srv.app.stop(0)
