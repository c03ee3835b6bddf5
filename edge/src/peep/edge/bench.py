"""Edge benchmark: the whole pipeline on a 640x480 video of 1-3 LFW faces, on one core.

:func:`run` prepares the material in the calling process (a video composed
with ``cv2.VideoWriter`` from LFW images, and a signed nc = 128 bundle built
with the core), then measures in a **fresh child process pinned to one CPU**
(``sched_setaffinity``; OpenCV and onnxruntime on one thread) so that
``rss_mb`` is the agent's own peak resident memory, not the benchmark
harness's. The child runs decode -> detect (Haar on ``detect_width`` 320,
scale 1.2) -> track -> policy -> normalise + project (onnxruntime) -> perturb
(secure sampler) -> spool (SQLite WAL, ``synchronous=FULL``, persistent
ledger) -> publish (in-memory forwarder thread that acknowledges, on the same
core).

Stage times: ``decode``, ``detect`` and ``track`` are per frame;
``project`` (full-resolution refine + normalise + ONNX projection),
``perturb``, ``spool`` (template build, ledger spend and spool insert, each
an fsynced SQLite commit) and ``publish`` (hand-off + ack + SQLite delete)
are per released template. ``fps_640x480`` counts frames over the wall time
of the whole loop, releases and the forwarder included. The release policy
is set to one release per track per second (60x the default rate) so the
per-release stages are exercised.

Run: ``python -c "import json; from peep.edge.bench import run; print(json.dumps(run(False), indent=1))"``
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DETECTOR: dict[str, Any] = {"detect_width": 320, "scale_factor": 1.2, "min_neighbors": 5, "min_size": 64}


def _prepare(work: Path, quick: bool) -> dict[str, Any]:
    from peep.core.bundle import load_private_key, write_keypair
    from peep.edge.testing import FaceTrack, build_bundle_from_images, compose_video, lfw_people

    everyone = lfw_people()
    frequent = {k: v for k, v in everyone.items() if len(v) >= 20}
    background = [v[0] for k, v in everyone.items() if k not in frequent]
    if len(frequent) < 3 or len(background) < 140:
        raise RuntimeError("benchmark: expected the staged LFW subset (>= 3 people with 20+ images, 140 others)")
    key_path, pub_path = write_keypair(work / "bench")
    n_bundle_images = 160 if quick else 300
    bundle_dir = build_bundle_from_images(
        background[:n_bundle_images], n_components=128, signing_key=load_private_key(key_path), out_dir=work / "bundle"
    )
    names = sorted(frequent)[:3]
    n = 150 if quick else 900
    tracks = [
        FaceTrack(image=frequent[names[0]][0], start=0, stop=n, x0=40, y0=30, amplitude=40, period_frames=120),
        FaceTrack(image=frequent[names[1]][0], start=n // 3, stop=n, x0=400, y0=30, amplitude=30, period_frames=90),
        FaceTrack(
            image=frequent[names[2]][0], start=2 * n // 3, stop=n, x0=220, y0=270, amplitude=50, period_frames=150
        ),
    ]
    video = compose_video(work / "bench.mp4", tracks, n_frames=n, fps=30.0)
    return {
        "video": str(work / "bench.mp4"),
        "bundle": str(bundle_dir),
        "public_key": str(pub_path),
        "n_frames": n,
        "faces_per_frame_mean": sum(video["visible"]) / n,
        "faces_per_frame_max": max(video["visible"]),
        "people": names,
    }


def _status_mb(field: str) -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _peak_rss_mb() -> float:
    # VmHWM belongs to this address space. getrusage's ru_maxrss does not: Linux
    # carries it across exec, so a child forked from a big parent would report
    # the parent's peak (the harness's 157 MB, not the agent's ~138 MB).
    hwm = _status_mb("VmHWM")
    return hwm if hwm == hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure the pipeline (runs in the pinned child process)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    rss = {"interpreter": _rss_mb()}
    import cv2

    cv2.setNumThreads(1)
    # What an MQTT-only agent process imports (config, metrics, paho), so rss_mb is the agent's.
    import peep.edge.agent
    import peep.edge.transport.mqtt  # noqa: F401
    from peep.core.accounting import PrivacyAccountant
    from peep.core.bundle import EigenfaceBundle, load_public_key
    from peep.core.imaging import HaarFaceDetector
    from peep.edge.capture import VideoSource
    from peep.edge.ledger import SqliteLedger
    from peep.edge.metrics import EdgeMetrics
    from peep.edge.pipeline import FramePipeline, make_releaser
    from peep.edge.policy import ReleasePolicy
    from peep.edge.spool import Spool
    from peep.edge.tracking import Tracker
    from peep.edge.transport.memory import MemoryForwarder

    rss["imports"] = _rss_mb()
    work = Path(spec["work"])
    bundle = EigenfaceBundle.load(spec["bundle"], load_public_key(spec["public_key"]))
    rss["bundle_loaded"] = _rss_mb()
    releaser = make_releaser(bundle, kind="peep", epsilon=8.0, delta=0.0)
    metrics = EdgeMetrics()
    ledger = SqliteLedger(work / "ledger.sqlite3")
    accountant = PrivacyAccountant(epsilon_budget=1e12, ledger=ledger)
    spool = Spool(work / "spool.sqlite3", destinations=["memory"], synchronous="full")
    forwarder = MemoryForwarder(spool, dest="memory", metrics=metrics)
    policy = ReleasePolicy(
        accountant=accountant,
        releases_per_window=1,
        window_s=1.0,
        min_hits=3,
        cost_epsilon=float(releaser.mechanism.guarantee.epsilon_vector),
    )
    pipeline = FramePipeline(
        device_id="bench",
        site="bench",
        detector=HaarFaceDetector(**DETECTOR),
        tracker=Tracker(id_prefix="bench"),
        policy=policy,
        releaser=releaser,
        spool=spool,
        metrics=metrics,
    )
    src = VideoSource(spec["video"], kind="file")
    forwarder.start()
    frames = 0
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        frame = src.read()
        if frame is None:
            break
        pipeline.timer.add("decode", time.perf_counter() - t0)
        pipeline.process(frame)
        frames += 1
    loop_s = time.perf_counter() - t_start
    forwarder.stop(10.0)
    src.close()
    timer = pipeline.timer
    releases = timer.calls.get("perturb", 0)
    out = {
        "fps_640x480": frames / loop_s,
        "frames": frames,
        "releases": releases,
        "delivered": len(forwarder.received),
        "frame_ms_mean": 1e3 * loop_s / frames,
        "stage_ms": {
            "decode": timer.mean_ms("decode"),
            "detect": timer.mean_ms("detect"),
            "track": timer.mean_ms("track"),
            "project": timer.mean_ms("project"),
            "perturb": timer.mean_ms("perturb"),
            "spool": timer.mean_ms("spool"),
            "publish": 1e3 * sum(forwarder.publish_seconds) / max(1, len(forwarder.publish_seconds)),
        },
        "rss_mb": _peak_rss_mb(),
        "rss_breakdown_mb": {**rss, "end": _rss_mb()},
        "cpus_used": 1 if cpus else None,
        "payload_bytes_mean": sum(len(p) for p in forwarder.received) / max(1, len(forwarder.received)),
    }
    spool.close()
    ledger.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    """Benchmark the edge pipeline; returns a JSON-able dict (see the module docstring)."""
    import cv2
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="peep-edge-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        spec = _prepare(work, quick)
        spec["work"] = str(work)
        prepare_s = time.perf_counter() - t0
        proc = subprocess.run(
            [sys.executable, "-m", "peep.edge.bench", "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"edge benchmark child failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(
        {
            "quick": quick,
            "video": {
                "size": [640, 480],
                "fps": 30.0,
                "frames": spec["n_frames"],
                "codec": "mp4v",
                "faces_per_frame_mean": round(spec["faces_per_frame_mean"], 3),
                "faces_per_frame_max": spec["faces_per_frame_max"],
                "source": "LFW deep-funneled images (3 people with >= 20 images) on a synthetic background",
            },
            "detector": {"kind": "haar", **DETECTOR, "refine": True, "opencv_threads": 1},
            "bundle": {"n_components": 128, "geometry": "47x62", "mechanism": "peep", "epsilon": 8.0},
            "policy": {"releases_per_window": 1, "window_seconds": 1.0, "min_track_frames": 3},
            "spool": {"backend": "sqlite-wal", "synchronous": "full"},
            "publisher": "in-memory forwarder thread (acks every template)",
            "prepare_s": prepare_s,
            "platform": {
                "machine": platform.machine(),
                "python": platform.python_version(),
                "opencv": cv2.__version__,
                "onnxruntime": onnxruntime.__version__,
                "cpu_count": os.cpu_count(),
            },
            "targets": {"fps_640x480_min": 30.0, "rss_mb_max": 150.0},
        }
    )
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(json.loads(sys.argv[2]))))
    else:
        print(json.dumps(run("--quick" in sys.argv), indent=1))
