"""A door's limits on one person outlast a restart, and its disk names no one who claimed.

Each "restart" here is a new controller, budget and memory over the same state folder, as a new process would
build them (``open_door``); the last test restarts a door built from its configuration.
"""

from __future__ import annotations

import os
import stat

import pytest
from peep.edge.door import Claim, Decision, DoorBudget, DoorController
from peep.edge.door_memory import DoorMemory, DoorMemoryError
from peep_testing.door import RecordingLock, frames


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _controller(memory: DoorMemory, clock: Clock, **kw) -> DoorController:
    opts = {"open_s": 0.05, "decision_timeout_s": 2.0, "lockout_failures": 3, "lockout_window_s": 60.0} | kw
    return DoorController("door-1", RecordingLock(), clock=clock, memory=memory, **opts)


def _refuse(ctl: DoorController, subject: str) -> None:
    claim = ctl.claim(subject)
    assert isinstance(claim, Claim), claim
    out = ctl.decide(Decision(claim.nonce, "door-1", subject, False, 0.1))
    assert out.reason == "rejected"


def _all_bytes(folder) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


def test_a_lock_out_outlasts_a_restart_and_its_window_still_ends(tmp_path):
    wall, mono = Clock(1_000_000.0), Clock(50.0)
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, mono)
    for _ in range(3):
        _refuse(ctl, "Kofi_Annan")
    assert ctl.claim("Kofi_Annan").reason == "locked_out"
    ctl.close()
    mem.close()
    # A new process: its monotonic clock starts elsewhere; ten seconds of wall time have passed.
    wall.t += 10
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, Clock(3.0))
    out = ctl.claim("Kofi_Annan")
    assert out.reason == "locked_out" and "3 failed claims within 60 s" in out.detail
    assert isinstance(ctl.claim("Tony_Blair"), Claim)  # another subject is not locked out
    ctl.close()
    mem.close()
    # Once the window has passed (wall clock), the subject may claim again.
    wall.t += 61
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, Clock(9.0))
    assert isinstance(ctl.claim("Kofi_Annan"), Claim)
    ctl.close()
    mem.close()


def test_an_accepted_claim_clears_the_count_on_disk_too(tmp_path):
    wall = Clock(1_000_000.0)
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, Clock(5.0), lockout_failures=2)
    _refuse(ctl, "alice")
    claim = ctl.claim("alice")
    assert ctl.decide(Decision(claim.nonce, "door-1", "alice", True, 0.9)).opened
    ctl.close()
    assert mem.recent("failure", 3600) == []
    ctl = _controller(mem, Clock(7.0), lockout_failures=2)
    _refuse(ctl, "alice")  # one failure since the accepted claim: not locked out
    assert isinstance(ctl.claim("alice"), Claim)
    ctl.close()
    mem.close()


def test_the_claim_throttle_outlasts_a_restart(tmp_path):
    wall = Clock(1_000_000.0)
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, Clock(0.0), max_claims_per_minute=4)
    for i in range(4):
        assert isinstance(ctl.claim(f"Made_Up_{i}"), Claim)
        ctl.expire()
        ctl._current = None  # each made-up claim ended (as the server's "unknown" would end it)
    ctl.close()
    mem.close()
    wall.t += 5
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, Clock(0.0), max_claims_per_minute=4)
    assert ctl.claim("Made_Up_9").reason == "throttled"
    ctl.close()
    mem.close()
    wall.t += 60
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    ctl = _controller(mem, Clock(0.0), max_claims_per_minute=4)
    assert isinstance(ctl.claim("Made_Up_9"), Claim)
    ctl.close()
    mem.close()


def test_a_subjects_hourly_spend_outlasts_a_restart(tmp_path):
    wall = Clock(1_000_000.0)
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    budget = DoorBudget(door_epsilon=1000.0, subject_epsilon=32.0, clock=wall, memory=mem)
    budget.charge("alice", 16.0)
    budget.charge("alice", 16.0)
    assert budget.refusal("alice", 16.0)[0] == "subject_budget"
    mem.close()
    wall.t += 30
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    again = DoorBudget(door_epsilon=1000.0, subject_epsilon=32.0, clock=wall, memory=mem)
    assert again.spent("alice") == pytest.approx(32.0)
    assert again.refusal("alice", 16.0)[0] == "subject_budget" and again.refusal("bob", 16.0) is None
    mem.close()
    wall.t += 3600
    mem = DoorMemory(tmp_path / "door.sqlite3", clock=wall)
    later = DoorBudget(door_epsilon=1000.0, subject_epsilon=32.0, clock=wall, memory=mem)
    assert later.refusal("alice", 16.0) is None
    mem.close()


