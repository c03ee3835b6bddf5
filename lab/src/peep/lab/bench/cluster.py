"""The ``cluster`` section of ``peep bench``: several ``peep serve`` replicas as one backend.

Real ``peep serve`` subprocesses (3) on one PostgreSQL schema and one MQTT
broker, device *processes* sending templates over MQTT (QoS 1, the replicas'
shared subscription) and over gRPC (``IngestStream``, each call to the next
replica, as a per-call load balancer does). Measured in one run:

``ingest_per_s_1`` / ``ingest_per_s_n``
    Templates per second stored by one replica, then by ``replicas`` replicas
    (the same devices and load, a fresh set of templates), from the first
    template sent to the last one committed (counted in the database).
``sent`` / ``stored`` / ``duplicates``
    Templates sent (both phases), rows in the ingest ledger afterwards (every
    template taken; identify templates themselves are decided and forgotten),
    and sends the replicas answered as already taken (gRPC acks ``DUPLICATE``; a
    resend after a failure). ``stored == sent`` with each (device, message id) once.
``promotion_to_serving_s``
    ``Train`` through replica A until every replica's ``Identify`` answers name
    the new version (``train_s``: until ``Train`` returned; ``after_train_s``:
    the rest, PostgreSQL ``NOTIFY`` and the swap).
``through_balancer``
    The gRPC devices through HAProxy with the shipped ``deploy/cluster/haproxy.cfg``
    (:class:`Balancer`; where ``haproxy`` is installed, else an ``error`` saying so),
    the replica holding an event subscriber's stream SIGKILLed a third of the way
    and restarted: ``sent``, ``decided`` (each (device, message id) once),
    ``duplicates`` (decided more than once), ``lost`` (never decided), how soon
    the balancer took the replica out and back in, the calls each replica
    answered, and ``events_followed``: what the subscriber, calling again with
    its last ``seq`` through the balancer, received (once each, in commit order?)
    and its lag.
``server_cpu_s_per_1k``
    Process CPU seconds of the replicas per 1,000 templates: ``decided`` (a phase
    with the model: identified, decision kept; per replica and in all) and
    ``stored_only`` (the first phases, before any model), and from ``decided`` the
    replicas of 1, 2, 4 or 8 cores that 1,000 templates a second would keep busy
    (a prediction; wall rates here are capped by 2 cores shared with everything).

Needs PostgreSQL (``PEEP_BENCH_PG_DSN``, default
``host=127.0.0.1 port=5432 dbname=postgres user=postgres``; a private schema,
dropped afterwards) and an MQTT v5 broker allowing anonymous clients
(``PEEP_BENCH_MQTT``, default ``127.0.0.1:1883``); without either it fails
saying which. Nothing stays on the broker: the replicas use session expiry 0,
a topic root of the run's own, and the retained bundle announcement is
cleared at the end.

The same harness (:class:`Replica`, :func:`run_devices`, :func:`stored_keys`,
:func:`serving_version`) drives the acceptance test,
``tests/server/test_cluster_processes.py``, there with the shipped Mosquitto
configuration, persistent sessions and a replica SIGKILLed mid-stream.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from peep.core.configfile import to_toml
from peep.lab.bench.server_clients import read_frames, write_frames
from peep.lab.processes.control import process_cpu_s, wait_for
from peep.lab.processes.haproxy import Balancer, haproxy_missing
from peep.lab.processes.ports import free_port
from peep.lab.processes.replica import Replica

log = logging.getLogger(__name__)

DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=postgres user=postgres connect_timeout=3"
DEFAULT_BROKER = "127.0.0.1:1883"


class ClusterUnavailableError(RuntimeError):
    """PostgreSQL or the broker the cluster section needs is not reachable (the message names which)."""


# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- replicas


# --------------------------------------------------------------------------- devices


@dataclass
class DeviceSpec:
    """One device process: ``kind`` "mqtt" (publish to ``topic``) or "grpc" (IngestStream to ``ports`` in turn)."""

    device_id: str
    kind: str
    frames: str
    topic: str = ""
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    ca: str | None = None
    ports: list[int] = field(default_factory=list)
    token: str = ""
    chunk: int = 500


def _device_main(spec: DeviceSpec, published: Any, index: int, processed: Any, window: int, results: Any) -> None:
    try:
        out = _mqtt_device(spec, published, index, processed, window) if spec.kind == "mqtt" else _grpc_device(spec)
    except Exception as exc:  # reported to the parent, which fails with it
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["device_id"] = spec.device_id
    out["kind"] = spec.kind
    results.put(out)


def _mqtt_device(spec: DeviceSpec, published: Any, index: int, processed: Any, window: int) -> dict[str, Any]:
    """Publish QoS 1, at most ``window`` templates outstanding over all devices (sent, not yet stored)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    payloads = read_frames(spec.frames)
    # MQTT v5 defaults: clean start, session expiry 0; nothing stays on the broker.
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"{spec.device_id}-{uuid.uuid4().hex[:6]}", protocol=mqtt.MQTTv5
    )
    if spec.username:
        c.username_pw_set(spec.username, spec.password)
    if spec.ca:
        c.tls_set(ca_certs=spec.ca)
    c.max_inflight_messages_set(20)
    c.max_queued_messages_set(0)
    c.connect(spec.host if not spec.ca else "localhost", spec.port)
    c.loop_start()
    start = time.time()
    infos = []
    for k, p in enumerate(payloads):
        while sum(published) - processed.value >= window:
            time.sleep(0.001)
        infos.append(c.publish(spec.topic, p, qos=1))
        published[index] = k + 1
    for info in infos:
        info.wait_for_publish(300)
    acked = sum(1 for i in infos if i.rc == 0 and i.is_published())
    c.disconnect()
    c.loop_stop()
    return {"start": start, "end": time.time(), "sent": len(payloads), "acknowledged": acked}


