"""The door's decision and lock: fail-secure in every way a decision can go wrong, real GPIO mock and broker."""

from __future__ import annotations

import sys
import threading
import time
import uuid

import numpy as np
import pytest
from peep.edge.door import (
    RELAY_CONVENTIONS,
    Claim,
    CommandLock,
    Decision,
    DoorController,
    GpioLock,
    MqttRelayLock,
)
from peep.lab.processes.control import wait_for
from peep_testing.door import RecordingLock, frames
from peep_testing.edge import EDGE_SITE


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def door():
    clock, lock, seen = FakeClock(), RecordingLock(), []
    ctl = DoorController("door-1", lock, open_s=0.05, decision_timeout_s=2.0, lockout_failures=3,
                         lockout_window_s=60.0, clock=clock, on_outcome=seen.append)  # fmt: skip
    yield ctl, clock, lock, seen
    ctl.close()


def _ok(claim: Claim, **kw) -> Decision:
    return Decision(**{"nonce": claim.nonce, "door": "door-1", "subject": claim.subject, "accepted": True} | kw)


def test_an_accepted_decision_for_the_current_claim_opens_then_relocks(door):
    ctl, clock, lock, seen = door
    assert lock.events == ["lock"]  # it starts locked whatever state it was in
    claim = ctl.claim("alice")
    assert isinstance(claim, Claim) and len(claim.nonce) == 32
    clock.t += 0.3
    out = ctl.decide(_ok(claim))
    assert out.opened and out.latency_s == pytest.approx(0.3) and seen[-1] is out
    time.sleep(0.3)
    assert lock.events == ["lock", "open", "lock"]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda c: None, "malformed"),
        (lambda c: _ok(c, nonce="0" * 32), "mismatch"),
        (lambda c: _ok(c, door="door-2"), "mismatch"),
        (lambda c: _ok(c, subject="mallory"), "mismatch"),
        (lambda c: _ok(c, accepted=False), "rejected"),
    ],
)
def test_every_wrong_decision_leaves_it_locked(door, make, reason):
    ctl, _clock, lock, _ = door
    claim = ctl.claim("alice")
    out = ctl.decide(make(claim))
    assert not out.opened and out.reason == reason and ctl.refusals[reason] == 1
    assert "open" not in lock.events


def test_late_replayed_and_expired_decisions_open_nothing(door):
    ctl, clock, lock, _ = door
    claim = ctl.claim("alice")
    clock.t += 2.5  # past the deadline
    assert ctl.decide(_ok(claim)).reason == "timeout"
    # The same accepted decision again (a replay, e.g. a captured MQTT message): refused.
    assert ctl.decide(_ok(claim)).reason == "replayed"
    claim2 = ctl.claim("alice")
    clock.t += 3.0
    assert ctl.expire().reason == "timeout" and ctl.decide(_ok(claim2)).reason == "replayed"
    # A decision for a claim of an earlier run of the agent (never issued here) is a mismatch.
    assert ctl.decide(Decision("f" * 32, "door-1", "alice", True)).reason == "mismatch"
    assert "open" not in lock.events and ctl.opened == 0


def test_a_claim_waits_alone_and_a_failed_one_says_why(door):
    ctl, _clock, lock, _ = door
    first = ctl.claim("alice")
    busy = ctl.claim("bob")
    assert not isinstance(busy, Claim) and busy.reason == "busy"
    assert ctl.fail(first, "unreachable", "server: connection refused").reason == "unreachable"
    # The claim is over: its decision arriving now opens nothing.
    assert ctl.decide(_ok(first)).reason == "replayed" and "open" not in lock.events
    assert isinstance(ctl.claim("bob"), Claim)


def test_a_subject_is_locked_out_after_n_failures_in_the_window(door):
    ctl, clock, _lock, _ = door
    for _ in range(3):
        c = ctl.claim("mallory")
        ctl.decide(_ok(c, accepted=False))
        clock.t += 1.0
    out = ctl.claim("mallory")
    assert not isinstance(out, Claim) and out.reason == "locked_out"
    assert isinstance(ctl.claim("alice"), Claim)  # others are not
    ctl.expire()
    clock.t += 61.0
    assert isinstance(ctl.claim("mallory"), Claim)  # the window passed


