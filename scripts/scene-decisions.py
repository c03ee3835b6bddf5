#!/usr/bin/env python
"""Why a scene's enrolled faces are or are not named: each face scored by the camera's own device model.

Reads a finished ``peep demo --scenes --out RUN`` folder (its scenes, ground truth, bundle, keys and the
device model the cameras held) and, for every ``--stride``-th frame, each face of the ground truth at least
``--visible`` visible that YuNet finds: describes it with the devices' encoder, projects it with the bundle,
and scores it with the device model as a camera does (one frame, no label mechanism). Per face-height bin it
prints how often the model ranks the right person first, how often the face clears the unknown threshold as
that person (what a decision needs), the median probability, and how many stranger faces clear it; and the
probabilities of the model's calibration people, which set the threshold.

Everything stays in memory; nothing is written unless ``--json`` names a file.

    python scripts/scene-decisions.py runs/demo-scenes-0 [--stride 3] [--json out.json]
    python scripts/scene-decisions.py runs/demo-scenes-0 --seed 0 --bands 45,60,70,110 --mirror
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

BINS = ((30, 45), (45, 60), (60, 70), (70, 110), (110, 10_000))


def _decider(run: Path, state: Path) -> Any:
    """The agent of a camera of ``run`` (its bundle, site key and held device model), opened without a network."""
    from peep.edge.agent import Agent
    from peep.edge.config import EdgeConfig

    shutil.copytree(run / "devices" / "cam-1" / "device-model", state / "device-model")
    cfg = EdgeConfig.model_validate({
        "device": {"id": "cam-1", "site": "demo", "state_dir": str(state)},
        "bundle": {"path": str(run / "bundle"), "public_key": str(run / "keys" / "site.pub"), "accept_updates": False},
        "privacy": {"mechanism": "privunit", "epsilon": 16.0, "site_key": str(run / "keys" / "template.key"),
                    "track_budget": 1e6},
        "capture": {"source": str(state), "max_fps": 0.0},
        "mqtt": {"enabled": True, "host": "127.0.0.1", "port": 1883, "tls": False},
        "metrics": {"port": 0},
        "recognition": {"decide": "device"},
    })  # fmt: skip
    agent = Agent(cfg, environ={})
    agent.open()
    decider = agent.decisions.decider()
    if decider is None:
        raise SystemExit(
            f"scene-decisions: the cameras' device model in {run} does not load: {agent.decisions.problem}"
        )
    return agent, decider


def _calibration_views(seed: int, n_people: int) -> list[tuple[str, float, Any]]:
    """The calibration people's photos drawn again as the demo drew them: (person, face height, image) each.

    The demo picks ``n_people`` one-image people by ``seed + 6`` and draws their photos with ``seed + 7``
    (:func:`peep.lab.scenes.views.write_camera_views`); the first draw of each photo is its face height.
    """
    import cv2
    from peep.lab.scenes.render import SceneSpec
    from peep.lab.scenes.views import camera_view
    from peep.server.datasets import IMAGE_EXTENSIONS, singles_folder

    singles = singles_folder(None)
    if singles is None:
        raise SystemExit("scene-decisions: lfw_singles/ is not staged (scripts/stage-lfw.sh)")
    names = sorted(p.name for p in singles.iterdir() if p.is_dir())
    pick = np.random.default_rng(seed + 6).permutation(len(names))[:n_people]
    rng = np.random.default_rng(seed + 7)
    lo, hi = SceneSpec.face_px
    out = []
    for person in sorted(names[int(i)] for i in pick):
        for f in sorted(f for f in (singles / person).glob("*") if f.suffix.lower() in IMAGE_EXTENSIONS):
            state = rng.bit_generator.state
            height = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            rng.bit_generator.state = state
            out.append((person, height, camera_view(cv2.imread(str(f), cv2.IMREAD_COLOR), rng)))
    return out


def _quantiles(values: Any, q: tuple[float, ...]) -> dict[str, float]:
    return {str(k): round(float(v), 4) for k, v in zip(q, np.quantile(values, q), strict=True)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a finished `peep demo --scenes --out RUN` folder")
    p.add_argument("--stride", type=int, default=3, help="every N-th frame (default 3)")
    p.add_argument("--visible", type=float, default=0.9, help="faces at least this share visible (default 0.9)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--mirror",
        action="store_true",
        help="also score each face and redrawn calibration view "
        "with the descriptor of the chip and its mirror image averaged (the enrolment as it was)",
    )
    p.add_argument("--seed", type=int, default=0, help="the run's --seed (with --bands or --mirror)")
    p.add_argument(
        "--bands",
        help="face-height edges (px, e.g. 60,90): thresholds set per band of the "
        "calibration faces' drawn heights, and what they would name",
    )
    a = p.parse_args(argv)
    run = a.run
    for need in ("people.json", "bundle", "keys/site.pub", "keys/template.key", "devices/cam-1/device-model",
                 "devices/door-1/device-model/current/class.key", "videos/cam-1.gt.jsonl"):  # fmt: skip
        if not (run / need).exists():
            p.error(f"{run}: expected a `peep demo --scenes` folder with {need}, which is missing")
    if a.stride < 1 or not 0.0 < a.visible <= 1.0:
        p.error(f"--stride >= 1 and 0 < --visible <= 1 expected, received {a.stride} and {a.visible}")

    import cv2
    from peep.core.decision import identify_open_set
    from peep.core.devicemodel import class_id
    from peep.edge.config import DetectorConfig
    from peep.edge.decide import fuse_projections
    from peep.edge.detection import build_detector
    from peep.edge.embedding import make_encoder
    from peep.lab.demo.steps.scenes import find_yunet
    from peep.lab.scenes.detectors import match_frame
    from peep.lab.scenes.render import read_ground_truth

    yunet = find_yunet(None)
    if yunet is None:
        p.error("YuNet's file was not found ($PEEP_YUNET_MODEL, `peep-edge models fetch yunet`)")
    detector = build_detector(DetectorConfig(kind="yunet", detect_width=None, model_path=str(yunet)))
    encoder = make_encoder()
    state = Path(tempfile.mkdtemp(prefix="peep-scene-decisions-"))
    try:
        agent, decider = _decider(run, state)
        key = bytes.fromhex((run / "devices" / "door-1" / "device-model" / "current" / "class.key").read_text().strip())
        column = {c: i for i, c in enumerate(decider.model.classes)}
        own = {n: column.get(class_id(key, n)) for n in json.loads((run / "people.json").read_text())["enrolled"]}
        threshold = float(decider.thresholds.unknown_threshold)

        def describe(image: Any, box: Any, mirror: bool) -> Any:
            if not mirror:
                return encoder.encode(image, box)
            chip = encoder.chip(image, box)
            return encoder.graph.describe(np.stack([chip, chip[:, ::-1]])).mean(axis=0)

        mirrored: dict[tuple[int, int], list[tuple[bool, float, float]]] = {b: [] for b in BINS}
        mirrored_strangers: list[float] = []

        def score(image: Any, box: Any, mirror: bool = False) -> tuple[int, bool, float]:
            bounded = agent.releaser.project(describe(image, box, mirror))[0]
            P = decider.probabilities(fuse_projections(np.atleast_2d(bounded), decider.domain))
            d = identify_open_set(P, decider.known, threshold)
            return int(d.best_class[0]), bool(d.unknown[0]), float(d.probability[0])

        enrolled: dict[tuple[int, int], list[tuple[bool, bool, float]]] = {b: [] for b in BINS}

        def right_of(face: Any, best: int) -> bool:
            return best == own.get(face["identity"])

        strangers: list[tuple[bool, float]] = []
        for gt_file in sorted((run / "videos").glob("cam-*.gt.jsonl")):
            cam = gt_file.name.split(".")[0]
            truth = {int(r["frame"]): r["faces"] for r in read_ground_truth(gt_file)}
            video = cv2.VideoCapture(str(run / "videos" / f"{cam}.mp4"))
            index = -1
            while True:
                ok, image = video.read()
                if not ok:
                    break
                index += 1
                faces = [f for f in truth.get(index, []) if float(f.get("visible", 1.0)) >= a.visible]
                if index % a.stride or not faces:
                    continue
                boxes = detector.detect(image)
                taken, _ = match_frame(faces, boxes)
                for face, i in zip(faces, taken, strict=True):
                    if i is None:
                        continue
                    best, unknown, prob = score(image, boxes[i])
                    if a.mirror:
                        m_best, _, m_prob = score(image, boxes[i], True)
                        if face["role"] == "stranger":
                            mirrored_strangers.append(m_prob)
                        elif face["role"] == "enrolled":
                            for lo, hi in BINS:
                                if lo <= float(face["height_px"]) < hi:
                                    m_right = m_best == own.get(face["identity"])
                                    mirrored[(lo, hi)].append((right_of(face, best), m_right, m_prob))
                    if face["role"] == "stranger":
                        strangers.append((not unknown, prob, float(face["height_px"])))
                    elif face["role"] == "enrolled":
                        right = best == own.get(face["identity"])
                        for lo, hi in BINS:
                            if lo <= float(face["height_px"]) < hi:
                                enrolled[(lo, hi)].append(
                                    (right, right and not unknown, prob, float(face["height_px"]))
                                )
            video.release()
            print(f"scene-decisions: {cam} read", file=sys.stderr, flush=True)
        P_cal = decider.probabilities(decider.model.calibration)[:, decider.known].max(axis=1)
        model_target = float(decider.thresholds.fpir_model_target)
        cal_file = np.load(run / "server" / "calibration.npz", allow_pickle=False)
        cal_people = [str(t) for t in cal_file["people"]]
        cal_best = decider.probabilities(cal_file["projections"])[:, decider.known].max(axis=1)
        if a.mirror:
            # the calibration views drawn again, each described plainly and mirror-averaged by the same path
            views = _calibration_views(
                a.seed, int(json.loads((run / "summary.json").read_text())["data"]["calibration_people"])
            )
            plain, mirror_best = [], []
            for _, _, img in views:
                found = detector.detect(img)
                if not found:
                    continue
                box = max(found, key=lambda b: b.w * b.h)
                for flag, acc in ((False, plain), (True, mirror_best)):
                    bounded = agent.releaser.project(describe(img, box, flag))[0]
                    P = decider.probabilities(fuse_projections(np.atleast_2d(bounded), decider.domain))
                    acc.append(float(P[0, decider.known].max()))
            print(f"scene-decisions: {len(plain)} calibration views described both ways", file=sys.stderr)
    finally:
        shutil.rmtree(state, ignore_errors=True)

    q = (0.5, 0.9, 0.99, 1.0)
    out: dict[str, Any] = {
        "run": str(run),
        "unknown_threshold": threshold,
        "calibration_people_probability_quantiles": _quantiles(P_cal, q),
        "stranger_faces": len(strangers),
        "stranger_faces_named": int(sum(s[0] for s in strangers)),
        "stranger_probability_quantiles": _quantiles([s[1] for s in strangers], q) if strangers else None,
        "enrolled_faces_per_bin": {},
    }
    print(f"unknown threshold {threshold:.3f}; calibration people's probability, quantiles {q}: "
          f"{out['calibration_people_probability_quantiles']}")  # fmt: skip
    print(f"stranger faces {len(strangers)}, named {out['stranger_faces_named']}; "
          f"quantiles: {out['stranger_probability_quantiles']}")  # fmt: skip
    print("bin px      faces  ranked first  identified  median probability")
    for (lo, hi), rows in enrolled.items():
        if not rows:
            continue
        r = np.array([x[:3] for x in rows], dtype=float)
        label = f"{lo}-{hi}" if hi < 10_000 else f">={lo}"
        row = {"faces": len(rows), "ranked_first": float(r[:, 0].mean()), "identified": float(r[:, 1].mean()),
               "median_probability": float(np.median(r[:, 2]))}  # fmt: skip
        out["enrolled_faces_per_bin"][label] = row
        print(f"{label:10s} {row['faces']:6d}  {row['ranked_first']:12.2f}  {row['identified']:10.2f}  "
              f"{row['median_probability']:18.3f}")  # fmt: skip
    if a.bands:
        summary = json.loads((run / "summary.json").read_text())
        heights = {person: h for person, h, _ in _calibration_views(a.seed, int(summary["data"]["calibration_people"]))}
        h_cal = np.array([heights.get(t, np.nan) for t in cal_people])
        print(f"calibration faces with a replayed height: {int(np.isfinite(h_cal).sum())} of {h_cal.size}")
        edges = [float(e) for e in a.bands.split(",")]
        bands = list(zip([0.0, *edges], [*edges, 1e9], strict=True))
        from peep.core.decision import threshold_at_fpir

        t_band = []
        for lo, hi in bands:
            sel = (h_cal >= lo) & (h_cal < hi)
            t = threshold_at_fpir(cal_best[sel], model_target) if sel.any() else threshold
            t_band.append(t)
            print(
                f"band {lo:g}-{hi:g} px: {int(sel.sum())} calibration faces, threshold {t:.3f} "
                f"(pooled {threshold:.3f}); 99th pct {np.quantile(cal_best[sel], 0.99):.3f}"
            )

        def t_of(h: float) -> float:
            return next(t for (lo, hi), t in zip(bands, t_band, strict=True) if lo <= h < hi)

        sn = sum(prob >= t_of(h) for _, prob, h in strangers)
        print(f"strangers named, band thresholds: {sn} of {len(strangers)} (pooled {out['stranger_faces_named']})")
        for (lo, hi), rows in enrolled.items():
            if rows:
                named = np.mean([right and prob >= t_of(h) for right, _, prob, h in rows])
                print(f"  {lo}-{hi}: identified with band thresholds {named:.2f}")
    if a.mirror:
        from peep.core.decision import threshold_at_fpir

        t_plain = threshold_at_fpir(plain, model_target)
        t_mirror = threshold_at_fpir(mirror_best, model_target)
        print(
            f"mirror: thresholds on {len(plain)} redrawn calibration views: plain {t_plain:.3f}, "
            f"mirror-averaged {t_mirror:.3f}; strangers named plain "
            f"{sum(pr >= t_plain for _, pr, _ in strangers)}, "
            f"mirrored {sum(pr >= t_mirror for pr in mirrored_strangers)}"
            f" of {len(strangers)}"
        )
        for (lo, hi), rows in mirrored.items():
            base = enrolled[(lo, hi)]
            if rows:
                pl = np.mean([r and pr >= t_plain for r, _, pr, _ in base])
                mi = np.mean([r and pr >= t_mirror for _, r, pr in rows])
                print(f"  {lo}-{hi}: {len(rows)} faces identified plain {pl:.2f}, mirror-averaged {mi:.2f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
