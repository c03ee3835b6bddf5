"""A door opened at Home Assistant's request: only outside a lock-out, a waiting claim and the throttle; locked
again after open_s, or at once on a request to lock."""

from __future__ import annotations

import pytest
from peep.edge.door import Claim, Decision, DoorController
from peep.lab.processes.control import wait_for
from peep_testing.door import RecordingLock


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


def test_a_request_from_home_assistant_opens_unless_a_lock_out_a_waiting_claim_or_the_throttle_stands(door):
    ctl, clock, lock, seen = door
    out = ctl.open_on_request("home_assistant")
    assert out.opened and out.requested_by == "home_assistant" and out.claim is None and seen[-1] is out
    assert wait_for(lambda: lock.events == ["lock", "open", "lock"], 2), lock.events  # open_s, then locked
    claim = ctl.claim("alice")  # someone at the door waiting for their decision: not let in past it
    assert (ctl.open_on_request("home_assistant").reason, ctl.decide(_ok(claim)).opened) == ("busy", True)
    assert wait_for(lambda: lock.events[-1] == "lock", 2)
    for _ in range(3):  # mallory fails until locked out: while she is, nobody opens the door from afar
        ctl.decide(_ok(ctl.claim("mallory"), accepted=False))
        clock.t += 1.0
    refused = ctl.open_on_request("home_assistant")
    assert (refused.opened, refused.reason, refused.requested_by) == (False, "locked_out", "home_assistant")
    clock.t += 61.0  # her window passed
    assert ctl.open_on_request("home_assistant").opened
    ctl.max_claims_per_minute = ctl.opened + 1  # requests count towards the throttle like claims
    clock.t += 61.0
    ctl.relock()
    for _ in range(ctl.max_claims_per_minute):
        ctl.open_on_request("home_assistant")
    assert ctl.open_on_request("home_assistant").reason == "throttled"


def test_a_request_to_lock_locks_at_once(door):
    ctl, _clock, lock, _ = door
    ctl.open_s = 30.0
    assert ctl.open_on_request("home_assistant").opened and lock.events[-1] == "open"
    ctl.relock()
    assert lock.events[-1] == "lock"
