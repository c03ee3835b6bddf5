"""Three ``peep serve`` replicas behind the shipped HAProxy configuration (deploy/cluster/haproxy.cfg), as deployed.

Real processes: three replicas on one private PostgreSQL schema, HAProxy (Debian's 2.6) with the shipped file,
its paths and addresses swapped for the test's (peep.lab.processes.haproxy.Balancer), terminating TLS and
speaking HTTP/2 over TLS to the replicas, checking each replica's ``/healthz``. Every client — the admin's
enrolment and training, ten device processes streaming templates, an event subscriber — uses the balancer's
one address. The replica holding the subscriber's stream is SIGKILLed under load and restarted: the balancer
shows it out and back, every template is taken and decided exactly once, and the subscriber, calling again
with its last seq, receives every decision once and in order.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from peep.lab.bench.cluster import (
    DeviceSpec,
    count_stored,
    decided_keys,
    grpc_stub,
    open_streams,
    run_devices,
    serving_version,
    stored_keys,
)
from peep.lab.bench.server_clients import write_frames
from peep.lab.processes.control import wait_for
from peep.lab.processes.haproxy import Balancer, haproxy_missing
from peep.lab.processes.ports import free_port
from peep.lab.processes.replica import Replica
from peep.lab.processes.sockets import SocketPlace
from peep.server.config import token_sha256
from peep.v1 import recognition_pb2
from peep_testing.server import ADMIN, DEVICE_TOKENS, SITE, base_config, tls_section, to_toml

pytestmark = [pytest.mark.slow, pytest.mark.processes]

CAMERAS = [f"cam-{i:02d}" for i in range(1, 11)]
TOKENS = {d: f"tok-{d}-{uuid.uuid4().hex}" for d in CAMERAS}
N_TEMPLATES = int(os.environ.get("PEEP_BALANCER_TEMPLATES", "3000"))


@pytest.fixture
def balanced(tmp_path, pki, keypair, bundle_dir, pg_dsn):
    missing = haproxy_missing()
    if missing:
        pytest.skip(missing)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    replicas, ports = [], []
    for name in ("a", "b", "c"):
        d = tmp_path / name
        d.mkdir()
        gport, mport = free_port(), free_port()
        cfg = base_config(
            d, keypair[3], bundle_dir,
            grpc={"listen": f"127.0.0.1:{gport}", "tls": tls_section(pki)},
            storage={"backend": "postgres", "dsn": pg_dsn, "pool_size": 4},
            cluster={"replica_id": f"{name}-{uuid.uuid4().hex[:6]}", "check_interval_s": 2.0},
            metrics={"enabled": True, "listen": f"127.0.0.1:{mport}"},
            logging={"format": "json", "level": "info"},
        )  # fmt: skip
        cfg["auth"]["devices"] += [{"id": c, "site": SITE, "token_sha256": token_sha256(TOKENS[c])} for c in CAMERAS]
        conf = d / "server.toml"
        conf.write_text(to_toml(cfg))
        replicas.append(Replica(name, conf, gport, env, mqtt=False))
        replicas[-1].metrics_port = mport  # type: ignore[attr-defined]
        ports.append((f"replica-{name}", gport, mport))
    balancer = Balancer(tmp_path / "haproxy", cert=pki.server_cert, key=pki.server_key, ca=pki.client_ca,
                        replicas=ports)  # fmt: skip
    for r in replicas:
        r.launch()
    try:
        for r in replicas:
            r.wait_ready()
        balancer.start()
        assert wait_for(lambda: set(balancer.servers().values()) == {"UP"}, 15), balancer.servers()
        yield replicas, balancer
    finally:
        balancer.stop()
        for r in replicas:
            r.stop(signal.SIGKILL, 10)


def test_ten_devices_through_the_balancer_and_a_replica_killed_every_template_decided_once(
    balanced, pg_dsn, templates, tmp_path, pki
):
    """The replica killed is the one holding an event subscriber's stream: the subscriber, following through the
    balancer, calls again with its last seq and receives every decision once, in order."""
    from peep.server.transport.follow import EventFollower

    replicas, balancer = balanced
    ca = str(pki.client_ca)
    stub = grpc_stub(balancer.port, ca)
    assert stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=120).rejected == 0
    version = stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=600).model_version
    probe = templates.message(int(templates.test[0]))
    direct = [grpc_stub(r.grpc_port, ca) for r in replicas]
    assert wait_for(lambda: all(serving_version(s, probe, DEVICE_TOKENS["cam-1"]) == version for s in direct), 10)
    taken_before = count_stored(pg_dsn)

    n_each = N_TEMPLATES // len(CAMERAS)
    specs, expected = [], set()
    for k, dev in enumerate(CAMERAS):
        msgs = [templates.message((k * n_each + i) % len(templates.X), device_id=dev, message_id=f"{dev}-{i:05d}")
                for i in range(n_each)]  # fmt: skip
        expected |= {(dev, m.message_id) for m in msgs}
        frames = tmp_path / f"{dev}.bin"
        write_frames(frames, [m.SerializeToString() for m in msgs])
        # Every device at the balancer's one address, in chunks of 100 (a failed chunk is resent to it).
        specs.append(DeviceSpec(dev, "grpc", str(frames), ports=[balancer.port], token=TOKENS[dev], ca=ca, chunk=100))

    # An admin's event subscriber at the balancer's address; the replica it landed on is the one killed.
    follower = EventFollower(lambda: stub, site=SITE, metadata=ADMIN, backoff=(0.1, 1.0))
    followed: list[Any] = []

    def follow() -> None:
        for ev in follower:
            if (ev.device_id, ev.message_id) in expected:
                followed.append(ev)

    following = threading.Thread(target=follow, daemon=True)
    following.start()
    assert wait_for(lambda: sum(open_streams(r.metrics_port) for r in replicas) == 1, 10), (
        "the subscriber's stream did not open"
    )
    victim = next(r for r in replicas if open_streams(r.metrics_port) == 1)
    name = f"replica-{victim.name}"
    others = [f"replica-{r.name}" for r in replicas if r is not victim]
    seen: dict[str, Any] = {}

    def taken() -> int:
        return count_stored(pg_dsn) - taken_before

    def kill_and_restart() -> None:
        assert wait_for(lambda: taken() >= N_TEMPLATES // 3, 120), "no progress before the kill"
        seen["at_kill"] = taken()
        seen["followed_at_kill"] = len(followed)
        victim.stop(signal.SIGKILL)
        t0 = time.monotonic()
        assert wait_for(lambda: balancer.servers()[name].startswith("DOWN"), 10), balancer.servers()
        seen["out_after_s"] = time.monotonic() - t0
        seen["while_out"] = balancer.servers()
        victim.start()  # the same replica id
        t1 = time.monotonic()
        assert wait_for(lambda: balancer.servers()[name] == "UP", 15), balancer.servers()
        seen["back_after_s"] = time.monotonic() - t1

    t0 = time.monotonic()
    reports = run_devices(specs, taken, during=kill_and_restart)
    assert wait_for(lambda: taken() >= N_TEMPLATES, 120), f"{taken()} of {N_TEMPLATES}"
    time.sleep(1.0)  # anything late would show now
    keys = [k for k in stored_keys(pg_dsn) if k in expected]
    decided = [k for k in decided_keys(pg_dsn) if k in expected]
    assert wait_for(lambda: len(followed) >= N_TEMPLATES, 30), f"the subscriber has {len(followed)} of {N_TEMPLATES}"
    time.sleep(1.0)  # a repeat would show now
    follower.stop()
    following.join(5)
    print(
        f"\n{N_TEMPLATES} templates from {len(CAMERAS)} devices through HAProxy in {time.monotonic() - t0:.1f} s; "
        f"{name} (the subscriber's) killed after {seen['at_kill']}, out of the balancer after "
        f"{seen['out_after_s']:.1f} s ({seen['while_out']}), back {seen['back_after_s']:.1f} s after its restart; "
        f"chunks resent {sum(r['retries'] for r in reports)}, answered duplicate "
        f"{sum(r['duplicates'] for r in reports)}; the subscriber had {seen['followed_at_kill']} events at the kill, "
        f"called again {follower.reconnects} time(s), received {len(followed)}, repeats {follower.repeated}"
    )
    assert seen["at_kill"] < N_TEMPLATES, "the kill was not mid-stream"
    assert all(seen["while_out"][o] == "UP" for o in others)
    assert sum(r["rejected"] for r in reports) == 0
    assert len(keys) == len(set(keys)) == N_TEMPLATES and set(keys) == expected  # every template taken once
    assert len(decided) == len(set(decided)) == N_TEMPLATES and set(decided) == expected  # and decided once
    # The subscriber lost its stream with its replica and resumed through the balancer: every event once, in order.
    assert follower.reconnects >= 1 and follower.repeated == 0
    assert [(e.device_id, e.message_id) for e in followed] == [k for k in decided_keys(pg_dsn) if k in expected]
    assert all(y.seq > x.seq for x, y in itertools.pairwise(followed))
    # The balancer spread the calls over the three (per call, not per connection: ten devices, three replicas).
    calls = {n: int(row.get("req_tot") or row.get("stot") or 0) for n, row in balancer.stats().items()}
    print(f"calls per replica through the balancer: {calls}")
    assert all(n > 0 for n in calls.values()), calls


def test_a_draining_replica_leaves_the_balancer_before_it_stops(balanced, pki):
    """SIGTERM: the replica's /healthz turns 503 NOT_SERVING at once, so the balancer takes it out while it drains."""
    replicas, balancer = balanced
    c = replicas[2]
    stopping = threading.Thread(target=lambda: c.stop(signal.SIGTERM, 60))
    stopping.start()
    assert wait_for(lambda: balancer.servers()["replica-c"].startswith("DOWN"), 15), balancer.servers()
    stopping.join(60)
    ch = grpc.secure_channel(f"localhost:{balancer.port}", grpc.ssl_channel_credentials(pki.ca_pem))
    for _ in range(6):  # every call reaches a live replica
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
    ch.close()


