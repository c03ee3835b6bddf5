"""The ``server`` section of ``peep bench``: ingest, identify and training speed.

Measured on the deployed path: a real :class:`~peep.server.app.ServerApp`
(SQLite store, TLS with bearer-token auth on gRPC, the broker at
127.0.0.1:1883 for MQTT), templates produced by the core release path on a
synthetic signed bundle (speed does not depend on the faces), and clients in
*separate processes*, as devices are, so client and server do not share a
Python interpreter lock.

Every end-to-end number is measured ``repeats`` times in the run (5, or 3
with ``--quick``), each ingest repeat on a fresh server and database; the
section reports the median of the repeats under the plain key and, under
``repeats``, every run with ``median``, ``worst``, ``best`` and ``spread``
(``(max - min) / median``). A deployer sizes hardware from ``worst``.

``ingest_per_s_grpc``
    Templates per second through ``IngestStream`` (several device streams in
    parallel), from the first message sent to the last summary received;
    every template validated and committed to SQLite.
``ingest_per_s_mqtt``
    Templates per second through the broker: device processes publish QoS 1
    to ``<prefix>/<site>/<device>/templates`` with at most 2,000 templates
    outstanding (closed loop, see :func:`_bench_mqtt`); timed from the first
    publish to the last template committed (and acknowledged) by the server.
``identify_p50_ms`` / ``identify_p99_ms``
    One template per ``Identify`` call over a real TLS socket, sequential.
``identify_batch_per_s``
    In-process :meth:`Recogniser.identify_batch` on batches of 1,024.
``identify_tracks_batch_per_s``
    The ingest path's :meth:`Recogniser.identify_tracks` on the same batches, each track released twice
    (track fusion: half the decisions fused), to compare with ``identify_batch_per_s`` of the same run.
``ingest_decided_per_s``
    Identify templates taken by the ingest path with a model serving, in-process,
    batches of 512, tracks of two releases: validation, rights, the duplicate
    look-up, the decision (track fusion included) and the one transaction that
    commits the ledger entries and the decisions (decide, then forget: no
    template is written).
``train_s_10k``
    ``Trainer.train`` (store read, fit, ONNX export and check, promotion) on
    10,000 templates x 128 dimensions, default preset (measured once).

``context.stages_us`` says where the time goes, per template or per call:
each stage of the server's ingest and identify paths timed in-process on
the same templates (one thread, nothing else running in the bench), next to
the server process's CPU per template during the end-to-end runs and the
client-side latency; what the stages do not explain is the transport (gRPC
core, TLS, HTTP/2, paho, thread hand-offs). ``context.cpu`` gives the CPU the
server and the bench's own clients used during the end-to-end runs
(``util`` 1.0 = one core busy for the whole run), so a client-bound
measurement shows itself. ``context.pinning`` says what was pinned: BLAS and
onnxruntime to one thread, and, on a machine with at least two CPUs, the
server process to CPU 0 and every client process to CPU 1 (``PEEP_BENCH_PIN=0``
turns the CPU pinning off).

Nothing is left on the broker: the MQTT servers use session expiry 0 (no
persistent session), the publishers clean sessions, and the retained bundle
announcement each server makes under its unique topic root is cleared after
the run (``context.mqtt.broker_left`` lists what remained: nothing).
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from peep.lab.bench.server_clients import (
    mqtt_publisher,
    own_cpu_s,
    pin_self,
    run_client,
    write_frames,
)
from peep.lab.processes.pki import IssuedFiles, make_local_pki
from peep.lab.processes.retained import clear_retained, retained_topics

N_COMPONENTS = 128
_TOKEN = "bench-device-token"
_ADMIN = "bench-admin-token"
_BROKER = ("127.0.0.1", 1883)


def synthetic_bundle(out: Path) -> tuple[Any, Path]:
    from peep.core.bundle import ProjectionBundle, build_bundle_files, load_public_key, write_keypair
    from peep.core.imaging import DEFAULT_GEOMETRY
    from peep.core.projections import EigenfaceProjection

    key_path, pub_path = write_keypair(out / "site")
    from peep.core.bundle import load_private_key

    rng = np.random.default_rng(0)
    faces = rng.random((400, DEFAULT_GEOMETRY.n_pixels))
    files = build_bundle_files(
        projection=EigenfaceProjection(n_components=N_COMPONENTS).fit(faces),
        geometry=DEFAULT_GEOMETRY,
        signing_key=load_private_key(key_path),
        normalisation={"method": "synthetic"},
        mechanism_defaults={"kind": "peep-raw", "epsilon": 8.0},
    )
    bdir = out / "bundle"
    from peep.core.bundle import write_bundle_files

    write_bundle_files(files, bdir)
    return ProjectionBundle.load(bdir, load_public_key(pub_path)), pub_path


def synthetic_templates(
    bundle: Any, n: int, *, devices: list[str], purpose: str = "identify", n_subjects: int = 0
) -> list[bytes]:
    """Encoded templates released with the secure sampler (peep-raw, eps = 8)."""
    from peep.core import wire
    from peep.core.release import TemplateReleaser

    r = TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0)
    rng = np.random.default_rng(1)
    faces = rng.random((min(n, 2000), bundle.n_features), dtype=np.float32)
    X = r.release(faces)
    out = []
    for i in range(n):
        subject = f"s{i % n_subjects}" if n_subjects else ""
        msg = wire.make_template(
            X[i % len(X)],
            device_id=devices[i % len(devices)],
            site="bench",
            bundle_id=bundle.bundle_id,
            mechanism=r.description,
            purpose=purpose,
            subject=subject,
        )
        out.append(wire.encode_template(msg))
    return out


def _config(
    tmp: Path, pub: Path, bundle_dir: Path, tls: IssuedFiles, devices: list[str], *, mqtt: dict[str, Any] | None
) -> Any:
    from peep.server.config import parse_config, token_sha256

    return parse_config(
        {
            "grpc": {
                "listen": "127.0.0.1:0",
                "grace_s": 2.0,
                "max_workers": 16,
                "tls": {"cert": str(tls.server_cert), "key": str(tls.server_key)},
            },
            "storage": {"backend": "sqlite", "path": str(tmp / "bench.db")},
            "bundle": {"public_key": str(pub), "dir": str(bundle_dir)},
            "auth": {
                "admin_token_sha256": token_sha256(_ADMIN),
                "devices": [{"id": d, "site": "bench", "token_sha256": token_sha256(f"{_TOKEN}-{d}")} for d in devices],
            },
            "mqtt": mqtt or {"enabled": False},
            "training": {"model_dir": str(tmp / "models")},
            "metrics": {"enabled": False},
            "logging": {"format": "text", "level": "warning"},
        }
    )


# --------------------------------------------------------------------------- pinning, CPU, summaries


def _pinning() -> dict[str, Any]:
    """Which CPUs the server (this process) and the client processes run on."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = os.environ.get("PEEP_BENCH_PIN", "1") != "0" and len(cpus) >= 2
    return {
        "cpu_affinity": pin,
        "server_cpus": cpus[:1] if pin else cpus,
        "client_cpus": cpus[1:2] if pin else cpus,
        "available_cpus": cpus,
        "blas_threads": 1,
        "onnxruntime_threads": 1,
        "env": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    }


