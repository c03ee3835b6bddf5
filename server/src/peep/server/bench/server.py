"""The ``server`` section of ``peep bench``: ingest, identify and training speed.

Measured on the deployed path: a real :class:`~peep.server.app.ServerApp`
(SQLite store, TLS with bearer-token auth on gRPC, the broker at
127.0.0.1:1883 for MQTT), templates produced by the core release path on a
synthetic signed bundle (speed does not depend on the faces), and clients in
*separate processes*, as devices are, so client and server do not share a
Python interpreter lock.

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
``train_s_10k``
    ``Trainer.train`` (store read, fit, ONNX export and check, promotion) on
    10,000 templates x 128 dimensions, default preset.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from peep.server.pki import IssuedFiles, make_local_pki

N_COMPONENTS = 128
_TOKEN = "bench-device-token"
_ADMIN = "bench-admin-token"


def _synthetic_bundle(out: Path) -> tuple[Any, Path]:
    from peep.core.bundle import EigenfaceBundle, build_bundle_files, load_public_key, write_keypair
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
    return EigenfaceBundle.load(bdir, load_public_key(pub_path)), pub_path


def _templates(
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


def _write_frames(path: Path, payloads: list[bytes]) -> None:
    with open(path, "wb") as fh:
        for p in payloads:
            fh.write(struct.pack("<I", len(p)))
            fh.write(p)


def _read_frames(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
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


def _child(args: list[str], timeout: float = 600.0) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "peep.server.bench.server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if r.returncode != 0:
        raise RuntimeError(f"bench client {args[0]} failed: {r.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------- the sections


def _bench_grpc(tmp: Path, bundle: Any, pub: Path, tls: IssuedFiles, n: int, streams: int) -> dict[str, Any]:
    from peep.server.app import ServerApp

    devices = [f"dev-{i}" for i in range(streams)]
    app = ServerApp(_config(tmp / "grpc", pub, Path(bundle.bench_dir), tls, devices, mqtt=None))
    app.start()
    try:
        files = []
        for d in devices:
            f = tmp / f"grpc-{d}.bin"
            _write_frames(f, _templates(bundle, n // streams, devices=[d]))
            files.append(str(f))
        res = _child(["grpc-ingest", str(app.port), str(tls.ca_cert), _TOKEN, *files])
        stored = app.services.store.count_templates()
        return {"rate": stored / res["seconds"], "stored": stored, "sent": res["sent"], "streams": streams}
    finally:
        app.stop(0)


def _bench_mqtt(tmp: Path, bundle: Any, pub: Path, tls: IssuedFiles, n: int, publishers: int) -> dict[str, Any]:
    from peep.core.topics import TopicScheme
    from peep.server.app import ServerApp

    prefix = f"peepbench-{uuid.uuid4().hex[:8]}/v1"
    topics = TopicScheme(prefix)
    devices = [f"dev-{i}" for i in range(publishers)]
    mqtt = {
        "enabled": True,
        "host": "127.0.0.1",
        "port": 1883,
        "username": None,
        "topic_prefix": prefix,
        "share_group": f"bench{uuid.uuid4().hex[:6]}",
        "client_id": f"peep-bench-{uuid.uuid4().hex[:6]}",
        "session_expiry_s": 0,  # a one-off server: no session left on the broker
    }
    app = ServerApp(_config(tmp / "mqtt", pub, Path(bundle.bench_dir), tls, devices, mqtt=mqtt))
    app.start(mqtt_wait=10.0)
    try:
        files = []
        for d in devices:
            f = tmp / f"mqtt-{d}.bin"
            _write_frames(f, _templates(bundle, n // publishers, devices=[d]))
            files.append(str(f))
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
                target=_mqtt_publisher,
                args=(topics.templates("bench", d), f, i, published, processed, window, results),
            )
            for i, (d, f) in enumerate(zip(devices, files, strict=True))
        ]
        done = threading.Event()

        def feed() -> None:
            while not done.is_set():
                processed.value = app.mqtt.processed
                time.sleep(0.0005)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        for p in procs:
            p.start()
        reports = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
        starts = [r["start"] for r in reports]
        total = (n // publishers) * publishers
        store = app.services.store
        last, last_change, count = time.time(), time.time(), 0
        while count < total and time.time() - last_change < 5.0:
            time.sleep(0.005)
            c = app.mqtt.processed
            if c != count:
                count, last_change = c, time.time()
        last = last_change
        done.set()
        stored = store.count_templates()
        return {
            "rate": stored / (last - min(starts)),
            "stored": stored,
            "sent": total,
            "publishers": publishers,
            "outstanding_window": window,
            "lost": total - count,
        }
    finally:
        app.stop(0)


def _train_and_identify(tmp: Path, bundle: Any, pub: Path, tls: IssuedFiles, n_identify: int) -> dict[str, Any]:
    from peep.core import wire
    from peep.server.app import ServerApp
    from peep.server.ingest.auth import Identity
    from peep.server.ingest.ingestor import Sender

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

        probes = rng.random((20_000, bundle.n_features), dtype=np.float32)
        P = r.release(probes[:2000])
        batch = np.vstack([P] * 10)
        s.recogniser.identify_batch(batch[:1024])
        t0 = time.perf_counter()
        for i in range(0, len(batch), 1024):
            s.recogniser.identify_batch(batch[i : i + 1024], top_k=5)
        batch_rate = len(batch) / (time.perf_counter() - t0)

        f = tmp / "identify.bin"
        _write_frames(f, [wire.encode_template(wire.make_template(
            P[i % len(P)], device_id="dev-0", site="bench", bundle_id=bundle.bundle_id, mechanism=r.description))
            for i in range(n_identify)])  # fmt: skip
        lat = _child(["grpc-identify", str(app.port), str(tls.ca_cert), f"{_TOKEN}-dev-0", str(f)])
        return {
            "train_s_10k": train_s,
            "train_epochs": result.metrics.get("epochs"),
            "train_validation_accuracy": result.validation_accuracy,
            "identify_batch_per_s": batch_rate,
            "identify_p50_ms": lat["p50_ms"],
            "identify_p99_ms": lat["p99_ms"],
            "identify_calls": lat["n"],
            "server_identify_p50_ms": _hist_quantile(s.metrics, 0.5),
        }
    finally:
        app.stop(0)


def _hist_quantile(metrics: Any, q: float) -> float | None:
    """Approximate quantile of the server-side identify histogram (bucket upper bound)."""
    total = metrics.value("peep_identify_seconds_count")
    if not total:
        return None
    for le in ("0.0002", "0.0005", "0.001", "0.002", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "1.0"):
        if metrics.value("peep_identify_seconds_bucket", {"le": le}) >= q * total:
            return float(le) * 1e3
    return None


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the server; returns a JSON-able dict (see module docstring)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    n_ingest = 6_000 if quick else 40_000
    n_identify = 500 if quick else 3_000
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="peep-bench-") as d, threadpool_limits(limits=1, user_api="blas"):
        tmp = Path(d)
        bundle, pub = _synthetic_bundle(tmp)
        bundle.bench_dir = str(tmp / "bundle")
        tls = make_local_pki(tmp / "tls")
        g = _bench_grpc(tmp, bundle, pub, tls, n_ingest, streams=4)
        out["ingest_per_s_grpc"] = g["rate"]
        try:
            m = _bench_mqtt(tmp, bundle, pub, tls, n_ingest, publishers=4)
            out["ingest_per_s_mqtt"] = m["rate"]
        except (OSError, TimeoutError, RuntimeError) as exc:
            m = {"error": f"MQTT broker at 127.0.0.1:1883 not usable ({exc})"}
            out["ingest_per_s_mqtt"] = None
        ti = _train_and_identify(tmp, bundle, pub, tls, n_identify)
        out.update({k: ti[k] for k in ("identify_p50_ms", "identify_p99_ms", "identify_batch_per_s", "train_s_10k")})
        out["context"] = {
            "quick": quick,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "store": "sqlite (WAL, synchronous=NORMAL)",
            "grpc": {"tls": True, "auth": "bearer token", "templates": g["stored"], "streams": g["streams"]},
            "mqtt": m,
            "identify": {"calls": ti["identify_calls"], "server_side_p50_ms_bucket": ti["server_identify_p50_ms"]},
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
                "ingest_per_s": 5000,
                "identify_p99_ms": 2.0,
                "identify_batch_per_s": 50000,
                "train_s_10k": 60.0,
            },
        }
    return out


# --------------------------------------------------------------------------- child processes


def _client_channel(port: str, ca_file: str) -> Any:
    import grpc

    creds = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
    return grpc.secure_channel(f"localhost:{port}", creds)


def _grpc_ingest(port: str, ca_file: str, token: str, *files: str) -> dict[str, Any]:
    import threading

    import grpc
    from peep.v1 import recognition_pb2_grpc, template_pb2

    batches = [[template_pb2.PerturbedTemplate.FromString(p) for p in _read_frames(f)] for f in files]
    ch = _client_channel(port, ca_file)
    stub = recognition_pb2_grpc.RecognitionServiceStub(ch)  # type: ignore[no-untyped-call]
    grpc.channel_ready_future(ch).result(timeout=10)
    results: list[Any] = [None] * len(batches)

    def send(i: int) -> None:
        dev = batches[i][0].device_id
        results[i] = stub.IngestStream(
            iter(batches[i]), metadata=[("authorization", f"Bearer {token}-{dev}")], timeout=600
        )

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(batches))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "sent": sum(len(b) for b in batches), "accepted": sum(r.accepted for r in results)}


def _grpc_identify(port: str, ca_file: str, token: str, file: str) -> dict[str, Any]:
    import grpc
    from peep.v1 import recognition_pb2, recognition_pb2_grpc, template_pb2

    msgs = [template_pb2.PerturbedTemplate.FromString(p) for p in _read_frames(file)]
    ch = _client_channel(port, ca_file)
    grpc.channel_ready_future(ch).result(timeout=10)
    stub = recognition_pb2_grpc.RecognitionServiceStub(ch)  # type: ignore[no-untyped-call]
    md = [("authorization", f"Bearer {token}")]
    reqs = [recognition_pb2.IdentifyRequest(template=m, top_k=5) for m in msgs]
    for r in reqs[:200]:
        stub.Identify(r, metadata=md, timeout=5)
    lat = []
    for r in reqs:
        t0 = time.perf_counter()
        stub.Identify(r, metadata=md, timeout=5)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return {
        "n": len(lat),
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
    }


def _mqtt_publisher(
    topic: str, file: str, index: int, published: Any, processed: Any, window: int, results: Any
) -> None:
    """Publish QoS 1 templates, keeping at most ``window`` outstanding across all publishers."""
    import socket

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    payloads = _read_frames(file)
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
    c.on_socket_open = lambda cl, ud, sock: sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]
    c.max_inflight_messages_set(20)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", 1883)
    c.loop_start()
    start = time.time()
    infos = []
    for k, p in enumerate(payloads):
        while sum(published) - processed.value >= window:
            time.sleep(0.0002)
        infos.append(c.publish(topic, p, qos=1))
        published[index] = k + 1
    for info in infos:
        info.wait_for_publish(120)
    end = time.time()
    c.disconnect()
    c.loop_stop()
    results.put({"start": start, "end": end, "n": len(payloads)})


def _main(argv: list[str]) -> int:
    cmd, *args = argv
    if cmd == "grpc-ingest":
        res = _grpc_ingest(*args)
    elif cmd == "grpc-identify":
        res = _grpc_identify(*args)
    elif cmd == "run":
        res = run(quick="--quick" in args)
    else:
        print(f"unknown bench command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