def test_a_balancer_in_a_deep_folder_keeps_its_stats_socket_in_a_short_one(tmp_path, pki):
    missing = haproxy_missing()
    if missing:
        pytest.skip(missing)
    deep = tmp_path.joinpath(*(["a-folder-deep-enough"] * 5))
    assert len(os.fsencode(str(deep / "admin.sock"))) > 97  # what HAProxy refuses for a stats socket
    balancer = Balancer(deep, cert=pki.server_cert, key=pki.server_key, ca=pki.client_ca,
                        replicas=[("replica-x", free_port(), free_port())])  # fmt: skip
    short = balancer.socket.parent
    assert short != deep and len(os.fsencode(str(balancer.socket))) <= 97
    try:
        for _ in range(2):  # started again after a stop, as a restarted balancer is
            balancer.start()
            assert set(balancer.servers()) == {"replica-x"}  # read through the stats socket
            balancer.stop()
            assert not short.exists()
    finally:
        balancer.stop()


def test_a_socket_goes_in_its_folder_unless_the_path_is_too_long_then_in_a_short_folder_of_its_own(tmp_path):
    shallow = SocketPlace(tmp_path, "x.sock", limit=4096)
    assert shallow.path == tmp_path / "x.sock" and shallow.short_dir is None
    shallow.remove()  # nothing of the caller's folder is deleted
    assert tmp_path.is_dir()

    deep = SocketPlace(tmp_path, "x.sock", limit=len(os.fsencode(str(tmp_path / "x.sock"))) - 1, prefix="peep-t-")
    short = deep.short_dir
    assert short is not None and deep.path == short / "x.sock" and short.name.startswith("peep-t-")
    assert short.stat().st_mode & 0o777 == 0o700  # private: only this user binds or reaches the socket
    deep.path.write_text("")  # as a bound socket's file would be
    deep.remove()
    assert not short.exists()
    deep.make()  # a part started again after its stop
    assert short.is_dir() and short.stat().st_mode & 0o777 == 0o700
    deep.remove()


def test_a_balancer_whose_port_is_taken_before_its_first_start_takes_another_and_keeps_it_on_a_restart(tmp_path, pki):
    missing = haproxy_missing()
    if missing:
        pytest.skip(missing)
    balancer = Balancer(tmp_path / "lb", cert=pki.server_cert, key=pki.server_key, ca=pki.client_ca,
                        replicas=[("replica-x", free_port(), free_port())])  # fmt: skip
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", balancer.port))
        squatter.listen()
        taken = balancer.port
        try:
            balancer.start()
            assert balancer.port != taken
            assert f"127.0.0.1:{balancer.port} " in balancer.conf.read_text()
            kept = balancer.port
            balancer.stop()
            balancer.start()
            assert balancer.port == kept
        finally:
            balancer.stop()