def test_gpio_lock_through_gpiozeros_mock_pins():
    from gpiozero.pins.mock import MockFactory

    factory = MockFactory()
    lock = GpioLock(17, pin_factory=factory)
    pin = factory.pin(17)
    ctl = DoorController("door-1", lock, open_s=0.2, decision_timeout_s=2.0)
    try:
        assert pin.state is False
        claim = ctl.claim("alice")
        ctl.decide(Decision(claim.nonce, "door-1", "alice", False))
        assert pin.state is False
        claim = ctl.claim("alice")
        assert ctl.decide(Decision(claim.nonce, "door-1", "alice", True)).opened
        assert pin.state is True
        time.sleep(0.5)
        assert pin.state is False
    finally:
        ctl.close()
    # Active-low relay boards: energised means a low output.
    lock = GpioLock(27, active_high=False, pin_factory=factory)
    lock.energise()
    assert factory.pin(27).state is False
    lock.release()
    assert factory.pin(27).state is True
    lock.close()


def test_mqtt_relay_lock_speaks_tasmotas_topic_on_the_real_broker(system_broker):
    import paho.mqtt.client as mqtt

    host, port = system_broker
    name = f"peeptest-{uuid.uuid4().hex[:8]}"
    topic_tpl, on, off = RELAY_CONVENTIONS["tasmota"]
    topic = topic_tpl.format(name=name)
    got: list[str] = []
    ready = threading.Event()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-relay")
    sub.on_message = lambda c, u, m: got.append(m.payload.decode())
    sub.on_subscribe = lambda *a: ready.set()
    sub.connect(host, port)
    sub.subscribe(topic, qos=1)
    sub.loop_start()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-door")
    pub.connect(host, port)
    pub.loop_start()
    try:
        assert ready.wait(5)

        def publish(t: str, payload: str) -> None:
            pub.publish(t, payload, qos=1).wait_for_publish(5)

        ctl = DoorController("door-1", MqttRelayLock(publish, topic=topic, payload_on=on, payload_off=off),
                             open_s=0.2, decision_timeout_s=2.0)  # fmt: skip
        claim = ctl.claim("alice")
        assert ctl.decide(Decision(claim.nonce, "door-1", "alice", True)).opened
        time.sleep(0.6)
        ctl.close()
        deadline = time.monotonic() + 5
        while len(got) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == ["OFF", "ON", "OFF", "OFF"]  # locked at start, opened, relocked, locked on close
    finally:
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()


def test_command_lock_runs_argument_lists(tmp_path):
    log = tmp_path / "lock.log"
    script = f"import sys; open({str(log)!r}, 'a').write(sys.argv[1] + '\\n')"
    lock = CommandLock([sys.executable, "-c", script, "open"], [sys.executable, "-c", script, "locked"])
    ctl = DoorController("door-1", lock, open_s=0.2, decision_timeout_s=2.0)
    claim = ctl.claim("alice")
    ctl.decide(Decision(claim.nonce, "door-1", "alice", True))
    time.sleep(0.8)
    ctl.close()
    assert log.read_text().split() == ["locked", "open", "locked", "locked"]
    with pytest.raises(ValueError, match="door.lock: expected an open and a close command"):
        CommandLock([], ["true"])