def _grpc_device(spec: DeviceSpec) -> dict[str, Any]:
    """IngestStream in chunks, each to the next replica; a failed call is resent to the next one."""
    import grpc
    from peep.v1 import recognition_pb2_grpc, template_pb2

    msgs = [template_pb2.PerturbedTemplate.FromString(p) for p in read_frames(spec.frames)]
    creds = grpc.ssl_channel_credentials(root_certificates=Path(spec.ca).read_bytes()) if spec.ca else None
    stubs = []
    for port in spec.ports:
        target = f"localhost:{port}"
        ch = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
        stubs.append(recognition_pb2_grpc.RecognitionServiceStub(ch))  # type: ignore[no-untyped-call]
    md = [("authorization", f"Bearer {spec.token}")]
    accepted = duplicates = rejected = retries = 0
    turn = 0
    start = time.time()
    for lo in range(0, len(msgs), spec.chunk):
        chunk = msgs[lo : lo + spec.chunk]
        deadline = time.monotonic() + 300
        while True:
            stub = stubs[turn % len(stubs)]
            turn += 1
            try:
                summary = stub.IngestStream(iter(chunk), metadata=md, timeout=60, wait_for_ready=False)
            except grpc.RpcError:
                retries += 1  # the replica died or is restarting: the same chunk to the next one
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            accepted += summary.accepted
            duplicates += summary.duplicates
            rejected += summary.rejected
            break
    return {
        "start": start,
        "end": time.time(),
        "sent": len(msgs),
        "accepted": accepted,
        "duplicates": duplicates,
        "rejected": rejected,
        "retries": retries,
    }


