"""The soak's real parts (peep.server.bench.soak.parts), each on its own and quickly.

PostgreSQL (its own cluster: initdb, a clean stop, a crash), the shipped
Mosquitto (a restart on the same ports, a persistent session's queue surviving
it, the queue read from $SYS), and /proc readings. A
test needing PostgreSQL's or Mosquitto's tools skips, naming the tool, only
where it is not installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import psycopg
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peep.server.bench.cluster import wait_for
from peep.server.bench.soak.parts import (
    PartUnavailable,
    PostgresCluster,
    ProcessStats,
    ShippedMosquitto,
    mosquitto_missing,
)

# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[PostgresCluster]:
    try:
        pg = PostgresCluster(tmp_path / "pg")
    except PartUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield pg
    finally:
        pg.cleanup()


def _rows(pg: PostgresCluster) -> list[str]:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT note FROM soak ORDER BY note")]


@pytest.mark.postgres
def test_a_committed_row_survives_a_clean_stop_and_a_crash_on_the_same_port(postgres: PostgresCluster) -> None:
    pg = postgres.start()
    port = pg.port
    assert pg.alive()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE soak (note text PRIMARY KEY)")
        conn.execute("INSERT INTO soak VALUES ('before the clean stop')")
    postmaster = pg.pid
    assert postmaster is not None and ProcessStats.sample(postmaster) is not None

    pg.stop("fast")
    assert not pg.alive() and pg.pid is None
    pg.start()
    assert _rows(pg) == ["before the clean stop"]
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO soak VALUES ('before the crash')")

    pg.stop("immediate")  # no checkpoint: the row is only in the WAL
    assert not pg.alive()
    pg.restart("fast")  # not running: nothing to stop, then recovery from the WAL
    assert pg.port == port
    assert _rows(pg) == ["before the clean stop", "before the crash"]
    assert "database system was interrupted" in pg.log()

    os.kill(pg.pid or 0, signal.SIGKILL)  # the postmaster killed outright: its pid file stays behind
    assert wait_for(lambda: not pg.alive(timeout=1), 10)
    pg.stop("fast")  # nothing left to stop
    pg.start()
    assert _rows(pg) == ["before the clean stop", "before the crash"]

    sizes = pg.table_sizes()
    assert set(sizes) == {"soak"} and sizes["soak"] > 0
    folder = pg.folder
    pg.cleanup()
    assert not folder.exists()


def test_postgres_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(PartUnavailable, match="initdb and pg_ctl not found in"):
        PostgresCluster(tmp_path / "pg", bindir=tmp_path)
    try:
        pg = PostgresCluster(tmp_path / "pg")
    except PartUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with pytest.raises(ValueError, match=r"mode: expected one of .* received 'sudden'"):
            pg.stop("sudden")
    finally:
        pg.cleanup()


# --------------------------------------------------------------------------- Mosquitto


def _mqtt(port: int, user: str, password: str, ca: Path, client_id: str, **connect: Any) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.username_pw_set(user, password)
    c.tls_set(ca_certs=str(ca))
    up = threading.Event()
    c.on_connect = lambda cl, u, f, rc, p: up.set() if not rc.is_failure else None
    c.connect("localhost", port, **connect)
    c.loop_start()
    assert up.wait(10), f"{user} could not connect to port {port}"
    return c


@pytest.mark.mqtt
def test_the_shipped_broker_restarts_on_its_ports_with_a_sessions_queue(tmp_path: Path, pki: Any) -> None:
    missing = mosquitto_missing()
    if missing:
        pytest.skip(missing)
    device_pw, server_pw = f"cam-pw-{uuid.uuid4().hex[:8]}", f"srv-pw-{uuid.uuid4().hex[:8]}"
    b = ShippedMosquitto(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key,
                         devices={"cam-1": device_pw}, server_password=server_pw, sys_interval_s=1)  # fmt: skip
    session = Properties(PacketTypes.CONNECT)
    session.SessionExpiryInterval = 600
    try:
        b.start()
        # The server's persistent session subscribes, then goes away; the camera publishes into its queue.
        srv = _mqtt(b.srv_port, "peep-server", server_pw, b.ca, "soak-server", clean_start=False, properties=session)
        subscribed = threading.Event()
        srv.on_subscribe = lambda *a: subscribed.set()
        srv.subscribe("devices/peep/v1/+/+/templates", qos=1)
        assert subscribed.wait(5)
        srv.disconnect()
        srv.loop_stop()
        cam = _mqtt(b.dev_port, "cam-1", device_pw, b.ca, "cam-1")
        sent = [b"template %d" % k for k in range(5)]
        infos = [cam.publish("peep/v1/site/cam-1/templates", p, qos=1) for p in sent]
        for info in infos:
            info.wait_for_publish(5)
        assert all(i.is_published() for i in infos)
        cam.disconnect()
        cam.loop_stop()
        assert wait_for(lambda: b.queue_depth(timeout=2) == len(sent), 10, 0.5), b.sys_stats()

        ports = (b.dev_port, b.srv_port)
        b.stop(signal.SIGTERM)  # a clean stop writes the queue to mosquitto.db
        assert b.pid is None and b.queue_depth(timeout=1) is None
        b.start()
        assert (b.dev_port, b.srv_port) == ports

        got: list[bytes] = []
        srv = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="soak-server", protocol=mqtt.MQTTv5)
        srv.username_pw_set("peep-server", server_pw)
        srv.tls_set(ca_certs=str(b.ca))
        srv.on_message = lambda c, u, m: got.append(bytes(m.payload))
        srv.connect("localhost", b.srv_port, clean_start=False, properties=session)
        srv.loop_start()
        try:
            assert wait_for(lambda: len(got) >= len(sent), 10), got
        finally:
            srv.disconnect()
            srv.loop_stop()
        assert sorted(got) == sent
        assert wait_for(lambda: b.queue_depth(timeout=2) == 0, 10, 0.5), b.sys_stats()
        stats = b.sys_stats()
        assert stats is not None and stats["dropped"] == 0
    finally:
        b.stop(signal.SIGKILL)


def test_the_shipped_broker_names_a_missing_tool(tmp_path: Path) -> None:
    missing = mosquitto_missing(tmp_path)
    assert missing is not None  # the tools, or else the shipped files, which tmp_path lacks
    with pytest.raises(PartUnavailable, match=r"not (installed|found)"):
        ShippedMosquitto(
            tmp_path / "b", tmp_path, tmp_path, tmp_path, devices={}, server_password="x", shipped=tmp_path
        )


# --------------------------------------------------------------------------- /proc


def test_process_stats_of_a_living_process_a_zombie_and_a_dead_one() -> None:
    sum(i * i for i in range(200_000))  # some CPU time of our own
    me = ProcessStats.sample(os.getpid())
    assert me is not None
    assert me["rss_mb"] > 10 and me["fds"] >= 3 and me["threads"] >= 1 and me["cpu_s"] > 0

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # Exited but not yet waited for: a zombie, whose memory and files are gone.
    assert wait_for(lambda: Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10)
    assert ProcessStats.sample(child.pid) is None
    child.wait(5)
    assert ProcessStats.sample(child.pid) is None  # reaped: no /proc entry at all