def test_door_configuration_builds_each_lock_and_names_what_is_missing(make_config, tmp_path, edge_keys):
    from gpiozero.pins.mock import MockFactory
    from peep.edge.config import load_config
    from peep.edge.door import build_lock
    from peep.edge.errors import ConfigError

    # make_config's device talks MQTT only (the local broker: no TLS, no password): its door's decision comes
    # over MQTT, signed by the server's decision key, on a broker it accepts only when told to.
    signed = {"decision_public_key": str(edge_keys["pub_path"]), "insecure_broker": True}
    cfg = load_config(make_config(door={"enabled": True, "gpio_pin": 22, "decision": "mqtt"} | signed)).door
    factory = MockFactory()
    lock = build_lock(cfg, pin_factory=factory)
    assert isinstance(lock, GpioLock)
    lock.energise()
    assert factory.pin(22).state is False  # active low by default: most relay boards are
    lock.close()
    sent: list[tuple[str, str]] = []
    door = {"enabled": True, "decision": "mqtt", "lock": "mqtt-relay", "relay_convention": "shelly",
            "relay_name": "shelly1-front"} | signed  # fmt: skip
    shelly = load_config(make_config("s.toml", door=door)).door
    relay = build_lock(shelly, publish=lambda t, p: sent.append((t, p)))
    relay.energise()
    assert sent == [("shellies/shelly1-front/relay/0/command", "on")]
    with pytest.raises(ValueError, match="needs the device's MQTT connection"):
        build_lock(shelly)
    for door, match in (
        ({"enabled": True, "lock": "command", "open_command": ["unlock"]}, "door.open_command/close_command"),
        ({"enabled": True, "lock": "mqtt-relay", "relay_convention": "custom"}, "door.relay_topic: expected the"),
        ({"enabled": True, "lock": "mqtt-relay", "relay_convention": "custom", "relay_topic": "a/+/b"}, "wildcards"),
        ({"enabled": True, "open_s": 0}, "door.open_s"),
        ({"enabled": True, "decision": "grpc"}, "door.decision: expected grpc.enabled for decision = 'grpc'"),
        ({"enabled": True, "decision": "carrier-pigeon"}, "door.decision"),
        ({"enabled": True, "lock": "mqtt-relay"}, None),
    ):
        if match is None:  # an MQTT relay needs the device's MQTT connection
            with pytest.raises(ConfigError, match="door.lock: expected mqtt.enabled"):
                load_config(make_config("m.toml", door=door, mqtt={"enabled": False}, grpc={"enabled": True}))
            continue
        with pytest.raises(ConfigError, match=match):
            load_config(make_config("x.toml", door={"decision": "mqtt"} | signed | door))
    # Deciding over MQTT: only on decisions signed by the server's key, and on an open broker only when told to.
    with pytest.raises(ConfigError, match="door.decision_public_key: expected the server's decision key"):
        load_config(make_config("k.toml", door={"enabled": True, "decision": "mqtt", "insecure_broker": True}))
    with pytest.raises(ConfigError, match="door.decision: expected a broker connection with TLS and credentials for "
                       "decision = 'mqtt', received no TLS and no credentials"):  # fmt: skip
        load_config(make_config("o.toml", door={"enabled": True, "decision": "mqtt",
                                                "decision_public_key": str(edge_keys["pub_path"])}))  # fmt: skip
    with pytest.raises(ConfigError, match="received no credentials"):
        load_config(make_config("p.toml", door={"enabled": True, "decision": "mqtt",
                                                "decision_public_key": str(edge_keys["pub_path"])},
                                mqtt={"tls": True, "port": 8883}))  # fmt: skip
    # Fusing soft traits: only where the device releases them, and the answer is the server's VerifyFused.
    with pytest.raises(ConfigError, match="door.fuse_soft_traits: expected soft.enabled and door.decision = 'grpc'"):
        load_config(
            make_config("f.toml", door={"enabled": True, "decision": "mqtt", "fuse_soft_traits": True} | signed)
        )
    fused = {"enabled": True, "decision": "grpc", "fuse_soft_traits": True}
    cfg = load_config(make_config("f2.toml", door=fused, grpc={"enabled": True, "target": "localhost:1"},
                                  soft={"enabled": True}))  # fmt: skip
    assert cfg.door.fuse_soft_traits
    with pytest.raises(ConfigError, match="door.decision: expected mqtt.enabled for decision = 'mqtt'"):
        load_config(make_config("g.toml", door={"enabled": True, "decision": "mqtt"}, mqtt={"enabled": False},
                                grpc={"enabled": True}))  # fmt: skip


# --------------------------------------------------------------------------- a claim on the device


class FakeVerifier:
    """Answers as configured and keeps what it was sent (the real one is gRPC Verify).

    ``known``: the subjects its claim check says the server knows (None: every one); ``check_error`` raised
    by the claim check instead.
    """

    def __init__(self, accepted: bool = True, error: Exception | None = None, *, known: set[str] | None = None,
                 check_error: Exception | None = None) -> None:  # fmt: skip
        self.accepted, self.error, self.sent = accepted, error, []
        self.known, self.check_error, self.checked = known, check_error, []

    def check_claim(self, claim, timeout_s):
        self.checked.append(claim.subject)
        if self.check_error is not None:
            raise self.check_error
        return self.known is None or claim.subject in self.known

    def claim_ticket(self, claim):
        return ""

    def verify(self, payload, claim, timeout_s):
        from peep.core.wire import decode_template

        self.sent.append((decode_template(payload), claim, timeout_s))
        if self.error is not None:
            raise self.error
        return Decision(claim.nonce, claim.door, claim.subject, self.accepted, 0.9 if self.accepted else 0.1)


