"""Deciding on the device, end to end with real parts: a trained server issuing signed device models, cameras
(gRPC/TLS and the real Mosquitto) and a door running the real agent on composed video, the server's events."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import pytest
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.testing import FaceTrack, compose_video, lfw_people
from peep_testing.devicemodel import start_trained
from peep_testing.server import DEVICE_TOKENS, DOOR_TOKEN, MQTT_PREFIX, mqtt_available, write_edge_config


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki, keypair, bundle_dir, templates, model_keys, calibration_path) -> Any:
    tmp = tmp_path_factory.mktemp("decision-mode")
    mqtt: dict[str, Any] = {"enabled": False}
    if mqtt_available() is None:
        mqtt = {"enabled": True, "share_group": f"g{uuid.uuid4().hex[:8]}", "client_id": f"srv-{uuid.uuid4().hex[:8]}",
                "connections": 1}  # fmt: skip
    srv = start_trained(tmp, pki, keypair, bundle_dir, templates, model_keys, calibration_path, mqtt=mqtt)
    if srv.app.mqtt is not None:
        assert srv.app.mqtt.wait_ready(10)
    events: list[Any] = []
    srv.services.events.add_sink(events.append)
    srv.events = events
    yield srv
    srv.app.stop(0)


@pytest.fixture(scope="module")
def walk_past(tmp_path_factory, lfw100, data_home) -> tuple[str, str]:
    """Two held-out photos of an enrolled person walking past, one after the other (two tracks)."""
    name = lfw100.target_names[int(np.bincount(lfw100.labels).argmax())].replace(" ", "_")
    photos = lfw_people(data_home)[name]
    path = tmp_path_factory.mktemp("walk") / "walk.mp4"
    tracks = [
        FaceTrack(image=photos[-1], start=0, stop=30, x0=200, y0=120, amplitude=20, period_frames=30),
        FaceTrack(image=photos[-2], start=50, stop=80, x0=200, y0=120, amplitude=20, period_frames=30),
    ]
    compose_video(path, tracks, n_frames=80, fps=10.0)
    return str(path), name


def _camera(tmp_path, server, keypair, bundle_dir, pki, model_keys, *, device: str, mqtt: bool) -> Agent:
    sections: dict[str, Any] = {
        "recognition": {"decide": "device", "epsilon_label": 8.0, "fuse_frames": 2,
                        "model_public_key": str(model_keys[3])},
    }  # fmt: skip
    if mqtt:
        sections["mqtt"] = {"enabled": True, "host": "127.0.0.1", "port": 1883, "tls": False,
                            "topic_prefix": MQTT_PREFIX}  # fmt: skip
    cfg = write_edge_config(
        tmp_path / f"{device}.toml", port=server.port, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3],
        device_id=device, privacy={"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e6,
                                   "min_track_frames": 2, "window_seconds": 60.0},
        grpc={"enabled": not mqtt, "token_env": "CAM_TOKEN"}, **sections,
    )  # fmt: skip
    return Agent(load_config(cfg), environ={"CAM_TOKEN": DEVICE_TOKENS[device]})


def _run(agent: Agent, video: str) -> None:
    from peep.edge.capture import VideoSource

    # The model first (a real camera starts deciding when it arrives; here the video is short).
    agent.open()
    agent.start_housekeeping()
    agent._start_transports()
    deadline = time.monotonic() + 20
    while agent.decisions.decider() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.decisions.decider() is not None, agent.decisions.problem
    source = VideoSource(video, kind="file")
    try:
        while (frame := source.read()) is not None:
            agent.pipeline.process(frame)
    finally:
        source.close()
        agent.shutdown(drain_timeout=20.0)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "mqtt"])
def test_a_camera_deciding_on_the_device_sends_only_labels_and_the_server_records_its_decisions(
    server, tmp_path, keypair, bundle_dir, pki, model_keys, walk_past, transport, templates
):
    if transport == "mqtt" and server.app.mqtt is None:
        pytest.skip(str(mqtt_available()))
    video, _name = walk_past
    device = "cam-2" if transport == "grpc" else "cam-1"
    agent = _camera(tmp_path, server, keypair, bundle_dir, pki, model_keys, device=device, mqtt=transport == "mqtt")
    _run(agent, video)
    from peep.edge.ledger import SqliteLedger

    ledger = SqliteLedger(agent.cfg.ledger_path)
    try:
        spends = [e for e in ledger.entries() if e.key.startswith("track:")]
    finally:
        ledger.close()
    assert len(spends) == 2 and all(e.epsilon == 8.0 for e in spends)  # one label per track, ε_label each
    ids = {e.message_id for e in spends}
    deadline = time.monotonic() + 20
    while not ids <= {ev.message_id for ev in server.events} and time.monotonic() < deadline:
        time.sleep(0.1)
    got = {ev.message_id: ev for ev in server.events if ev.message_id in ids}
    assert set(got) == ids, "every decision reached the server as an event"
    for ev in got.values():
        assert ev.decided_on == "device" and ev.epsilon_label == 8.0 and ev.device_id == device
        # The released label mapped back to an enrolled subject (randomised: not always the one who walked past).
        assert (ev.unknown and not ev.subject) or ev.subject in set(templates.subjects)
        assert server.services.store.get_template(ev.message_id, device_id=device) is None  # no template kept


@pytest.mark.slow
def test_a_door_deciding_on_the_device_decides_with_the_server_stopped_and_its_records_wait(
    tmp_path, pki, keypair, bundle_dir, templates, model_keys, calibration_path, walk_past
):
    from gpiozero.pins.mock import MockFactory
    from peep.core.wire import decode_template
    from peep.edge.capture import VideoSource
    from peep.edge.door import DoorController, GpioLock
    from peep.edge.door_session import DoorSession
    from peep.lab.demo.devices import FrameWindow

    srv = start_trained(tmp_path / "srv", pki, keypair, bundle_dir, templates, model_keys, calibration_path)
    video, name = walk_past
    try:
        cfg = write_edge_config(
            tmp_path / "door.toml", port=srv.port, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3],
            device_id="door-1", privacy={"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e6},
            grpc={"token_env": "DOOR_TOKEN", "deadline_s": 5.0},
            door={"enabled": True, "decision": "device", "lock": "gpio"},
            recognition={"model_public_key": str(model_keys[3])},
        )  # fmt: skip
        agent = Agent(load_config(cfg), environ={"DOOR_TOKEN": DOOR_TOKEN})
        pipeline = agent.open()
        agent.start_transports()
        deadline = time.monotonic() + 20
        while agent.decisions.decider() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.decisions.decider() is not None, agent.decisions.problem
    finally:
        srv.app.stop(0)  # the server is gone before the first claim
    pins = MockFactory()
    ctl = DoorController("cam-1", GpioLock(17, pin_factory=pins), open_s=0.05, decision_timeout_s=10.0)
    session = DoorSession(pipeline, agent.accountant, ctl, None, face_timeout_s=5.0,  # type: ignore[arg-type]
                          decisions=agent.decisions)  # fmt: skip
    source = VideoSource(video, kind="file")
    window = FrameWindow(source)
    try:
        window.start, window.stop = 1, 30
        out = session.handle(name, window.read)
        # Decided here, on the device's model: opened, or refused by its threshold; never "unreachable".
        assert out.opened or out.reason == "rejected", out
        states = [p.state for p in pins.pin(17).states]
        assert states.count(True) == (1 if out.opened else 0)
        records = [decode_template(r.payload) for r in agent.spool.peek("grpc", 10)]
        assert [(m.subject, m.decision.accepted, len(m.values)) for m in records] == [(name, out.opened, 0)]
        assert agent.accountant.ledger.recent("door:", 0.0) == []  # nothing of the face released
    finally:
        ctl.close()
        source.close()
        agent.shutdown(drain_timeout=0)