def run_devices(
    specs: Sequence[DeviceSpec],
    stored: Callable[[], int],
    *,
    window: int = 2_000,
    during: Callable[[], None] | None = None,
    timeout: float = 600.0,
) -> list[dict[str, Any]]:
    """Run one process per device until all have sent (and had acknowledged) their templates.

    ``stored`` returns how many templates the backend has stored: the MQTT
    devices keep at most ``window`` outstanding. ``during`` runs in this
    process while the devices send (e.g. kill and restart a replica).
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    published = ctx.RawArray("q", len(specs))
    processed = ctx.RawValue("q", 0)
    results = ctx.Queue()
    base = stored()
    done = threading.Event()

    def feed() -> None:
        while not done.is_set():
            try:
                processed.value = stored() - base
            except Exception:
                pass
            time.sleep(0.05)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    procs = [
        ctx.Process(target=_device_main, args=(s, published, i, processed, window, results), daemon=True)
        for i, s in enumerate(specs)
    ]
    env_before = dict(os.environ)
    os.environ.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    try:
        for p in procs:
            p.start()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    try:
        if during is not None:
            during()
        reports = [results.get(timeout=timeout) for _ in procs]
    finally:
        done.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [r for r in reports if "error" in r]
    if errors:
        raise RuntimeError(f"device processes failed: {errors}")
    return reports


# --------------------------------------------------------------------------- the database and the replicas' answers


def stored_keys(dsn: str) -> list[tuple[str, str]]:
    """(device_id, message_id) of every template taken: the ingest ledger's rows (its key makes a duplicate
    impossible; identify/verify templates themselves are decided and forgotten)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return [(str(d), str(m)) for d, m in conn.execute("SELECT device_id, message_id FROM ingest_ledger")]


def decided_keys(dsn: str) -> list[tuple[str, str]]:
    """(device_id, message_id) of every kept decision of an ingested template, one row per decision."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        q = "SELECT device_id, message_id FROM recognition_events WHERE message_id != '' ORDER BY id"
        return [(str(d), str(m)) for d, m in conn.execute(q)]


def count_decided(dsn: str) -> int:
    """Kept decisions of ingested templates (rows of ``recognition_events`` with a message id)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM recognition_events WHERE message_id != ''").fetchone()
        return int(row[0]) if row else 0


def count_stored(dsn: str) -> int:
    """Templates taken (rows of the ingest ledger); 0 before the schema exists."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT COUNT(*) FROM ingest_ledger").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0


def open_streams(metrics_port: int) -> int:
    """A replica's ``peep_grpc_streams`` gauge (its streaming calls open), read from its metrics listener."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("peep_grpc_streams "):
                return int(float(line.split()[1]))
    return 0


def grpc_stub(port: int, ca: str | None) -> Any:
    import grpc
    from peep.v1 import recognition_pb2_grpc

    target = f"localhost:{port}"
    if ca:
        ch = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes()))
    else:
        ch = grpc.insecure_channel(target)
    return recognition_pb2_grpc.RecognitionServiceStub(ch)  # type: ignore[no-untyped-call]


def serving_version(stub: Any, probe: Any, token: str) -> str:
    """The model version a replica's Identify answer names ("" without a model)."""
    from peep.v1 import recognition_pb2

    req = recognition_pb2.IdentifyRequest(template=probe, top_k=1)
    try:
        return str(stub.Identify(req, metadata=[("authorization", f"Bearer {token}")], timeout=5).model_version)
    except Exception:
        return ""


# --------------------------------------------------------------------------- the bench section


_DEVICES = [f"cam-{i:02d}" for i in range(1, 11)]
_ADMIN = "bench-admin-" + uuid.uuid4().hex[:8]
_DESK = "desk-1"


def _token(device: str) -> str:
    return f"bench-token-{device}"


def _preflight(dsn: str, broker: str) -> tuple[str, int]:
    import psycopg

    try:
        psycopg.connect(dsn, autocommit=True).close()
    except Exception as exc:
        raise ClusterUnavailableError(
            f"the cluster section needs PostgreSQL: cannot connect with {dsn!r} ({str(exc).strip()}); "
            "set PEEP_BENCH_PG_DSN to a database where this user may create a schema"
        ) from None
    host, _, port = broker.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            pass
    except (OSError, ValueError) as exc:
        raise ClusterUnavailableError(
            f"the cluster section needs an MQTT v5 broker: cannot connect to {broker} ({exc}); "
            "set PEEP_BENCH_MQTT=HOST:PORT (anonymous access)"
        ) from None
    return host, int(port)