@pytest.fixture
def door_agent(make_config, tmp_path):
    from peep.edge.agent import Agent
    from peep.edge.config import load_config

    agent = Agent(load_config(make_config(privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6})),
                  environ={})  # fmt: skip
    pipeline = agent.open()
    yield agent, pipeline
    agent.shutdown(drain_timeout=0)


def test_a_claim_releases_one_verify_template_spent_not_spooled_and_opens_on_accept(door_agent, one_person_video):
    from peep.edge.door_session import DoorSession

    agent, pipeline = door_agent
    lock = RecordingLock()
    verifier = FakeVerifier(accepted=True)
    ctl = DoorController("cam-1", lock, open_s=0.05, decision_timeout_s=30.0)
    session = DoorSession(pipeline, agent.accountant, ctl, verifier, face_timeout_s=10.0, settle_frames=5)
    out = session.handle("alice", frames(one_person_video["path"]))
    ctl.close()
    assert out.opened and lock.events[:2] == ["lock", "open"]
    ((msg, claim, timeout_s),) = verifier.sent
    assert claim.subject == "alice" and msg.subject == "alice" and msg.purpose == 3  # VERIFY
    assert msg.message_id == claim.nonce  # the decision names the claim through the template's id
    assert 0 < timeout_s <= 30.0
    spends = agent.accountant.ledger.entries(f"door:{claim.nonce[:16]}")
    assert [s.message_id for s in spends] == [msg.message_id] and spends[0].purpose == "verify"
    assert spends[0].epsilon == pytest.approx(16.0, rel=1e-3)
    assert agent.spool.peek("mqtt", 10) == []  # answered in the call: never queued for ingest
    st = session.last_timing.stages
    assert {"detect", "release", "descriptor", "perturb", "encode", "verify", "actuate", "claim_to_lock"} <= set(st)
    assert 0 < st["descriptor"] + st["perturb"] + st["encode"] <= st["release"]
    assert session.last_timing.marks["verify_start"] <= session.last_timing.marks["verify_end"]


@pytest.mark.parametrize(
    ("verifier", "reason"),
    [
        (FakeVerifier(accepted=False), "rejected"),
        (None, "unreachable"),  # the server down: VerifierUnavailable
        (FakeVerifier(error=ValueError("score: not a number")), "malformed"),
    ],
)
def test_a_claim_stays_locked_when_the_answer_is_no_or_missing(door_agent, one_person_video, verifier, reason):
    from peep.edge.door_session import DoorSession, VerifierUnavailable

    agent, pipeline = door_agent
    verifier = verifier or FakeVerifier(error=VerifierUnavailable("Verify: UNAVAILABLE: connection refused"))
    lock = RecordingLock()
    ctl = DoorController("cam-1", lock, open_s=0.05, decision_timeout_s=30.0)
    out = DoorSession(pipeline, agent.accountant, ctl, verifier, face_timeout_s=10.0).handle(
        "alice", frames(one_person_video["path"])
    )
    ctl.close()
    assert not out.opened and out.reason == reason and "open" not in lock.events


def test_no_face_no_release(door_agent):
    from peep.edge.capture import Frame
    from peep.edge.door_session import DoorSession

    agent, pipeline = door_agent
    blank = iter([Frame(np.zeros((240, 320, 3), np.uint8), float(i), i) for i in range(10)])
    verifier = FakeVerifier()
    ctl = DoorController("cam-1", RecordingLock(), decision_timeout_s=30.0)
    out = DoorSession(pipeline, agent.accountant, ctl, verifier, face_timeout_s=5.0).handle(
        "alice", lambda: next(blank, None)
    )
    ctl.close()
    assert (
        out.reason == "no_face"
        and verifier.sent == []
        and agent.accountant.ledger.entries(f"door:{out.claim.nonce[:16]}") == []
    )


def test_an_observer_may_call_back_into_the_door_without_deadlock(door):
    """Outcomes are reported after the door's lock is released: an observer asking for the next claim works."""
    ctl, *_ = door
    follow: list = []
    ctl.on_outcome = lambda out: follow.append(ctl.claim("bob")) if out.reason == "rejected" else None
    claim = ctl.claim("alice")
    out = ctl.decide(_ok(claim, accepted=False))
    assert out.reason == "rejected" and len(follow) == 1 and isinstance(follow[0], Claim)


