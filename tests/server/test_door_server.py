"""A door against real parts: over gRPC/TLS the device's VERIFY release answered by the server's Verify (and the
server down); over MQTT the decision on the device's events topic of our own Mosquitto with the shipped ACL."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from typing import Any

import numpy as np
import pytest
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.door import DoorController, GpioLock
from peep.edge.door_session import DoorSession, GrpcVerifier
from peep.edge.testing import FaceTrack, compose_video
from peep.edge.transport.grpc import make_channel
from peep_testing.server import DEVICE_TOKENS, SITE, write_edge_config


def _door_agent(tmp_path, keypair, bundle_dir, pki, port: int) -> Agent:
    cfg = write_edge_config(
        tmp_path / "door.toml", port=port, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3], device_id="cam-1",
        privacy={"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e6},
        grpc={"token_env": "DOOR_TOKEN", "deadline_s": 5.0},
    )  # fmt: skip
    return Agent(load_config(cfg), environ={"DOOR_TOKEN": DEVICE_TOKENS["cam-1"]})


def _command_lock_door(tmp_path, video, door_keys: str = ""):
    """Turn the door.toml _door_agent wrote into a door on ``video`` whose lock is a command writing to a log."""
    log = tmp_path / "lock.log"
    script = f"import sys; open({str(log)!r}, 'a').write(sys.argv[1] + '\\n')"
    text = (tmp_path / "door.toml").read_text().replace('source = "0"', f'source = "{video}"')
    text += (
        '\n[door]\nenabled = true\nlock = "command"\n'
        f"open_command = {json.dumps([sys.executable, '-c', script, 'open'])}\n"
        f"close_command = {json.dumps([sys.executable, '-c', script, 'locked'])}\n" + door_keys
    )
    (tmp_path / "door.toml").write_text(text)
    return log


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


@pytest.mark.slow
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
        # A claim for a name the server does not know: refused on the server's word before anything is released.
        released = len(agent.accountant.ledger.entries())
        out = session.handle("Nobody_Enrolled", _frames(video))
        assert not out.opened and out.reason == "unknown_subject" and "nothing was released" in out.detail, out
        assert len(agent.accountant.ledger.entries()) == released
        # A deadline shorter than the call: the claim times out, locked.
        ctl.decision_timeout_s = 0.001
        out = session.handle(name, _frames(video))
        assert not out.opened and out.reason == "timeout", out
        ctl.decision_timeout_s = 10.0
        # The server gone: the claim ends locked, reason unreachable.
        dead = make_channel(agent.cfg.grpc.model_copy(update={"target": "localhost:1"}))
        session.verifier = GrpcVerifier(dead, agent.grpc_token)
        out = session.handle(name, _frames(video))
        assert not out.opened and out.reason == "unreachable" and "CheckClaim" in out.detail, out
        # Only the first claim released: the unknown subject, the missed deadline and the dead server did not.
        assert len(agent.accountant.ledger.entries()) == released
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
    # peep-raw at ε 8 costs 4,409 per template: budgets that admit a few claims.
    log = _command_lock_door(tmp_path, video, "open_s = 0.2\ndecision_timeout_s = 10.0\n"
                             "epsilon_per_hour = 100000.0\nsubject_epsilon_per_hour = 100000.0\n")  # fmt: skip
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
    # The claims take under a second: the door's last report would come within the server's one-per-second
    # limit of its first (a door running for real reports every grpc.report_interval_s).
    monkeypatch.setattr(trained_server.services.device_reports, "min_interval_s", 0.0)
    assert edge_main(["door", "--config", str(tmp_path / "door.toml"), "--claims", str(claims)]) == 0
    metrics = made[0].metrics
    assert metrics.value("peep_edge_door_refusals_total", reason="unknown_subject") == 1
    out = capsys.readouterr().out
    assert f"claim {name}: " in out and "claim Nobody_Enrolled: locked (unknown_subject)" in out
    assert "\x1b" not in out  # a malformed claim is never echoed
    events = log.read_text().split()
    assert events[0] == "locked" and events[-1] == "locked"  # locked at start and at the end
    assert events.count("open") == (1 if f"claim {name}: opened" in out else 0)
    assert agent_cfg.device.id == "cam-1"
    # What the door spent reached the server (its report, the Devices and Privacy views' source): the
    # release of the one claim for a known subject, at the door's per-template ε.
    report, _ = trained_server.services.device_reports.latest()["cam-1"]
    from peep.edge.ledger import SqliteLedger

    ledger = SqliteLedger(agent_cfg.device.state_dir / "ledger.sqlite3")
    spent = ledger.entries()
    ledger.close()
    assert report.releases == len(spent) == 1 and report.epsilon_vector_spent == pytest.approx(
        sum(e.epsilon for e in spent)
    )


# --------------------------------------------------------------------------- the decision over MQTT


class MqttDoor:
    """Door cam-1 deciding over MQTT: its own connection (the device's credentials), a recording lock, the
    server's decision key pinned."""

    def __init__(self, agent: Agent, broker, public_key, *, timeout_s: float = 4.0) -> None:
        from peep.edge.config import MqttConfig
        from peep.edge.door_session import MqttVerifier
        from peep.edge.transport.mqtt import MqttLink
        from peep_testing.broker import DEVICE_PASSWORDS

        self.lock = _CountingLock()
        self.outcomes: list = []
        self.ctl = DoorController("cam-1", self.lock, open_s=0.05, decision_timeout_s=timeout_s,
                                  lockout_failures=100, on_outcome=self.outcomes.append)  # fmt: skip
        mcfg = MqttConfig(host="localhost", port=broker.dev_port, ca_file=str(broker.ca), reconnect_max_s=1)
        self.link = MqttLink(mcfg, client_id=f"door-cam-1-{uuid.uuid4().hex[:6]}", site=SITE, device_id="cam-1",
                             password=DEVICE_PASSWORDS["cam-1"], publish_status=False,
                             on_event=lambda ev: self.verifier.on_event(ev))  # fmt: skip
        self.verifier = MqttVerifier(self.link, self.ctl, public_key=public_key, site=SITE)
        self.session = DoorSession(agent.open(), agent.accountant, self.ctl, self.verifier, face_timeout_s=5.0)
        self.link.start()
        assert self.link.wait_connected(10)

    def claim_in_background(self, subject: str, video: str) -> Any:
        done: dict[str, Any] = {}
        t = threading.Thread(target=lambda: done.setdefault("out", self.session.handle(subject, _frames(video))))
        t.start()
        return t, done

    def close(self) -> None:
        self.ctl.close()
        self.link.stop()


class _CountingLock:
    def __init__(self) -> None:
        self.opened = 0

    def energise(self) -> None:
        self.opened += 1

    def release(self) -> None: ...

    def close(self) -> None: ...


def _mqtt_door_agent(tmp_path, keypair, bundle_dir, pki) -> Agent:
    # The agent's own transports stay off: the door's MQTT connection is MqttDoor's.
    return _door_agent(tmp_path, keypair, bundle_dir, pki, port=1)


def _template_of(server_side, deadline_s: float = 10.0):
    """The VERIFY template the door published, as the server's account reads it (its message id: the nonce)."""
    from peep.core.wire import decode_template
    from peep_testing.broker import wait_for

    assert wait_for(lambda: any(t.endswith("/templates") for t, _, _ in server_side.messages), deadline_s)
    _, payload, _ = next(m for m in server_side.messages if m[0].endswith("/templates"))
    server_side.messages.clear()
    return decode_template(payload)


def _decision(msg, key=None, **kw) -> bytes:
    """The server's decision on ``msg`` as JSON, with ``kw`` replacing fields; signed by ``key`` (what it says)."""
    from peep.core.signing import door_statement, sign_statement
    from peep.core.wire import template_digest

    event = {"event_id": uuid.uuid4().hex, "site": SITE, "device_id": msg.device_id, "message_id": msg.message_id,
             "track_id": msg.track_id, "purpose": "verify", "claimed_subject": msg.subject, "accepted": True,
             "probability": 0.97, "model_version": "v000001", "template_sha256": template_digest(msg)} | kw  # fmt: skip
    if key is not None and isinstance(event["accepted"], bool):  # what cannot be read is not signed either
        statement = door_statement("verify", site=SITE, device_id=event["device_id"], nonce=event["message_id"],
                                   subject=event["claimed_subject"], verdict=event["accepted"],
                                   template_sha256=event["template_sha256"])  # fmt: skip
        event["signature"] = sign_statement(key, statement)
    return json.dumps(event).encode()


def answer_claim_checks(server_side, key, known: bool = True) -> None:
    """Let the test's server account answer every door's claim check (signed with ``key``), as the server does."""
    from peep.core.signing import door_statement, sign_statement

    server_side.subscribe("devices/peep/v1/+/+/claims")
    record = server_side.c.on_message

    def on_message(c, u, m):
        if not m.topic.endswith("/claims"):
            record(c, u, m)
            return
        q = json.loads(m.payload)
        _, _, _, site, device, _ = m.topic.split("/")
        answer = {"kind": "claim_check", "nonce": q["nonce"], "device_id": device, "site": site,
                  "claimed_subject": q["claimed_subject"], "known": known, "model_version": "v000001"}  # fmt: skip
        statement = door_statement("claim_check", site=site, device_id=device, nonce=q["nonce"],
                                   subject=q["claimed_subject"], verdict=known)  # fmt: skip
        answer["signature"] = sign_statement(key, statement)
        c.publish(f"devices/peep/v1/{site}/{device}/events", json.dumps(answer), qos=1)

    server_side.c.on_message = on_message


@pytest.mark.slow
def test_over_mqtt_only_the_servers_decision_for_this_claim_opens_and_only_once(
    shipped_broker, tmp_path, keypair, bundle_dir, pki, claim_video, decision_keys
):
    """The test plays the server (its broker account and decision key); the door is the device cam-1 with its
    own credential.

    Malformed decisions, decisions for another claim, another door or another subject, a forged decision from
    another device's credential, a replay, and no decision at all leave it locked; the one accepted decision
    for the waiting claim opens it once.
    """
    from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, wait_for

    video, name = claim_video
    key = decision_keys[0]
    agent = _mqtt_door_agent(tmp_path, keypair, bundle_dir, pki)
    door = MqttDoor(agent, shipped_broker, decision_keys[1])
    server_side = Client(shipped_broker.srv_port, "peep-server", SERVER_PASSWORD, shipped_broker.ca).connect()
    intruder = Client(shipped_broker.dev_port, "cam-2", DEVICE_PASSWORDS["cam-2"], shipped_broker.ca).connect()
    events = f"devices/peep/v1/{SITE}/cam-1/events"
    try:
        server_side.subscribe("devices/peep/v1/+/cam-1/templates")
        answer_claim_checks(server_side, key)
        # 1. Everything wrong, then nothing: locked, timeout.
        t, done = door.claim_in_background(name, video)
        msg = _template_of(server_side)
        assert msg.subject == name and msg.purpose == 3
        wrong = [
            b"{not json", b"[]", _decision(msg, key, accepted="yes"), _decision(msg, key, probability=float("nan")),
            _decision(msg, key, message_id=uuid.uuid4().hex),  # another claim
            _decision(msg, key, device_id="cam-2"),  # another door
            _decision(msg, key, claimed_subject="someone_else"),  # another subject
            _decision(msg, key, template_sha256="ab" * 32),  # another template under this claim's nonce
        ]  # fmt: skip
        for payload in wrong:
            server_side.c.publish(events, payload, qos=1).wait_for_publish(5)
        # A device credential writing cam-1's decision (the nonce known): the broker refuses it.
        forged = [intruder.c.publish(f"peep/v1/{SITE}/cam-1/events", _decision(msg, key), qos=1),
                  intruder.c.publish(f"peep/v1/{SITE}/cam-2/events", _decision(msg, key), qos=1)]  # fmt: skip
        assert wait_for(lambda: all(f.mid in intruder.acks for f in forged), 10)
        assert [intruder.acks[f.mid] for f in forged] == [0x87, 0x87]  # Not authorized
        t.join(20)
        out = done["out"]
        assert not out.opened and out.reason == "timeout", out
        assert door.lock.opened == 0
        reasons = [o.reason for o in door.outcomes]
        assert reasons.count("malformed") == 4 and reasons.count("mismatch") == 4, reasons
        # 2. The accepted decision for the waiting claim: opened, once; its replay opens nothing.
        t, done = door.claim_in_background(name, video)
        msg = _template_of(server_side)
        server_side.c.publish(events, _decision(msg, key), qos=1).wait_for_publish(5)
        t.join(20)
        assert done["out"].opened and door.lock.opened == 1
        server_side.c.publish(events, _decision(msg, key), qos=1).wait_for_publish(5)
        assert wait_for(lambda: door.outcomes[-1].reason == "replayed", 10), door.outcomes[-1]
        # 3. A replayed decision of the last claim while a new claim waits: still locked (the new claim times out).
        t, done = door.claim_in_background(name, video)
        new_msg = _template_of(server_side)
        server_side.c.publish(events, _decision(msg, key), qos=1).wait_for_publish(5)
        t.join(20)
        assert new_msg.message_id != msg.message_id
        assert done["out"].reason == "timeout" and door.lock.opened == 1
        assert "replayed" in [o.reason for o in door.outcomes[-3:]]
    finally:
        intruder.close()
        server_side.close()
        door.close()
        agent.shutdown(drain_timeout=0)


def test_over_mqtt_the_broker_down_keeps_it_locked(
    shipped_broker, tmp_path, keypair, bundle_dir, pki, claim_video, decision_keys
):
    import signal

    from peep_testing.broker import wait_for

    video, name = claim_video
    agent = _mqtt_door_agent(tmp_path, keypair, bundle_dir, pki)
    door = MqttDoor(agent, shipped_broker, decision_keys[1], timeout_s=3.0)
    try:
        shipped_broker.stop(signal.SIGKILL)
        assert wait_for(lambda: not door.link.connected.is_set(), 10)
        out = door.session.handle(name, _frames(video))
        assert not out.opened and out.reason == "unreachable" and "not connected" in out.detail, out
        assert door.lock.opened == 0
    finally:
        door.close()
        agent.shutdown(drain_timeout=0)


@pytest.mark.slow
def test_over_mqtt_a_real_server_decides_the_claim(
    shipped_broker, tmp_path, keypair, bundle_dir, pki, claim_video, templates, monkeypatch, decision_keys
):
    """The server on the same broker (its own account, the shipped ACL, its decision key), enrolled and trained:
    it answers the door's claim check, and the decision it publishes on cam-1's events topic names the claim's
    nonce, signed, and the door acts on it; a claim for a subject it does not know is refused before anything is
    released."""
    from peep.edge.device_key import DeviceKey
    from peep.v1 import recognition_pb2
    from peep_testing.broker import SERVER_PASSWORD
    from peep_testing.server import ADMIN, base_config, start_server, tls_section

    monkeypatch.setenv("PEEP_TEST_MQTT_PASSWORD", SERVER_PASSWORD)
    mqtt = shipped_broker.server_mqtt_section(client_id=f"peep-door-{uuid.uuid4().hex[:6]}",
                                              decision_signing_key=str(decision_keys[2]))  # fmt: skip
    cfg = base_config(tmp_path, keypair[3], bundle_dir, mqtt=mqtt, grpc={"tls": tls_section(pki)})
    agent = _mqtt_door_agent(tmp_path, keypair, bundle_dir, pki)
    # The door's signing key, made in its state folder on first use, registered as an installer would.
    cfg["auth"]["devices"][0]["signing_key"] = DeviceKey(agent.cfg.device_key_path).public_text
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=15)
    video, name = claim_video
    door = None
    try:
        stub = srv.stub()
        assert stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
        assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
        door = MqttDoor(agent, shipped_broker, decision_keys[1], timeout_s=10.0)
        out = door.session.handle(name, _frames(video))
        assert out.opened or out.reason == "rejected", out  # the server's decision, whichever it was
        assert door.lock.opened == int(out.opened)
        assert door.ctl.refusals["forged"] == 0  # the server's decision and claim check verified
        released = len(agent.accountant.ledger.entries())
        out = door.session.handle("Nobody_Enrolled", _frames(video))
        assert not out.opened and out.reason == "unknown_subject", out
        assert len(agent.accountant.ledger.entries()) == released  # nothing released for it
    finally:
        if door is not None:
            door.close()
        agent.shutdown(drain_timeout=0)
        srv.app.stop(0)


