"""``peep bench --sections detectors``: each face detector on the same rendered scenes, per face-height bin.

Scenes (:mod:`peep.lab.scenes.render`): a room, an entrance and a street at 640x480 and 15 frames/s,
up to 3 people at once with faces 30-160 px, H.264 at 1 Mbit/s; two seeds each (one with ``--quick``),
20 s each (8 s with ``--quick``); ``$PEEP_BENCH_SCENE_SEEDS`` picks other seeds (held-out scenes). They
are rendered once into the cache (``PEEP_CACHE_DIR``, keyed by their parameters) and reused. Every
detector sees the same frames; the figures are
:func:`peep.lab.scenes.detectors.evaluate`'s. YuNet is measured when its file is found
(:func:`peep.edge.models.find_model`), else recorded as skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: The detectors measured: a name, the ``[detector]`` settings that make it.
DETECTORS: dict[str, dict[str, Any]] = {
    "haar, 320 px wide, faces >= 64 px (without YuNet)": {"kind": "haar"},
    "haar, full frame, faces >= 24 px": {
        "kind": "haar", "detect_width": None, "scale_factor": 1.1, "min_neighbors": 3, "min_size": 24,
    },
    "hog, full frame, upsample 0": {"kind": "hog", "detect_width": None, "upsample": 0, "min_size": 8},
    "hog, full frame, upsample 1": {"kind": "hog", "detect_width": None, "upsample": 1, "min_size": 8},
    "yunet, full frame, score >= 0.7": {"kind": "yunet", "model_path": None},
    "yunet, full frame, score >= 0.8": {"kind": "yunet", "model_path": None, "score_threshold": 0.8},
    "yunet, full frame, score >= 0.9": {"kind": "yunet", "model_path": None, "score_threshold": 0.9},
}  # fmt: skip
SETTINGS = ("room", "entrance", "street")
#: The detector whose boxes are also tracked as a device with a descriptor bundle tracks (the default's).
TRACKED_WITH_FACES = "yunet, full frame, score >= 0.7"


def _tracks_with_faces(detector: Any, paths: list[Path], name: str) -> dict[str, Any]:
    """The default detector's boxes tracked with faces compared where positions are unsure (dlib's descriptor)."""
    from peep.edge.embedding import make_encoder
    from peep.edge.tracking import Tracker
    from peep.lab.scenes.detectors import evaluate_tracks

    try:
        encoder = make_encoder()
    except Exception as exc:  # the descriptor is the edge's [dlib] extra
        return {"skipped": f"no descriptor encoder: {type(exc).__name__}: {exc}"}
    print(f"peep bench: detectors: {name}, tracked with faces", file=sys.stderr, flush=True)
    tracks = evaluate_tracks(detector, paths, Tracker, encoder=encoder)
    line = (
        f"  {tracks['passes_seen']} passes, {tracks['identity_switches']} switches, {tracks['mixed_tracks']} mixed "
        f"tracks, {tracks['mixed_released_tracks']} mixed in what is released; "
        f"{tracks['descriptors_per_detection']:.2f} descriptors per detection"
    )
    print(line, file=sys.stderr, flush=True)
    return {"detector": name, **tracks}


def _cache_root() -> Path:
    """``scenes/`` in the faces' cache folder (``PEEP_CACHE_DIR``, as the faces' cache), else a temporary one."""
    import tempfile

    from peep.server.datasets import cache_dir, resolve_data_home

    folder = cache_dir(resolve_data_home(None))
    return (folder if folder is not None else Path(tempfile.mkdtemp(prefix="peep-scenes-"))) / "scenes"


def _people(data_home: str | None, n: int, seed: int) -> list[Any]:
    from peep.lab.scenes.render import lfw_people
    from peep.server.datasets import ensure_lfw

    root = ensure_lfw(data_home)
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and len(list(p.glob("*.jpg"))) >= 5)
    pick = np.random.default_rng(seed).permutation(len(names))[:n]
    return lfw_people(data_home, [names[int(i)] for i in pick], role="public", max_photos=5)


def scene_seeds(quick: bool) -> tuple[int, ...]:
    """0 and 1 (0 with ``--quick``), or ``$PEEP_BENCH_SCENE_SEEDS`` (comma-separated): other seeds give
    held-out scenes of the same settings, to check a change measured on the usual ones."""
    raw = os.environ.get("PEEP_BENCH_SCENE_SEEDS", "").strip()
    if not raw:
        return (0,) if quick else (0, 1)
    try:
        seeds = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"PEEP_BENCH_SCENE_SEEDS: expected comma-separated integers, received {raw!r}") from None
    if not seeds or any(x < 0 for x in seeds):
        raise ValueError(f"PEEP_BENCH_SCENE_SEEDS: expected comma-separated integers >= 0, received {raw!r}")
    return seeds


def scenes(quick: bool, data_home: str | None = None) -> list[Path]:
    """The bench's scenes, rendered into the cache unless already there; their paths without suffix."""
    from peep.lab.scenes.render import SceneSpec, render_scene

    seeds = scene_seeds(quick)
    seconds = 8.0 if quick else 20.0
    people = _people(data_home, 16, 11)
    out: list[Path] = []
    for setting in SETTINGS:
        for seed in seeds:
            spec = SceneSpec(setting=setting, seconds=seconds, seed=seed)
            key = hashlib.sha256(
                json.dumps([repr(spec), [p.photos for p in people], "v3"], sort_keys=True).encode()
            ).hexdigest()[:16]
            folder = _cache_root() / key
            name = f"{setting}-{seed}"
            if not (folder / f"{name}.json").is_file():
                print(f"peep bench: detectors: rendering {name} ({spec.n_frames} frames)", file=sys.stderr, flush=True)
                render_scene(spec, people, folder, name=name)
            out.append(folder / name)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    """Measure every detector of :data:`DETECTORS` on the scenes; returns the section's JSON-able dict."""
    from peep.edge.config import DetectorConfig
    from peep.edge.detection import build_detector
    from peep.edge.models import find_model
    from peep.edge.tracking import Tracker
    from peep.lab.scenes.detectors import HEIGHT_BINS, evaluate

    paths = scenes(quick)
    result: dict[str, Any] = {
        "scenes": [str(p) for p in paths],
        "scene_seeds": list(scene_seeds(quick)),
        "setup": "640x480, 15 fps, H.264 1 Mbit/s, rooms, entrances and streets, up to 3 people at once; recall "
        "over faces at least half visible; one thread; decoding excluded; each detector's boxes tracked by the "
        "edge's Tracker with its default settings, by position (tracks) and, for the default detector, with faces "
        "compared as a device with a descriptor bundle does (tracks_with_faces)",
        "bins_px": [list(b) for b in HEIGHT_BINS],
        "detectors": {},
    }
    for name, settings in DETECTORS.items():
        cfg = dict(settings)
        if cfg["kind"] == "yunet":
            found = find_model("yunet")
            model = None if found is None else str(found)
            if model is None:
                result["detectors"][name] = {
                    "skipped": "no YuNet file: peep-edge models fetch yunet, or PEEP_YUNET_MODEL"
                }
                continue
            cfg["model_path"] = model
        print(f"peep bench: detectors: {name}", file=sys.stderr, flush=True)
        try:
            detector = build_detector(DetectorConfig(**cfg))
            measured = evaluate(detector, paths, make_tracker=Tracker)
        except Exception as exc:  # one detector's failure is recorded, the others still measured
            result["detectors"][name] = {"settings": cfg, "error": f"{type(exc).__name__}: {exc}"}
            continue
        result["detectors"][name] = {"settings": cfg, **measured}
        if name == TRACKED_WITH_FACES:
            result["tracks_with_faces"] = _tracks_with_faces(detector, paths, name)
        recall = ", ".join(f"{k} {'–' if v is None else f'{v:.2f}'}" for k, v in measured["recall"].items())
        tr = measured["tracks"]
        print(f"  recall {recall}; false {measured['false_per_1000_frames']:.1f}/1000 frames; "
              f"{measured['cpu_ms_per_frame']:.1f} ms/frame; {tr['passes_seen']} passes, {tr['identity_switches']} "
              f"switches, {tr['fragments']} fragments, {tr['mixed_tracks']} mixed tracks", file=sys.stderr,
              flush=True)  # fmt: skip
    return result
