"""Three ``peep serve`` replicas as one backend, as deployed.

Real processes on the real services: three ``peep serve`` subprocesses on one
private PostgreSQL schema, our own Mosquitto with the shipped configuration
(deploy/mosquitto: persistence, the devices' listener with its mount point, the
server's listener; peep_testing.broker), each replica configured like
deploy/cluster/replica-*.toml: its ``cluster.replica_id`` names its persistent
MQTT sessions (no ``mqtt.client_id``). Ten device *processes*
(peep.lab.bench.cluster, the harness ``peep bench --sections cluster`` uses):
five publish QoS 1 over MQTT with their own broker accounts, five stream over gRPC,
each call to the next replica and a failed call resent to the next one, as
through a per-call load balancer.

The full size is 20,000 templates. CI sends ``PEEP_CLUSTER_TEMPLATES``
(default 6,000) to keep the suite's time reasonable on 2 cores; the full size
was run by hand (``PEEP_CLUSTER_TEMPLATES=20000``), numbers in docs/OPERATIONS.md.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from peep.lab.bench.cluster import (
    DeviceSpec,
    count_stored,
    decided_keys,
    grpc_stub,
    run_devices,
    serving_version,
    stored_keys,
)
from peep.lab.bench.server_clients import write_frames
from peep.lab.processes.control import wait_for
from peep.lab.processes.ports import free_port
from peep.lab.processes.replica import Replica
from peep.server.config import token_sha256
from peep.v1 import recognition_pb2
from peep_testing.broker import SERVER_PASSWORD, ShippedBroker
from peep_testing.server import ADMIN, ADMIN_TOKEN, DEVICE, DEVICE_TOKENS, SITE, base_config, tls_section, to_toml

pytestmark = [pytest.mark.mqtt, pytest.mark.slow, pytest.mark.processes]

CAMERAS = [f"cam-{i:02d}" for i in range(1, 11)]
PASSWORDS = {d: f"{d}-pw-{uuid.uuid4().hex[:8]}" for d in CAMERAS}
TOKENS = {d: f"tok-{d}-{uuid.uuid4().hex}" for d in CAMERAS}
N_TEMPLATES = int(os.environ.get("PEEP_CLUSTER_TEMPLATES", "6000"))


@pytest.fixture
def broker(tmp_path, pki):
    b = ShippedBroker(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key, devices=PASSWORDS).start()
    yield b
    b.stop(signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path, pki, keypair, bundle_dir, pg_dsn, broker):
    env = {
        **os.environ,
        "PEEP_TEST_MQTT_PASSWORD": SERVER_PASSWORD,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    replicas = []
    for name in ("a", "b", "c"):
        d = tmp_path / name
        d.mkdir()
        port = free_port()
        cfg = base_config(
            d,
            keypair[3],
            bundle_dir,
            grpc={"listen": f"127.0.0.1:{port}", "tls": tls_section(pki)},
            storage={"backend": "postgres", "dsn": pg_dsn, "pool_size": 4},
            mqtt=broker.server_mqtt_section(session_expiry_s=600),
            cluster={"replica_id": name, "check_interval_s": 2.0},
            logging={"format": "json", "level": "info"},
        )
        del cfg["mqtt"]["client_id"]  # the replica id names the sessions, as in deploy/cluster
        cfg["auth"]["devices"] += [{"id": c, "site": SITE, "token_sha256": token_sha256(TOKENS[c])} for c in CAMERAS]
        conf = d / "server.toml"
        conf.write_text(to_toml(cfg))
        replicas.append(Replica(name, conf, port, env, mqtt=True))
    for r in replicas:
        r.launch()
    try:
        for r in replicas:
            r.wait_ready()
        yield replicas
    finally:
        for r in replicas:
            r.stop(signal.SIGKILL, 10)


def test_three_replicas_decide_every_template_once_and_agree_on_models_and_erasures(
    cluster, broker, pg_dsn, templates, tmp_path, pki
):
    b = cluster[1]
    started = {r.name: next(e for e in r.events if e.get("event") == "server started") for r in cluster}
    assert [started[n]["mqtt_client_id"] for n in "abc"] == ["peep-server-a", "peep-server-b", "peep-server-c"]

    # ------------------------------------------------ train through A: B and C serve it within 5 s
    sa, sb, sc = (grpc_stub(r.grpc_port, str(pki.client_ca)) for r in cluster)
    token = DEVICE_TOKENS["cam-1"]
    probe = templates.message(int(templates.test[0]))
    summary = sa.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=120)
    assert summary.rejected == 0
    t_train = time.monotonic()
    resp = sa.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=600)
    train_s = time.monotonic() - t_train
    version = resp.model_version
    t_ret = time.monotonic()
    assert wait_for(lambda: all(serving_version(s, probe, token) == version for s in (sa, sb, sc)), 5.0, 0.01)
    promotion_s = time.monotonic() - t_ret
    taken_before = count_stored(pg_dsn)  # the enrolment templates

    # ------------------------------------------------ N templates, 10 devices, B SIGKILLed and restarted
    n_each = N_TEMPLATES // len(CAMERAS)
    X = templates.X
    ports = [r.grpc_port for r in cluster]
    specs, expected = [], set()
    for k, dev in enumerate(CAMERAS):
        msgs = [
            templates.message((k * n_each + i) % len(X), device_id=dev, message_id=f"{dev}-{i:05d}")
            for i in range(n_each)
        ]
        expected |= {(dev, m.message_id) for m in msgs}
        frames = tmp_path / f"{dev}.bin"
        write_frames(frames, [m.SerializeToString() for m in msgs])
        if k % 2 == 0:
            topic = f"peep/v1/{SITE}/{dev}/templates"
            specs.append(
                DeviceSpec(dev, "mqtt", str(frames), topic=topic, port=broker.dev_port, username=dev,
                           password=PASSWORDS[dev], ca=str(broker.ca))
            )  # fmt: skip
        else:
            specs.append(DeviceSpec(dev, "grpc", str(frames), ports=ports, token=TOKENS[dev], ca=str(pki.client_ca)))
    at_kill: dict[str, Any] = {}

    def taken() -> int:
        return count_stored(pg_dsn) - taken_before

    def kill_and_restart_b() -> None:
        assert wait_for(lambda: taken() >= N_TEMPLATES // 3, 120), "no progress before the kill"
        at_kill["stored"] = taken()
        b.stop(signal.SIGKILL)
        time.sleep(1.0)
        b.start()  # the same replica id: it resumes its persistent sessions
        at_kill["back"] = taken()

    t0 = time.monotonic()
    reports = run_devices(specs, taken, during=kill_and_restart_b)
    assert wait_for(lambda: taken() >= N_TEMPLATES, 120), f"{taken()} of {N_TEMPLATES}"
    time.sleep(1.0)  # anything late would show now
    ingest_s = time.monotonic() - t0
    keys = [k for k in stored_keys(pg_dsn) if k in expected]
    decided = [k for k in decided_keys(pg_dsn) if k in expected]
    mqtt_acked = sum(r["acknowledged"] for r in reports if r["kind"] == "mqtt")
    grpc_reports = [r for r in reports if r["kind"] == "grpc"]
    duplicates = sum(r["duplicates"] for r in grpc_reports)
    retries = sum(r["retries"] for r in grpc_reports)
    print(
        f"\n{N_TEMPLATES} templates from {len(CAMERAS)} device processes in {ingest_s:.1f} s; taken at the kill "
        f"{at_kill['stored']}; taken {len(keys)} ({len(set(keys))} distinct), decided {len(decided)} "
        f"({len(set(decided))} distinct); MQTT acknowledged {mqtt_acked}; gRPC calls resent {retries}, answered "
        f"duplicate {duplicates}"
    )
    assert at_kill["stored"] < N_TEMPLATES, "the kill was not mid-stream"
    assert mqtt_acked == N_TEMPLATES // 2
    assert sum(r["rejected"] for r in grpc_reports) == 0
    assert len(keys) == len(set(keys)) == N_TEMPLATES and set(keys) == expected  # every template taken once
    assert len(decided) == len(set(decided)) == N_TEMPLATES and set(decided) == expected  # and decided once
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # and none of them kept (recognition.keep = none)
        kept = conn.execute("SELECT COUNT(*) FROM templates WHERE purpose != 'enroll'").fetchone()[0]
    assert kept == 0

    # ------------------------------------------------ erase through C: none of the three names the subject within 5 s
    victim = str(templates.subjects[templates.test[0]])
    probes = [templates.message(int(i)) for i in templates.test if templates.subjects[i] == victim][:5]
    reqs = [recognition_pb2.IdentifyRequest(template=p, top_k=10) for p in probes]

    def named(stub: Any) -> bool:
        for r in reqs:
            out = stub.Identify(r, metadata=DEVICE, timeout=5)
            if out.subject == victim or any(x.subject == victim and x.probability > 0 for x in out.candidates):
                return True
        return False

    assert named(sa)
    done: dict[str, Any] = {}
    eraser = threading.Thread(
        target=lambda: done.setdefault(
            "r",
            sc.EraseSubject(
                recognition_pb2.EraseSubjectRequest(subject=victim, retrain=True),
                metadata=[("authorization", f"Bearer {ADMIN_TOKEN}")],
                timeout=600,
            ),
        )
    )
    t_erase = time.monotonic()
    eraser.start()
    assert wait_for(lambda: not any(named(s) for s in (sa, sb, sc)), 5.0, 0.01)
    erased_s = time.monotonic() - t_erase
    assert wait_for(lambda: _templates_of(pg_dsn, victim) == 0, 5.0)
    eraser.join(600)
    assert done["r"].model_version > version
    assert not any(named(s) for s in (sa, sb, sc))
    print(
        f"Train {train_s:.2f} s, then served by all three in {promotion_s:.3f} s; erased through C: "
        f"no replica names the subject after {erased_s:.3f} s"
    )


def _templates_of(dsn: str, subject: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM templates WHERE subject = %s", (subject,)).fetchone()
        return int(row[0]) if row else 0
