"""The demo's cameras on scenes (``peep demo --scenes``): people walking through rooms, entrances and streets.

Each camera's held-out photos and strangers (dealt as for the portrait videos) walk through one rendered
scene each (:mod:`peep.lab.scenes.render`): several at once, faces 30-160 px high, crossing and
covering each other, under a camera's noise, blur and H.264. The ground truth beside each video says
whose face each released box is (:func:`peep.lab.scenes.detectors.match_frame`), so a release is
judged against the person it shows, not against who was scheduled in front of the camera.

What is judged, per **pass** (one person crossing once) and per face-height bin of the pass's largest
face at least half visible:

identified
    an enrolled person's pass whose decisions named them, and never anyone else;
named
    a stranger's pass any decision of which named an enrolled person;
not decided
    a pass no decision was made on (never detected in a clear view, or gone before the release policy's
    first frames): counted as not identified.

Detection recall per bin comes from running the cameras' own detector over the same videos here
(:func:`peep.lab.scenes.detectors.evaluate`). A few frames go into the report with the ground truth's
boxes and what was decided on each released face, so a reader sees what the cameras saw.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from peep.lab.demo.scenario import Appearance, CameraScript
from peep.lab.demo.steps.context import HEARTBEAT_S, RunContext
from peep.lab.scenes.detectors import HEIGHT_BINS
from peep.server.progress import Progress

#: The settings the cameras' scenes cycle through.
SETTINGS = ("entrance", "room", "street")
#: The pass-height bins of the summary: the detectors' (by a pass's largest face), pixels: [low, high).
PASS_BINS = HEIGHT_BINS
#: The end-to-end target is read on passes with a face at least this high.
TARGET_FACE_PX = 60.0
#: Annotated frames in the report.
ANNOTATED_FRAMES = 4


def find_yunet(data_home: str | None) -> Path | None:
    """YuNet's file with its pinned SHA-256 (:func:`peep.edge.models.find_model`), also looked for in ``models/``
    of the team folder that holds the LFW copy (``<team>/datasets/lfw_home``)."""
    from peep.edge.models import find_model
    from peep.server.datasets import ensure_lfw

    try:
        team = [ensure_lfw(data_home).resolve().parents[2] / "models"]
    except (FileNotFoundError, IndexError, ValueError):
        team = []
    return find_model("yunet", team)


def detector_settings(data_home: str | None) -> dict[str, Any]:
    """The cameras' ``[detector]`` for scenes: YuNet where its file is, else dlib's HOG upsampled once."""
    model = find_yunet(data_home)
    if model is not None:
        return {"kind": "yunet", "model_path": str(model)}
    # finds 60 % of 30-45 px faces and about 90 % above (docs/CAMERAS.md), at 4-5 times YuNet's CPU
    return {"kind": "hog", "detect_width": None, "upsample": 1, "min_size": 8}


def compose_scene_videos(ctx: RunContext, scripts: list[CameraScript]) -> list[CameraScript]:
    """Render each camera's appearances as one scene (each person walks through once); the scripts, with
    their scene, frame count and the appearances' frames set from the ground truth."""
    from peep.lab.scenes.render import ScenePerson, SceneSpec, render_scene

    o = ctx.opts
    vdir = ctx.out / "videos"
    vdir.mkdir(exist_ok=True)

    def one(k: int, script: CameraScript) -> CameraScript:
        people = [
            ScenePerson(name=a.person, role="enrolled" if a.enrolled else "stranger", photos=(str(a.image),))
            for a in script.appearances
        ]
        spec = SceneSpec(setting=SETTINGS[k % len(SETTINGS)], fps=o.fps, max_people=3, seed=1000 * o.seed + k)
        description = render_scene(spec, people, vdir, name=script.device_id, each_once=True)
        passes = description["passes"]
        appearances = [
            Appearance(person=a.person, enrolled=a.enrolled, image=a.image, start=p["first_frame"],
                       stop=p["last_frame"] + 1)
            for a, p in zip(script.appearances, passes, strict=True)
        ]  # fmt: skip
        return CameraScript(
            device_id=script.device_id,
            transport=script.transport,
            video=vdir / f"{script.device_id}.mp4",
            n_frames=int(description["frames"]),
            appearances=appearances,
            scene=vdir / script.device_id,
        )

    out: list[CameraScript | None] = [None] * len(scripts)
    with Progress("    scenes rendered", len(scripts), heartbeat=HEARTBEAT_S) as bar, \
            ThreadPoolExecutor(max_workers=min(len(scripts), os.cpu_count() or 1)) as pool:  # fmt: skip
        bar.update(0)
        jobs = {pool.submit(one, k, s): k for k, s in enumerate(scripts)}
        for done in as_completed(jobs):
            out[jobs[done]] = done.result()
            bar.advance()
    return [s for s in out if s is not None]


