"""The soak's nemesis: a seeded schedule, every fault healed, each recovery timed on the timeline's clock."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
from peep.lab.bench.soak.nemesis import FAULT_KINDS, Fault, Nemesis, schedule
from peep.lab.bench.soak.timeline import Timeline


def _targets(kind: str) -> list[str]:
    return ["replica-a", "replica-b"] if kind.startswith("replica") else ["cam-1", "cam-2", "cam-3"]


def test_a_quick_schedule_has_each_kind_once_in_time_order_and_the_same_seed_repeats_it():
    faults = schedule(7, 300, _targets, quick=True, warmup_s=30)
    assert sorted(f.kind for f in faults) == sorted(FAULT_KINDS)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert faults == schedule(7, 300, _targets, quick=True, warmup_s=30)
    assert faults != schedule(8, 300, _targets, quick=True, warmup_s=30)
    assert all(f.at_s >= 30 and f.target in _targets(f.kind) for f in faults)
    for a, b in itertools.pairwise(faults):
        assert a.at_s + a.duration_s + 25.0 <= b.at_s + 1e-6  # healed and settled before the next starts


def test_an_hour_draws_more_faults_every_kind_at_least_once_none_overlapping():
    faults = schedule(1, 3600, _targets, quick=False, warmup_s=300)
    assert set(f.kind for f in faults) == set(FAULT_KINDS) and len(faults) > len(FAULT_KINDS)
    assert all(5.0 <= f.duration_s <= 20.0 for f in faults)
    for a, b in itertools.pairwise(faults):
        assert a.at_s + a.duration_s <= b.at_s
    assert faults[-1].at_s + faults[-1].duration_s + 25.0 <= 3600 + 1e-6


def test_a_schedule_that_cannot_fit_or_names_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="duration_s: expected at least"):
        schedule(0, 100, _targets, quick=True, warmup_s=30)
    with pytest.raises(ValueError, match="kinds: expected some of .* received 'meteor'"):
        schedule(0, 300, _targets, quick=True, warmup_s=30, kinds=["meteor"])
    with pytest.raises(ValueError, match="targets: expected at least one part for broker_restart"):
        schedule(0, 300, lambda k: [], quick=True, warmup_s=30, kinds=["broker_restart"])


class FakeWorld:
    def __init__(self, recover_after_s: float, fail_inject: str = "") -> None:
        self.recover_after_s, self.fail_inject = recover_after_s, fail_inject
        self.log: list[tuple[str, str]] = []
        self.healed_at: dict[str, float] = {}

    def targets(self, kind: str) -> list[str]:
        return _targets(kind)

    def inject(self, fault: Fault):
        if fault.kind == self.fail_inject:
            raise RuntimeError("no such part")
        self.log.append(("inject", fault.kind))

        def heal() -> None:
            self.log.append(("heal", fault.kind))
            self.healed_at[fault.kind] = time.monotonic()

        return heal

    def recovered(self, fault: Fault) -> bool:
        at = self.healed_at.get(fault.kind)
        return at is not None and time.monotonic() - at >= self.recover_after_s


def test_the_nemesis_heals_every_fault_and_times_its_recovery_on_the_timeline():
    timeline = Timeline()
    world = FakeWorld(recover_after_s=0.3)
    faults = [Fault("broker_restart", 0.1, 0.2, "broker"), Fault("camera_kill", 0.8, 0.1, "cam-1")]
    nemesis = Nemesis(world, timeline, faults, t0=timeline.now(), recovery_limit_s=5.0, poll_s=0.05).start()
    assert nemesis.join(10.0)
    assert world.log == [("inject", "broker_restart"), ("heal", "broker_restart"),
                         ("inject", "camera_kill"), ("heal", "camera_kill")]  # fmt: skip
    recs = [r.as_dict() for r in nemesis.records]
    assert [r["kind"] for r in recs] == ["broker_restart", "camera_kill"]
    for r in recs:
        assert r["error"] == "" and 0.25 <= r["recovery_s"] <= 1.0
    windows = timeline.faults()
    assert [w.kind for w in windows] == ["broker_restart", "camera_kill"]
    assert all(w.recovery_s is not None and w.recovery_s >= 0.25 for w in windows)


def test_a_fault_that_does_not_recover_or_cannot_be_injected_is_recorded_not_raised():
    timeline = Timeline()
    world = FakeWorld(recover_after_s=60.0, fail_inject="disk_full")
    faults = [Fault("disk_full", 0.0, 0.1, "cam-1"), Fault("clock_step", 0.1, 0.1, "cam-2")]
    nemesis = Nemesis(world, timeline, faults, t0=timeline.now(), recovery_limit_s=0.5, poll_s=0.05).start()
    assert nemesis.join(10.0)
    first, second = (r.as_dict() for r in nemesis.records)
    assert first["error"].startswith("inject: RuntimeError: no such part") and first["recovered_s"] is None
    assert second["error"] == "" and second["ended_s"] is not None and second["recovered_s"] is None
    assert [w.recovery_s for w in timeline.faults()] == [None, None]


def test_stopping_waits_for_the_fault_in_hand_to_be_healed_within_a_bound():
    timeline = Timeline()
    world = FakeWorld(recover_after_s=0.0)
    nemesis = Nemesis(world, timeline, [Fault("network_cut", 0.0, 0.5, "cam-3")], t0=timeline.now(), poll_s=0.05)
    nemesis.start()
    threading.Event().wait(0.1)
    t = time.monotonic()
    assert nemesis.stop(timeout_s=10.0)
    assert ("heal", "network_cut") in world.log and time.monotonic() - t < 5.0


def test_quiet_time_leaves_undisturbed_stretches_between_faults():
    faults = schedule(3, 3600, _targets, quick=False, warmup_s=300, quiet_s=150.0)
    assert set(f.kind for f in faults) == set(FAULT_KINDS) and len(faults) <= 3300 // (20 + 25 + 150)
    for a, b in itertools.pairwise(faults):
        assert b.at_s - (a.at_s + a.duration_s + 25.0) >= 150.0 - 1e-6, (a, b)


def test_a_run_too_short_for_its_quiet_minutes_is_refused_before_anything_starts(tmp_path, monkeypatch):
    # 1200 s fits the faults' slots without the quiet minutes after each, but not with them: the run used
    # to start the whole system and fail 20 s later when the real schedule was drawn.
    from peep.lab.bench.soak import runner

    started = []
    monkeypatch.setattr(runner.SoakWorld, "start", lambda self: started.append(self))
    with pytest.raises(ValueError, match="duration_s: expected at least"):
        runner.run(duration_s=1200, out_dir=str(tmp_path))
    assert started == []
    assert schedule(0, 1200, _targets, quick=False, warmup_s=300)  # without the quiet minutes it fits


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_raises_once_in_the_run_and_a_second_does_not_cut_the_stopping_short(sig, capsys):
    from peep.lab.bench.soak.runner import SoakStopped, stop_on_signals

    before = signal.getsignal(sig)
    stopped_parts = []
    with pytest.raises(SoakStopped) as stopped:
        with stop_on_signals():
            try:
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises here, in the main thread
            finally:  # the run stopping its parts: another signal meanwhile is only noted
                os.kill(os.getpid(), sig)
                time.sleep(0.2)
                stopped_parts.append("all")
    assert stopped.value.signum == sig and str(stopped.value) == f"stopped by {signal.Signals(sig).name}"
    assert stopped_parts == ["all"]
    assert "already stopping" in capsys.readouterr().err
    assert signal.getsignal(sig) == before  # restored once the run is over
