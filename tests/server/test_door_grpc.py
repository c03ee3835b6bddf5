"""A door over real gRPC/TLS: the device's VERIFY release answered by the server's Verify, and the server down."""

from __future__ import annotations

import numpy as np
import pytest
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.door import DoorController
from peep.edge.door_session import DoorSession, GrpcVerifier
from peep.edge.testing import FaceTrack, compose_video
from peep.edge.transport.grpc import make_channel
from peep_server_testlib import DEVICE_TOKENS, SITE


class RecordingLock:
    def __init__(self) -> None:
        self.events: list[str] = []

    def energise(self) -> None:
        self.events.append("open")

    def release(self) -> None:
        self.events.append("lock")

    def close(self) -> None:
        self.events.append("lock")


def _door_agent(tmp_path, keypair, bundle_dir, pki, port: int) -> Agent:
    cfg = tmp_path / "door.toml"
    cfg.write_text(
        f"""
[device]
id = "cam-1"
site = "{SITE}"
state_dir = "{tmp_path / "door-state"}"
[bundle]
path = "{bundle_dir}"
public_key = "{keypair[3]}"
[privacy]
mechanism = "peep-raw"
epsilon = 8.0
track_budget = 1000000.0
[capture]
source = "0"
[mqtt]
enabled = false
[grpc]
enabled = true
target = "localhost:{port}"
ca_file = "{pki.dir / "ca.pem"}"
token_env = "DOOR_TOKEN"
deadline_s = 5.0
"""
    )
    return Agent(load_config(cfg), environ={"DOOR_TOKEN": DEVICE_TOKENS["cam-1"]})


def _frames(video: str, limit: int = 40):
    from peep.edge.capture import VideoSource

    src = VideoSource(video, kind="file")
    n = {"i": 0}

    def read():
        n["i"] += 1
        return src.read() if n["i"] <= limit else None

    return read


@pytest.fixture(scope="module")
def claim_video(tmp_path_factory, lfw100, data_home):
    """A held-out photo of an enrolled person walking past the door camera."""
    from peep.edge.testing import lfw_people

    name = lfw100.target_names[int(np.bincount(lfw100.labels).argmax())].replace(" ", "_")
    photo = lfw_people(data_home)[name][-1]
    path = tmp_path_factory.mktemp("door") / "claim.mp4"
    compose_video(path, [FaceTrack(image=photo, start=0, stop=40, x0=200, y0=120, amplitude=10, period_frames=40)],
                  n_frames=40, fps=10.0)  # fmt: skip
    return str(path), name


def test_a_claim_is_answered_by_the_servers_verify_and_a_dead_server_keeps_it_locked(
    trained_server, tmp_path, keypair, bundle_dir, pki, claim_video
):
    video, name = claim_video
    agent = _door_agent(tmp_path, keypair, bundle_dir, pki, trained_server.port)
    pipeline = agent.open()
    channel = make_channel(agent.cfg.grpc)
    try:
        lock = RecordingLock()
        ctl = DoorController("cam-1", lock, open_s=0.05, decision_timeout_s=10.0)
        session = DoorSession(pipeline, agent.accountant, ctl, GrpcVerifier(channel, agent.grpc_token),
                              face_timeout_s=5.0)  # fmt: skip
        out = session.handle(name, _frames(video))
        # A decision came back over TLS for this claim: opened, or rejected by the server's threshold.
        assert out.opened or out.reason == "rejected", out
        assert session.last_timing.stages["verify"] > 0
        # A claim for a name the server does not know: the server refuses it (an answer, not an outage).
        out = session.handle("Nobody_Enrolled", _frames(video))
        assert not out.opened and out.reason == "rejected" and "NOT_FOUND: claimed_subject" in out.detail, out
        # A deadline shorter than the call: the claim times out, locked.
        ctl.decision_timeout_s = 0.001
        out = session.handle(name, _frames(video))
        assert not out.opened and out.reason == "timeout", out
        ctl.decision_timeout_s = 10.0
        # The server gone: the claim ends locked, reason unreachable.
        dead = make_channel(agent.cfg.grpc.model_copy(update={"target": "localhost:1"}))
        session.verifier = GrpcVerifier(dead, agent.grpc_token)
        out = session.handle(name, _frames(video))
        assert not out.opened and out.reason == "unreachable" and "UNAVAILABLE" in out.detail
        dead.close()
        ctl.close()
        assert lock.events.count("open") == (1 if ctl.opened else 0)
    finally:
        channel.close()
        agent.shutdown(drain_timeout=0)