#: On scenes with YuNet, the cameras decide only on faces YuNet scored at least this: its score falls as a face is
#: covered (median 0.78 under half visible, 0.92 wholly visible), and a decision on a face emerging from behind a
#: desk or a person called the person unknown (docs/CAMERAS.md).
SCENE_MIN_FACE_SCORE = 0.9


def camera_min_face_score(opts: Any, detector_kind: str | None) -> float | None:
    """The cameras' ``recognition.min_face_score``: ``--min-face-score`` (0: every face); else, on scenes with
    YuNet, :data:`SCENE_MIN_FACE_SCORE`; else every face (None)."""
    if opts.min_face_score is not None:
        return opts.min_face_score or None
    return SCENE_MIN_FACE_SCORE if opts.scenes and detector_kind == "yunet" else None


class SceneTruth:
    """Whose face a released box is, read from a scene's ground truth."""

    def __init__(self, scene: Path) -> None:
        from peep.lab.scenes.render import read_ground_truth

        self.frames = {int(r["frame"]): r["faces"] for r in read_ground_truth(scene.with_suffix(".gt.jsonl"))}

    def face(self, frame: int, box: Sequence[float]) -> dict[str, Any] | None:
        """The ground-truth face the box ``(x, y, w, h)`` shows in ``frame``, or None (a false detection)."""
        from peep.core.imaging import FaceBox
        from peep.lab.scenes.detectors import match_frame

        faces = self.frames.get(frame, [])
        x, y, w, h = (float(v) for v in box)
        taken, _ = match_frame(faces, [FaceBox(x=x, y=y, w=w, h=h, score=1.0)])
        hit = [f for f, i in zip(faces, taken, strict=True) if i is not None]
        return hit[0] if hit else None


def _bin(h: float | None) -> str | None:
    from peep.lab.scenes.detectors import bin_label

    if h is None:
        return None
    for lo, hi in PASS_BINS:
        if lo <= h < hi:
            return bin_label(lo, hi)
    return None


def judge_passes(
    scripts: list[CameraScript], releases: dict[str, dict[str, Any]], events: dict[str, Any]
) -> dict[str, Any]:
    """Each pass's decisions judged against the person it shows; pooled and per face-height bin."""

    decisions: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for mid, r in releases.items():
        ev = events.get(mid)
        if ev is not None and r.get("pass") is not None:
            decisions[(r["device"], int(r["pass"]))].append(ev)
    rows: list[dict[str, Any]] = []
    for s in scripts:
        if s.scene is None:
            continue
        description = json.loads(s.scene.with_suffix(".json").read_text())
        for p in description["passes"]:
            evs = decisions.get((s.device_id, int(p["track"])), [])
            named = [ev.subject for ev in evs if not ev.unknown]
            enrolled = p["role"] == "enrolled"
            rows.append({
                "device": s.device_id,
                "pass": int(p["track"]),
                "person": p["name"],
                "enrolled": enrolled,
                "max_face_px": p["max_face_px"] if p["faces"] else None,
                "decisions": len(evs),
                "named": named,
                "identified": enrolled and bool(named) and all(n == p["name"] for n in named),
                "stranger_named": (not enrolled) and bool(named),
            })  # fmt: skip

    def pooled(sel: list[dict[str, Any]]) -> dict[str, Any]:
        enr = [r for r in sel if r["enrolled"]]
        stra = [r for r in sel if not r["enrolled"]]
        return {
            "enrolled_passes": len(enr),
            "identified": sum(r["identified"] for r in enr),
            "identified_rate": sum(r["identified"] for r in enr) / len(enr) if enr else None,
            "enrolled_not_decided": sum(r["decisions"] == 0 for r in enr),
            "enrolled_misnamed": sum(any(n != r["person"] for n in r["named"]) for r in enr),
            "stranger_passes": len(stra),
            "strangers_named": sum(r["stranger_named"] for r in stra),
            "strangers_named_rate": sum(r["stranger_named"] for r in stra) / len(stra) if stra else None,
        }

    seen = [r for r in rows if r["max_face_px"] is not None]
    per_bin = {}
    from peep.lab.scenes.detectors import bin_label

    for lo, hi in PASS_BINS:
        per_bin[bin_label(lo, hi)] = pooled([r for r in seen if _bin(r["max_face_px"]) == bin_label(lo, hi)])
    return {
        "passes": len(rows),
        "never_half_visible": len(rows) - len(seen),
        "all": pooled(seen),
        f"face_{TARGET_FACE_PX:g}_px_up": pooled([r for r in seen if r["max_face_px"] >= TARGET_FACE_PX]),
        "per_bin": per_bin,
        "rows": rows,
    }


