"""Scenes with ground truth (peep.lab.scenes): the video and its ground truth agree, frame by frame.

A short scene is rendered once for the module (LFW photos of three people, 4 s at 10 frames/s) and read
back through OpenCV's FFmpeg decoder, as a camera's stream is; dlib's HOG detector checks that the ground
truth's boxes sit where the faces are.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from peep.core.imaging import FaceBox
from peep.lab.scenes.detectors import evaluate, match_frame
from peep.lab.scenes.render import SceneSpec, _visible, lfw_people, read_ground_truth, render_scene

pytest.importorskip("av", reason="PyAV is the lab's H.264 encoder; CI installs the lab")

PEOPLE = ("Colin_Powell", "Tony_Blair", "Ariel_Sharon")
SPEC = SceneSpec(seconds=4.0, fps=10.0, max_people=2, face_px=(60, 130), seed=3, setting="entrance")


@pytest.fixture(scope="module")
def scene(data_home: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("scene")
    people = lfw_people(data_home, PEOPLE, role="enrolled", max_photos=3)
    description = render_scene(SPEC, people, out, name="s")
    return out / "s", description


def test_the_video_and_its_ground_truth_have_the_same_frames(scene) -> None:
    base, description = scene
    cap = cv2.VideoCapture(str(base.with_suffix(".mp4")))
    frames = []
    while True:
        ok, image = cap.read()
        if not ok:
            break
        frames.append(image.shape)
    cap.release()
    truth = read_ground_truth(base.with_suffix(".gt.jsonl"))
    assert len(frames) == len(truth) == SPEC.n_frames == 40
    assert set(frames) == {(480, 640, 3)}
    assert [r["frame"] for r in truth] == list(range(40))
    written = json.loads(base.with_suffix(".json").read_text())
    assert written == json.loads(json.dumps(description)) and written["spec"]["seed"] == 3
    tracks = {p["track"]: p for p in description["passes"]}
    assert tracks, "nobody walked through"
    for record in truth:
        for face in record["faces"]:
            p = tracks[face["track"]]
            assert p["first_frame"] <= record["frame"] <= p["last_frame"]
            assert face["identity"] == p["name"] and face["identity"] in {n.replace("_", " ") for n in PEOPLE}
            assert face["role"] == "enrolled" and 0.0 < face["visible"] <= 1.0
            # heights stay within the pass's range (a turn narrows the box, never its height)
            assert 60 * 0.99 <= face["height_px"] <= 130 * 1.01
            x, y, w, h = face["box"]
            assert x + w > 0 and y + h > 0 and x < 640 and y < 480 and w <= h


def test_the_ground_truth_boxes_are_where_the_faces_are(scene) -> None:
    from peep.edge.detection import DlibHogFaceDetector

    pytest.importorskip("dlib", reason="dlib-bin is the edge's [dlib] extra; CI installs it")
    base, _ = scene
    truth = read_ground_truth(base.with_suffix(".gt.jsonl"))
    detector = DlibHogFaceDetector(upsample=0)
    cap = cv2.VideoCapture(str(base.with_suffix(".mp4")))
    clear = found = 0
    for record in truth:
        ok, image = cap.read()
        assert ok
        big = [f for f in record["faces"] if f["visible"] >= 0.95 and f["height_px"] >= 90 and f["box"][0] >= 0
               and f["box"][0] + f["box"][2] <= 640]  # fmt: skip
        if not big:
            continue
        taken, _ = match_frame(big, detector.detect(image))
        clear += len(big)
        found += sum(t is not None for t in taken)
    cap.release()
    assert clear >= 10, "too few large, clear faces to judge the boxes"
    assert found / clear >= 0.8, (found, clear)


def test_matching_follows_the_stated_rule() -> None:
    truth = [{"box": [100, 100, 50, 60], "visible": 1.0, "height_px": 60}]
    near = FaceBox(x=105, y=110, w=45, h=45, score=1.0)  # centre 127.5,132.5 vs 125,130; height 0.75
    assert match_frame(truth, [near]) == ([0], 0)
    far = FaceBox(x=200, y=100, w=50, h=60)  # 100 px off: false
    assert match_frame(truth, [far]) == ([None], 1)
    tiny = FaceBox(x=120, y=125, w=10, h=10)  # in place but a sixth of the height: false
    assert match_frame(truth, [tiny]) == ([None], 1)
    # two detections of one face: the better-scored one matches, the other is false
    assert match_frame(truth, [FaceBox(x=104, y=108, w=45, h=45, score=0.2), near]) == ([1], 1)


def test_visibility_counts_what_covers_the_box() -> None:
    fixtures = np.zeros((100, 100), np.float32)
    box = (10.0, 10.0, 20.0, 20.0)
    assert _visible(box, [], fixtures) == pytest.approx(1.0)
    half = np.ones((20, 10), np.float32)  # covers the left half of the box
    assert _visible(box, [(10, 10, half)], fixtures) == pytest.approx(0.5)
    fixtures[:, :] = 1.0
    assert _visible(box, [], fixtures) == pytest.approx(0.0)
    # half outside the frame
    assert _visible((-10.0, 10.0, 20.0, 20.0), [], np.zeros((100, 100), np.float32)) == pytest.approx(0.5)


def test_evaluate_counts_every_visible_face_once(scene) -> None:
    base, _ = scene
    truth = read_ground_truth(base.with_suffix(".gt.jsonl"))

    class Nothing:
        def detect(self, image):
            return []

    result = evaluate(Nothing(), [base])
    visible = sum(1 for r in truth for f in r["faces"] if f["visible"] >= 0.5)
    assert sum(result["faces"].values()) == visible and result["frames"] == 40
    assert result["false_detections"] == 0
    assert all(v in (None, 0.0) for v in result["recall"].values())


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("max_people", 5, "max_people: expected 1-4"), ("setting", "moon", "setting: expected room or entrance"),
     ("face_px", (200, 100), "face_px: expected 8 <= low <= high"), ("bitrate", 10, "bitrate: expected")],
)  # fmt: skip
def test_a_bad_scene_names_the_field(field, value, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        SceneSpec(**{field: value})


def test_the_edge_tracker_never_puts_two_people_in_one_track(scene) -> None:
    """No track holds two ground-truth people's faces: one track is one appearance's releases and budget."""
    from peep.edge.detection import DlibHogFaceDetector
    from peep.edge.tracking import Tracker
    from peep.lab.scenes.detectors import evaluate_tracks

    pytest.importorskip("dlib", reason="dlib-bin is the edge's [dlib] extra; CI installs it")
    from peep.edge.embedding import make_encoder

    base, _ = scene
    detector = DlibHogFaceDetector(upsample=0)
    by_position = evaluate_tracks(detector, [base], Tracker)
    assert by_position["passes_seen"] >= 2
    assert by_position["mixed_tracks"] == 0 and by_position["mixed_faces"] == 0, by_position["per_scene"]
    # as a device with a descriptor bundle tracks: the faces compared where positions are unsure
    by_face = evaluate_tracks(detector, [base], Tracker, encoder=make_encoder())
    assert by_face["mixed_tracks"] == 0 and by_face["mixed_released_tracks"] == 0, by_face["per_scene"]
    # described where needed, not at every detection
    assert 0 < by_face["descriptors_per_detection"] < 0.8, by_face["descriptors_per_detection"]
    assert by_face["passes_seen"] == by_position["passes_seen"]


def test_switches_fragments_and_mixed_tracks_are_counted_from_the_ground_truth(scene) -> None:
    """A tracker that gives every face of a frame the id of the face's rank in that frame: swaps when people cross."""
    from peep.lab.scenes.detectors import evaluate_tracks

    base, _ = scene
    truth = read_ground_truth(base.with_suffix(".gt.jsonl"))

    class Oracle:  # detects exactly the ground truth's faces, in the ground truth's order
        def __init__(self) -> None:
            self.frame = 0

        def detect(self, image):
            faces = truth[self.frame]["faces"]
            self.frame += 1
            return [FaceBox(x=f["box"][0], y=f["box"][1], w=f["box"][2], h=f["box"][3]) for f in faces]

    class ByPass:  # the ideal tracker: one track per pass
        def update(self, boxes, t, shape=None):
            faces = truth[round(t * SPEC.fps)]["faces"]
            return [type("T", (), {"id": f"p{f['track']}"})() for f in faces]

    class ByRank:  # the first box of every frame is track "a", the second "b": people are mixed
        def update(self, boxes, t, shape=None):
            return [type("T", (), {"id": "ab"[i] if i < 2 else f"x{i}"})() for i in range(len(boxes))]

    ideal = evaluate_tracks(Oracle(), [base], ByPass)
    assert ideal["identity_switches"] == ideal["fragments"] == ideal["mixed_tracks"] == 0
    passes = {f["track"] for r in truth for f in r["faces"]}
    assert ideal["passes_seen"] == len(passes)
    bad = evaluate_tracks(Oracle(), [base], ByRank)
    two_at_once = any(len(r["faces"]) >= 2 for r in truth)
    assert two_at_once, "the scene has no frame with two people"
    assert bad["mixed_tracks"] >= 1 and bad["mixed_faces"] >= 1