# --------------------------------------------------------------------------- an attacker at the badge reader


@pytest.mark.slow
def test_a_flood_of_made_up_ids_on_stdin_releases_nothing_and_never_drives_the_lock(
    trained_server, tmp_path, keypair, bundle_dir, pki, claim_video, data_home
):
    """500 made-up ids typed into ``peep-edge door``'s stdin in one burst, a real server deciding: a few are
    asked about (unknown: nothing released), the rest throttled at once; the lock is never driven."""
    import os
    import subprocess
    import time

    from peep.edge.ledger import SqliteLedger

    video, _ = claim_video
    cfg = _door_agent(tmp_path, keypair, bundle_dir, pki, trained_server.port).cfg
    # The defaults but the hourly budgets: this test's peep-raw at ε 8 costs 4,409 per template.
    log = _command_lock_door(tmp_path, video, "epsilon_per_hour = 20000.0\nsubject_epsilon_per_hour = 10000.0\n")
    flood = "".join(f"Made_Up_{i:03d}\n" for i in range(500)).encode()
    env = os.environ | {"DOOR_TOKEN": DEVICE_TOKENS["cam-1"]}
    cmd = [sys.executable, "-m", "peep.edge.cli", "door", "--config", str(tmp_path / "door.toml"), "--claims", "-"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, input=flood, capture_output=True, env=env, timeout=120)
    took = time.monotonic() - t0
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("claim ")]
    assert len(lines) == 500 and sum("(throttled)" in ln for ln in lines) == 490, out[-2000:]
    assert sum("(unknown_subject)" in ln for ln in lines) == 10
    ledger = SqliteLedger(cfg.device.state_dir / "ledger.sqlite3")
    spent = ledger.entries()
    ledger.close()
    assert spent == []  # no template of the face at the door, ε 0 of the door's hourly 20,000
    assert "ε spent by this device in all: 0 releases, per vector 0, per coordinate 0" in out
    assert log.read_text().split() == ["locked", "locked"]  # released at start and at the end, never driven
    print(f"500 made-up ids: {took:.1f} s with start-up; 10 asked about, 490 throttled, 0 released")