def summary(values: list[float], *, higher_is_better: bool) -> dict[str, Any]:
    """Median, worst, best and spread ((max - min) / median) of repeated measurements.

    >>> summary([3.0, 1.0, 2.0], higher_is_better=True)["worst"]
    1.0
    >>> summary([3.0, 1.0, 2.0], higher_is_better=False)["spread"]
    1.0
    """
    med = float(statistics.median(values))
    lo, hi = float(min(values)), float(max(values))
    return {
        "median": med,
        "worst": lo if higher_is_better else hi,
        "best": hi if higher_is_better else lo,
        "spread": (hi - lo) / med if med else None,
        "runs": [float(v) for v in values],
    }


# --------------------------------------------------------------------------- the sections


def _bench_grpc(
    tmp: Path, bundle: Any, pub: Path, tls: IssuedFiles, files: list[str], devices: list[str], client_cpus: list[int]
) -> dict[str, Any]:
    from peep.server.app import ServerApp

    run_dir = tmp / f"grpc-{uuid.uuid4().hex[:6]}"
    app = ServerApp(_config(run_dir, pub, Path(bundle.bench_dir), tls, devices, mqtt=None))
    app.start()
    try:
        cpu0 = own_cpu_s()
        res = run_client(["grpc-ingest", str(app.port), str(tls.ca_cert), _TOKEN, *files], client_cpus)
        server_cpu = own_cpu_s() - cpu0
        stored = app.services.store.count_received()  # templates taken (ledger)
        return {
            "rate": stored / res["seconds"],
            "stored": stored,
            "sent": res["sent"],
            "streams": len(files),
            "seconds": res["seconds"],
            "server_cpu_s": server_cpu,
            "client_cpu_s": res["cpu_s"],
        }
    finally:
        app.stop(0)


