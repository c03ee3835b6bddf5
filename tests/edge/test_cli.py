"""peep-edge CLI: bundle verification, refusing bad bundles, enrolment, clean stop on SIGTERM."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from peep.core.wire import PURPOSES, decode_template
from peep.edge.cli import main
from peep_testing.edge import EDGE_SITE


@pytest.fixture
def bundle_copy(edge_bundle_dir, tmp_path) -> Path:
    d = tmp_path / "bundle-copy"
    shutil.copytree(edge_bundle_dir, d)
    return d


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_bundle_verify_ok_tampered_and_wrong_key(bundle_copy, edge_keys, capsys):
    pub = str(edge_keys["pub_path"])
    assert main(["bundle", "verify", str(bundle_copy), "--public-key", pub]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["bundle", "verify", str(bundle_copy), "--public-key", str(edge_keys["other_pub_path"])]) == 1
    assert "signature.sig: Ed25519 signature does not verify" in capsys.readouterr().err
    flip_byte(bundle_copy / "projector.onnx")
    assert main(["bundle", "verify", str(bundle_copy), "--public-key", pub]) == 1
    assert "projector.onnx: SHA-256 does not match the signed manifest" in capsys.readouterr().err
    assert main(["bundle", "verify", str(bundle_copy), "--public-key", "/nonexistent.pub"]) == 2
    assert "--public-key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda d: flip_byte(d / "projector.onnx"), "projector.onnx: SHA-256 does not match"),
        (lambda d: flip_byte(d / "metadata.json", 20), "metadata.json: SHA-256 does not match"),
        (lambda d: (d / "signature.sig").unlink(), "signature.sig: missing from bundle"),
    ],
)
def test_run_refuses_a_tampered_or_unsigned_bundle_saying_which_file(bundle_copy, make_config, capsys, damage, needle):
    damage(bundle_copy)
    path = make_config(bundle={"path": str(bundle_copy)})
    # A configuration error (exit 2) naming bundle.path, as --validate-config says it.
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bundle.path: refusing to start" in err and needle in err


def test_run_refuses_a_bundle_signed_by_another_key(make_config, edge_keys, capsys):
    path = make_config(bundle={"public_key": str(edge_keys["other_pub_path"])})
    assert main(["run", "--config", str(path)]) == 2
    assert "signature.sig: Ed25519 signature does not verify with the pinned key" in capsys.readouterr().err


def test_usage_errors_exit_2(make_config, capsys):
    with pytest.raises(SystemExit) as info:
        main(["enroll", "--config", "x.toml"])
    assert info.value.code == 2
    path = make_config()
    assert main(["enroll", "--config", str(path), "--subject", "a/b", "--source", "0", "--count", "1"]) == 2
    assert "--subject: expected" in capsys.readouterr().err
    assert main(["enroll", "--config", str(path), "--subject", "alice", "--source", "0", "--count", "0"]) == 2
    assert "--count: expected >= 1" in capsys.readouterr().err
    assert main(["enroll", "--config", str(path), "--subject", "alice", "--source", "/nope", "--count", "1"]) == 2
    assert "capture.source: expected a camera index" in capsys.readouterr().err


def snapshot(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_enroll_publishes_enrolment_templates_and_writes_no_image(
    system_broker, make_config, people, collector_factory, tmp_path, capsys
):
    device = f"cam-{uuid.uuid4().hex[:8]}"
    name = sorted(people)[5]
    src = tmp_path / "enrol-src"
    src.mkdir()
    for p in people[name][:8]:
        shutil.copy(p, src / p.name)
    col = collector_factory(*system_broker, [f"peep/v1/{EDGE_SITE}/{device}/#"])
    path = make_config(
        device={"id": device, "site": EDGE_SITE},
        privacy={"epsilon": 4.0, "track_budget": 1e6, "enroll_budget": 2048.0},
    )
    before = snapshot(tmp_path)
    rc = main(
        ["enroll", "--config", str(path), "--subject", "alice", "--source", str(src), "--count", "5", "--timeout", "10"]
    )
    assert rc == 0, capsys.readouterr().err
    assert col.wait_for(lambda: len(col.payloads()) >= 5, 10)
    msgs = [decode_template(p) for p in col.payloads()]
    assert len(msgs) == 5
    assert all(m.purpose == PURPOSES["enroll"] and m.subject == "alice" for m in msgs)
    assert col.payloads("/status") == [], "enrolment runs next to the agent and leaves its status alone"
    new = snapshot(tmp_path) - before
    assert {p.name for p in new} <= {
        "spool.sqlite3",
        "spool.sqlite3-wal",
        "spool.sqlite3-shm",
        "ledger.sqlite3",
        "ledger.sqlite3-wal",
        "ledger.sqlite3-shm",
        "device.key",  # the device's signing key (32 random bytes), made on first start
    }
    assert all(m.device_signature for m in msgs)  # each template signed with it
    for p in new:
        head = p.read_bytes()[:8]
        assert not head.startswith((b"\xff\xd8", b"\x89PNG", b"P5", b"BM")), p
    # The budget caps enrolment: 2048 per-vector ε = 8 releases of 256; 5 were spent.
    rc = main(
        ["enroll", "--config", str(path), "--subject", "alice", "--source", str(src), "--count", "5", "--timeout", "10"]
    )
    assert rc == 1
    assert "privacy.enroll_budget: budget exceeded for key 'subject:alice'" in capsys.readouterr().err


def test_enroll_with_unreachable_broker_fails_and_keeps_templates(make_config, people, tmp_path, capsys, h):
    src = tmp_path / "src"
    src.mkdir()
    for p in people[sorted(people)[6]][:3]:
        shutil.copy(p, src / p.name)
    path = make_config(mqtt={"port": h.free_port()})
    rc = main(
        ["enroll", "--config", str(path), "--subject", "bob", "--source", str(src), "--count", "2", "--timeout", "1"]
    )
    assert rc == 1
    assert "2 enrolment templates released but not all acknowledged" in capsys.readouterr().err
    from peep.edge.spool import Spool

    with Spool(tmp_path / "state" / "spool.sqlite3", destinations=["mqtt"]) as spool:
        assert [it.purpose for it in spool.peek("mqtt", 10)] == ["enroll", "enroll"]


def test_sigterm_stops_cleanly_flushing_the_spool_and_publishing_offline(
    system_broker, make_config, crowd_video, collector_factory
):
    device = f"cam-{uuid.uuid4().hex[:8]}"
    col = collector_factory(*system_broker, [f"peep/v1/{EDGE_SITE}/{device}/#"])
    path = make_config(
        device={"id": device, "site": EDGE_SITE},
        capture={"source": crowd_video["path"], "max_fps": 10.0},  # 20 s of video, stopped early
        privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 1.0, "min_track_frames": 1},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "peep.edge.cli", "run", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert col.wait_for(lambda: len(col.payloads()) >= 2, 30), proc.stderr
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert time.monotonic() - t0 < 15
    logs = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    events = [r["event"] for r in logs]
    assert "starting" in events and events[-1] == "stopped"
    start = next(r for r in logs if r["event"] == "starting")
    assert start["epsilon_coordinate"] == 4.0 and start["epsilon_vector"] == 256.0 and start["secure_sampler"]
    assert all({"epsilon_coordinate", "epsilon_vector"} <= r.keys() for r in logs if r["event"] == "release")
    assert logs[-1]["spool_remaining"] == 0
    assert "source_finished" not in events, "stopped by the signal, not by the end of the video"
    released = sum(1 for r in logs if r["event"] == "release")
    assert col.wait_for(lambda: len(col.payloads()) == released, 5)
    assert col.wait_for(lambda: col.payloads("/status")[-1:] == [b"offline"], 5)


# --------------------------------------------------------------------------- deadletter


def refuse(path: Path, refusals: list[tuple[str, str, str]], *, days_ago: float = 0.0) -> dict[str, bytes]:
    """Spool and dead-letter one template per (transport, message id, reason), as the forwarders do."""
    from peep.edge.spool import Spool

    marks = {}
    for dest, mid, reason in refusals:
        with Spool(path, destinations=[dest]) as spool:
            marks[mid] = f"<<payload-{mid}-{uuid.uuid4().hex}>>".encode()
            spool.put(message_id=mid, purpose="identify", payload=marks[mid].ljust(600, b"."))
            assert spool.dead_letter(dest, mid, reason)
    if days_ago:
        with sqlite3.connect(path) as db:
            db.execute(
                f"UPDATE dead SET failed = failed - ? WHERE message_id IN ({','.join('?' * len(refusals))})",
                (days_ago * 86_400, *(mid for _, mid, _ in refusals)),
            )
        db.close()
    return marks


def test_deadletter_list_reports_counts_and_rows_never_payloads(make_config, tmp_path, capsys):
    path = make_config(grpc={"enabled": True, "tls": False})
    spool_path = tmp_path / "state" / "spool.sqlite3"
    long_reason = "values: expected 64 coefficients \x1b[31m" + "x" * 400
    marks = refuse(spool_path, [("grpc", "g-old", "bundle_id: unknown bundle")], days_ago=2)
    marks |= refuse(
        spool_path,
        [
            ("grpc", "g1", "bundle_id: unknown bundle"),
            ("grpc", "g2", long_reason),
            ("mqtt", "m1", "capture_time_too_old"),
        ],
    )
    assert main(["deadletter", "--config", str(path), "list", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)
    assert report["count"] == 4 and report["spool"] == str(spool_path)
    assert (report["dead_letter_days"], report["dead_letter_max"]) == (7.0, 1000)
    assert report["per_transport"] == {"grpc": 3, "mqtt": 1}
    assert report["per_reason"]["bundle_id: unknown bundle"] == 2
    rows = report["dead_letters"]
    assert [r["message_id"] for r in rows] == ["g-old", "g1", "g2", "m1"]
    assert all(set(r) == {"transport", "message_id", "purpose", "reason", "failed", "failed_unix"} for r in rows)
    bounded = rows[2]["reason"]
    assert len(bounded) == 200 and "\x1b" not in bounded
    assert bounded.startswith("values: expected 64 coefficients ?[31m")
    assert report["oldest"] == rows[0]["failed"] and report["newest"] == rows[-1]["failed"]
    assert rows[1]["failed_unix"] - rows[0]["failed_unix"] == pytest.approx(2 * 86_400, abs=60)
    assert all(m.decode() not in out for m in marks.values())

    # The text form; --config is also accepted after the action.
    assert main(["deadletter", "list", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"4 dead letters in {spool_path} (kept 7 days, at most 1000")
    assert "per transport: grpc 3, mqtt 1" in text
    assert "     2  bundle_id: unknown bundle" in text
    assert "mqtt  m1  identify  " in text and "capture_time_too_old" in text
    assert all(m.decode() not in text for m in marks.values())


def test_deadletter_purge_all_or_older_than_and_the_payloads_leave_the_file(make_config, tmp_path, capsys):
    path = make_config()
    spool_path = tmp_path / "state" / "spool.sqlite3"
    marks = refuse(spool_path, [("mqtt", "old", "r")], days_ago=3)
    marks |= refuse(spool_path, [("mqtt", "new", "r")])
    assert main(["deadletter", "--config", str(path), "purge", "--older-than-days", "2"]) == 0
    assert capsys.readouterr().out == f"purged 1 dead letters older than 2 days from {spool_path}\n"
    assert main(["deadletter", "--config", str(path), "list", "--json"]) == 0
    assert [r["message_id"] for r in json.loads(capsys.readouterr().out)["dead_letters"]] == ["new"]
    assert main(["deadletter", "--config", str(path), "purge"]) == 0
    assert capsys.readouterr().out == f"purged 1 dead letters from {spool_path}\n"
    on_disk = b"".join(p.read_bytes() for p in spool_path.parent.glob("spool.sqlite3*"))
    assert all(m not in on_disk for m in marks.values())
    assert main(["deadletter", "--config", str(path), "list"]) == 0
    assert capsys.readouterr().out.startswith("0 dead letters in")


def test_deadletter_list_applies_the_configured_bounds_first(make_config, tmp_path, capsys):
    spool_path = tmp_path / "state" / "spool.sqlite3"
    refuse(spool_path, [("mqtt", "ancient", "r")], days_ago=10)
    refuse(spool_path, [("mqtt", "recent", "r")], days_ago=1)
    path = make_config(spool={"dead_letter_days": 2.0})
    assert main(["deadletter", "--config", str(path), "list", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["message_id"] for r in report["dead_letters"]] == ["recent"] and report["dead_letter_days"] == 2.0


def test_deadletter_usage_and_config_errors(make_config, tmp_path, capsys):
    path = make_config()
    with pytest.raises(SystemExit) as info:
        main(["deadletter", "--config", str(path)])
    assert info.value.code == 2 and "required: ACTION" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["deadletter", "--config", str(path), "purge", "--older-than-days", "soon"])
    assert info.value.code == 2 and "--older-than-days: invalid float value: 'soon'" in capsys.readouterr().err
    assert main(["deadletter", "list"]) == 2
    assert "--config: expected the agent's edge.toml, received none" in capsys.readouterr().err
    assert main(["deadletter", "--config", str(path), "purge", "--older-than-days", "-1"]) == 2
    assert "--older-than-days: expected a number of days >= 0, received -1.0" in capsys.readouterr().err
    assert main(["deadletter", "--config", str(make_config("bad.toml", spool={"dead_letter_days": 400})), "list"]) == 2
    assert "spool.dead_letter_days: " in capsys.readouterr().err
    # No spool yet: an error naming the path, and none is created.
    assert main(["deadletter", "--config", str(path), "list"]) == 1
    assert "spool.path: no spool file at" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def test_deadletter_purge_while_the_agent_writes_loses_nothing(make_config, tmp_path, capsys):
    from peep.edge.spool import Spool

    path = make_config(spool={"dead_letter_max": 100_000})  # only purges delete here
    spool_path = tmp_path / "state" / "spool.sqlite3"
    # The running agent's connection.
    agent_spool = Spool(spool_path, destinations=["mqtt"], synchronous="normal", dead_letter_max=100_000)
    refused = [0]
    stop = threading.Event()

    def agent_refuses() -> None:
        while not stop.is_set():
            mid = f"m{refused[0]}"
            agent_spool.put(message_id=mid, purpose="identify", payload=b"x" * 600)
            agent_spool.dead_letter("mqtt", mid, "r")
            refused[0] += 1

    writer = threading.Thread(target=agent_refuses)
    writer.start()
    purged = 0
    try:
        # Two seconds of purges beside the writer, and on until one purged something: on a loaded machine the
        # first call (its imports) took the whole two seconds, before the writer had refused anything.
        start = time.monotonic()
        while time.monotonic() < start + 2.0 or (purged == 0 and time.monotonic() < start + 30.0):
            assert main(["deadletter", "--config", str(path), "purge"]) == 0, capsys.readouterr().err
            purged += int(capsys.readouterr().out.split()[1])
            assert main(["deadletter", "--config", str(path), "list", "--json"]) == 0
            json.loads(capsys.readouterr().out)
    finally:
        stop.set()
        writer.join(10)
    try:
        assert refused[0] > 0 and purged > 0
        assert purged + len(agent_spool.dead()) == refused[0], "every dead letter purged once or still there"
    finally:
        agent_spool.close()


def test_device_key_prints_the_public_half_of_a_key_made_once_and_refuses_a_damaged_one(make_config, tmp_path, capsys):
    """The key the agent signs with: made on first use (mode 0600), the same on every later call, and printed as
    the server's [[auth.devices]] lines; a damaged file is named, never silently replaced."""
    from peep.core.signing import parse_public_key_text

    path = make_config()
    assert main(["device-key", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    key_file = tmp_path / "state" / "device.key"
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == 32
    line = next(x for x in out.splitlines() if x.startswith("signing_key = "))
    parse_public_key_text(line.split('"')[1])
    assert 'id = "cam-1"' in out
    assert main(["device-key", "--config", str(path)]) == 0
    assert line in capsys.readouterr().out  # the same key: it is read, not made again
    key_file.write_bytes(b"short")
    assert main(["device-key", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "device.signing_key" in err and "32-byte key, received 5 bytes" in err
