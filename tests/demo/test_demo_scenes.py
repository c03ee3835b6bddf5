"""`peep demo --scenes`: the cameras watch rendered scenes, and each release is judged against the face it shows.

A reduced run (three subjects, four strangers, two cameras, no door, deciding on the device) end to end,
and the pass judgement on hand-made cases.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from peep.lab.demo import summary_lines
from peep.lab.demo.scenario import CameraScript
from peep.lab.demo.steps.scenes import judge_passes
from peep.lab.scenes.render import read_ground_truth
from peep.server.cli import main

pytest.importorskip("av", reason="PyAV is the lab's H.264 encoder; CI installs the lab")

SMALL = ["--subjects", "3", "--enrol-images", "8", "--probe-images", "2", "--strangers", "4", "--cameras", "2",
         "--qbbs-epsilon", "20", "--public-max-faces", "5", "--no-door", "--mqtt", "off", "--scenes",
         "--enrol-as-seen", "0.5", "--device-fpir", "0.02"]  # fmt: skip


@pytest.fixture(scope="module")
def scene_run(tmp_path_factory: pytest.TempPathFactory, data_home: str) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo-scenes") / "run"
    rc = main(["demo", "--data-home", data_home, "--out", str(out), *SMALL])
    assert rc == 0
    return out, json.loads((out / "summary.json").read_text())


@pytest.mark.demo
@pytest.mark.processes
def test_every_person_walks_through_a_scene_once_and_every_pass_is_judged(scene_run) -> None:
    out, s = scene_run
    sc = s["scenes"]
    # the devices' thresholds were set on the calibration people as the scenes' camera sees a face, and
    # those drawn photos were not kept
    assert s["data"]["calibration_population"] == "lfw_singles" and s["data"]["calibration_views"] == "scenes"
    assert not (out / "server" / "calibration-views").exists() and not list((out / "server").rglob("*.png"))
    # half of each subject's 8 enrolment photos were drawn as the camera sees a face, released, and deleted
    assert s["data"]["enrolment_as_seen"] == 0.5 and s["data"]["device_fpir"] == 0.02
    folders = sorted((out / "enrol").iterdir())
    assert len(folders) == 3 and all(sorted(f.is_symlink() for f in d.iterdir()) == [True] * 4 for d in folders)
    assert any("a camera names 2.0 % of them" in line for line in summary_lines(s))
    # 3 subjects x 2 held-out photos and 4 strangers, each dealt to one camera and walking through once
    assert sc["passes"] == 10
    described = [json.loads(p.read_text()) for p in sorted((out / "videos").glob("cam-*.json"))]
    assert len(described) == 2 and sum(len(d["passes"]) for d in described) == 10
    rows = json.loads((out / "passes.json").read_text())
    assert len(rows) == 10 and sum(r["enrolled"] for r in rows) == 6
    seen = [r for r in rows if r["max_face_px"] is not None]
    per_bin = sc["per_bin"].values()
    assert sum(c["enrolled_passes"] + c["stranger_passes"] for c in per_bin) == len(seen)
    assert sc["all"]["identified"] == sum(r["identified"] for r in seen if r["enrolled"])
    assert sc["detection"]["frames"] == sum(d["frames"] for d in described)
    assert sc["detection"]["recall_45_up"] is not None


@pytest.mark.demo
@pytest.mark.processes
def test_each_release_is_the_face_its_box_shows_and_no_track_holds_two_people(scene_run) -> None:
    """Read from the ground truth: every released box is matched to the face under it, and a device's track
    never released two people's faces."""
    out, _ = scene_run
    releases = json.loads((out / "releases.json").read_text())
    assert releases and all(r["box"] is not None for r in releases)
    truth = {d: read_ground_truth(out / "videos" / f"{d}.gt.jsonl") for d in {r["device"] for r in releases}}
    people_of_track: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in releases:
        if r["person"] is None:  # a box on no face: a false detection
            continue
        faces = {f["track"]: f for f in truth[r["device"]][r["frame"]]["faces"]}
        face = faces[r["pass"]]
        assert face["identity"] == r["person"] and face["height_px"] == r["face_px"]
        x, y, w, h = r["box"]
        fx, fy, fw, fh = face["box"]
        assert abs((x + w / 2) - (fx + fw / 2)) <= fh / 2 and abs((y + h / 2) - (fy + fh / 2)) <= fh / 2
        people_of_track[(r["device"], r["track"])].add(r["person"])
    assert people_of_track and all(len(p) == 1 for p in people_of_track.values()), people_of_track


