"""A reduced `peep demo` end to end: real server (gRPC/TLS, SQLite, QBBS, MQTT when the broker
answers), real edge agents over composed videos, enrolment, training, identification, verification."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from peep.server.cli import main

pytestmark = [pytest.mark.demo, pytest.mark.processes]

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".pgm", ".bmp"}


# A reduced demo: three subjects, four strangers, two cameras; the server decides (the devices deciding, the
# default, is tests/demo/test_demo_device.py).
SMALL = ["--subjects", "3", "--enrol-images", "8", "--probe-images", "2", "--strangers", "4", "--cameras", "2",
         "--qbbs-epsilon", "20", "--public-max-faces", "5", "--decide", "server"]  # fmt: skip


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, data_home: str) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "run"
    rc = main(["demo", "--data-home", data_home, "--out", str(out), *SMALL])
    assert rc == 0
    return out, json.loads((out / "summary.json").read_text())


def test_demo_summary_is_complete_and_consistent(demo_run):
    out, s = demo_run
    edge, ident, ver, p = s["edge"], s["identification"], s["verification"], s["privacy"]
    assert edge["errors"] == [] and edge["events_missing"] == []
    # Every capture of the script that the agents released came back as an identification event.
    assert ident["enrolled_templates"] + ident["stranger_templates"] == edge["templates"] > 0
    assert ident["enrolled_templates"] >= 4 and ident["stranger_templates"] >= 2
    for v in (ident["accuracy"], ident["unknown_rejection_rate"], ver["face"]["gar"], ver["face"]["far"]):
        assert 0.0 <= v <= 1.0
    # Every enrolled capture is also claimed as each of the other (subjects - 1) enrolled people.
    assert ver["face_every_impostor"]["claims"] == ident["enrolled_templates"] * (s["data"]["subjects"] - 1)
    assert 0.0 <= ver["face_every_impostor"]["far"] <= 1.0
    assert ident["fused_decisions"] >= 0
    # Both epsilons are reported; the default is privunit at ε = 16 per template (a coordinate is
    # post-processing of the vector, so the same ε), on a dlib-resnet bundle (K = 16).
    assert p["mechanism"] == "privunit" and p["epsilon_vector"] == pytest.approx(16.0, rel=1e-4)
    assert p["epsilon_coordinate"] == pytest.approx(p["epsilon_vector"])
    assert s["bundle"]["projection"] == "dlib-resnet" and s["bundle"]["n_components"] == 16
    # Each device's ledger holds exactly one release's cost per template it sent (template + soft traits).
    per_release = p["epsilon_vector"] + p["soft_traits_epsilon_per_release"]
    for dev in edge["devices"].values():
        assert dev["epsilon_vector_spent"] == pytest.approx(dev["releases"] * per_release)
        assert dev["max_epsilon_vector_per_track"] <= p["per_track_budget_epsilon_vector"] + 1e-6
    # Genuine and impostor claims were both verified; the odometer charged each claimed subject
    # exactly what its verifications released (traits the calibration gives no weight cost nothing).
    assert ver["claims"] == 2 * ident["enrolled_templates"]
    rows = json.loads((out / "verification.json").read_text())
    charged: dict[str, float] = {}
    for r in rows:
        charged[r["claim"]] = charged.get(r["claim"], 0.0) + r["qbbs_epsilon_spent"]
    for subject, spent in ver["qbbs_epsilon_per_subject"].items():
        assert spent == pytest.approx(charged.get(subject, 0.0))
    assert s["model"]["model_version"] == "v000001"


def test_the_runs_log_holds_the_per_claim_lines_and_the_summary_counts_them(demo_run):
    out, s = demo_run
    log = out / "demo.log"
    text = log.read_text()
    # The door's refusals (each impostor claim, each fail-secure check) are in the run's log, not on the terminal.
    assert "peep.edge.door: door_refused" in text
    warnings = sum(1 for line in text.splitlines() if re.match(r"^\S+ \S+ warning ", line))
    assert s["log"]["file"] == str(log) and s["log"]["warnings"] == warnings > 0
    assert s["log"]["events"]["peep.edge.door: door_refused"] == text.count("peep.edge.door: door_refused")


def test_the_demos_door_claims_went_through_the_door_path_and_every_fail_secure_check_held(demo_run):
    out, s = demo_run
    door, data = s["door"], s["data"]
    # Every held-out photo at the door twice: its person's badge, and another subject's.
    assert door["genuine"] == door["impostor"] == data["subjects"] * 2  # --probe-images 2
    rows = json.loads((out / "door.json").read_text())
    assert len(rows) == door["genuine"] + door["impostor"]
    assert sum(r["opened"] for r in rows if r["genuine"]) == door["genuine_opened"]
    # The pin's own record agrees with the claims that opened it.
    assert door["pin_openings"] == door["genuine_opened"] + door["impostor_opened"]
    assert door["fail_secure_checks"] == door["fail_secure_run"] >= 8 and door["fail_secure_failed"] == []
    decided = [r for r in rows if r["face_to_lock_ms"] is not None]
    assert decided and door["p50_ms"] <= door["p95_ms"] <= door["worst_ms"]
    for r in decided:  # a release, the server's answer and the pin, each timed
        assert {"descriptor", "perturb", "verify", "actuate"} <= set(r["stages_ms"])
    assert set(door["lockout_would_refuse"]) == {"genuine", "impostor"}
    # The door's whole spend is reported: one release per claim that found a face, each at the run's
    # per-template ε; the fail-secure checks release nothing (a made-up id, the server out of reach and a
    # deadline no answer can meet end before the face is taken).
    eps, p = door["epsilon"], s["privacy"]
    assert eps["releases"] == sum("release" in r["stages_ms"] for r in rows)
    assert eps["epsilon_vector_per_release"] == pytest.approx(p["epsilon_vector"], rel=1e-4)
    assert eps["epsilon_coordinate_per_release"] == pytest.approx(p["epsilon_coordinate"], rel=1e-4)
    assert eps["epsilon_vector_spent"] == pytest.approx(eps["releases"] * p["epsilon_vector"], rel=1e-4)
    # Never a template in what the door reported.
    assert all(set(r) == {"subject", "genuine", "opened", "reason", "face_to_lock_ms", "stages_ms"} for r in rows)


def test_the_lockout_replay_refuses_as_the_door_would():
    from peep.lab.demo.summary import door_summary

    def row(subject, genuine, opened, reason=""):
        return {"subject": subject, "genuine": genuine, "opened": opened, "reason": reason,
                "face_to_lock_ms": 100.0, "stages_ms": {}}  # fmt: skip

    rows = [row("a", False, False, "rejected"), row("a", False, False, "rejected"), row("a", True, False, "no_face"),
            row("a", True, True), row("a", False, False, "rejected"), row("a", False, False, "rejected"),
            row("a", True, True), row("b", False, False, "rejected")]  # fmt: skip
    d = door_summary(rows, [], pin_openings=2, lockout=(3, 300.0))
    # Three failures lock "a" out, so its next genuine claim would have been refused; after that (not made)
    # the count stays, and the two later impostor claims and the last genuine one are refused too.
    assert d["lockout_would_refuse"] == {"genuine": 2, "impostor": 2}
    assert d["genuine_opened"] == 2 and d["impostor_opened"] == 0 and d["refusals"] == {"rejected": 5, "no_face": 1}


def test_demo_writes_a_self_contained_report(demo_run):
    out, _ = demo_run
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4
    assert "ε per coordinate / per vector" in html
    assert 'src="http' not in html and "src='http" not in html


def test_no_pixels_reach_the_server(demo_run):
    out, _s = demo_run
    server = out / "server"
    images = [p for p in server.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES]
    assert images == []
    con = sqlite3.connect(server / "peep.db")
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        blob_bytes = 0
        for t in tables:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
            for c in cols:
                (n,) = con.execute(f"SELECT max(length({c})) FROM {t}").fetchone()
                if n is not None and t != "bundles":
                    blob_bytes = max(blob_bytes, int(n))
    finally:
        con.close()
    # The largest stored value is a template (nc float32 + metadata), far below a 62x47 face.
    assert 0 < blob_bytes < 62 * 47
    # The edge agents kept no images either.
    devices = out / "devices"
    assert [p for p in devices.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES] == []


def test_the_server_keeps_nothing_of_the_strangers_it_decided(demo_run):
    """Decide, then forget (the default recognition.keep): after the run the database holds no identify or
    verify template, and a never-enrolled person's message id is found only in the ledger of received ids
    and in the decision -- read in every table, not only templates."""
    out, s = demo_run
    assert s["kept"]["keep"] == "none"
    assert s["kept_templates"]["recognised"] == 0 and s["kept_templates"]["strangers"] == 0
    assert s["kept_templates"]["enrolment"] == s["data"]["enrolment_images"] and s["kept_templates"]["background"] > 0
    releases = json.loads((out / "releases.json").read_text())
    assert "payload" not in releases[0]
    strangers = {r["message_id"] for r in releases if r["person"] is not None and not r["enrolled"]}
    assert len(strangers) == s["identification"]["stranger_templates"] > 0
    con = sqlite3.connect(out / "server" / "peep.db")
    try:
        (n,) = con.execute("SELECT COUNT(*) FROM templates WHERE purpose != 'enroll'").fetchone()
        assert n == 0
        assert con.execute("SELECT COUNT(*) FROM track_memory").fetchone() == (0,)
        where: dict[str, set[str]] = {}
        for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for row in con.execute(f"SELECT * FROM {t}"):  # the database's own table names
                for cell in row:
                    if isinstance(cell, str) and cell in strangers:
                        where.setdefault(t, set()).add(cell)
        assert set(where) == {"ingest_ledger", "recognition_events"}
        assert where["ingest_ledger"] == strangers and where["recognition_events"] == strangers
        # what those rows hold: ids, times, the release's ε; the decision, its probability, the model
        ledger_cols = [r[1] for r in con.execute("PRAGMA table_info(ingest_ledger)")]
        assert ledger_cols == ["device_id", "message_id", "site", "received_at", "purpose", "track_id", "bundle_id",
                               "mechanism_kind", "epsilon_coordinate", "epsilon_vector", "epsilon_traits",
                               "transport", "sent_by", "epsilon_label"]  # fmt: skip
        q = "SELECT subject, unknown FROM recognition_events WHERE message_id = ?"
        for mid in strangers:
            for subject, unknown in con.execute(q, (mid,)):
                assert unknown == 0 or subject == ""  # an unknown decision names nobody
    finally:
        con.close()


def test_the_ledger_counts_each_devices_own_releases_by_the_transport_they_came_by(demo_run):
    """Every camera's releases with its own transport, the door's claims (decided by ``Verify``, then forgotten)
    as the door's releases, and the public background the admin credential enrolled through desk-1 apart."""
    out, s = demo_run
    con = sqlite3.connect(out / "server" / "peep.db")
    try:
        rows = con.execute(
            "SELECT device_id, purpose, transport, sent_by, COUNT(*), SUM(epsilon_vector + epsilon_traits) "
            "FROM ingest_ledger GROUP BY device_id, purpose, transport, sent_by"
        ).fetchall()
    finally:
        con.close()
    by = {(d, purpose, transport, sent_by): (n, eps) for d, purpose, transport, sent_by, n, eps in rows}
    for cam, dev in s["edge"]["devices"].items():
        assert {k[1:] for k in by if k[0] == cam} == {("identify", dev["transport"], "device")}
        n, eps = by[(cam, "identify", dev["transport"], "device")]
        assert n == dev["releases"] and eps == pytest.approx(dev["epsilon_vector_spent"])
    # Every claim the server answered is a release of the door's in the ledger; a release that never reached the
    # server would be in the door's own ledger only (the fail-secure checks release nothing), so that is the most
    # the server can count.
    door = s["door"]["epsilon"]
    answered = sum(r["opened"] or r["reason"] == "rejected" for r in json.loads((out / "door.json").read_text()))
    n, eps = by[("door-1", "verify", "grpc", "device")]
    assert {k[1:] for k in by if k[0] == "door-1"} == {("verify", "grpc", "device")}
    assert 0 < answered <= n <= door["releases"]
    assert eps == pytest.approx(n * door["epsilon_vector_per_release"])
    assert by[("desk-1", "enroll", "grpc", "admin")][0] == s["kept_templates"]["background"] > 0
    own = sum(n for (d, purpose, _, sent_by), (n, _) in by.items() if purpose == "enroll" and sent_by == "device")
    assert own == s["kept_templates"]["enrolment"]