def _bench_mqtt(
    tmp: Path,
    bundle: Any,
    pub: Path,
    tls: IssuedFiles,
    files: list[str],
    devices: list[str],
    n_each: int,
    client_cpus: list[int],
) -> dict[str, Any]:
    from peep.core.topics import TopicScheme
    from peep.server.app import ServerApp

    prefix = f"peepbench-{uuid.uuid4().hex[:8]}/v1"
    topics = TopicScheme(prefix)
    publishers = len(devices)
    mqtt = {
        "enabled": True,
        "host": _BROKER[0],
        "port": _BROKER[1],
        "username": None,
        "topic_prefix": prefix,
        "share_group": f"bench{uuid.uuid4().hex[:6]}",
        "client_id": f"peep-bench-{uuid.uuid4().hex[:6]}",
        "session_expiry_s": 0,  # a one-off server: no session left on the broker
    }
    run_dir = tmp / f"mqtt-{uuid.uuid4().hex[:6]}"
    app = ServerApp(_config(run_dir, pub, Path(bundle.bench_dir), tls, devices, mqtt=mqtt))
    try:
        app.start(mqtt_wait=10.0)
        # Closed-loop load: the publishers keep at most `window` templates
        # outstanding (published, not yet committed by the server), as devices
        # with a bounded spool do. Without it, this box's broker (Mosquitto's
        # default max_queued_messages = 1000 per connection) would drop what
        # the publishers, sharing the two cores, push faster than the server
        # stores, and the number would measure the broker's queue, not the server.
        import multiprocessing as mp
        import threading

        ctx = mp.get_context("spawn")
        published = ctx.RawArray("q", publishers)
        processed = ctx.RawValue("q", 0)
        results = ctx.Queue()
        window = 2_000
        procs = [
            ctx.Process(
                target=mqtt_publisher,
                args=(topics.templates("bench", d), f, i, published, processed, window, results, client_cpus),
            )
            for i, (d, f) in enumerate(zip(devices, files, strict=True))
        ]
        done = threading.Event()

        def feed() -> None:
            # The window is 2,000 templates (> 0.1 s of ingest): reading the counter every 2 ms
            # keeps it current and costs the server's interpreter almost nothing.
            while not done.is_set():
                processed.value = app.mqtt.processed
                time.sleep(0.002)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        cpu0 = own_cpu_s()
        for p in procs:
            p.start()
        reports = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
        starts = [r["start"] for r in reports]
        total = n_each * publishers
        last_change, count = time.time(), 0
        while count < total and time.time() - last_change < 5.0:
            time.sleep(0.005)
            c = app.mqtt.processed
            if c != count:
                count, last_change = c, time.time()
        server_cpu = own_cpu_s() - cpu0
        done.set()
        stored = app.services.store.count_received()  # templates taken (ledger)
        seconds = last_change - min(starts)
        return {
            "rate": stored / seconds,
            "stored": stored,
            "sent": total,
            "publishers": publishers,
            "outstanding_window": window,
            "lost": total - count,
            "seconds": seconds,
            "server_cpu_s": server_cpu,
            "client_cpu_s": sum(r["cpu_s"] for r in reports),
            "prefix": prefix,
            "client_id": mqtt["client_id"],
            "connections": app.config.mqtt.connections,
        }
    finally:
        app.stop(0)
        # The server announced its bundle retained under this run's root: clear it.
        clear_retained([topics.bundle], *_BROKER)


