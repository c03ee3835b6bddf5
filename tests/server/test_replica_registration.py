"""One process per ``cluster.replica_id``: a registration with a heartbeat in the database.

Two replicas under one id fought over its persistent MQTT sessions in a reconnect loop with warnings only.
Now the second refuses to start, naming the first's host and start time; a registration whose heartbeat
lapsed, or whose process is gone from this host (a crash, restarted), is taken over.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from peep.lab.processes.control import wait_for
from peep.lab.processes.ports import free_port
from peep.lab.processes.replica import Replica
from peep.server.storage.postgres import PostgresStore
from peep.server.storage.sqlite import SqliteStore
from peep_testing.server import base_config, tls_section, to_toml


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    s = (
        SqliteStore(tmp_path / "r.db")
        if request.param == "sqlite"
        else PostgresStore(request.getfixturevalue("pg_dsn"), pool_size=2)
    )
    yield s
    s.close()


def test_an_id_is_held_by_one_process_until_its_heartbeat_lapses_or_its_process_is_gone(store):
    alive = lambda pid: True  # noqa: E731
    assert store.register_replica("b", host="h1", pid=11, token="t1", now=1000.0, stale_s=30.0, alive=alive) is None
    # Another process, another host, while the first beats: refused, with who holds it.
    holder = store.register_replica("b", host="h2", pid=22, token="t2", now=1010.0, stale_s=30.0, alive=alive)
    assert (holder.host, holder.pid, holder.started_at, holder.heartbeat_at) == ("h1", 11, 1000.0, 1000.0)
    assert store.heartbeat_replica("b", "t1", 1020.0)
    assert store.register_replica("b", host="h2", pid=22, token="t2", now=1045.0, stale_s=30.0, alive=alive) is not None
    # Its heartbeat lapsed: taken over; the old holder's next heartbeat says so.
    assert store.register_replica("b", host="h2", pid=22, token="t2", now=1051.0, stale_s=30.0, alive=alive) is None
    assert not store.heartbeat_replica("b", "t1", 1052.0)
    assert store.heartbeat_replica("b", "t2", 1052.0)
    # The same host with the holder's process gone (a crash, restarted at once): taken over without waiting.
    assert store.register_replica("b", host="h2", pid=33, token="t3", now=1053.0, stale_s=30.0,
                                  alive=lambda pid: pid != 22) is None  # fmt: skip
    # A clean stop releases it: the next process registers at once.
    store.release_replica("b", "t2")  # not the holder's token: nothing released
    assert store.register_replica("b", host="h9", pid=1, token="t9", now=1054.0, stale_s=30.0, alive=alive) is not None
    store.release_replica("b", "t3")
    assert store.register_replica("b", host="h9", pid=1, token="t9", now=1055.0, stale_s=30.0, alive=alive) is None
    # Other ids are independent.
    assert store.register_replica("c", host="h2", pid=22, token="u", now=1055.0, stale_s=30.0, alive=alive) is None


def _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, name: str, replica_id: str) -> Replica:
    d = tmp_path / name
    d.mkdir()
    port = free_port()
    cfg = base_config(d, keypair[3], bundle_dir, grpc={"listen": f"127.0.0.1:{port}", "tls": tls_section(pki)},
                      storage={"backend": "postgres", "dsn": pg_dsn, "pool_size": 2},
                      cluster={"replica_id": replica_id, "registration_timeout_s": 6.0},
                      logging={"format": "json", "level": "info"})  # fmt: skip
    conf = d / "server.toml"
    conf.write_text(to_toml(cfg))
    return Replica(name, conf, port, {**os.environ}, mqtt=False)


@pytest.mark.slow
def test_a_second_process_with_a_live_replica_id_refuses_to_start_naming_the_first(
    tmp_path, pki, keypair, bundle_dir, pg_dsn
):
    first = _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, "first", "b").start()
    try:
        second = _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, "second", "b").launch()
        assert second.proc is not None
        rc = second.proc.wait(60)
        out = second.tail(40)
        assert rc == 1, out
        host = socket.gethostname()
        assert "cluster.replica_id: 'b' is held by a live replica on host" in out and repr(host[:64]) in out, out
        assert f"pid {first.proc.pid}" in out and "started 20" in out, out  # its start time, ISO 8601
        second.stop()
        # The first was never disturbed.
        assert first.proc.poll() is None and first.seen("replica registered")
        # Killed without a word: a replacement on this host takes the id over at once (its process is gone).
        first.stop(signal.SIGKILL)
        third = _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, "third", "b").start()
        assert third.seen("replica registered")
        third.stop(signal.SIGTERM)  # a clean stop releases it
        fourth = _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, "fourth", "b").start()
        fourth.stop(signal.SIGTERM)
    finally:
        first.stop(signal.SIGKILL)


@pytest.mark.slow
def test_a_registration_without_a_heartbeat_is_taken_over(tmp_path, pki, keypair, bundle_dir, pg_dsn):
    """A replica on another host that vanished (its host down): after registration_timeout_s its id is free."""
    store = PostgresStore(pg_dsn, pool_size=1)
    try:
        now = time.time()
        assert store.register_replica("b", host="lost-host", pid=4242, token="x", now=now, stale_s=6.0,
                                      alive=lambda pid: True) is None  # fmt: skip
    finally:
        store.close()
    early = _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, "early", "b").launch()
    assert early.proc is not None and early.proc.wait(60) == 1 and "'lost-host'" in early.tail(40)
    early.stop()
    assert wait_for(lambda: time.time() - now > 6.5, 10)
    late = _replica(tmp_path, pki, keypair, bundle_dir, pg_dsn, "late", "b").start()
    try:
        assert late.seen("replica registered")
    finally:
        late.stop(signal.SIGTERM)