def test_usage_errors_name_the_option(capsys):
    assert main(["demo", "--subjects", "0"]) == 2
    assert "--subjects" in capsys.readouterr().err
    assert main(["demo", "--mechanism", "gaussian-l2"]) == 2
    assert "--delta" in capsys.readouterr().err


def test_demo_leaves_nothing_retained_on_the_broker(demo_run):
    """Its devices' statuses (its own site) and its bundle announcement are cleared when it ends."""
    _, s = demo_run
    if not s["mqtt"]:
        pytest.skip("the demo ran without a broker (none on 127.0.0.1:1883)")
    from peep.lab.processes.retained import retained_topics
    from peep.v1 import recognition_pb2

    assert retained_topics(f"peep/v1/{s['site']}/#") == {}
    held = retained_topics("peep/v1/bundle").get("peep/v1/bundle")
    assert held is None or recognition_pb2.BundleFiles.FromString(held).bundle_id != s["bundle"]["bundle_id"]


def test_demo_console_stays_up_on_the_demos_data(tmp_path: Path, data_home: str):
    """`peep demo --console`: after the run the server and its console keep serving the demo's data; the
    one-time admin password logs in (and must be changed first); Live shows the demo's recognitions,
    Devices its cameras, each with a status; the server configuration it wrote loads, and the add-user
    command it prints adds an account that logs in; close() stops both."""
    pytest.importorskip("starlette", reason="the console extra (peep-server[console]) is not installed")
    import re
    import shlex
    import ssl
    import stat
    import subprocess
    import sys

    import httpx
    from peep.lab.demo import Demo, DemoOptions
    from peep.lab.demo.runner import add_user_command
    from peep.server.config import load_config

    opts = DemoOptions(
        out=tmp_path / "run", data_home=data_home, subjects=3, enrol_images=8, probe_images=2, strangers=4,
        cameras=2, qbbs_epsilon=20.0, public_max_faces=5, mqtt="off", console=True, decide="server",
    )  # fmt: skip
    demo = Demo(opts, say=lambda _m: None)
    try:
        summary = demo.run()
        c = summary["console"]
        assert demo.console_password and c["account"] == "admin" and c["url"].startswith("https://localhost:")
        named = sorted({ev.subject for ev in demo.events.values() if not ev.unknown})
        assert named, "the demo's cameras named nobody"
        ctx = ssl.create_default_context(cafile=c["ca_cert"])
        with httpx.Client(base_url=c["url"], verify=ctx, timeout=30) as web:

            def csrf(path: str) -> str:
                m = re.search(r'name="csrf" value="([^"]*)"', web.get(path).text)
                assert m, path
                return m.group(1)

            r = web.post("/login", data={"name": "admin", "password": demo.console_password, "csrf": csrf("/login")})
            assert r.status_code == 303 and r.headers["location"] == "/password"
            new = "a-Newcomer's-own-passphrase-42"
            form = {"current": demo.console_password, "new": new, "again": new, "csrf": csrf("/password")}
            assert web.post("/password", data=form).status_code == 303
            r = web.post("/login", data={"name": "admin", "password": new, "csrf": csrf("/login")})
            assert r.status_code == 303 and r.headers["location"] == "/"
            live = web.get("/live").text
            assert any(s in live for s in named), named
            devices = web.get("/devices").text
            assert "cam-1" in devices and "cam-2" in devices
            # Without MQTT each camera's report (suppressed releases, budgets) came over gRPC (ReportDevice).
            for cam in ("cam-1", "cam-2"):
                row = re.search(rf"<tr>\s*<td>{cam}</td>.*?</tr>", devices, re.S)
                assert row and "ready; reported" in row.group(0), devices[:3000]
                # Σ ε is the whole spend, templates and soft traits: what the camera's own ledger recorded.
                edge = summary["edge"]["devices"][cam]
                total = re.search(r'class="eps-total">([0-9.,]+)', row.group(0))
                spent = edge["epsilon_vector_spent"]
                assert total and "e+" not in row.group(0), row.group(0)
                assert float(total.group(1).replace(",", "")) == pytest.approx(spent, rel=1e-3), (row.group(0), spent)
                # ... and on its most-released track, the most the camera's own ledger spent on one track.
                track = re.search(r'class="eps-track">([0-9.,]+)', row.group(0))
                most = edge["max_epsilon_vector_per_track"]
                assert track and float(track.group(1).replace(",", "")) == pytest.approx(most, rel=1e-3), most
            # The door's claims are its releases, from the ledger: at least every claim the server answered, at
            # most what the door's own ledger spent, each at the run's per-template ε.
            door = summary["door"]["epsilon"]
            claims = json.loads((tmp_path / "run" / "door.json").read_text())
            answered = sum(r["opened"] or r["reason"] == "rejected" for r in claims)
            row = re.search(r"<tr>\s*<td>door-1</td>.*?</tr>", devices, re.S)
            assert row and "releases: gRPC" in row.group(0), devices[:3000]
            n = int(re.search(r'class="releases">([0-9,]+)', row.group(0)).group(1).replace(",", ""))
            assert 0 < answered <= n <= door["releases"]
            total = re.search(r'class="eps-total">([0-9.,]+)', row.group(0))
            spent = n * door["epsilon_vector_per_release"]
            assert total and float(total.group(1).replace(",", "")) == pytest.approx(spent)
            # The background the admin credential enrolled through desk-1 is not the desk's own.
            row = re.search(r"<tr>\s*<td>desk-1</td>.*?</tr>", devices, re.S)
            background = summary["kept_templates"]["background"]
            assert row and f"and {background} sent in its name with the administrator" in row.group(0)
            # Every device the server heard from has a status (gRPC contacts here: --mqtt off), never "unknown".
            rows = re.findall(r"<tr>\s*<td>([^<]+)</td>.*?</tr>", devices, re.S)
            statuses = re.findall(r'class="status-([^"]+)"', devices)
            assert {"desk-1", "cam-1", "cam-2"} <= set(rows) and len(statuses) == len(rows), devices[:3000]
            assert all(st in ("online", "offline") for st in statuses), dict(zip(rows, statuses, strict=True))

            # The configuration the demo's server runs with, loadable by the project's own loader: what runs,
            # with the ports it bound; token digests only, readable by its owner only.
            path = Path(c["config"])
            assert path == tmp_path / "run" / "server" / "server.toml"
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            text = path.read_text()
            for token in (demo.admin_token, *demo.device_tokens.values()):
                assert token not in text
            loaded = load_config(path).model_dump()
            running = demo.app.config.model_dump()
            running["grpc"]["listen"] = f"127.0.0.1:{demo.app.port}"
            running["console"]["listen"] = f"127.0.0.1:{demo.app.console.port}"
            assert loaded == running
            # The add-user command the demo prints, run as printed (with a name): an operator who logs in.
            command = shlex.split(add_user_command(path, name="operator-1"))
            assert command[:2] == ["peep", "console"]
            peep = str(Path(sys.executable).with_name("peep"))
            done = subprocess.run([peep, *command[1:]], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            otp = done.stdout.strip().splitlines()[-1]
        with httpx.Client(base_url=c["url"], verify=ctx, timeout=30) as web:
            r = web.post("/login", data={"name": "operator-1", "password": otp, "csrf": csrf_of(web, "/login")})
            assert r.status_code == 303 and r.headers["location"] == "/password"
            mine = "an-Operator's-own-passphrase-7"
            form = {"current": otp, "new": mine, "again": mine, "csrf": csrf_of(web, "/password")}
            assert web.post("/password", data=form).status_code == 303
            r = web.post("/login", data={"name": "operator-1", "password": mine, "csrf": csrf_of(web, "/login")})
            assert r.status_code == 303 and r.headers["location"] == "/"
            assert "cam-1" in web.get("/devices").text
        _screenshots(c["url"], new, tmp_path)
        url = c["url"]
    finally:
        demo.close()
    with pytest.raises(httpx.ConnectError), httpx.Client(verify=ctx, timeout=5) as late:
        late.get(url)


def csrf_of(web, path: str) -> str:
    """The CSRF token of the form on the console page ``path``."""
    import re

    m = re.search(r'name="csrf" value="([^"]*)"', web.get(path).text)
    assert m, path
    return m.group(1)


def _screenshots(url: str, password: str, tmp_path: Path) -> None:
    """Screenshots of Live and Devices from this test's small demo, when $PEEP_CONSOLE_SCREENSHOTS names a
    folder and Debian's chromium is installed (scripts/bootstrap.sh installs it). docs/img holds those of the
    default demo (scripts/console-screenshots.py)."""
    import os

    out = os.environ.get("PEEP_CONSOLE_SCREENSHOTS")
    if out and Path("/usr/bin/chromium").exists():
        save_screenshots(url, password, Path(out), tmp_path)


def save_screenshots(url: str, password: str, out: Path, tmp_path: Path) -> None:
    """Log in as the console's admin with ``password`` and save ``console-live.png`` and ``console-devices.png``
    in ``out`` (headless Debian Chromium, 1280 × 900)."""
    import time

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1280,900", f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(arg)
    options.accept_insecure_certs = True  # the demo's local CA is not in Chromium's store; still TLS
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url + "login")
        driver.find_element(By.ID, "name").send_keys("admin")
        driver.find_element(By.ID, "password").send_keys(password)
        driver.find_element(By.ID, "login").click()
        Path(out).mkdir(parents=True, exist_ok=True)
        for page in ("live", "devices"):
            driver.get(url + page)
            time.sleep(1.0)  # the Live page fills from its event stream
            driver.save_screenshot(str(Path(out) / f"console-{page}.png"))
    finally:
        driver.quit()


