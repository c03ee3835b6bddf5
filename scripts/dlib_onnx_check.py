"""Our ONNX translation of dlib's face ResNet against dlib itself, on real LFW face chips.

Builds the graph from the installed ``face_recognition_models`` file
(:mod:`peep.edge.dlibdat`, :mod:`peep.edge.dlibgraph`), makes N aligned chips
from LFW images (dlib's frontal face detector, its 5-point landmarks,
``dlib.get_face_chip(rgb, shape, size=150, padding=0.25)``; images with no
face are skipped), computes each chip's descriptor with dlib
(``compute_face_descriptor(chip)``) and with onnxruntime, one chip at a time
and one thread each, back to back on the same chips, and prints the largest
absolute difference per coordinate, the smallest cosine and the time per
face of each back end. Exits 1 if the difference exceeds ``--tolerance``.

Usage::

    .venv/bin/python scripts/dlib_onnx_check.py --faces 1000 --json /tmp/dlib-onnx.json
"""

from __future__ import annotations

import os

# One thread everywhere, set before numpy and onnxruntime load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from numpy.typing import NDArray  # noqa: E402

# The team's datasets folder beside the repository (as scripts/stage-lfw.sh finds it), or $PEEP_DATASETS.
DATASETS = Path(os.environ.get("PEEP_DATASETS") or Path(__file__).resolve().parents[2] / "shared" / "datasets")
NETWORK = "dlib_face_recognition_resnet_model_v1.dat"
LANDMARKS = "shape_predictor_5_face_landmarks.dat"