@dataclass
class _Cluster:
    """What a cluster run set up, which its steps share.

    ``dsn`` reaches the run's private ``schema``; ``host``/``port`` the broker, under the topic root ``prefix``;
    ``bundle`` is the synthetic bundle the templates come from, ``tls`` the run's PKI
    (:class:`~peep.lab.processes.pki.IssuedFiles`); ``replicas`` are not started yet, ``metrics_ports`` their metrics
    listeners (``/healthz`` for the balancer), in the same order.
    """

    tmp: Path
    dsn: str
    schema: str
    host: str
    port: int
    prefix: str
    bundle: Any
    tls: Any
    replicas: list[Replica]
    metrics_ports: list[int]


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the cluster; returns a JSON-able dict (see module docstring).

    Raises
    ------
    ClusterUnavailableError
        PostgreSQL or the broker is not reachable.
    """
    import psycopg

    dsn0 = os.environ.get("PEEP_BENCH_PG_DSN", DEFAULT_DSN)
    host, port = _preflight(dsn0, os.environ.get("PEEP_BENCH_MQTT", DEFAULT_BROKER))
    per_phase = 3_000 if quick else 10_000
    schema = f"peep_bench_{uuid.uuid4().hex[:10]}"
    prefix = f"peepbench-{uuid.uuid4().hex[:8]}/v1"
    group = f"bench{uuid.uuid4().hex[:6]}"
    admin = psycopg.connect(dsn0, autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    dsn = f"{dsn0} options='-c search_path={schema}'"
    cluster: _Cluster | None = None
    with tempfile.TemporaryDirectory(prefix="peep-bench-cluster-") as tmp_s:
        try:
            cluster = _set_up(Path(tmp_s), dsn, schema, host, port, prefix, group, n_replicas=3)
            return _measure(cluster, per_phase)
        finally:
            _tear_down(cluster.replicas if cluster is not None else [], prefix, host, port, admin, schema)


def _set_up(tmp: Path, dsn: str, schema: str, host: str, port: int, prefix: str, group: str, *,
            n_replicas: int) -> _Cluster:  # fmt: skip
    """The bundle, the PKI and ``n_replicas`` replicas' configurations (written under ``tmp``, none started)."""
    from peep.lab.bench.server import synthetic_bundle
    from peep.lab.processes.pki import make_local_pki

    bundle, pub = synthetic_bundle(tmp)
    tls = make_local_pki(tmp / "pki")
    cfg_base = _replica_config(dsn, pub, tmp, host, port, prefix, group)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    replicas: list[Replica] = []
    metrics_ports: list[int] = []
    for k in range(n_replicas):
        name = "abcdefgh"[k]
        gport = free_port()
        cfg = json.loads(json.dumps(cfg_base))
        cfg["cluster"] = {"replica_id": f"bench-{name}-{uuid.uuid4().hex[:4]}"}
        cfg["grpc"] = {
            "listen": f"127.0.0.1:{gport}",
            "grace_s": 2.0,
            "tls": {"cert": str(tls.server_cert), "key": str(tls.server_key)},
        }
        mport = free_port()  # /healthz for the balancer
        cfg["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{mport}"}
        conf = tmp / f"replica-{name}.toml"
        conf.write_text(to_toml(cfg))
        replicas.append(Replica(name, conf, gport, env, mqtt=True))
        metrics_ports.append(mport)
    return _Cluster(tmp=tmp, dsn=dsn, schema=schema, host=host, port=port, prefix=prefix, bundle=bundle, tls=tls,
                    replicas=replicas, metrics_ports=metrics_ports)  # fmt: skip