def test_each_claim_is_charged_on_its_own_so_a_budget_of_one_release_serves_every_visit(make_config, one_person_video):
    """The track budget bounds one claim (one release), not a person's visits: a key per subject refused the
    third claim of the same person for ever."""
    from peep.edge.agent import Agent
    from peep.edge.config import load_config
    from peep.edge.door_session import DoorSession

    cfg = make_config(privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 16.0})
    agent = Agent(load_config(cfg), environ={})
    try:
        verifier = FakeVerifier(accepted=True)
        ctl = DoorController("cam-1", RecordingLock(), open_s=0.05, decision_timeout_s=30.0)
        session = DoorSession(agent.open(), agent.accountant, ctl, verifier, face_timeout_s=10.0)
        outs = [session.handle("alice", frames(one_person_video["path"])) for _ in range(3)]
        ctl.close()
        assert [o.opened for o in outs] == [True, True, True], [o.reason for o in outs]
        assert len({o.claim.nonce for o in outs}) == 3 and len(verifier.sent) == 3
    finally:
        agent.shutdown(drain_timeout=0)


def test_claims_from_a_local_socket_one_line_each_bounded(tmp_path):
    """An access controller connects to the door's socket and writes claims; an over-long line is dropped whole."""
    import os
    import socket
    import stat

    from peep.edge.door_claims import MAX_CLAIM_LINE, read_claims, socket_claims

    path = tmp_path / "door.sock"
    stop = threading.Event()
    got: list[str] = []
    # A daemon, stopped in ``finally``: a failed assertion must not leave a reader that keeps pytest from exiting.
    reader = threading.Thread(target=lambda: got.extend(read_claims(socket_claims(path, stop=stop))), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 5
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o007 == 0  # no access for others
        for payload in (b"alice\nbob\n", b"x" * (MAX_CLAIM_LINE + 50) + b"\ncarol\n", b"bad\x1b[2Jid\n"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(str(path))
                c.sendall(payload)
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        reader.join(5)
    assert got == ["alice", "bob", "carol"] and not path.exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a socket"):
        next(socket_claims(tmp_path / "file"))


def test_a_door_socket_path_appears_only_once_a_controller_can_connect(tmp_path, monkeypatch):
    """The claims socket's path is there only when it listens: a controller that sees it is never refused."""
    import socket

    from peep.edge.door_claims import socket_claims

    listen = socket.socket.listen

    def slow_listen(self, *args):
        time.sleep(0.3)  # widens the window between bind and listen that a loaded machine opens by chance
        return listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", slow_listen)
    path = tmp_path / "door.sock"
    stop = threading.Event()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(socket_claims(path, stop=stop)), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 5
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(path))  # refused if the path appeared at bind
            c.sendall(b"alice\n")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        reader.join(5)
    assert got == [b"alice"], got
    assert not path.exists() and [p.name for p in tmp_path.iterdir()] == []  # nothing left behind


def test_a_door_reports_what_it_spent_over_mqtt(make_config, one_person_video, system_broker):
    """A door reads no frames in ``run``'s loop: start_transports publishes its retained report (its ε spent)."""
    import json

    import paho.mqtt.client as mqtt
    from peep.edge.agent import Agent
    from peep.edge.config import load_config
    from peep.edge.door_session import DoorSession

    host, port = system_broker
    device = f"door-{uuid.uuid4().hex[:6]}"
    cfg = make_config(device={"id": device, "site": EDGE_SITE}, mqtt={"report_interval_s": 1.0},
                      privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6})  # fmt: skip
    agent = Agent(load_config(cfg), environ={})
    reports: list[dict] = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{device}-watch")
    sub.on_message = lambda c, u, m: reports.append(json.loads(m.payload)) if m.payload else None
    sub.connect(host, port)
    sub.subscribe(f"peep/v1/{EDGE_SITE}/{device}/report", qos=1)
    sub.loop_start()
    try:
        ctl = DoorController(device, RecordingLock(), open_s=0.05, decision_timeout_s=30.0)
        session = DoorSession(agent.open(), agent.accountant, ctl, FakeVerifier(), face_timeout_s=10.0)
        assert session.handle("alice", frames(one_person_video["path"])).opened
        agent.start_transports()
        # Its own MQTT client id: a `peep-edge run` of the same device keeps the usual one.
        assert agent.mqtt_link.client_id == agent.cfg.mqtt_client_id + "-door-agent"
        deadline = time.monotonic() + 10
        while not any(r["releases"] == 1 for r in reports) and time.monotonic() < deadline:
            time.sleep(0.05)
        report = next(r for r in reports if r["releases"] == 1)
        assert report["epsilon_vector_spent"] == pytest.approx(16.0, rel=1e-3)
        ctl.close()
    finally:
        agent.shutdown(drain_timeout=0)
        sub.loop_stop()
        sub.disconnect()