def detection_recall(scripts: list[CameraScript], settings: dict[str, Any]) -> dict[str, Any]:
    """The cameras' detector on their own scenes, here: recall per face-height bin and false detections."""
    from peep.edge.config import DetectorConfig
    from peep.edge.detection import build_detector
    from peep.lab.scenes.detectors import evaluate

    detector = build_detector(DetectorConfig(**settings))
    scenes = [s.scene for s in scripts if s.scene is not None]
    result = evaluate(detector, scenes)
    return {k: result[k] for k in ("frames", "faces", "recall", "recall_45_up", "false_per_1000_frames",
                                   "cpu_ms_per_frame")}  # fmt: skip


def annotate_frames(
    scripts: list[CameraScript], releases: dict[str, dict[str, Any]], events: dict[str, Any], out: Path
) -> list[str]:
    """A few frames with released faces, drawn with the ground truth and each decision; their file names.

    Frames with the most people in view are chosen, one per camera in turn. Green: the ground truth's face
    boxes (enrolled people and strangers alike); a released box is yellow when its decision was right, red
    when it named the wrong person or a stranger.
    """
    import cv2

    by_frame: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for mid, r in releases.items():
        if r.get("box") is not None:
            by_frame[(r["device"], int(r["frame"]))].append({**r, "event": events.get(mid)})
    folder = out / "frames"
    folder.mkdir(exist_ok=True)
    names: list[str] = []
    per_camera = {s.device_id: s for s in scripts if s.scene is not None}
    truths = {d: SceneTruth(s.scene) for d, s in per_camera.items() if s.scene is not None}
    ranked = sorted(by_frame, key=lambda k: (-len(truths[k[0]].frames.get(k[1], [])) if k[0] in truths else 0, k))
    chosen: list[tuple[str, int]] = []
    for device in per_camera:
        for key in ranked:
            if key[0] == device and key not in chosen:
                chosen.append(key)
                break
    for key in ranked:
        if len(chosen) >= ANNOTATED_FRAMES:
            break
        if key not in chosen and key[0] in truths:
            chosen.append(key)
    for device, frame in chosen[:ANNOTATED_FRAMES]:
        cap = cv2.VideoCapture(str(per_camera[device].video))
        cap.set(cv2.CAP_PROP_POS_FRAMES, frame)
        ok, image = cap.read()
        cap.release()
        if not ok:
            continue
        for f in truths[device].frames.get(frame, []):
            x, y, w, h = (round(float(v)) for v in f["box"])
            cv2.rectangle(image, (x, y), (x + w, y + h), (60, 200, 60), 1)
            cv2.putText(image, f"{'enrolled' if f['role'] == 'enrolled' else 'stranger'} {h} px", (x, y + h + 12),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.38, (60, 200, 60), 1, cv2.LINE_AA)  # fmt: skip
        for r in by_frame[(device, frame)]:
            x, y, w, h = (round(float(v)) for v in r["box"])
            ev = r["event"]
            said = "undecided" if ev is None else ("unknown" if ev.unknown else str(ev.subject))
            right = ev is not None and (
                (r.get("enrolled") and not ev.unknown and ev.subject == r.get("person"))
                or (r.get("enrolled") is False and ev.unknown)
                or (r.get("enrolled") and ev.unknown)
            )
            colour = (0, 215, 255) if right else (40, 40, 230)
            cv2.rectangle(image, (x - 2, y - 2), (x + w + 2, y + h + 2), colour, 2)
            cv2.putText(image, f"decided: {said}", (x, max(12, y - 6)), cv2.FONT_HERSHEY_SIMPLEX, 0.42, colour, 1,
                        cv2.LINE_AA)  # fmt: skip
        name = f"{device}-{frame:05d}.png"
        cv2.imwrite(str(folder / name), image)
        names.append(f"frames/{name}")
    return names


def scene_summary(
    ctx: RunContext,
    scripts: list[CameraScript],
    releases: dict[str, dict[str, Any]],
    events: dict[str, Any],
    detector: dict[str, Any],
) -> dict[str, Any]:
    """The summary's ``scenes``: passes judged, detection recall, annotated frames."""
    judged = judge_passes(scripts, releases, events)
    (ctx.out / "passes.json").write_text(json.dumps(judged.pop("rows"), indent=1) + "\n")
    return {
        "detector": {k: v for k, v in detector.items() if k != "model_path"},
        # the cameras decide only on faces the detector scored at least this (None: every face)
        "min_face_score": camera_min_face_score(ctx.opts, detector.get("kind")),
        "detection": detection_recall(scripts, detector),
        **judged,
        "frames": annotate_frames(scripts, releases, events, ctx.out),
        "target": {
            "face_px": TARGET_FACE_PX,
            "identified_rate_at_least": 0.90,
            "strangers_named_rate_at_most": 0.02,
        },
    }


__all__ = [
    "PASS_BINS",
    "SceneTruth",
    "annotate_frames",
    "compose_scene_videos",
    "detection_recall",
    "detector_settings",
    "find_yunet",
    "judge_passes",
    "scene_summary",
]
