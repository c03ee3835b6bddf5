"""Durable MQTT delivery: `peep serve` killed, stopped or away while devices publish, and nothing acknowledged is lost.

The broker is our own Mosquitto with the shipped configuration (deploy/mosquitto:
persistence, queue limits, TLS, the devices' listener with its mount point, the
server's listener). The server runs as a subprocess (`peep serve --config`, the lab's Replica) with
a fixed client id, as a replica does in production. A device publishes QoS 1
templates and counts the broker's PUBACKs (after which a device deletes them
from its spool); the test then counts the rows in the server's SQLite store:
the ingest ledger (one row per message id taken: its key makes a second one
impossible) and, where the server has a model, the decisions. Identify
templates themselves are decided and forgotten, so "ledger rows == decisions ==
templates acknowledged, each message id once" means every acknowledged
template was taken and decided exactly once.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from peep.lab.processes.replica import Replica
from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, ShippedBroker, session_exists, wait_for
from peep_testing.server import PEEP, SITE, base_config, to_toml

pytestmark = [pytest.mark.mqtt, pytest.mark.slow, pytest.mark.processes]

REPLICA = "peep-durability-a"


@pytest.fixture
def broker(tmp_path, pki):
    b = ShippedBroker(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key).start()
    yield b
    b.stop(signal.SIGKILL)


@pytest.fixture
def server_factory(tmp_path, keypair, bundle_dir, broker, request):
    made: list[Replica] = []

    def make(*, trained: bool = False, **mqtt: Any) -> Replica:
        if trained and not (tmp_path / "peep.db").exists():
            # The session's trained server's database and model registry: this replica decides what it takes.
            copy_trained(request.getfixturevalue("trained_server"), tmp_path)
        cfg = base_config(
            tmp_path,
            keypair[3],
            bundle_dir,
            mqtt=broker.server_mqtt_section(client_id=REPLICA, session_expiry_s=600, **mqtt),
            logging={"format": "json", "level": "info"},
        )
        cfg["auth"]["allow_insecure"] = True
        conf = tmp_path / "server.toml"
        conf.write_text(to_toml(cfg))
        env = {**os.environ, "PEEP_TEST_MQTT_PASSWORD": SERVER_PASSWORD}
        p = Replica(REPLICA, conf, 0, env, mqtt=True)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop(signal.SIGKILL)


def copy_trained(trained: Any, dest: Path) -> None:
    """``trained``'s SQLite database (a consistent copy, taken while it runs) and model directory into ``dest``."""
    cfg = trained.services.config
    src = sqlite3.connect(str(cfg.storage.path))
    dst = sqlite3.connect(str(dest / "peep.db"))
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    shutil.copytree(cfg.training.model_dir, dest / "models")


def stored(db: Path, tag: str = "") -> int:
    """Templates taken (ledger rows), of message ids starting ``tag-`` when given."""
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM ingest_ledger WHERE message_id LIKE ?", (f"{tag}%",))
                       .fetchone()[0])  # fmt: skip
        except sqlite3.OperationalError:  # schema not created yet
            return 0


def decided(db: Path, tag: str) -> tuple[int, int, int]:
    """(decisions, distinct message ids decided, identify templates kept) of message ids starting ``tag-``."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        n, distinct = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM recognition_events WHERE message_id LIKE ?", (f"{tag}-%",)
        ).fetchone()
        (kept,) = conn.execute("SELECT COUNT(*) FROM templates WHERE message_id LIKE ?", (f"{tag}-%",)).fetchone()
    return int(n), int(distinct), int(kept)


class Device:
    """cam-1 publishing QoS 1 templates through the devices' listener; a successful PUBACK = the broker took it."""

    def __init__(self, broker: ShippedBroker) -> None:
        self.client = Client(broker.dev_port, "cam-1", DEVICE_PASSWORDS["cam-1"], broker.ca).connect()
        self.topic = f"peep/v1/{SITE}/cam-1/templates"
        self.mids: list[int] = []

    def publish(self, payloads: list[bytes], *, rate: float | None = None) -> None:
        t0 = time.monotonic()
        for i, p in enumerate(payloads):
            self.mids.append(self.client.c.publish(self.topic, p, qos=1).mid)
            if rate is not None:
                ahead = t0 + (i + 1) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    def acknowledged(self) -> int:
        with self.client.lock:
            # < 0x80 is success: 0x00, or 0x10 "no matching subscribers" (no server session to queue for)
            return sum(1 for m in self.mids if self.client.acks.get(m, 0x80) < 0x80)