# --------------------------------------------------------------------------- what an attacker at the door tries


def _session(agent, pipeline, verifier, **ctl_kw):
    from peep.edge.door_session import DoorSession

    lock = RecordingLock()
    ctl = DoorController("cam-1", lock, open_s=0.05, decision_timeout_s=30.0, **ctl_kw)
    return DoorSession(pipeline, agent.accountant, ctl, verifier, face_timeout_s=10.0), ctl, lock


def _door_spends(agent) -> list:
    return [e for e in agent.accountant.ledger.entries() if e.key.startswith("door:")]


def test_a_claim_for_a_subject_the_server_does_not_know_releases_nothing(door_agent, one_person_video):
    """The server is asked first, with no template: a made-up id costs the face at the door nothing."""
    agent, pipeline = door_agent
    verifier = FakeVerifier(known={"alice"})
    session, ctl, _lock = _session(agent, pipeline, verifier)
    out = session.handle("Made_Up_Person", frames(one_person_video["path"]))
    assert not out.opened and out.reason == "unknown_subject" and "nothing was released" in out.detail
    assert verifier.checked == ["Made_Up_Person"] and verifier.sent == [] and _door_spends(agent) == []
    assert session.handle("alice", frames(one_person_video["path"])).opened  # a known one is verified
    assert len(verifier.sent) == 1 and len(_door_spends(agent)) == 1
    ctl.close()


def test_a_flood_of_made_up_ids_is_throttled_at_once_and_releases_nothing(door_agent, one_person_video):
    """500 ids typed in a burst: max_claims_per_minute are asked about (all unknown), the rest refused at once."""
    from peep.edge.door_claims import serve_claims

    agent, pipeline = door_agent
    verifier = FakeVerifier(known={"alice"})
    session, ctl, lock = _session(agent, pipeline, verifier, max_claims_per_minute=10)
    outcomes: list = []
    t0 = time.monotonic()
    opened = serve_claims(session, [f"Made_Up_{i}\n" for i in range(500)], frames(one_person_video["path"]),
                          on_outcome=outcomes.append)  # fmt: skip
    elapsed = time.monotonic() - t0
    ctl.close()
    reasons = [o.reason for o in outcomes]
    assert opened == 0 and reasons.count("unknown_subject") == 10 and reasons.count("throttled") == 490
    assert verifier.sent == [] and _door_spends(agent) == [] and "open" not in lock.events
    assert elapsed < 5.0  # refused, not queued: no face was looked for
    assert ctl.refusals["throttled"] == 490


def test_the_door_and_each_subject_spend_within_their_hourly_budgets_across_a_restart(door_agent, one_person_video):
    from peep.edge.door import DoorBudget

    agent, pipeline = door_agent
    budget = DoorBudget(door_epsilon=48.0, subject_epsilon=32.0)  # three releases, two per subject (ε 16 each)
    verifier = FakeVerifier()
    session, ctl, _lock = _session(agent, pipeline, verifier)
    session.budget = budget
    outs = [session.handle(s, frames(one_person_video["path"])) for s in ("alice", "alice", "alice", "bob", "carol")]
    assert [o.opened for o in outs] == [True, True, False, True, False]
    assert [o.reason for o in outs if not o.opened] == ["subject_budget", "door_budget"]
    assert "per-vector ε 31.9999 of 32 spent on this subject" in outs[2].detail, outs[2].detail
    assert "(per-coordinate ε 15.9999 a release); nothing was released" in outs[2].detail
    assert len(_door_spends(agent)) == 3 and budget.spent() == pytest.approx(48.0, rel=1e-3)
    assert ctl.refusals["subject_budget"] == 1 and ctl.refusals["door_budget"] == 1
    # After a restart the door's window is read back from the ledger: still spent.
    again = DoorBudget(door_epsilon=48.0, subject_epsilon=32.0,
                       spent=agent.accountant.ledger.recent("door:", time.time() - 3600))  # fmt: skip
    assert again.spent() == pytest.approx(48.0, rel=1e-3) and again.refusal("dave", 16.0)[0] == "door_budget"
    # An hour later the window has passed.
    later = DoorBudget(door_epsilon=48.0, subject_epsilon=32.0, clock=lambda: time.time() + 3601,
                       spent=agent.accountant.ledger.recent("door:", time.time() - 3600))  # fmt: skip
    assert later.refusal("dave", 16.0) is None
    ctl.close()


