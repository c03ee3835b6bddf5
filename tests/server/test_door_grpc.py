"""A door over real gRPC/TLS: the device's VERIFY release answered by the server's Verify, and the server down."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.door import DoorController, GpioLock
from peep.edge.door_session import DoorSession, GrpcVerifier
from peep.edge.testing import FaceTrack, compose_video
from peep.edge.transport.grpc import make_channel
from peep_server_testlib import DEVICE_TOKENS, write_edge_config


def _door_agent(tmp_path, keypair, bundle_dir, pki, port: int) -> Agent:
    cfg = write_edge_config(
        tmp_path / "door.toml", port=port, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3], device_id="cam-1",
        privacy={"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e6},
        grpc={"token_env": "DOOR_TOKEN", "deadline_s": 5.0},
    )  # fmt: skip
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
        from gpiozero.pins.mock import MockFactory

        pins = MockFactory()
        ctl = DoorController("cam-1", GpioLock(17, pin_factory=pins), open_s=0.05, decision_timeout_s=10.0)
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
        states = [p.state for p in pins.pin(17).states]
        assert states.count(True) == ctl.opened and states[-1] is False  # opened only when accepted; locked now
    finally:
        channel.close()
        agent.shutdown(drain_timeout=0)


def test_peep_edge_door_reads_claims_and_drives_a_command_lock(
    trained_server, tmp_path, keypair, bundle_dir, pki, claim_video, data_home, capsys, monkeypatch
):
    """The command end to end: three claim lines (one malformed), real server, the lock a command writing a log."""
    from peep.edge.cli import main as edge_main
    from peep.edge.testing import lfw_people

    _, name = claim_video
    photo = lfw_people(data_home)[name][-1]
    video = tmp_path / "door.mp4"
    compose_video(video, [FaceTrack(image=photo, start=0, stop=150, x0=200, y0=120, amplitude=10, period_frames=50)],
                  n_frames=150, fps=10.0)  # fmt: skip
    agent_cfg = _door_agent(tmp_path, keypair, bundle_dir, pki, trained_server.port).cfg
    log = tmp_path / "lock.log"
    script = f"import sys; open({str(log)!r}, 'a').write(sys.argv[1] + '\\n')"
    cfg_text = (tmp_path / "door.toml").read_text().replace('source = "0"', f'source = "{video}"')
    cfg_text += (
        '\n[door]\nenabled = true\nlock = "command"\n'
        f"open_command = {json.dumps([sys.executable, '-c', script, 'open'])}\n"
        f"close_command = {json.dumps([sys.executable, '-c', script, 'locked'])}\n"
        "open_s = 0.2\ndecision_timeout_s = 10.0\n"
    )
    (tmp_path / "door.toml").write_text(cfg_text)
    claims = tmp_path / "claims.txt"
    claims.write_text(f"{name}\nNobody_Enrolled\nbad\x1b[2Jclaim\n")
    monkeypatch.setenv("DOOR_TOKEN", DEVICE_TOKENS["cam-1"])
    from peep.edge import agent as agent_module

    made: list = []
    real_init = agent_module.Agent.__init__

    def keep(self, *a, **kw):
        real_init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(agent_module.Agent, "__init__", keep)
    assert edge_main(["door", "--config", str(tmp_path / "door.toml"), "--claims", str(claims)]) == 0
    metrics = made[0].metrics
    assert metrics.value("peep_edge_door_refusals_total", reason="rejected") >= 1
    out = capsys.readouterr().out
    assert f"claim {name}: " in out and "claim Nobody_Enrolled: locked (rejected)" in out
    assert "\x1b" not in out  # a malformed claim is never echoed
    events = log.read_text().split()
    assert events[0] == "locked" and events[-1] == "locked"  # locked at start and at the end
    assert events.count("open") == (1 if f"claim {name}: opened" in out else 0)
    assert agent_cfg.device.id == "cam-1"
