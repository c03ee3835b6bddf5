"""A door deciding on the device: the claim scored with the site's signed model on the face's clean projection,
no template released, no server asked, the access record spooled."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peep.core.imaging import primary_face
from peep.edge.door import DoorController
from peep_testing.door import RecordingLock, frames


@pytest.fixture
def device_door(make_config, edge_keys):
    """A door that decides on the device, and a signed model whose 'alice' is the video's person."""
    from peep.edge.agent import Agent
    from peep.edge.config import load_config

    cfg = make_config(privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6},
                      door={"enabled": True, "decision": "device", "lock": "command",
                            "open_command": ["true"], "close_command": ["true"]})  # fmt: skip
    agent = Agent(load_config(cfg), environ={})
    pipeline = agent.open()
    yield agent, pipeline
    agent.shutdown(drain_timeout=0)


def _device_model(agent, pipeline, video, edge_keys, serial=1):
    """A linear model (scaled cosine to each class direction) with alice = the video's face, bob = elsewhere."""
    from peep.core.devicemodel import build_device_model_files, class_key_file
    from peep.server.recognition.export import _linear_onnx

    read = frames(video["path"], limit=3)
    frame = read()
    box = primary_face(pipeline.detector.detect(frame.image), frame.image.shape)
    u = pipeline.project_face(frame, box)
    rng = np.random.default_rng(0)
    k = u.shape[0]
    others = rng.standard_normal((3, k))
    means = np.vstack([u, others / np.linalg.norm(others, axis=1, keepdims=True)])  # alice, bob, carol, background
    keyed = agent.site_key.apply(means) if agent.site_key is not None else means
    onnx = _linear_onnx(40.0 * keyed.T, np.zeros(4))
    public = rng.standard_normal((400, k))
    files = build_device_model_files(
        onnx=onnx, calibration=(public / np.linalg.norm(public, axis=1, keepdims=True)).astype(np.float32),
        subjects=["alice", "bob", "carol", ""], background_index=3, serial=serial, model_version="v0001",
        bundle_id=pipeline.releaser.bundle_id, key_id=pipeline.releaser.key_id, n_components=k, trained_at=1.0,
        signing_key=edge_keys["private"], extra={"domain": "unit"}, class_key=bytes(16),
    )  # fmt: skip
    return files | class_key_file(bytes(16))  # as GetDeviceModel hands it to a door


def test_a_door_deciding_on_the_device_opens_for_the_face_without_the_server_and_spools_the_record(
    device_door, one_person_video, edge_keys
):
    from peep.core.wire import decode_template
    from peep.edge.door_session import DoorSession

    agent, pipeline = device_door
    lock = RecordingLock()
    ctl = DoorController("cam-1", lock, open_s=0.05, decision_timeout_s=30.0)
    # No verifier at all: no server to ask. Without a model the door stays locked.
    session = DoorSession(pipeline, agent.accountant, ctl, None, face_timeout_s=10.0, decisions=agent.decisions)
    out = session.handle("alice", frames(one_person_video["path"]))
    assert not out.opened and out.reason == "no_model" and lock.events.count("open") == 0
    assert agent.model_store.offer(_device_model(agent, pipeline, one_person_video, edge_keys), source="test")
    out = session.handle("alice", frames(one_person_video["path"]))
    assert out.opened, out
    assert {"verify", "project", "claim_to_lock"} <= set(session.last_timing.stages)
    time.sleep(0.1)
    out_bob = session.handle("bob", frames(one_person_video["path"]))
    assert not out_bob.opened and out_bob.reason == "rejected"
    out_mallory = session.handle("mallory", frames(one_person_video["path"]))
    assert out_mallory.reason == "unknown_subject"
    ctl.close()
    records = [decode_template(r.payload) for r in agent.spool.peek("mqtt", 10)]
    assert [(m.subject, m.decision.accepted, len(m.values)) for m in records] == [("alice", True, 0), ("bob", False, 0)]
    assert all(m.purpose == 3 and m.decision.model_serial == 1 for m in records)
    assert agent.accountant.ledger.recent("door:", 0.0) == []  # nothing of a face released: no ε spent