def _replica_config(dsn: str, pub: Path, tmp: Path, host: str, port: int, prefix: str, group: str) -> dict[str, Any]:
    """What every replica's configuration shares: the store, the bundle, the devices' tokens, the broker."""
    from peep.server.config import token_sha256

    desk = _DESK
    return {
        "storage": {"backend": "postgres", "dsn": dsn, "pool_size": 4},
        "bundle": {"public_key": str(pub), "dir": str(tmp / "bundle")},
        "auth": {
            "admin_token_sha256": token_sha256(_ADMIN),
            "devices": [
                *({"id": d, "site": "bench", "token_sha256": token_sha256(_token(d))} for d in _DEVICES),
                {
                    "id": desk,
                    "site": "bench",
                    "token_sha256": token_sha256(_token(desk)),
                    "enrolment_desk": True,
                },
            ],
        },
        "mqtt": {
            "enabled": True,
            "host": host,
            "port": port,
            "username": None,
            "topic_prefix": prefix,
            "share_group": group,
            "session_expiry_s": 0,  # the shared broker: no session outlives the run
        },
        "training": {"preset": "lda", "model_dir": str(tmp / "models")},
        "logging": {"format": "json", "level": "info"},
    }


def _measure(cluster: _Cluster, per_phase: int) -> dict[str, Any]:
    """Ingest on one replica then on all, the promotion, ingest with a model, then through the balancer."""
    replicas = cluster.replicas
    replicas[0].start()
    one = _phase(cluster, "one", per_phase, replicas[:1])
    for r in replicas[1:]:
        r.launch()
    for r in replicas[1:]:
        r.wait_ready()
    many = _phase(cluster, "many", per_phase, replicas)
    keys = stored_keys(cluster.dsn)
    promotion = _promote(cluster)
    # The same load again, now with a model: each template identified, its decision kept (the CPU a
    # deployment pays per template; the phases above only store, nothing can be decided yet).
    decided = _phase(cluster, "decided", per_phase, replicas)
    balanced = _balanced(cluster, per_phase // 2)
    return _result(cluster, one, many, decided, keys, promotion, balanced)


def _phase_specs(cluster: _Cluster, phase: str, n: int, ports: list[int]) -> list[DeviceSpec]:
    """The devices of a phase, ``n`` fresh templates among them: the even ones over MQTT, the odd ones over gRPC
    to ``ports`` in turn."""
    from peep.lab.bench.server import synthetic_templates

    out = []
    for i, d in enumerate(_DEVICES):
        msgs = synthetic_templates(cluster.bundle, n // len(_DEVICES), devices=[d])
        frames = cluster.tmp / f"{phase}-{d}.bin"
        write_frames(frames, msgs)
        if i % 2 == 0:
            topic = f"{cluster.prefix}/bench/{d}/templates"
            out.append(DeviceSpec(d, "mqtt", str(frames), topic=topic, host=cluster.host, port=cluster.port))
        else:
            out.append(DeviceSpec(d, "grpc", str(frames), ports=ports, token=_token(d), ca=str(cluster.tls.ca_cert)))
    return out


def _phase(cluster: _Cluster, name: str, n: int, up: list[Replica]) -> dict[str, Any]:
    """``n`` templates to the replicas ``up``, timed from the first sent to the last stored, with their CPU."""
    dsn = cluster.dsn
    before = count_stored(dsn)
    cpu0 = {r.name: process_cpu_s(r.proc.pid) for r in up if r.proc is not None}
    reports = run_devices(_phase_specs(cluster, name, n, [r.grpc_port for r in up]), lambda: count_stored(dsn))
    sent = sum(r["sent"] for r in reports)
    t0 = min(r["start"] for r in reports)
    if not wait_for(lambda: count_stored(dsn) - before >= sent, 120, 0.02):
        raise RuntimeError(f"{name}: {count_stored(dsn) - before} of {sent} stored after 120 s")
    seconds = time.time() - t0
    cpu = {r.name: process_cpu_s(r.proc.pid) - cpu0[r.name] for r in up if r.proc is not None}
    return {
        "sent": sent,
        "seconds": round(seconds, 3),
        "rate": round(sent / seconds, 1),
        "duplicates": sum(r.get("duplicates", 0) for r in reports),
        "server_cpu_s": {k: round(v, 3) for k, v in cpu.items()},
    }


def _promote(cluster: _Cluster) -> dict[str, Any]:
    """Enrol through the desk, ``Train`` through replica A, until every replica serves the new version.

    Returns ``{"train_s", "promotion_s", "version"}``: until ``Train`` returned, until every replica's
    ``Identify`` named the version (RuntimeError after 30 s more), and the version.
    """
    from peep.lab.bench.server import synthetic_templates
    from peep.v1 import recognition_pb2, template_pb2

    enrol = [
        template_pb2.PerturbedTemplate.FromString(p)
        for p in synthetic_templates(cluster.bundle, 600, devices=[_DESK], purpose="enroll", n_subjects=20)
    ]
    stubs = [grpc_stub(r.grpc_port, str(cluster.tls.ca_cert)) for r in cluster.replicas]
    stubs[1].IngestStream(iter(enrol), metadata=[("authorization", f"Bearer {_token(_DESK)}")], timeout=120)
    probe = template_pb2.PerturbedTemplate.FromString(synthetic_templates(cluster.bundle, 1, devices=[_DEVICES[0]])[0])
    t0 = time.monotonic()
    resp = stubs[0].Train(recognition_pb2.TrainRequest(), metadata=[("authorization", f"Bearer {_ADMIN}")], timeout=600)
    train_s = time.monotonic() - t0
    version = resp.model_version
    if not wait_for(lambda: all(serving_version(s, probe, _token(_DEVICES[0])) == version for s in stubs), 30):
        raise RuntimeError(f"not every replica served {version} within 30 s of Train returning")
    return {"train_s": train_s, "promotion_s": time.monotonic() - t0, "version": version}


def _balanced(cluster: _Cluster, n: int) -> dict[str, Any]:
    """:func:`_through_balancer` with ``n`` templates behind a balancer of its own (stopped after), or an
    ``error`` saying why HAProxy cannot run here."""
    missing = haproxy_missing()
    if missing:
        return {"error": missing}
    tls = cluster.tls
    pairs = zip(cluster.replicas, cluster.metrics_ports, strict=True)
    backends = [(f"replica-{r.name}", r.grpc_port, mp) for r, mp in pairs]
    balancer = Balancer(cluster.tmp / "haproxy", cert=tls.server_cert, key=tls.server_key, ca=tls.ca_cert,
                        replicas=backends).start()  # fmt: skip
    try:
        # After the promotion: with a model, every template is decided (and the decisions counted).
        return _through_balancer(balancer, cluster.replicas, cluster.metrics_ports, cluster.bundle, cluster.tmp,
                                 cluster.dsn, n, str(tls.ca_cert))  # fmt: skip
    finally:
        balancer.stop()


def _result(
    cluster: _Cluster,
    one: dict[str, Any],
    many: dict[str, Any],
    decided: dict[str, Any],
    keys: list[tuple[str, str]],
    promotion: dict[str, Any],
    balanced: dict[str, Any],
) -> dict[str, Any]:
    """The section's JSON from the phases, the ingest ledger's keys, the promotion and the balancer's run."""
    train_s, promotion_s = promotion["train_s"], promotion["promotion_s"]
    return {
        "replicas": len(cluster.replicas),
        "ingest_per_s_1": one["rate"],
        "ingest_per_s_n": many["rate"],
        "sent": one["sent"] + many["sent"],
        "stored": len(keys),
        "distinct_stored": len(set(keys)),
        "duplicates": one["duplicates"] + many["duplicates"],
        "promotion_to_serving_s": round(promotion_s, 3),
        "through_balancer": balanced,
        "server_cpu_s_per_1k": _cpu_per_1k(one, many, decided, cpus=os.cpu_count() or 1),
        "context": {
            "phases": {"one": one, "many": many, "decided": decided},
            "devices": {"mqtt": len(_DEVICES[0::2]), "grpc": len(_DEVICES[1::2])},
            "train_s": round(train_s, 3),
            "after_train_s": round(promotion_s - train_s, 3),
            "model_version": promotion["version"],
            "storage": "postgres (one schema, pool_size 4 per replica)",
            "schema": cluster.schema,
            "broker": f"{cluster.host}:{cluster.port} (session expiry 0, topic root {cluster.prefix})",
            "cpus": os.cpu_count(),
            "note": "replicas, devices, PostgreSQL and the broker share this machine's CPUs",
        },
    }


def _tear_down(replicas: list[Replica], prefix: str, host: str, port: int, admin: Any, schema: str) -> None:
    """Stop the replicas, clear the retained bundle announcement, drop the schema."""
    from peep.lab.processes.retained import clear_retained

    for r in replicas:
        r.stop(signal.SIGTERM, 30)
    clear_retained([f"{prefix}/bundle"], host, port)
    admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    admin.close()


def _through_balancer(balancer: Balancer, replicas: list[Replica], metrics_ports: list[int], bundle: Any, tmp: Path,
                      dsn: str, n: int, ca: str) -> dict[str, Any]:  # fmt: skip
    """The gRPC devices through the shipped HAProxy configuration, a replica SIGKILLed and restarted mid-way.

    The replica killed is the one holding an admin's ``StreamEvents`` subscriber, which follows through the
    balancer (:class:`~peep.server.transport.follow.EventFollower`). ``sent``; ``decided``: (device, message id)
    pairs in the decisions table, each counted once; ``duplicates``: pairs decided more than once (0 expected);
    ``lost``: sent, never decided; ``events_followed``: what the subscriber received (``received`` of
    ``expected``, ``repeats``, ``in_commit_order``, calls made again, and the lag from decision to receipt, which
    includes the outage for the events decided while it had no stream).
    """
    from peep.lab.bench.server import synthetic_templates
    from peep.server.transport.follow import EventFollower
    from peep.v1 import template_pb2

    devices = _DEVICES[1::2]  # the gRPC half of the devices
    specs, expected = [], set()
    for d in devices:
        payloads = synthetic_templates(bundle, n // len(devices), devices=[d])
        expected |= {(d, template_pb2.PerturbedTemplate.FromString(p).message_id) for p in payloads}
        frames = tmp / f"balanced-{d}.bin"
        write_frames(frames, payloads)
        specs.append(DeviceSpec(d, "grpc", str(frames), ports=[balancer.port], token=_token(d), ca=ca, chunk=100))
    decided_before = count_decided(dsn)
    stub = grpc_stub(balancer.port, ca)
    follower = EventFollower(lambda: stub, metadata=[("authorization", f"Bearer {_ADMIN}")], backoff=(0.1, 1.0))
    followed: list[tuple[Any, float]] = []

    def follow() -> None:
        try:
            for ev in follower:
                if (ev.device_id, ev.message_id) in expected:
                    followed.append((ev, time.time()))
        except Exception as exc:  # reported below as fewer received
            log.warning("bench: the event follower stopped", extra={"error": str(exc)[:200]})

    following = threading.Thread(target=follow, name="bench-follower", daemon=True)
    following.start()
    if not wait_for(lambda: sum(open_streams(mp) for mp in metrics_ports) >= 1, 10):
        raise RuntimeError("through the balancer: the event subscriber's stream did not open")
    victim, name = next(
        ((r, f"replica-{r.name}") for r, mp in zip(replicas, metrics_ports, strict=True) if open_streams(mp) >= 1)
    )
    seen: dict[str, Any] = {}

    def kill_and_restart() -> None:
        if not wait_for(lambda: count_decided(dsn) - decided_before >= len(expected) // 3, 120):
            raise RuntimeError("through the balancer: no progress before the kill")
        victim.stop(signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: balancer.servers().get(name, "").startswith("DOWN"), 10)
        seen["out_after_s"] = round(time.monotonic() - t0, 2)
        victim.start()
        t1 = time.monotonic()
        wait_for(lambda: balancer.servers().get(name) == "UP", 15)
        seen["back_after_s"] = round(time.monotonic() - t1, 2)

    t0 = time.time()
    reports = run_devices(specs, lambda: count_decided(dsn) - decided_before, during=kill_and_restart)
    wait_for(lambda: count_decided(dsn) - decided_before >= len(expected), 60)
    decided = [k for k in decided_keys(dsn) if k in expected]
    wait_for(lambda: len(followed) >= len(expected), 30)
    follower.stop()
    following.join(5)
    lag = np.array([1000 * (at - (ev.time.seconds + ev.time.nanos * 1e-9)) for ev, at in followed])
    calls = {name: int(row.get("req_tot") or row.get("stot") or 0) for name, row in balancer.stats().items()}
    return {
        "sent": len(expected),
        "decided": len(set(decided)),
        "duplicates": len(decided) - len(set(decided)),
        "lost": len(expected - set(decided)),
        "seconds": round(time.time() - t0, 3),
        "resent_chunks": sum(r.get("retries", 0) for r in reports),
        "answered_duplicate": sum(r.get("duplicates", 0) for r in reports),
        "replica_killed": {
            "name": victim.name,
            "why": "it held the event subscriber's stream",
            "out_of_the_balancer_after_s": seen.get("out_after_s"),
            "back_after_restart_s": seen.get("back_after_s"),
        },
        "events_followed": {
            "expected": len(expected),
            "received": len(followed),
            "distinct": len({(ev.device_id, ev.message_id) for ev, _ in followed}),
            "repeats": follower.repeated,
            "in_commit_order": [(ev.device_id, ev.message_id) for ev, _ in followed] == decided,
            "called_again": follower.reconnects,
            "lag_ms": {
                "p50": round(float(np.percentile(lag, 50)), 1) if lag.size else None,
                "p95": round(float(np.percentile(lag, 95)), 1) if lag.size else None,
                "max": round(float(lag.max()), 1) if lag.size else None,
            },
        },
        "calls_per_replica": calls,
        "balancer": "HAProxy, deploy/cluster/haproxy.cfg (paths and addresses swapped)",
    }


def _cpu_per_1k(one: dict[str, Any], many: dict[str, Any], decided: dict[str, Any], *, cpus: int) -> dict[str, Any]:
    """Server CPU seconds per 1,000 templates (process CPU of the replicas), and what they predict.

    Wall rates on this machine are capped by its cores, which the replicas share with PostgreSQL, the broker
    and the devices; CPU per template is not. ``stored_only``: the first phases, before any model (a template
    stored, nothing decided); ``decided``: with the model (identified, the decision kept), per replica and in
    all. ``replicas_for_1k_per_s``: replicas of a given core count that 1,000 decided templates a second
    would keep fully busy — a prediction, without headroom, PostgreSQL and the broker not included.
    """

    def per_1k(phase: dict[str, Any]) -> float:
        return 1000 * float(sum(phase["server_cpu_s"].values())) / int(phase["sent"])

    total = per_1k(decided)
    return {
        "decided": round(total, 3),
        "per_replica": {k: round(1000 * v / decided["sent"], 3) for k, v in decided["server_cpu_s"].items()},
        "stored_only": {"one_replica": round(per_1k(one), 3), "all_replicas": round(per_1k(many), 3)},
        "replicas_for_1k_per_s": {f"{cores}_cores": max(1, math.ceil(total / cores)) for cores in (1, 2, 4, 8)},
        "note": (
            f"measured on {cpus} cores shared by the replicas, PostgreSQL, the broker and the devices; 1,000 "
            "decided templates a second need `decided` core-seconds a second on the replicas alone: "
            "replicas_for_1k_per_s is a prediction from that, without headroom"
        ),
    }