@pytest.mark.slow
def test_an_outage_locks_nobody_out_and_the_first_claim_after_it_is_decided(
    tmp_path, keypair, bundle_dir, pki, claim_video, templates
):
    """Five claims while the server is down end unreachable, spend nothing, count nothing towards the lock-out;
    a claim made as soon as the server listens again is decided, not unreachable."""
    import socket
    import time

    from peep.edge.door_session import DoorSession, GrpcVerifier
    from peep.v1 import recognition_pb2
    from peep_testing.server import ADMIN, base_config, free_port, start_server, tls_section

    port = free_port()
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki), "listen": f"127.0.0.1:{port}"})
    srv = start_server(cfg, pki, tmp_path)
    stub = srv.stub()
    assert stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
    stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
    video, name = claim_video
    agent = _door_agent(tmp_path, keypair, bundle_dir, pki, port)
    pipeline = agent.open()
    channel = make_channel(agent.cfg.grpc, reconnect_max_s=1.0)  # as open_door makes it
    ctl = DoorController("cam-1", _CountingLock(), open_s=0.05, decision_timeout_s=5.0, lockout_failures=5)
    session = DoorSession(pipeline, agent.accountant, ctl, GrpcVerifier(channel, agent.grpc_token),
                          face_timeout_s=5.0)  # fmt: skip
    try:
        first = session.handle(name, _frames(video))
        assert first.opened or first.reason == "rejected", first
        srv.app.stop(0)
        released = len(agent.accountant.ledger.entries())
        outs = [session.handle(name, _frames(video)) for _ in range(5)]
        assert [o.reason for o in outs] == ["unreachable"] * 5, outs
        assert len(agent.accountant.ledger.entries()) == released  # nothing released while it could not be asked
        srv = start_server(cfg, pki, tmp_path)
        assert srv.port == port
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        t0 = time.monotonic()
        again = session.handle(name, _frames(video))
        assert again.opened or again.reason == "rejected", again  # decided: not unreachable, not locked out
        took = time.monotonic() - t0
        print(f"first claim after the server's return decided in {took:.2f} s ({again.reason or 'opened'})")
    finally:
        ctl.close()
        channel.close()
        agent.shutdown(drain_timeout=0)
        srv.app.stop(0)