def test_an_outage_never_locks_a_subject_out_and_spends_nothing_while_the_server_cannot_be_asked(
    door_agent, one_person_video
):
    from peep.edge.door_session import VerifierUnavailable

    agent, pipeline = door_agent
    down = FakeVerifier(check_error=VerifierUnavailable("CheckClaim: UNAVAILABLE: connection refused"))
    session, ctl, _lock = _session(agent, pipeline, down, lockout_failures=3)
    outs = [session.handle("alice", frames(one_person_video["path"])) for _ in range(5)]
    assert [o.reason for o in outs] == ["unreachable"] * 5 and _door_spends(agent) == []
    # The server answers the check but the decision is lost on the way back: ε was spent, still no lock-out.
    session.verifier = FakeVerifier(error=VerifierUnavailable("Verify: UNAVAILABLE: connection reset"))
    outs = [session.handle("alice", frames(one_person_video["path"])) for _ in range(4)]
    assert [o.reason for o in outs] == ["unreachable"] * 4 and len(_door_spends(agent)) == 4
    session.verifier = FakeVerifier(accepted=True)  # the server back
    assert session.handle("alice", frames(one_person_video["path"])).opened
    ctl.close()


def test_only_the_servers_refusals_count_towards_a_lock_out(door):
    ctl, clock, _lock, _ = door  # lockout_failures = 3
    ctl.max_claims_per_minute = 100
    for reason in ("unreachable", "timeout", "no_face", "malformed", "unreachable"):
        c = ctl.claim("alice")
        ctl.fail(c, reason)
        clock.t += 1.0
    for _ in range(3):  # deadlines passing without an answer
        ctl.claim("alice")
        clock.t += 3.0
        assert ctl.expire().reason == "timeout"
    assert isinstance(ctl.claim("alice"), Claim)
    clock.t += 3.0
    ctl.expire()
    for _ in range(3):  # three refusals by the server
        c = ctl.claim("alice")
        assert isinstance(c, Claim), c
        ctl.decide(_ok(c, accepted=False))
    assert ctl.claim("alice").reason == "locked_out"


def test_claims_beyond_the_rate_are_throttled_then_taken_again(door):
    ctl, clock, _lock, _ = door
    ctl.max_claims_per_minute = 3
    for i in range(3):
        c = ctl.claim(f"s{i}")
        ctl.fail(c, "unknown_subject")
        clock.t += 1.0
    out = ctl.claim("alice")
    assert not isinstance(out, Claim) and out.reason == "throttled" and ctl.refusals["throttled"] == 1
    clock.t += 58.0  # the first of the three is a minute old
    assert isinstance(ctl.claim("alice"), Claim)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_an_over_long_claim_line_is_dropped_whole_from_a_stream_and_logged_with_its_length(chunk, caplog):
    """``Kofi_Annan`` and 102,400 spaces and a tail is no claim for Kofi_Annan, however the bytes arrive."""
    import logging
    import os

    from peep.edge.door_claims import fd_claim_lines, read_claims

    padding = 2_000 if chunk == 1 else 102_400  # a byte at a time: a shorter line, still far over the bound
    first = b"Kofi_Annan" + b" " * padding + b"tail"
    payload = first + b"\nalice\n"
    r, w = os.pipe()

    def write() -> None:
        for i in range(0, len(payload), chunk):
            os.write(w, payload[i : i + chunk])
        os.close(w)

    writer = threading.Thread(target=write)
    writer.start()
    with caplog.at_level(logging.WARNING, logger="peep.edge.door"):
        got = list(read_claims(fd_claim_lines(r, poll_s=0.05)))
    writer.join(10)
    os.close(r)
    assert got == ["alice"]
    lengths = [rec.peep_fields["length"] for rec in caplog.records if rec.getMessage() == "door_claim_malformed"]
    assert lengths == [len(first)], lengths