@pytest.mark.demo
@pytest.mark.processes
def test_the_report_shows_the_scenes_annotated_frames(scene_run) -> None:
    out, s = scene_run
    frames = s["scenes"]["frames"]
    assert 1 <= len(frames) <= 4
    for name in frames:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.html").read_text()
    assert "What the cameras saw: scenes, judged per pass" in report
    assert report.count("data:image/png;base64,") >= len(frames)


def _scene(tmp_path: Path, passes: list[dict]) -> CameraScript:
    base = tmp_path / "cam-1"
    base.with_suffix(".json").write_text(json.dumps({"passes": passes}))
    return CameraScript(device_id="cam-1", transport="grpc", video=base.with_suffix(".mp4"), n_frames=10, scene=base)


def test_a_pass_is_identified_only_when_its_decisions_name_the_person_and_no_one_else(tmp_path: Path) -> None:
    def p(track: int, name: str, role: str, px: float) -> dict:
        return {"track": track, "name": name, "role": role, "faces": 5, "max_face_px": px}

    script = _scene(tmp_path, [
        p(1, "Ann", "enrolled", 80), p(2, "Bob", "enrolled", 80), p(3, "Cy", "enrolled", 40),
        p(4, "Dee", "enrolled", 120), p(5, "Eve", "stranger", 80), p(6, "Fay", "stranger", 50),
    ])  # fmt: skip
    said = {  # message id -> (pass, decision: a subject or None for unknown)
        "m1": (1, "Ann"), "m2": (1, None),  # named, once unknown: identified
        "m3": (2, "Bob"), "m4": (2, "Ann"),  # named once, misnamed once: not identified
        "m5": (3, None),  # unknown only
        "m6": (5, "Ann"), "m7": (6, None),  # a stranger named; one not
    }  # fmt: skip
    releases = {m: {"device": "cam-1", "pass": k} for m, (k, _) in said.items()}
    events = {m: SimpleNamespace(unknown=who is None, subject=who) for m, (_, who) in said.items()}
    judged = judge_passes([script], releases, events)
    rows = {r["pass"]: r for r in judged["rows"]}
    assert [rows[k]["identified"] for k in (1, 2, 3, 4)] == [True, False, False, False]
    assert rows[4]["decisions"] == 0  # never decided: not identified
    assert [rows[k]["stranger_named"] for k in (5, 6)] == [True, False]
    up = judged["face_60_px_up"]
    assert up["enrolled_passes"] == 3 and up["identified"] == 1 and up["enrolled_misnamed"] == 1
    assert up["enrolled_not_decided"] == 1 and up["strangers_named"] == 1 and up["stranger_passes"] == 1
    assert judged["per_bin"]["30-45"]["enrolled_passes"] == 1 and judged["per_bin"][">=110"]["identified"] == 0


def test_scene_cameras_decide_only_on_faces_yunet_does_not_doubt_unless_told_otherwise() -> None:
    from peep.lab.demo.options import DemoOptions
    from peep.lab.demo.steps.scenes import SCENE_MIN_FACE_SCORE, camera_min_face_score

    scenes = DemoOptions(out=Path("unused"), scenes=True)
    assert camera_min_face_score(scenes, "yunet") == SCENE_MIN_FACE_SCORE == 0.9
    assert camera_min_face_score(scenes, "hog") is None  # dlib's SVM scores are on another scale
    assert camera_min_face_score(DemoOptions(out=Path("unused")), "yunet") is None  # the portraits: unchanged
    assert camera_min_face_score(DemoOptions(out=Path("unused"), scenes=True, min_face_score=0.0), "yunet") is None
    assert camera_min_face_score(DemoOptions(out=Path("unused"), min_face_score=0.8), "haar") == 0.8