@pytest.mark.slow
def test_over_mqtt_the_server_answers_claim_checks_signed_and_ignores_what_is_not_one(
    shipped_broker, tmp_path, keypair, bundle_dir, pki, templates, monkeypatch, decision_keys
):
    """A door's question on its claims topic: answered on its events topic, signed with the server's decision key;
    a question that is not one (unreadable, another shape, too large) gets no answer and is counted."""
    from peep.core.signing import door_statement, verify_statement
    from peep.v1 import recognition_pb2
    from peep_testing.broker import DEVICE_PASSWORDS, SERVER_PASSWORD, Client, wait_for
    from peep_testing.server import ADMIN, base_config, start_server, tls_section

    monkeypatch.setenv("PEEP_TEST_MQTT_PASSWORD", SERVER_PASSWORD)
    mqtt = shipped_broker.server_mqtt_section(client_id=f"peep-door-{uuid.uuid4().hex[:6]}",
                                              decision_signing_key=str(decision_keys[2]))  # fmt: skip
    srv = start_server(base_config(tmp_path, keypair[3], bundle_dir, mqtt=mqtt, grpc={"tls": tls_section(pki)}),
                       pki, tmp_path, mqtt_wait=15)  # fmt: skip
    door = Client(shipped_broker.dev_port, "cam-1", DEVICE_PASSWORDS["cam-1"], shipped_broker.ca).connect()
    try:
        stub = srv.stub()
        assert stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
        stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
        door.subscribe(f"peep/v1/{SITE}/cam-1/events")
        claims = f"peep/v1/{SITE}/cam-1/claims"
        enrolled = str(templates.subjects[0])
        bridge = srv.app.mqtt
        for payload in (b"{not json", b'{"nonce": "zz", "claimed_subject": "alice"}', b"x" * 5000,
                        json.dumps({"nonce": "a" * 32, "claimed_subject": "bad\x1b[2J"}).encode()):  # fmt: skip
            door.c.publish(claims, payload, qos=1).wait_for_publish(5)
        assert wait_for(lambda: bridge.claim_checks["refused"] == 4, 10), bridge.claim_checks
        asked = {"b" * 32: enrolled, "c" * 32: "Nobody_Enrolled"}
        for nonce, subject in asked.items():
            door.c.publish(claims, json.dumps({"nonce": nonce, "claimed_subject": subject}), qos=1)
        assert wait_for(lambda: len(door.messages) >= 2, 10)
        answers = {a["nonce"]: a for a in (json.loads(p) for _, p, _ in door.messages)}
        assert set(answers) == set(asked)  # the four that were not questions got no answer
        for nonce, subject in asked.items():
            a = answers[nonce]
            assert a["kind"] == "claim_check" and a["claimed_subject"] == subject
            assert a["known"] == (subject == enrolled)
            statement = door_statement("claim_check", site=SITE, device_id="cam-1", nonce=nonce, subject=subject,
                                       verdict=a["known"])  # fmt: skip
            assert verify_statement(decision_keys[1], statement, a["signature"])
            assert not verify_statement(keypair[1], statement, a["signature"])  # another key's check fails
    finally:
        door.close()
        srv.app.stop(0)
