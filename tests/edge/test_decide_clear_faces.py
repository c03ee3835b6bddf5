"""A camera deciding on the device fuses only faces its detector does not doubt (``recognition.min_face_score``):
a face emerging from behind a desk or another person scores low, and a decision on it calls the person unknown."""

from __future__ import annotations

import numpy as np
import pytest
from peep.core.imaging import FaceBox
from peep.core.wire import decode_template
from peep.edge.agent import Agent
from peep.edge.capture import Frame
from peep.edge.config import RecognitionConfig, load_config
from peep_testing.devicemodel import random_device_model

#: One face walking across, its detector score frame by frame: covered at first, then clear, covered, clear.
SCORES = [0.70, 0.75, 0.95, 0.60, 0.93, 0.96, 0.97, 0.98]


class ScriptedDetector:
    def __init__(self, scores: list[float]) -> None:
        self.scores, self.calls = scores, 0

    def detect(self, image):
        i, self.calls = self.calls, self.calls + 1
        if i >= len(self.scores):
            return []
        return [FaceBox(x=200 + 4 * i, y=150, w=90, h=90, score=self.scores[i])]


def _run(make_config, edge_bundle, edge_keys, **recognition):
    cfg = load_config(make_config(
        privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6, "min_track_frames": 2,
                 "window_seconds": 60.0},
        recognition={"decide": "device", "epsilon_label": 8.0, "fuse_frames": 2, **recognition},
    ))  # fmt: skip
    agent = Agent(cfg, environ={})
    pipeline = agent.open()
    assert agent.model_store.offer(random_device_model(edge_bundle, edge_keys["private"], serial=3), source="test")
    pipeline.detector = ScriptedDetector(SCORES)
    pipeline.refiner = None  # the scripted boxes are the faces
    rng = np.random.default_rng(0)
    got = []
    for i in range(len(SCORES) + 2):
        image = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
        got += [(i, r) for r in pipeline.process(Frame(image=image, timestamp=i / 10.0, index=i))]
    return got


def test_a_camera_waits_for_faces_its_detector_does_not_doubt(make_config, edge_bundle, edge_keys):
    got = _run(make_config, edge_bundle, edge_keys, min_face_score=0.9)
    assert len(got) == 1  # one decision per track window
    at, rel = got[0]
    # frames 2 and 4 are the first two scored >= 0.9: decided at 4 on both, nothing of frames 0, 1 and 3
    assert at == 4 and rel.box.score == pytest.approx(0.93)
    assert decode_template(rel.payload).decision.frames_fused == 2


def test_without_min_face_score_a_camera_decides_on_its_first_faces(make_config, edge_bundle, edge_keys):
    got = _run(make_config, edge_bundle, edge_keys)
    assert [at for at, _ in got] == [1] and got[0][1].box.score == pytest.approx(0.75)
    assert decode_template(got[0][1].payload).decision.frames_fused == 2


def test_min_face_score_is_a_detector_score():
    with pytest.raises(ValueError, match="min_face_score"):
        RecognitionConfig(min_face_score=1.5)
    assert RecognitionConfig().min_face_score is None