def _ingest_stages(
    tmp: Path, bundle: Any, pub: Path, tls: IssuedFiles, payloads: list[bytes], devices: list[str]
) -> dict[str, float]:
    """Microseconds per template of each server-side ingest stage, in-process, batches of 512."""
    from peep.core.topics import TopicScheme
    from peep.server.app import ServerApp
    from peep.server.ingest.auth import Identity
    from peep.server.ingest.ingestor import Sender
    from peep.server.storage import IngestBatch, LedgerEntry
    from peep.v1 import template_pb2

    app = ServerApp(_config(tmp / f"stages-{uuid.uuid4().hex[:6]}", pub, Path(bundle.bench_dir), tls, devices,
                            mqtt=None))  # fmt: skip
    app.start()
    try:
        s = app.services
        senders = {d: Sender(identity=Identity(name=d, is_admin=False, site="bench")) for d in devices}
        topics = TopicScheme("peep/v1")
        topic = topics.templates("bench", "dev-0")
        t: dict[str, float] = dict.fromkeys(("mqtt_topic", "parse", "validate", "authorise", "record", "commit"), 0.0)
        n = 0
        clock = time.perf_counter
        for i in range(0, len(payloads) - 511, 512):
            chunk = payloads[i : i + 512]
            t0 = clock()
            for _ in chunk:
                topics.parse(topic, leaf="templates")
            t1 = clock()
            msgs = [template_pb2.PerturbedTemplate.FromString(p) for p in chunk]
            t2 = clock()
            valid = [s.validator.validate(m) for m in msgs]
            t3 = clock()
            for m in msgs:
                s.ingestor.authorise(m, senders[m.device_id])
            t4 = clock()
            now = time.time()
            entries = [LedgerEntry.from_message(v.message, received_at=now) for v in valid]
            t5 = clock()
            # What Ingestor.store_valid does for templates no model decides: the duplicate look-up and the
            # batch's one transaction (ledger entries; identify templates are not kept).
            s.store.seen([e.key for e in entries])
            s.store.commit_ingest(IngestBatch(entries))
            t6 = clock()
            for k, a, b in (("mqtt_topic", t0, t1), ("parse", t1, t2), ("validate", t2, t3), ("authorise", t3, t4),
                            ("record", t4, t5), ("commit", t5, t6)):  # fmt: skip
                t[k] += b - a
            n += len(chunk)
        return {k: v / n * 1e6 for k, v in t.items()}
    finally:
        app.stop(0)