def test_each_once_walks_every_person_through_once_in_order(data_home: str, tmp_path: Path) -> None:
    """A demo camera's people: each once, with their first photo, the scene as long as it takes."""
    people = lfw_people(data_home, PEOPLE, role="stranger", max_photos=2)
    spec = SceneSpec(seconds=1.0, fps=10.0, max_people=2, face_px=(60, 100), seed=5)
    description = render_scene(spec, people, tmp_path, name="q", each_once=True)
    passes = description["passes"]
    assert [p["name"] for p in passes] == [q.name for q in people]
    assert [p["photo"] for p in passes] == [Path(q.photos[0]).name for q in people]
    truth = read_ground_truth(tmp_path / "q.gt.jsonl")
    # longer than spec.seconds, and the video, its ground truth and the description agree
    assert description["frames"] == len(truth) == max(p["last_frame"] for p in passes) + 1 > spec.n_frames
    cap = cv2.VideoCapture(str(tmp_path / "q.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == len(truth)
    cap.release()


def test_held_out_scene_seeds_are_read_and_bad_ones_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from peep.lab.bench.detectors import scene_seeds

    monkeypatch.delenv("PEEP_BENCH_SCENE_SEEDS", raising=False)
    assert scene_seeds(False) == (0, 1) and scene_seeds(True) == (0,)
    monkeypatch.setenv("PEEP_BENCH_SCENE_SEEDS", "2, 3")
    assert scene_seeds(False) == (2, 3)
    for bad in ("x", "-1"):
        monkeypatch.setenv("PEEP_BENCH_SCENE_SEEDS", bad)
        with pytest.raises(ValueError, match="PEEP_BENCH_SCENE_SEEDS: expected comma-separated integers"):
            scene_seeds(False)


def test_a_face_held_out_of_every_track_is_counted_as_held_not_as_a_switch() -> None:
    """One pass in track "a", its face held out for a frame (a one-frame id of its own), then in "a" again."""
    from peep.lab.scenes.tracks import TrackJudge

    faces = [{"track": 1, "identity": "A", "visible": 1.0}]
    frames = [("a", False), ("held-1", True), ("a", False), ("a", False)]
    judge = TrackJudge()
    judge.start("one pass")
    for tid, held in frames:
        judge.feed(faces, [0], [tid], [not held], [held])
    s = judge.summary()
    assert (s["identity_switches"], s["fragments"], s["held_faces"], s["tracks"]) == (0, 0, 1, 1)
    # the same ids reported as tracks: the pass is split there and back
    plain = TrackJudge()
    plain.start("one pass")
    for tid, _ in frames:
        plain.feed(faces, [0], [tid])
    s = plain.summary()
    assert (s["identity_switches"], s["fragments"], s["held_faces"]) == (2, 1, 0)