def test_the_state_names_no_one_and_keeps_rows_only_as_long_as_a_limit_needs_them(tmp_path):
    wall = Clock(1_000_000.0)
    mem = DoorMemory(tmp_path / "door.sqlite3", keep_s=3600.0, clock=wall)
    ctl = _controller(mem, Clock(1.0))
    budget = DoorBudget(door_epsilon=1000.0, subject_epsilon=100.0, clock=wall, memory=mem)
    _refuse(ctl, "Gerhard_Schroeder")
    budget.charge("Gerhard_Schroeder", 16.0)
    ctl.close()
    assert b"Gerhard" not in _all_bytes(tmp_path)  # the database, its WAL and the key
    assert stat.S_IMODE(os.stat(tmp_path / "door.key").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "door.sqlite3").st_mode) == 0o600
    # The id is keyed: another door's key gives another id for the same name.
    (tmp_path / "other").mkdir()
    other = DoorMemory(tmp_path / "other" / "door.sqlite3", clock=wall)
    assert other.subject_key("Gerhard_Schroeder") != mem.subject_key("Gerhard_Schroeder")
    other.close()
    # An hour on, the next write deletes what no window looks back over.
    wall.t += 3601
    mem.record("claim")
    assert [kind for kind in ("claim", "failure", "release") if mem.recent(kind, 10 * 3600)] == ["claim"]
    mem.close()


def test_a_damaged_key_is_refused_by_name(tmp_path):
    (tmp_path / "door.key").write_bytes(b"short")
    with pytest.raises(DoorMemoryError, match=r"door\.key: expected the door's 32-byte key, received 5 bytes"):
        DoorMemory(tmp_path / "door.sqlite3")
    (tmp_path / "door.key").unlink()
    mem = DoorMemory(tmp_path / "door.sqlite3")
    with pytest.raises(ValueError, match="kind: expected one of claim, failure, release, received 'visit'"):
        mem.record("visit")
    mem.close()


class _Refusing:
    """The server's answer to every claim: known, and not the claimed person."""

    def check_claim(self, claim, timeout_s):
        return True

    def claim_ticket(self, claim):
        return ""

    def verify(self, payload, claim, timeout_s):
        return Decision(claim.nonce, claim.door, claim.subject, False, 0.1)


def test_a_door_from_its_configuration_still_refuses_a_locked_out_subject_after_a_restart(
    make_config, one_person_video
):
    """Through ``open_door``: five refused claims, the process gone, a new door on the same state folder."""
    from gpiozero.pins.mock import MockFactory
    from peep.edge.agent import Agent
    from peep.edge.config import load_config
    from peep.edge.door_session import open_door

    def door():
        cfg = make_config("door.toml", privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6},
                          capture={"source": one_person_video["path"], "max_fps": 0.0},
                          door={"enabled": True, "lockout_failures": 2, "open_s": 0.2},
                          mqtt={"enabled": False},
                          grpc={"enabled": True, "tls": False, "target": "localhost:1"})  # fmt: skip
        agent = Agent(load_config(cfg), environ={})
        rig = open_door(agent, pin_factory=MockFactory(), face_timeout_s=10.0)
        rig.session.verifier = _Refusing()
        return agent, rig

    agent, rig = door()
    outs = [rig.session.handle("Kofi_Annan", frames(one_person_video["path"])) for _ in range(3)]
    assert [o.reason for o in outs] == ["rejected", "rejected", "locked_out"]
    state = agent.cfg.device.state_dir
    rig.close()
    agent.shutdown(drain_timeout=0)
    agent, rig = door()
    try:
        assert agent.cfg.device.state_dir == state
        out = rig.session.handle("Kofi_Annan", frames(one_person_video["path"]))
        assert out.reason == "locked_out"
        assert b"Kofi_Annan" not in (state / "door.sqlite3").read_bytes()
    finally:
        rig.close()
        agent.shutdown(drain_timeout=0)