def _train_and_identify(
    tmp: Path, bundle: Any, pub: Path, tls: IssuedFiles, n_identify: int, repeats: int, client_cpus: list[int]
) -> dict[str, Any]:
    from peep.core import wire
    from peep.server.app import ServerApp
    from peep.server.ingest.auth import Identity
    from peep.server.ingest.ingestor import Sender
    from peep.v1 import recognition_pb2

    app = ServerApp(_config(tmp / "train", pub, Path(bundle.bench_dir), tls, ["dev-0"], mqtt=None))
    app.start()
    try:
        s = app.services
        # 10,000 enrolment templates of 100 subjects: a subject is a random face
        # whose releases differ by the mechanism's noise plus pose-like jitter.
        from peep.core.release import TemplateReleaser

        r = TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0)
        rng = np.random.default_rng(2)
        base = rng.random((100, bundle.n_features), dtype=np.float32)
        faces = np.clip(np.repeat(base, 100, axis=0) + rng.normal(0, 0.15, (10_000, bundle.n_features)), 0, 1)
        X = r.release(faces.astype(np.float32))
        msgs = [
            wire.make_template(
                X[i], device_id="dev-0", site="bench", bundle_id=bundle.bundle_id, mechanism=r.description,
                purpose="enroll", subject=f"s{i // 100:03d}",
            )
            for i in range(10_000)
        ]  # fmt: skip
        admin = Sender(identity=Identity(name="admin", is_admin=True))
        for i in range(0, len(msgs), 1000):
            s.ingestor.ingest(msgs[i : i + 1000], "grpc", admin, recognise=False)
        t0 = time.perf_counter()
        result = s.trainer.train()
        train_s = time.perf_counter() - t0

        probes = rng.random((2000, bundle.n_features), dtype=np.float32)
        P = r.release(probes)
        batch = np.vstack([P] * 10)
        s.recogniser.identify_batch(batch[:1024])
        batch_rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(0, len(batch), 1024):
                s.recogniser.identify_batch(batch[i : i + 1024], top_k=5)
            batch_rates.append(len(batch) / (time.perf_counter() - t0))
        # Track fusion on the ingest path: the same batches, every track released twice (half the decisions
        # fused). This model has no background class to calibrate a fused threshold on; its single one and
        # uniform class frequencies stand in, which costs the same.
        from dataclasses import replace

        from peep.server.recognition.fusion import TrackFusion

        m = s.recogniser.require_model()
        uniform = np.full(len(m.classes), 1.0 / len(m.classes))
        fusing = replace(m, priors=uniform, unknown_threshold_fused=m.unknown_threshold)
        keys = [("bench", "dev-0", f"t{i // 2}") for i in range(1024)]
        track_rates = []
        for _ in range(repeats):
            fusion = TrackFusion()
            t0 = time.perf_counter()
            for i in range(0, len(batch), 1024):
                part = batch[i : i + 1024]
                s.recogniser.identify_tracks(part, keys[: len(part)], fusion, model=fusing)
            track_rates.append(len(batch) / (time.perf_counter() - t0))

        # Ingest with a model: each template decided and its decision committed with its ledger entry in the
        # batch's one transaction (the template is not kept), in-process, batches of 512, tracks of two.
        camera = Sender(identity=Identity(name="dev-0", is_admin=False, site="bench"))
        decided_rates = []
        for rep in range(repeats):
            msgs_d = [
                wire.make_template(P[i % len(P)], device_id="dev-0", site="bench", bundle_id=bundle.bundle_id,
                                   mechanism=r.description, track_id=f"d{rep}-{i // 2}")
                for i in range(4 * 1024)
            ]  # fmt: skip
            t0 = time.perf_counter()
            for i in range(0, len(msgs_d), 512):
                s.ingestor.ingest(msgs_d[i : i + 512], "grpc", camera)
            decided_rates.append(len(msgs_d) / (time.perf_counter() - t0))

        probe_msgs = [
            wire.make_template(P[i % len(P)], device_id="dev-0", site="bench", bundle_id=bundle.bundle_id,
                               mechanism=r.description)
            for i in range(n_identify)
        ]  # fmt: skip
        f = tmp / "identify.bin"
        write_frames(f, [wire.encode_template(m) for m in probe_msgs])
        runs = []
        for _ in range(repeats):
            h0 = (s.metrics.value("peep_identify_seconds_sum"), s.metrics.value("peep_identify_seconds_count"))
            cpu0 = own_cpu_s()
            lat = run_client(["grpc-identify", str(app.port), str(tls.ca_cert), f"{_TOKEN}-dev-0", str(f)], client_cpus)
            lat["server_cpu_s"] = own_cpu_s() - cpu0
            h1 = (s.metrics.value("peep_identify_seconds_sum"), s.metrics.value("peep_identify_seconds_count"))
            lat["handler_mean_us"] = (h1[0] - h0[0]) / max(1.0, h1[1] - h0[1]) * 1e6
            runs.append(lat)
        stages = _identify_stages(s, probe_msgs[:2000])
        return {
            "train_s_10k": train_s,
            "train_epochs": result.metrics.get("epochs"),
            "train_validation_accuracy": result.validation_accuracy,
            "batch_rates": batch_rates,
            "track_rates": track_rates,
            "decided_rates": decided_rates,
            "runs": runs,
            "stages": stages,
            "identify_response": recognition_pb2.IdentifyResponse.DESCRIPTOR.full_name,
        }
    finally:
        app.stop(0)


def _identify_stages(s: Any, msgs: list[Any]) -> dict[str, float]:
    """Microseconds per call of each server-side identify stage, in-process, one template at a time."""
    from peep.server.ingest.auth import Identity
    from peep.server.ingest.ingestor import Sender
    from peep.v1 import recognition_pb2

    sender = Sender(identity=Identity(name="dev-0", is_admin=False, site="bench"))
    raw = [recognition_pb2.IdentifyRequest(template=m, top_k=5).SerializeToString() for m in msgs]
    rec = s.recogniser
    m = rec.require_model()
    t: dict[str, float] = dict.fromkeys(("parse", "validate_authorise", "model_check", "onnx", "rank", "respond"), 0.0)
    clock = time.perf_counter
    for data in raw:
        t0 = clock()
        req = recognition_pb2.IdentifyRequest.FromString(data)
        t1 = clock()
        valid = s.ingestor.check(req.template, sender)
        t2 = clock()
        rec.check_compatible(req.template.bundle_id, valid.kind, key_id=req.template.key_id)
        t3 = clock()
        rec.probabilities(valid.values.reshape(1, -1), m)
        t4 = clock()
        r = rec.identify(valid.values, top_k=5)
        t5 = clock()
        resp = recognition_pb2.IdentifyResponse(subject=r.subject, unknown=r.unknown, model_version=r.model_version)
        for name, p in r.candidates:
            resp.candidates.add(subject=name, probability=p)
        resp.SerializeToString()
        t6 = clock()
        t["parse"] += t1 - t0
        t["validate_authorise"] += t2 - t1
        t["model_check"] += t3 - t2
        t["onnx"] += t4 - t3
        t["rank"] += (t5 - t4) - (t4 - t3)  # identify = onnx + ranking; the onnx part is timed above
        t["respond"] += t6 - t5
    return {k: max(0.0, v) / len(raw) * 1e6 for k, v in t.items()}


