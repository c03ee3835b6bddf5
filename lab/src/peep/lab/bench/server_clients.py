"""The server bench's client processes and the pieces it shares with them: templates as length-prefixed frames
in a file, pinning to CPUs, a process's own CPU time, and ``python -m peep.lab.bench.server_clients CMD ...``
(``grpc-ingest``, ``grpc-identify``; JSON on the last line of stdout).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

N_COMPONENTS = 128
_TOKEN = "bench-device-token"
_ADMIN = "bench-admin-token"
_BROKER = ("127.0.0.1", 1883)


def write_frames(path: Path, payloads: list[bytes]) -> None:
    with open(path, "wb") as fh:
        for p in payloads:
            fh.write(struct.pack("<I", len(p)))
            fh.write(p)


def read_frames(path: str | Path) -> list[bytes]:
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def pin_self(cpus: list[int]) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_client(args: list[str], cpus: list[int], timeout: float = 600.0) -> dict[str, Any]:
    env = {**os.environ, **CHILD_ENV, "PEEP_BENCH_CLIENT_CPUS": ",".join(map(str, cpus))}
    r = subprocess.run(
        [sys.executable, "-m", "peep.lab.bench.server_clients", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if r.returncode != 0:
        raise RuntimeError(f"bench client {args[0]} failed: {r.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def _client_pin() -> None:
    cpus = [int(c) for c in os.environ.get("PEEP_BENCH_CLIENT_CPUS", "").split(",") if c]
    pin_self(cpus)


def _client_channel(port: str, ca_file: str) -> Any:
    import grpc

    creds = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
    return grpc.secure_channel(f"localhost:{port}", creds)


def _grpc_ingest(port: str, ca_file: str, token: str, *files: str) -> dict[str, Any]:
    import threading

    import grpc
    from peep.v1 import recognition_pb2_grpc, template_pb2

    batches = [[template_pb2.PerturbedTemplate.FromString(p) for p in read_frames(f)] for f in files]
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
    cpu0 = own_cpu_s()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "cpu_s": own_cpu_s() - cpu0,
        "sent": sum(len(b) for b in batches),
        "accepted": sum(r.accepted for r in results),
    }


def _grpc_identify(port: str, ca_file: str, token: str, file: str) -> dict[str, Any]:
    import grpc
    from peep.v1 import recognition_pb2, recognition_pb2_grpc, template_pb2

    msgs = [template_pb2.PerturbedTemplate.FromString(p) for p in read_frames(file)]
    ch = _client_channel(port, ca_file)
    grpc.channel_ready_future(ch).result(timeout=10)
    stub = recognition_pb2_grpc.RecognitionServiceStub(ch)  # type: ignore[no-untyped-call]
    md = [("authorization", f"Bearer {token}")]
    reqs = [recognition_pb2.IdentifyRequest(template=m, top_k=5) for m in msgs]
    warmup = reqs[:200]
    for r in warmup:
        stub.Identify(r, metadata=md, timeout=5)
    lat = []
    cpu0 = own_cpu_s()
    start = time.perf_counter()
    for r in reqs:
        t0 = time.perf_counter()
        stub.Identify(r, metadata=md, timeout=5)
        lat.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    lat.sort()
    return {
        "n": len(lat),
        "warmup": len(warmup),
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
        "max_ms": lat[-1] * 1e3,
        "seconds": seconds,
        "cpu_s": own_cpu_s() - cpu0,
    }


def mqtt_publisher(
    topic: str,
    file: str,
    index: int,
    published: Any,
    processed: Any,
    window: int,
    results: Any,
    cpus: list[int] | None = None,
) -> None:
    """Publish QoS 1 templates, keeping at most ``window`` outstanding across all publishers."""
    import socket

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    pin_self(cpus or [])
    payloads = read_frames(file)
    # MQTT v5 defaults: clean start and session expiry 0, so the session ends with the connection.
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
    c.on_socket_open = lambda cl, ud, sock: sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]
    c.max_inflight_messages_set(20)
    c.max_queued_messages_set(0)
    c.connect(*_BROKER)
    c.loop_start()
    cpu0 = own_cpu_s()
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
    results.put({"start": start, "end": end, "n": len(payloads), "cpu_s": own_cpu_s() - cpu0})


def main(argv: list[str]) -> int:
    cmd, *args = argv
    _client_pin()
    res: dict[str, Any]
    if cmd == "grpc-ingest":
        res = _grpc_ingest(*args)
    elif cmd == "grpc-identify":
        res = _grpc_identify(*args)
    else:
        print(f"unknown bench command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