def _door_command_config(make_config, tmp_path, video: str, **door) -> tuple:
    """A door deciding over gRPC (a server that is not there), its lock a command writing to a log."""
    log = tmp_path / "lock.log"
    script = f"import sys; open({str(log)!r}, 'a').write(sys.argv[1] + '\\n')"
    section = {"enabled": True, "decision": "grpc", "lock": "command",
               "open_command": [sys.executable, "-c", script, "open"],
               "close_command": [sys.executable, "-c", script, "locked"]} | door  # fmt: skip
    cfg = make_config("door.toml", privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6},
                      capture={"source": video, "max_fps": 10.0}, mqtt={"enabled": False},
                      grpc={"enabled": True, "target": "127.0.0.1:1", "tls": False, "report_interval_s": 0},
                      door=section)  # fmt: skip
    return cfg, log


@pytest.mark.parametrize("while_", ["idle", "claim"])
def test_sigterm_ends_the_door_promptly_from_an_open_idle_stdin_and_from_a_claim(
    make_config, tmp_path, one_person_video, while_
):
    """Under systemd a stop is SIGTERM, then SIGKILL (which skips releasing the lock): the door must end first."""
    import signal
    import subprocess

    cfg, log = _door_command_config(make_config, tmp_path, one_person_video["path"])
    cmd = [sys.executable, "-m", "peep.edge.cli", "door", "--config", str(cfg), "--claims", "-"]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            assert wait_for(lambda: log.exists() and "locked" in log.read_text(), 60), "the door did not start"
            time.sleep(0.5)  # the door is waiting for a claim on stdin, which stays open
            if while_ == "claim":
                proc.stdin.write(b"alice\n")  # asked about a server that is not there: waits for it to come back
                proc.stdin.flush()
                time.sleep(0.8)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=10)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
            stdout, stderr = proc.communicate()
    out = stdout.decode()
    assert rc == 0 and took < 5.0, (rc, took, out, stderr.decode()[-2000:])
    print(f"SIGTERM while {while_}: exited {rc} after {took:.2f} s")
    assert log.read_text().split() == ["locked", "locked"]  # locked at start, released on the way out
    assert "stopped after 0 opening(s)" in out


def test_validate_config_refuses_a_door_that_could_never_open_or_cannot_read_its_decision_key(
    make_config, tmp_path, one_person_video, capsys
):
    from peep.edge.cli import main

    cfg, _ = _door_command_config(make_config, tmp_path, one_person_video["path"], subject_epsilon_per_hour=8.0)
    assert main(["run", "--config", str(cfg), "--validate-config"]) == 2
    err = capsys.readouterr().err
    assert "door.subject_epsilon_per_hour: expected at least one release's per-vector ε (15.9999" in err
    bad_key = tmp_path / "not-a-key.pub"
    bad_key.write_text("not a key")
    cfg = make_config("mqtt-door.toml", privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6},
                      capture={"source": one_person_video["path"]},
                      door={"enabled": True, "decision": "mqtt", "insecure_broker": True,
                            "decision_public_key": str(bad_key)})  # fmt: skip
    assert main(["run", "--config", str(cfg), "--validate-config"]) == 2
    assert "door.decision_public_key: expected an Ed25519 public key in PEM" in capsys.readouterr().err


def test_a_claim_whose_deadline_passed_before_its_face_was_taken_releases_nothing(door_agent, one_person_video):
    from peep.edge.door_session import DoorSession

    agent, pipeline = door_agent

    class SlowCheck(FakeVerifier):
        def check_claim(self, claim, timeout_s):
            time.sleep(0.3)  # the answer comes, but after the claim's deadline
            return True

    verifier = SlowCheck()
    ctl = DoorController("cam-1", RecordingLock(), open_s=0.05, decision_timeout_s=0.2)
    out = DoorSession(pipeline, agent.accountant, ctl, verifier, face_timeout_s=5.0).handle(
        "alice", frames(one_person_video["path"])
    )
    ctl.close()
    assert out.reason == "timeout" and "nothing was released" in out.detail
    assert verifier.sent == [] and _door_spends(agent) == []


class _StuckLock:
    """A drive that fails to energise (a strike that does not move), and releases."""

    def __init__(self) -> None:
        self.released = 0

    def energise(self) -> None:
        raise OSError("the strike did not move")

    def release(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.release()


def test_a_reported_lock_says_locked_unlocked_and_jammed_when_its_drive_fails():
    from peep.edge.door import ReportedLock

    said: list[str] = []
    stuck = ReportedLock(_StuckLock(), said.append)
    stuck.release()
    with pytest.raises(OSError, match="did not move"):  # the controller still sees the failure and fails secure
        stuck.energise()
    stuck.close()
    assert said == ["locked", "jammed", "locked"] and stuck.lock.released == 2