@dataclass
class _ServerRuns:
    """What :func:`run` measured, before it is summarised.

    ``grpc_runs`` / ``mqtt_runs``: one dict per repeat (``mqtt_runs`` empty, ``mqtt_error`` saying why, without a
    usable broker); ``broker_left``: what remained on the broker under each run's topic root (None without MQTT
    runs); ``ingest_stages``: microseconds per template per ingest stage; ``ti``: what
    :func:`_train_and_identify` returned.
    """

    grpc_runs: list[dict[str, Any]]
    mqtt_runs: list[dict[str, Any]]
    mqtt_error: str | None
    broker_left: dict[str, list[str]] | None
    ingest_stages: dict[str, float]
    ti: dict[str, Any]


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the server; returns a JSON-able dict (see module docstring)."""
    repeats = 3 if quick else 5
    streams = publishers = 4
    pinning = _pinning()
    runs = _measure(n_ingest=6_000 if quick else 20_000, n_identify=500 if quick else 2_000, repeats=repeats,
                    n_devices=max(streams, publishers), pinning=pinning)  # fmt: skip
    reps = _repeats(runs)
    out: dict[str, Any] = {key: rep["median"] if rep else None for key, rep in reps.items()}
    out["train_s_10k"] = runs.ti["train_s_10k"]
    out["repeats"] = reps
    out["context"] = _context(runs, reps, quick=quick, repeats=repeats, pinning=pinning, streams=streams,
                              publishers=publishers)  # fmt: skip
    out["targets_met"] = _targets_met(out)
    return out


def _measure(*, n_ingest: int, n_identify: int, repeats: int, n_devices: int, pinning: dict[str, Any]) -> _ServerRuns:
    """Every measurement of the section, this process pinned as ``pinning`` says (its affinity restored after)
    and BLAS on one thread, in a temporary directory removed after."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    before = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    try:
        pin_self(pinning["server_cpus"])
        client_cpus = pinning["client_cpus"]
        with tempfile.TemporaryDirectory(prefix="peep-bench-") as d, threadpool_limits(limits=1, user_api="blas"):
            tmp = Path(d)
            bundle, pub = synthetic_bundle(tmp)
            bundle.bench_dir = str(tmp / "bundle")
            tls = make_local_pki(tmp / "tls")
            devices = [f"dev-{i}" for i in range(n_devices)]
            per = n_ingest // len(devices)
            files, stage_payloads = _ingest_files(tmp, bundle, devices, per)
            grpc_runs = [_bench_grpc(tmp, bundle, pub, tls, files, devices, client_cpus) for _ in range(repeats)]
            mqtt_error = None
            mqtt_runs: list[dict[str, Any]] = []
            try:
                for _ in range(repeats):
                    mqtt_runs.append(_bench_mqtt(tmp, bundle, pub, tls, files, devices, per, client_cpus))
            except (OSError, TimeoutError, RuntimeError) as exc:
                mqtt_error = f"MQTT broker at {_BROKER[0]}:{_BROKER[1]} not usable ({exc})"
            broker_left = None
            if mqtt_runs:
                roots = {r["prefix"] for r in mqtt_runs}
                broker_left = {root: sorted(retained_topics(f"{root}/#", *_BROKER)) for root in sorted(roots)}
            ingest_stages = _ingest_stages(tmp, bundle, pub, tls, stage_payloads, devices)
            ti = _train_and_identify(tmp, bundle, pub, tls, n_identify, repeats, client_cpus)
    finally:
        if before:
            pin_self(before)
    return _ServerRuns(grpc_runs=grpc_runs, mqtt_runs=mqtt_runs, mqtt_error=mqtt_error, broker_left=broker_left,
                       ingest_stages=ingest_stages, ti=ti)  # fmt: skip


