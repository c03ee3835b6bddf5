"""The soak's real parts (peep.lab.processes), each on its own and quickly.

PostgreSQL (its own cluster: initdb, a clean stop, a crash), the shipped
Mosquitto (a restart on the same ports, a persistent session's queue surviving
it, the queue read from $SYS), the cuttable TCP path (alone, and as a camera's
path to the broker), and /proc readings. A test needing PostgreSQL's or
Mosquitto's tools skips, naming the tool, only where it is not installed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
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
from peep.lab.processes.control import PartUnavailable, ProcessStats, port_open, unit_environment, wait_for
from peep.lab.processes.mosquitto import ShippedMosquitto, mosquitto_missing
from peep.lab.processes.postgres import PostgresCluster
from peep.lab.processes.tcpproxy import TcpProxy

pytestmark = pytest.mark.processes

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


# --------------------------------------------------------------------------- the TCP path


class EchoServer:
    """Echoes what each connection sends; counts how its connections ended."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.ended: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
                self.ended.append("eof")
            except ConnectionResetError:
                self.ended.append("reset")
            except OSError as exc:
                self.ended.append(type(exc).__name__)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._acceptor.join(5)
        for t in self._threads:
            t.join(5)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    e = EchoServer()
    yield e
    e.close()


def _talk(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _sees_the_end(s: socket.socket) -> bool:
    """Whether a connected socket's next read says its connection is over (EOF or reset)."""
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _turned_away(port: int) -> bool:
    """Whether a new connection to ``port`` is reset, at once or at its first read (the proxy accepts, then resets)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except ConnectionResetError:
        return True
    with s:
        return _sees_the_end(s)


def test_the_proxy_passes_bytes_both_ways_and_ends_its_threads(echo: EchoServer) -> None:
    before = threading.active_count()
    with TcpProxy(0, ("127.0.0.1", echo.port)) as proxy:
        payload = bytes(range(256)) * 4096  # 1 MiB: more than one socket buffer each way
        assert _talk(proxy.port, payload) == payload
        assert wait_for(lambda: proxy.open_connections == 0, 5)
        stats = proxy.stats()
        assert stats["accepted"] == 1 and stats["bytes_in"] == stats["bytes_out"] == len(payload)
        assert wait_for(lambda: echo.ended == ["eof"], 5)  # a clean end passed on as a clean end
    assert wait_for(lambda: threading.active_count() <= before, 5)


def test_a_cut_ends_open_connections_and_refuses_new_ones_until_healed(echo: EchoServer) -> None:
    before = threading.active_count()
    proxy = TcpProxy(0, ("127.0.0.1", echo.port))
    try:
        port = proxy.port
        open_ = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
        for k, s in enumerate(open_):
            s.sendall(b"ping %d" % k)
            assert s.recv(64) == b"ping %d" % k
        assert proxy.open_connections == 5

        proxy.cut()
        assert all(_sees_the_end(s) for s in open_)
        for s in open_:
            s.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        assert proxy.open_connections == 0 and proxy.stats()["cut"] is True
        # The far side saw its connections fail too, not end cleanly.
        assert wait_for(lambda: len(echo.ended) == 5, 5) and "eof" not in echo.ended, echo.ended

        proxy.heal()
        assert proxy.port == port
        assert _talk(port, b"after the heal") == b"after the heal"
        assert proxy.stats()["cuts"] == 1
    finally:
        proxy.close()
    assert not port_open(port)
    assert wait_for(lambda: threading.active_count() <= before, 5)


def test_the_proxy_refuses_beyond_its_limit_and_when_the_target_is_down(echo: EchoServer) -> None:
    with pytest.raises(ValueError, match="max_connections: expected at least 1, received 0"):
        TcpProxy(0, ("127.0.0.1", echo.port), max_connections=0)
    with TcpProxy(0, ("127.0.0.1", echo.port), max_connections=2) as proxy:
        held = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(2)]
        assert wait_for(lambda: proxy.open_connections == 2, 5)
        assert _turned_away(proxy.port)  # a third
        assert proxy.stats()["refused"] == 1
        for s in held:
            s.close()
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        nobody = spare.getsockname()[1]  # bound, not listening: a connect is refused
        with TcpProxy(0, ("127.0.0.1", nobody)) as proxy:
            assert _turned_away(proxy.port)
            assert wait_for(lambda: proxy.stats()["refused"] == 1, 5)


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

        def server_session() -> tuple[mqtt.Client, list[mqtt.MQTTMessage], threading.Event]:
            # Acknowledged by hand: the test knows when each PUBACK is queued (paho's own ack follows
            # on_message on its thread, so a disconnect could overtake the last one).
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="soak-server", protocol=mqtt.MQTTv5,
                            manual_ack=True)  # fmt: skip
            c.username_pw_set("peep-server", server_pw)
            c.tls_set(ca_certs=str(b.ca))
            box: list[mqtt.MQTTMessage] = []
            acked = threading.Event()
            c.on_message = lambda cl, u, m: box.append(m)
            c.on_subscribe = lambda *a: acked.set()
            c.connect("localhost", b.srv_port, clean_start=False, properties=session)
            c.loop_start()
            return c, box, acked

        srv, got, flushed = server_session()
        try:
            assert wait_for(lambda: len(got) >= len(sent), 10), [m.payload for m in got]
            for m in list(got):
                srv.ack(m.mid, m.qos)
            # A SUBACK comes after the broker has read every packet sent before the SUBSCRIBE: the PUBACKs.
            srv.subscribe("devices/peep/v1/+/+/templates", qos=1)
            assert flushed.wait(10)
        finally:
            srv.disconnect()
            srv.loop_stop()
        assert sorted(bytes(m.payload) for m in got) == sent
        # The broker let go of every one: the same session, back again, is sent nothing more. (Its $SYS store
        # count is not the witness: once in CI it still counted the five 45 s after their PUBACKs.)
        again, more, answered = server_session()
        try:
            # A broker still holding them resends them as the session resumes, before it answers a SUBSCRIBE.
            again.subscribe("devices/peep/v1/+/+/templates", qos=1)
            assert answered.wait(10)
        finally:
            again.disconnect()
            again.loop_stop()
        assert more == [], [m.payload for m in more]
        stats = b.sys_stats()
        assert stats is not None and stats["dropped"] == 0
    finally:
        b.stop(signal.SIGKILL)


@pytest.mark.mqtt
def test_a_camera_behind_a_cut_path_loses_its_connection_and_resumes_after_the_heal(tmp_path: Path, pki: Any) -> None:
    missing = mosquitto_missing()
    if missing:
        pytest.skip(missing)
    device_pw = f"cam-pw-{uuid.uuid4().hex[:8]}"
    b = ShippedMosquitto(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key,
                         devices={"cam-1": device_pw}, server_password="unused")  # fmt: skip
    try:
        b.start()
        with TcpProxy(0, ("127.0.0.1", b.dev_port)) as path:
            cam = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="cam-1", protocol=mqtt.MQTTv5)
            cam.username_pw_set("cam-1", device_pw)
            cam.tls_set(ca_certs=str(b.ca))
            cam.reconnect_delay_set(0.1, 0.5)
            connects, losses = threading.Semaphore(0), threading.Semaphore(0)
            cam.on_connect = lambda c, u, f, rc, p: connects.release()
            cam.on_disconnect = lambda c, u, f, rc, p: losses.release()
            cam.connect_async("localhost", path.port)
            cam.loop_start()
            try:
                assert connects.acquire(timeout=10)
                cam.publish("peep/v1/site/cam-1/status", b"online", qos=1).wait_for_publish(5)
                path.cut()
                assert losses.acquire(timeout=10)
                time.sleep(0.5)  # its reconnect attempts meet a refused port
                assert not connects.acquire(timeout=0)
                path.heal()
                assert connects.acquire(timeout=10)
                again = cam.publish("peep/v1/site/cam-1/status", b"back", qos=1)
                again.wait_for_publish(5)
                assert again.is_published()
            finally:
                cam.disconnect()
                cam.loop_stop()
        assert path.stats()["accepted"] >= 2 and path.stats()["cuts"] == 1
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


def test_each_process_runs_with_its_shipped_units_environment(tmp_path):
    # The shipped units cap the allocator's arenas: a soak run without it measured growth no deployment has.
    for unit in ("peep-server.service", "peep-edge.service", "peep-edge-door.service"):
        assert unit_environment(unit)["MALLOC_ARENA_MAX"] == "2"
    (tmp_path / "x.service").write_text(
        '[Service]\nEnvironment=A=1 "B=two words"\n# Environment=C=3\nEnvironment=A=4\nExecStart=/bin/true\n'
    )
    assert unit_environment("x.service", tmp_path) == {"A": "4", "B": "two words"}


def test_a_unit_that_is_missing_or_malformed_is_named(tmp_path):
    with pytest.raises(PartUnavailable, match="nothere.service not found"):
        unit_environment("nothere.service", tmp_path)
    (tmp_path / "bad.service").write_text("Environment=JUSTAWORD\n")
    with pytest.raises(PartUnavailable, match="expected KEY=VALUE, received 'JUSTAWORD'"):
        unit_environment("bad.service", tmp_path)