def models_dir() -> Path:
    """The installed ``face_recognition_models/models`` folder (the package is not imported: it needs pkg_resources)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("face_recognition_models is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


def lfw_images(root: Path, seed: int) -> list[Path]:
    """Every LFW jpg under ``root``/lfw_home/lfw_funneled and ``root``/lfw_singles, in a seeded order."""
    folders = (root / "lfw_home" / "lfw_funneled", root / "lfw_singles")
    paths = [p for folder in folders for p in sorted(folder.glob("*/*.jpg"))]
    if not paths:
        sys.exit(f"no LFW images under {root} (expected lfw_home/lfw_funneled/ and lfw_singles/)")
    order = np.random.default_rng(seed).permutation(len(paths))
    return [paths[i] for i in order]


def face_chips(paths: list[Path], n: int, models: Path, root: Path) -> tuple[NDArray[np.uint8], list[str], int]:
    """Up to ``n`` aligned chips, shape (n, 150, 150, 3) uint8 RGB; their sources; how many images were read."""
    import dlib

    detector = dlib.get_frontal_face_detector()
    landmarks = dlib.shape_predictor(str(models / LANDMARKS))
    chips, sources, tried = [], [], 0
    for path in paths:
        if len(chips) == n:
            break
        tried += 1
        rgb = dlib.load_rgb_image(str(path))
        boxes = detector(rgb, 0)
        if not boxes:
            continue
        box = max(boxes, key=lambda r: r.area())
        chip = dlib.get_face_chip(rgb, landmarks(rgb, box), size=150, padding=0.25)
        chips.append(np.ascontiguousarray(chip, dtype=np.uint8))
        sources.append(str(path.relative_to(root)))
    if not chips:
        sys.exit(f"no face found in the {tried} LFW images tried")
    return np.stack(chips), sources, tried


def timed(fn: Any, chips: NDArray[np.uint8]) -> tuple[NDArray[np.float64], float, float]:
    """``fn`` on each chip: descriptors (n, 128), wall and CPU seconds per chip."""
    fn(chips[0])  # warm-up (first-call allocations, onnxruntime's arena)
    wall, cpu = time.perf_counter(), time.process_time()
    out = np.stack([np.asarray(fn(chip), dtype=np.float64).reshape(-1) for chip in chips])
    return out, (time.perf_counter() - wall) / len(chips), (time.process_time() - cpu) / len(chips)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faces", type=int, default=1000, help="number of face chips (default 1000)")
    ap.add_argument("--datasets", type=Path, default=DATASETS, help=f"holds lfw_home/ and lfw_singles/ ({DATASETS})")
    ap.add_argument("--seed", type=int, default=0, help="order in which LFW images are tried (default 0)")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed |dlib - onnx| (default 1e-4)")
    ap.add_argument("--json", type=Path, help="write the numbers to this JSON file")
    args = ap.parse_args(argv)

    import dlib
    import onnxruntime as ort
    from peep.edge.dlibdat import read_network
    from peep.edge.dlibgraph import INPUT, build_graph

    models = models_dir()
    t0 = time.perf_counter()
    network = read_network(models / NETWORK)
    t_parse = time.perf_counter() - t0
    graph = build_graph(network)
    t_build = time.perf_counter() - t0 - t_parse
    print(f"parsed {NETWORK} in {t_parse:.2f} s: {network.count()}")
    print(f"built the ONNX graph in {t_build:.2f} s: {len(graph)} bytes")

    chips, sources, tried = face_chips(lfw_images(args.datasets, args.seed), args.faces, models, args.datasets)
    print(f"{len(chips)} face chips from {tried} LFW images ({tried - len(chips)} without a detected face)")

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
    net = dlib.face_recognition_model_v1(str(models / NETWORK))

    ref, t_dlib, c_dlib = timed(net.compute_face_descriptor, chips)
    got, t_onnx, c_onnx = timed(lambda chip: session.run(None, {INPUT: chip[None]})[0][0], chips)
    # Batches of 16 (the batch size dlib's python API uses): all chips at once would need ~0.7 MB per chip.
    wall = time.perf_counter()
    batched = np.concatenate([session.run(None, {INPUT: chips[i : i + 16]})[0] for i in range(0, len(chips), 16)])
    t_batch = (time.perf_counter() - wall) / len(chips)
    batched = batched.astype(np.float64)

    diff = np.abs(got - ref)
    cos = np.sum(got * ref, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    worst = int(np.argmax(diff.max(axis=1)))
    norms = np.linalg.norm(ref, axis=1)
    result = {
        "faces": len(chips),
        "images_tried": tried,
        "max_abs_diff": float(diff.max()),
        "max_abs_diff_batched": float(np.abs(batched - ref).max()),
        "mean_abs_diff": float(diff.mean()),
        "min_cosine": float(cos.min()),
        "worst_face": sources[worst],
        "descriptor_norm": {"min": float(norms.min()), "max": float(norms.max())},
        "seconds_per_face": {"dlib": t_dlib, "onnxruntime": t_onnx, "onnxruntime_batches_of_16": t_batch},
        "cpu_seconds_per_face": {"dlib": c_dlib, "onnxruntime": c_onnx},
        "tolerance": args.tolerance,
        "passed": bool(diff.max() <= args.tolerance),
        "versions": {
            "dlib": str(dlib.__version__),
            "onnxruntime": str(ort.__version__),
            "python": platform.python_version(),
        },
        "graph_bytes": len(graph),
        "seed": args.seed,
    }
    print(
        f"max |dlib - onnx| per coordinate: {result['max_abs_diff']:.3g} "
        f"(in batches of 16: {result['max_abs_diff_batched']:.3g}), "
        f"mean {result['mean_abs_diff']:.3g}, worst face {sources[worst]}"
    )
    print(f"min cosine(dlib, onnx): {result['min_cosine']:.9f}")
    print(
        f"time per face, one thread: dlib {1e3 * t_dlib:.1f} ms (cpu {1e3 * c_dlib:.1f}), "
        f"onnxruntime {1e3 * t_onnx:.1f} ms (cpu {1e3 * c_onnx:.1f}); "
        f"onnxruntime in batches of 16 {1e3 * t_batch:.1f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    if not result["passed"]:
        print(f"FAILED: difference above the tolerance {args.tolerance:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