def retired(srv: Replica) -> dict[str, int]:
    """The sessions the server retired (its log), with the templates each held."""
    return {e["client_id"]: e["templates"] for e in list(srv.events) if e.get("event") == "mqtt session retired"}


def payloads(templates: Any, n: int, tag: str) -> list[bytes]:
    X = templates.X
    return [templates.message(i % len(X), message_id=f"{tag}-{i:05d}").SerializeToString() for i in range(n)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_server_stopped_mid_stream_decides_every_acknowledged_template_once(
    server_factory, broker, templates, tmp_path, sig
):
    n = 2000
    tag = sig.name
    srv = server_factory(trained=True).start()
    dev = Device(broker)
    try:
        sender = threading.Thread(target=dev.publish, args=(payloads(templates, n, tag),), kwargs={"rate": 400})
        sender.start()
        db = tmp_path / "peep.db"
        assert wait_for(lambda: stored(db, tag) >= 300, 30), "".join(srv.lines[-20:]) + broker.log()[-3000:]
        srv.stop(sig)  # mid-stream: the device keeps publishing
        at_stop = stored(db, tag)
        srv.start()  # the same replica comes back (systemd Restart=, an upgrade)
        sender.join(60)
        assert wait_for(lambda: dev.acknowledged() == n, 30), f"broker acknowledged {dev.acknowledged()} of {n}"
        wait_for(lambda: stored(db, tag) >= n, 60)
        assert srv.stop(signal.SIGTERM) == 0
        rows = stored(db, tag)
        decisions, distinct, kept = decided(db, tag)
        print(f"\n{sig.name}: sent {n}, acknowledged {dev.acknowledged()}, taken at the stop {at_stop}, taken {rows}, "
              f"decisions {decisions} ({distinct} message ids), templates kept {kept}")  # fmt: skip
        assert at_stop < n, "the stop was not mid-stream"
        assert rows == n, f"{sig.name}: {n} acknowledged by the broker, {rows} taken"
        assert decisions == distinct == n, f"{sig.name}: {n} taken, {decisions} decisions of {distinct} ids"
        assert kept == 0  # decided, then forgotten
    finally:
        dev.client.close()


def test_templates_published_while_the_server_is_down_are_decided_when_it_returns(
    server_factory, broker, templates, tmp_path
):
    srv = server_factory(trained=True).start()  # the replica's first start creates its session on the broker
    assert srv.stop(signal.SIGTERM) == 0
    dev = Device(broker)
    try:
        n = 500
        dev.publish(payloads(templates, n, "down"))
        assert wait_for(lambda: dev.acknowledged() == n, 30)
        # The broker restarts meanwhile (an upgrade of the backend): the queue is persisted.
        broker.stop(signal.SIGTERM)
        broker.start()
        srv.start()
        db = tmp_path / "peep.db"
        wait_for(lambda: stored(db, "down") >= n, 60)
        assert srv.stop(signal.SIGTERM) == 0
        rows = stored(db, "down")
        decisions, distinct, kept = decided(db, "down")
        print(f"\ndown for the burst: sent {n}, acknowledged {dev.acknowledged()}, taken {rows}, decisions "
              f"{decisions} ({distinct} message ids), templates kept {kept}")  # fmt: skip
        assert rows == n and decisions == distinct == n and kept == 0
    finally:
        dev.client.close()


def test_sessions_a_replica_no_longer_uses_are_drained_and_ended(server_factory, broker, templates, tmp_path):
    """A session keeps taking its share until it expires: lowering mqtt.connections, or retiring a replica,
    must store what its sessions hold and end them, or that share is lost when they expire."""
    srv = server_factory(connections=3).start()
    assert srv.stop(signal.SIGTERM) == 0
    dev = Device(broker)
    db = tmp_path / "peep.db"
    try:
        n = 300
        dev.publish(payloads(templates, n, "three"))  # split between the 3 sessions while the server is away
        assert wait_for(lambda: dev.acknowledged() == n, 30)
        srv = server_factory(connections=1).start()  # restarted with one connection: -1 and -2 are surplus
        assert wait_for(lambda: stored(db) >= n, 60), f"{stored(db)} of {n} stored"
        assert wait_for(lambda: len(retired(srv)) == 2, 30), retired(srv)
        shares = retired(srv)
        assert srv.stop(signal.SIGTERM) == 0
        print(f"\nconnections 3 -> 1: {n} queued, stored {stored(db)}, held by the retired sessions {shares}")
        # Each surplus session held a share (what would have been lost when it expired).
        assert set(shares) == {f"{REPLICA}-1", f"{REPLICA}-2"} and all(v > 0 for v in shares.values())
        assert stored(db) == n
        assert not session_exists(broker, f"{REPLICA}-1") and not session_exists(broker, f"{REPLICA}-2")
        # The replica is taken out of service: `peep mqtt retire` ends its last session.
        dev.publish(payloads(templates, 20, "last"))
        r = subprocess.run(
            [PEEP, "mqtt", "retire", "--config", str(srv.conf)],
            env=srv.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert f"mqtt retire: {REPLICA}: 20 templates stored, session ended" in r.stdout
        assert stored(db) == n + 20
        assert not session_exists(broker, REPLICA)
        # Nothing is queued for it any more: the broker says so to the device (0x10, no subscribers).
        mid = dev.client.c.publish(dev.topic, payloads(templates, 1, "after")[0], qos=1).mid
        assert wait_for(lambda: mid in dev.client.acks, 10) and dev.client.acks[mid] == 0x10
    finally:
        dev.client.close()


def test_retire_refuses_while_the_replica_is_running_and_loses_nothing(server_factory, broker, templates, tmp_path):
    """The operator's likely mistake: `peep mqtt retire` with the replica still running. The replica takes its
    session back; the command says so (exit 1) and leaves the session subscribed: nothing published is lost."""
    srv = server_factory(connections=1).start()
    dev = Device(broker)
    db = tmp_path / "peep.db"
    try:
        r = subprocess.run(
            [PEEP, "mqtt", "retire", "--config", str(srv.conf)],
            env=srv.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert "is the replica still running? Stop it first" in r.stderr and "session left in place" in r.stderr
        assert "Traceback" not in r.stderr and "session ended" not in r.stdout
        n = 50
        dev.publish(payloads(templates, n, "running"))
        assert wait_for(lambda: dev.acknowledged() == n, 30)
        assert wait_for(lambda: stored(db) >= n, 30), f"{stored(db)} of {n} stored"
        assert srv.stop(signal.SIGTERM) == 0
        assert stored(db) == n
        assert session_exists(broker, REPLICA)  # still the replica's: it was not ended
    finally:
        dev.client.close()


def test_retire_errors_name_what_to_fix(server_factory, broker, keypair, bundle_dir, tmp_path, capsys):
    from peep.server.cli import main

    srv = server_factory()
    # A wrong password: the broker's refusal, with the keys to check; exit 1.
    r = subprocess.run(
        [PEEP, "mqtt", "retire", "--config", str(srv.conf)],
        env={**srv.env, "PEEP_TEST_MQTT_PASSWORD": "not-the-password"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"the broker refused {REPLICA}" in r.stderr and "mqtt.password" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # No broker sessions to retire: a usage error naming the key (exit 2).
    off = tmp_path / "off.toml"
    cfg = base_config(tmp_path, keypair[3], bundle_dir)  # mqtt.enabled = false
    cfg["auth"]["allow_insecure"] = True
    off.write_text(to_toml(cfg))
    assert main(["mqtt", "retire", "--config", str(off)]) == 2
    assert "mqtt.enabled: expected true" in capsys.readouterr().err
    assert main(["mqtt", "retire", "--config", str(off), "--from-connection", "64"]) == 2
    assert "--from-connection: expected 0 to 63, received 64" in capsys.readouterr().err