def test_synthetic_traits_stay_inside_the_declared_ranges(tmp_path: Path):
    # seed 11's log-normal weights reach below the adult range (33.7 kg), which the server refuses to enrol:
    # the demo stopped there. The demo now clips to the range and counts what it clipped.
    import numpy as np
    from peep.lab.demo.runner import Demo, DemoOptions
    from peep.lab.qbbs.anthropometry import synthetic_anthropometry
    from peep.server.config.qbbs import DEFAULT_TRAITS

    _, weight = synthetic_anthropometry(np.array([0.0, 1.0] * 5), seed=11)
    assert weight.min() < DEFAULT_TRAITS["weight"].lower
    demo = Demo(DemoOptions(out=tmp_path))
    assert demo._in_range("weight", float(weight.min())) == DEFAULT_TRAITS["weight"].lower
    assert demo._in_range("height", 250.0) == DEFAULT_TRAITS["height"].upper
    assert demo._in_range("weight", 70.5) == 70.5
    assert demo.clipped_traits == {"weight": 1, "height": 1}


def test_the_demo_is_keyed_and_the_server_holds_key_ids_only(demo_run):
    """A fresh site key per run: every stored template and the model carry its id; the key stays in keys/."""
    from peep.core.sitekey import SiteKey

    out, s = demo_run
    key = SiteKey.load(out / "keys" / "template.key")
    assert s["privacy"]["site_key_id"] == key.key_id
    with sqlite3.connect(out / "server" / "peep.db") as db:
        assert db.execute("SELECT DISTINCT key_id FROM templates").fetchall() == [(key.key_id,)]
    (model,) = (out / "server" / "models" / "versions").glob("v*/model.json")  # SQLite: versions are files
    assert json.loads(model.read_text())["key_id"] == key.key_id
    secret = (out / "keys" / "template.key").read_text().splitlines()[-1].split(":")[1]
    for f in (out / "server").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_a_second_run_into_the_same_folder_starts_afresh(demo_run, data_home, tmp_path):
    """Nothing of the first run is built on: the same counts and the same ε per device, a new key."""
    out, first = demo_run
    rc = main(["demo", "--data-home", data_home, "--out", str(out), *SMALL])
    assert rc == 0
    second = json.loads((out / "summary.json").read_text())
    assert second["kept_templates"] == first["kept_templates"]
    assert (
        second["model"]["model_version"] == "v000001"
        and second["model"]["n_templates"] == first["model"]["n_templates"]
    )
    assert second["privacy"]["site_key_id"] != first["privacy"]["site_key_id"]
    for dev, d in second["edge"]["devices"].items():
        per_release = second["privacy"]["epsilon_vector"] + second["privacy"]["soft_traits_epsilon_per_release"]
        assert d["epsilon_vector_spent"] == pytest.approx(d["releases"] * per_release), dev
    # A folder the demo did not make is never cleared.
    foreign = tmp_path / "mine"
    (foreign / "server").mkdir(parents=True)
    (foreign / "server" / "notes.txt").write_text("keep me")
    assert main(["demo", "--data-home", data_home, "--out", str(foreign)]) == 2
    assert (foreign / "server" / "notes.txt").read_text() == "keep me"