def _ingest_files(tmp: Path, bundle: Any, devices: list[str], per: int) -> tuple[list[str], list[bytes]]:
    """``per`` templates for each device in a file of its own, and the first 10,240 of them in all (an equal
    share from each device), which the in-process stage timings run on."""
    files = []
    stage_payloads: list[bytes] = []
    for dev in devices:
        f = tmp / f"templates-{dev}.bin"
        payloads = synthetic_templates(bundle, per, devices=[dev])
        stage_payloads.extend(payloads[: 10_240 // len(devices)])
        write_frames(f, payloads)
        files.append(str(f))
    return files, stage_payloads


def _repeats(runs: _ServerRuns) -> dict[str, dict[str, Any] | None]:
    """Each end-to-end number's :func:`summary` over its repeats, by its key in the section (the MQTT one None
    without MQTT runs)."""
    ti = runs.ti
    return {
        "ingest_per_s_grpc": summary([r["rate"] for r in runs.grpc_runs], higher_is_better=True),
        "ingest_per_s_mqtt": summary([r["rate"] for r in runs.mqtt_runs], higher_is_better=True)
        if runs.mqtt_runs
        else None,
        "identify_p50_ms": summary([r["p50_ms"] for r in ti["runs"]], higher_is_better=False),
        "identify_p99_ms": summary([r["p99_ms"] for r in ti["runs"]], higher_is_better=False),
        "identify_batch_per_s": summary(ti["batch_rates"], higher_is_better=True),
        "identify_tracks_batch_per_s": summary(ti["track_rates"], higher_is_better=True),
        "ingest_decided_per_s": summary(ti["decided_rates"], higher_is_better=True),
    }


def _per_template_us(runs: list[dict[str, Any]], key: str) -> float:
    """The median over ``runs`` of ``key`` (seconds) per template stored, in microseconds."""
    return float(statistics.median(r[key] / r["stored"] * 1e6 for r in runs))


def _util(runs: list[dict[str, Any]], key: str) -> float:
    """The median over ``runs`` of ``key`` (CPU seconds) per second of the run (1.0: one core busy throughout)."""
    return float(statistics.median(r[key] / r["seconds"] for r in runs))


_INGEST_STAGES = ("parse", "validate", "authorise", "record", "commit")


def _stages(runs: _ServerRuns, reps: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """``context.stages_us``: each stage next to the server's CPU per template or call end to end, and what the
    stages leave to the transport."""
    ingest_stages, ti = runs.ingest_stages, runs.ti
    g, m, p50 = reps["ingest_per_s_grpc"], reps["ingest_per_s_mqtt"], reps["identify_p50_ms"]
    assert g is not None and p50 is not None
    grpc_server_us = _per_template_us(runs.grpc_runs, "server_cpu_s")
    stages: dict[str, Any] = {
        "ingest_grpc_per_template": {
            **{k: ingest_stages[k] for k in _INGEST_STAGES},
            "server_cpu_end_to_end": grpc_server_us,
            "wall_end_to_end": 1e6 / g["median"],
        },
        "identify_per_call": {
            **ti["stages"],
            "handler_mean": float(statistics.median(r["handler_mean_us"] for r in ti["runs"])),
            "client_p50": p50["median"] * 1e3,
            # The server's CPU over the client's whole life: its warm-up calls included.
            "server_cpu_end_to_end": float(
                statistics.median(r["server_cpu_s"] / (r["n"] + r["warmup"]) * 1e6 for r in ti["runs"])
            ),
        },
    }
    stage_sum = sum(ingest_stages[k] for k in _INGEST_STAGES)
    stages["ingest_grpc_per_template"]["transport_rest"] = max(0.0, grpc_server_us - stage_sum)
    if runs.mqtt_runs:
        mqtt_server_us = _per_template_us(runs.mqtt_runs, "server_cpu_s")
        keys = ("mqtt_topic", *_INGEST_STAGES)
        stages["ingest_mqtt_per_template"] = {
            **{k: ingest_stages[k] for k in keys},
            "server_cpu_end_to_end": mqtt_server_us,
            "transport_rest": max(0.0, mqtt_server_us - sum(ingest_stages[k] for k in keys)),
            "wall_end_to_end": 1e6 / m["median"] if m else None,
        }
    ident = stages["identify_per_call"]
    ident["grpc_tls_threads_rest"] = max(0.0, ident["client_p50"] - sum(ti["stages"].values()))
    return stages


def _cpu(runs: _ServerRuns) -> dict[str, dict[str, Any]]:
    """``context.cpu``: the server's and the bench clients' CPU during the end-to-end runs (``util``)."""
    grpc_runs, mqtt_runs, ti = runs.grpc_runs, runs.mqtt_runs, runs.ti
    cpu: dict[str, dict[str, Any]] = {
        "grpc_ingest": {
            "server_util": _util(grpc_runs, "server_cpu_s"),
            "client_util": _util(grpc_runs, "client_cpu_s"),
        },
        "identify": {
            # The timed calls' share of the server's CPU (the warm-up calls are not in "seconds").
            "server_util": float(
                statistics.median(
                    r["server_cpu_s"] * r["n"] / (r["n"] + r["warmup"]) / r["seconds"] for r in ti["runs"]
                )
            ),
            "client_util": float(statistics.median(r["cpu_s"] / r["seconds"] for r in ti["runs"])),
        },
    }
    if mqtt_runs:
        cpu["mqtt_ingest"] = {
            "server_util": _util(mqtt_runs, "server_cpu_s"),
            "client_util": _util(mqtt_runs, "client_cpu_s"),
            "note": "the broker's CPU is not counted (a system process)",
        }
    return cpu


def _mqtt_context(runs: _ServerRuns, *, publishers: int) -> dict[str, Any]:
    """``context.mqtt``: the runs and what they stored, or why there were none."""
    mqtt_runs = runs.mqtt_runs
    if runs.mqtt_error or not mqtt_runs:
        return {"error": runs.mqtt_error, "runs": mqtt_runs, "broker_left": runs.broker_left}
    return {
        "stored": mqtt_runs[0]["stored"],
        "sent": mqtt_runs[0]["sent"],
        "lost": max(r["lost"] for r in mqtt_runs),
        "publishers": publishers,
        "qos": 1,
        "session_expiry_s": 0,
        "runs": mqtt_runs,
        "broker_left": runs.broker_left,
    }


def _context(runs: _ServerRuns, reps: dict[str, dict[str, Any] | None], *, quick: bool, repeats: int,
             pinning: dict[str, Any], streams: int, publishers: int) -> dict[str, Any]:  # fmt: skip
    """The section's ``context``: the machine, the pinning, where the time went, every run, the targets."""
    ti = runs.ti
    return {
        "quick": quick,
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "pinning": pinning,
        "cpu": _cpu(runs),
        "stages_us": _stages(runs, reps),
        "store": "sqlite (WAL, synchronous=NORMAL)",
        "grpc": {
            "tls": True,
            "auth": "bearer token",
            "templates": runs.grpc_runs[0]["stored"],
            "streams": streams,
            "runs": runs.grpc_runs,
        },
        "mqtt": _mqtt_context(runs, publishers=publishers),
        "identify": {"calls": ti["runs"][0]["n"], "runs": ti["runs"]},
        "train": {
            "preset": "default",
            "epochs": ti["train_epochs"],
            "validation_accuracy": ti["train_validation_accuracy"],
            "templates": 10_000,
            "subjects": 100,
            "dims": N_COMPONENTS,
        },
        "templates": "peep-raw eps=8 via TemplateReleaser (secure sampler) on a synthetic signed nc=128 bundle",
        "targets": {
            "median": {
                "ingest_per_s_grpc": 15_000,
                "ingest_per_s_mqtt": 10_000,
                "identify_p99_ms": 1.0,
                "identify_batch_per_s": 100_000,
                "train_s_10k": 60.0,
            },
            "worst": {"ingest_per_s_grpc": 5_000, "ingest_per_s_mqtt": 5_000, "identify_p99_ms": 2.0},
        },
    }


def _targets_met(out: dict[str, Any]) -> dict[str, bool | None]:
    t = out["context"]["targets"]
    r = out["repeats"]
    met: dict[str, bool | None] = {}
    for key, target in t["median"].items():
        value = out.get(key)
        if value is None:
            met[f"{key}_median"] = None
        else:
            met[f"{key}_median"] = value <= target if key in ("identify_p99_ms", "train_s_10k") else value >= target
    for key, target in t["worst"].items():
        rep = r.get(key)
        if rep is None:
            met[f"{key}_worst"] = None
        else:
            worst = rep["worst"]
            met[f"{key}_worst"] = worst <= target if key == "identify_p99_ms" else worst >= target
    return met
