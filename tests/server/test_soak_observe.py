"""The soak's observation side on synthetic histories: the timeline, the sampler, the targets, the report.

Nothing here runs the system: timelines are filled by hand (a leak of known slope, a fault of known
recovery, a minute of known p99) and the sampler reads this test process and a temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from peep.lab.bench.soak.report import write_report
from peep.lab.bench.soak.sampler import (
    ResourceSampler,
    Source,
    callable_source,
    directory_bytes_source,
    process_source,
    read_process,
)
from peep.lab.bench.soak.targets import judge
from peep.lab.bench.soak.timeline import LIFE, Timeline

HOUR = 3600.0


def _steady(
    tl: Timeline,
    series: str,
    mb_per_hour: float,
    *,
    seconds: float = HOUR,
    every_s: float = 10.0,
    seed: int = 0,
    start_mb: float = 200.0,
    t0: float = 0.0,
) -> None:
    """RSS of ``series`` climbing ``mb_per_hour`` with ±1 MB of noise, one sample every ``every_s``."""
    rng = np.random.default_rng(seed)
    for t in np.arange(t0, t0 + seconds, every_s):
        tl.add("rss_mb", series, float(t), start_mb + mb_per_hour * (t - t0) / HOUR + float(rng.uniform(-1, 1)))


# -- timeline --------------------------------------------------------------------------------


def test_slope_finds_a_leak_and_a_flat_series() -> None:
    tl = Timeline()
    _steady(tl, "leaky", 10.0)
    _steady(tl, "flat", 0.0, seed=1)
    leak = tl.slope_per_hour("rss_mb", "leaky", after_s=300)
    flat = tl.slope_per_hour("rss_mb", "flat", after_s=300)
    assert leak is not None and flat is not None
    assert leak == pytest.approx(10.0, abs=0.5)
    assert abs(flat) < 0.5
    assert tl.slope_per_hour("rss_mb", "nobody") is None


def test_growth_is_last_minus_first_after_warm_up() -> None:
    tl = Timeline()
    for t, v in ((0.0, 50.0), (299.0, 90.0), (300.0, 100.0), (2000.0, 130.0), (3000.0, 103.0)):
        tl.add("fds", "door", t, v)
    assert tl.growth("fds", "door", after_s=300) == 3.0
    assert tl.growth("fds", "door", after_s=5000) is None


def test_a_restart_is_not_a_leak() -> None:
    """Each life climbs for a few minutes from a small heap, then stays flat: no growth overall."""
    tl = Timeline()
    for life, (t0, t1) in enumerate(((0.0, 1200.0), (1200.0, 2400.0), (2400.0, 3600.0))):
        for t in np.arange(t0, t1, 10.0):
            since = t - t0
            tl.add(LIFE, "replica-a", float(t), 1000.0 + life)
            tl.add("rss_mb", "replica-a", float(t), 100.0 + min(since, 240.0) / 2)
    assert [round(life) for _, life in tl.lives("replica-a")] == [1000, 1001, 1002]
    assert LIFE not in tl.measures()
    slope = tl.slope_per_hour("rss_mb", "replica-a", after_s=300)
    assert slope == pytest.approx(0.0, abs=1e-9)
    assert tl.growth("rss_mb", "replica-a", after_s=300) == pytest.approx(0.0)
    # Without the lives, the climbs back after each restart read as growth.
    plain = Timeline()
    t, v = tl.samples("rss_mb", "replica-a")
    for a, b in zip(t, v, strict=True):
        plain.add("rss_mb", "replica-a", float(a), float(b))
    assert (plain.slope_per_hour("rss_mb", "replica-a", after_s=0) or 0) > 5


def test_a_process_started_late_has_its_own_warm_up() -> None:
    """A camera first seen at 10 min, climbing for 5 min from its start, flat afterwards."""
    tl = Timeline()
    for t in np.arange(600.0, HOUR, 10.0):
        tl.add(LIFE, "cam-2", float(t), 7.0)
        tl.add("rss_mb", "cam-2", float(t), 80.0 + min(t - 600.0, 290.0) / 10)
    assert tl.slope_per_hour("rss_mb", "cam-2", after_s=300) == pytest.approx(0.0, abs=1e-9)
    assert tl.growth("rss_mb", "cam-2", after_s=300) == 0.0
    assert (tl.slope_per_hour("rss_mb", "cam-2", after_s=300, life_warmup_s=0) or 0) > 1


def test_a_known_step_is_not_a_leak_but_growth_after_it_still_is() -> None:
    """A replica flat at 200 MB that steps up 68 MB during the mid-run training, then flat (or leaking) again."""
    tl, leaky = Timeline(), Timeline()
    for t in np.arange(0.0, HOUR, 10.0):
        step = 68.0 * min(1.0, max(0.0, (t - 1800.0) / 20.0))
        tl.add("rss_mb", "replica-b", float(t), 200.0 + step)
        leaky.add("rss_mb", "replica-b", float(t), 200.0 + step + 10.0 * t / HOUR)
    # Unmarked, the step reads as ~100 MB an hour.
    assert (tl.slope_per_hour("rss_mb", "replica-b", after_s=300) or 0) > 50
    for timeline in (tl, leaky):
        timeline.step("replica-b", 1800.0, 1810.0, "the mid-run training")
    assert tl.slope_per_hour("rss_mb", "replica-b", after_s=300) == pytest.approx(0.0, abs=1e-9)
    assert tl.growth("rss_mb", "replica-b", after_s=300) == pytest.approx(0.0)
    assert leaky.slope_per_hour("rss_mb", "replica-b", after_s=300) == pytest.approx(10.0, abs=1e-6)
    # Another process's samples are not cut by it.
    assert tl.steps("replica-a") == [] and [w.why for w in tl.steps("replica-b")] == ["the mid-run training"]
    v = _by_target(judge(GOOD, tl))["rss_mb_per_hour[replica-b]"]
    assert v["ok"] and "1800-1840 s left out" in v["detail"] and "the mid-run training" in v["detail"]
    with pytest.raises(ValueError, match="end_s must not be before start_s"):
        tl.step("replica-b", 10.0, 9.0, "x")
    with pytest.raises(TypeError, match="why must be a non-empty str"):
        tl.step("replica-b", 10.0, 11.0, "")


def test_thinning_keeps_the_bound_and_both_ends() -> None:
    cap = 64
    tl = Timeline(cap=cap)
    for i in range(5000):
        tl.add("rss_mb", "cam-1", float(i), float(i) / 100)
        n = len(tl.samples("rss_mb", "cam-1")[0])
        assert n < cap
        if i >= cap:
            assert n >= 3 * cap // 4 - 1
    t, _ = tl.samples("rss_mb", "cam-1")
    assert t[0] == 0.0 and t[-1] == 4999.0
    assert np.all(np.diff(t) > 0)
    assert tl.dropped("rss_mb", "cam-1") == 5000 - len(t)
    # The newest quarter is untouched; the thinned history still gives the slope.
    assert np.all(np.diff(t[-cap // 4 :]) == 1.0)
    assert tl.slope_per_hour("rss_mb", "cam-1", after_s=0) == pytest.approx(36.0)


def test_percentiles_per_minute() -> None:
    tl = Timeline()
    for i in range(1, 1001):
        tl.latency("ingest_to_decision", 5.0, float(i))  # minute 0: 1 … 1000 ms
    tl.latency("ingest_to_decision", 125.0, 40.0)  # minute 2
    tl.latency("ingest_to_decision", 130.0, -3.0)  # a wall-clock step: clamped, counted
    rows = tl.percentiles_per_minute("ingest_to_decision")
    assert [(r["minute"], r["n"]) for r in rows] == [(0, 1000), (2, 2)]
    assert rows[0]["p50_ms"] == pytest.approx(500.0, rel=0.006)
    assert rows[0]["p99_ms"] == pytest.approx(990.0, rel=0.006)
    assert rows[0]["max_ms"] == 1000.0
    assert rows[1]["p99_ms"] == pytest.approx(40.0, rel=0.006)
    assert tl.clamped("ingest_to_decision") == 1
    assert tl.percentiles_per_minute("claim_to_lock") == []


def test_json_round_trip() -> None:
    tl = Timeline(cap=32)
    for i in range(100):
        tl.add("rss_mb", "replica-a", i * 1.5, 100 + i / 7)
        tl.add("fds", "replica-b", i * 1.5, 40.0)
    tl.add(LIFE, "replica-a", 3.0, 12345.67)
    tl.fault("replica_sigkill", 10.0, 10.5, 14.25)
    tl.fault("network_cut", 30.0, 60.0, None)
    tl.step("replica-a", 40.0, 45.0, "training")
    for i in range(50):
        tl.latency("claim_to_lock", i * 3.0, 50.0 + i)
    text = tl.to_json()
    back = Timeline.from_json(text)
    assert back.to_dict() == tl.to_dict()
    assert back.to_json() == text
    assert back.faults() == tl.faults() and back.faults()[1].recovered_s is None
    assert back.steps() == tl.steps() and back.steps()[0].why == "training"
    assert back.percentiles_per_minute("claim_to_lock") == tl.percentiles_per_minute("claim_to_lock")
    assert back.slope_per_hour("rss_mb", "replica-a", 0) == tl.slope_per_hour("rss_mb", "replica-a", 0)
    with pytest.raises(ValueError, match="format"):
        Timeline.from_dict({**json.loads(text), "format": 99})


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("rss_mb", "a", 1.0, float("nan")), ValueError, "value must be finite"),
        (("rss_mb", "a", float("inf"), 1.0), ValueError, "t_s must be finite"),
        (("rss_mb", "", 1.0, 1.0), TypeError, "series must be a non-empty str"),
        (("rss_mb", "a", 1.0, "12"), TypeError, "value must be a real number"),
    ],
)
def test_add_refuses_what_is_not_a_sample(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Timeline().add(*args)


def test_fault_refuses_an_end_before_its_start() -> None:
    with pytest.raises(ValueError, match="end_s must not be before start_s"):
        Timeline().fault("broker_stop", 10.0, 9.0)


def test_threads_add_at_once() -> None:
    tl = Timeline(cap=1000)

    def fill(k: int) -> None:
        for i in range(2000):
            tl.add("threads", f"s{k % 2}", float(i), 1.0)
            tl.latency("claim_to_lock", float(i), 5.0)

    workers = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert sum(r["n"] for r in tl.percentiles_per_minute("claim_to_lock")) == 8000
    for s in ("s0", "s1"):
        assert len(tl.samples("threads", s)[0]) + tl.dropped("threads", s) == 4000


# -- sampler ---------------------------------------------------------------------------------


def test_process_source_reads_this_process() -> None:
    got = process_source("me", os.getpid)()
    assert got is not None
    me = got["me"]
    assert me["rss_mb"] > 1 and me["fds"] >= 3 and me["threads"] >= 1 and me["cpu_s"] > 0
    assert me[LIFE] == read_process(os.getpid())[LIFE]
    second = process_source("me", os.getpid)
    second()
    assert "cpu_pct" in (second() or {}).get("me", {})
    assert process_source("gone", lambda: None)() is None
    assert process_source("gone", lambda: 2**22 + 1)() is None  # above any pid_max: no such process


def test_directory_source_counts_files_and_tolerates_absence(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    src = directory_bytes_source("cam-1", spool)
    assert src() is None
    (spool / "sub").mkdir(parents=True)
    (spool / "a.bin").write_bytes(b"x" * 100)
    (spool / "sub" / "b.bin").write_bytes(b"y" * 23)
    assert src() == {"cam-1": {"spool_bytes": 123.0, "spool_files": 2.0}}


def test_callable_source_shapes() -> None:
    assert callable_source(lambda: 7, measure="broker_queue", series="mosquitto")() == {
        "mosquitto": {"broker_queue": 7}
    }
    assert callable_source(lambda: {"templates": 1.5, "events": 0.25}, measure="db_mb")() == {
        "templates": {"db_mb": 1.5},
        "events": {"db_mb": 0.25},
    }
    assert callable_source(lambda: None, measure="db_mb")() is None
    with pytest.raises(TypeError, match="must return a number"):
        callable_source(lambda: {"a": 1.0}, measure="q", series="s")()


def test_sampler_survives_a_failing_source_and_stops_in_time() -> None:
    tl = Timeline()
    calls = {"bad": 0}

    def bad() -> None:
        calls["bad"] += 1
        raise RuntimeError("broker gone")

    release = threading.Event()

    def stuck() -> dict[str, dict[str, float]]:
        release.wait(10)  # a size query hanging while PostgreSQL is down
        return {"db": {"db_mb": 1.0}}

    sources = [
        Source("bad", bad),
        Source("refused", lambda: {"x": {"rss_mb": float("nan")}}),
        Source("stuck", stuck),
        Source("absent", lambda: None),
        process_source("me", os.getpid),
    ]
    sampler = ResourceSampler(tl, 0.02, sources).start()
    deadline = time.monotonic() + 10
    while sampler.readings["process:me"] < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    assert sampler.stop(timeout_s=0.5) is False  # "stuck" is still in its call
    assert time.monotonic() - t0 < 1.0
    release.set()
    assert sampler.readings["process:me"] >= 5
    assert sampler.failures["bad"] >= 3 and sampler.failures["refused"] >= 3
    assert sampler.failures["process:me"] == 0 and sampler.absent["absent"] >= 3
    assert "RuntimeError: broker gone" in sampler.last_error["bad"]
    assert len(tl.samples("rss_mb", "me")[0]) >= 5


def test_sampler_stops_promptly_between_samples() -> None:
    tl = Timeline()
    with ResourceSampler(tl, 30.0, [process_source("me", os.getpid)]) as sampler:
        deadline = time.monotonic() + 5
        while not sampler.readings["process:me"] and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 1.0
    assert sampler.readings["process:me"] == 1
    sampler.sample_now()
    assert sampler.readings["process:me"] == 2 and len(tl.samples("rss_mb", "me")[0]) == 2
    with pytest.raises(ValueError, match="every_s must be a positive"):
        ResourceSampler(tl, 0, [])


# -- targets ---------------------------------------------------------------------------------


def _quiet_run(*, fault_recovery_s: float = 5.0, p99_late_factor: float = 1.0) -> Timeline:
    """An hour of a flat replica and ~1 latency a second, p99 ≈ 100 ms, one broker stop at 20–21 min.

    From minute 40 on the slowest 2 % of each minute take ``p99_late_factor`` × 100 ms.
    """
    tl = Timeline()
    _steady(tl, "replica-a", 0.0)
    for t in np.arange(0.0, HOUR, 10.0):
        tl.add("fds", "replica-a", float(t), 40.0)
        tl.add("threads", "replica-a", float(t), 12.0)
    tl.fault("broker_stop", 1200.0, 1260.0, 1260.0 + fault_recovery_s)
    for minute in range(60):
        slow = 100.0 * (p99_late_factor if minute >= 40 else 1.0)
        for i in range(60):
            ms = 1000.0 if 20 <= minute <= 21 else slow if i < 2 else 10.0 + i / 10
            tl.latency("ingest_to_decision", 60.0 * minute + i, ms)
            tl.latency("claim_to_lock", 60.0 * minute + i, 100.0 if i < 2 else 50.0)
    return tl


GOOD: dict[str, Any] = {
    "devices": {
        "cam-1": {"sent": 1000, "decided_once": 998, "dead_lettered": 2, "lost": 0, "duplicated": 0},
        "door": {"sent": 50, "decided_once": 50, "dead_lettered": 0, "lost": 0, "duplicated": 0},
    },
    "wrong_lock_drives": 0,
    "faults": [{"kind": "broker_stop", "at_s": 1200.0, "recovered_s": 1265.0}],
}


def _by_target(verdicts: list[Any]) -> dict[str, Any]:
    return {v["target"]: v for v in verdicts}


def test_a_quiet_run_passes_every_target() -> None:
    verdicts = judge(GOOD, _quiet_run())
    failed = [v for v in verdicts if not v["ok"]]
    assert not failed, failed
    names = set(_by_target(verdicts))
    assert {
        "lost",
        "duplicated",
        "wrong_lock_drives",
        "rss_mb_per_hour[replica-a]",
        "fds_growth[replica-a]",
        "threads_growth[replica-a]",
        "recovery[broker_stop@1200s]",
        "p99_per_minute[ingest_to_decision]",
        "p99_per_minute[claim_to_lock]",
    } == names
    for v in verdicts:
        assert set(v) == {"target", "ok", "value", "limit", "detail"}
        assert f"limit {v['limit']:g}" in v["detail"]


def test_a_leak_of_10_mb_an_hour_fails() -> None:
    tl = _quiet_run()
    _steady(tl, "camera-2", 10.0, seed=3)
    v = _by_target(judge(GOOD, tl))["rss_mb_per_hour[camera-2]"]
    assert not v["ok"] and v["limit"] == 5.0
    assert v["value"] == pytest.approx(10.0, abs=0.7)
    assert "MB per hour" in v["detail"]


def test_descriptors_creeping_fail() -> None:
    tl = _quiet_run()
    for t in np.arange(0.0, HOUR, 10.0):
        tl.add("fds", "door", float(t), 30.0 + t // 600)  # one more every 10 minutes
    v = _by_target(judge(GOOD, tl))["fds_growth[door]"]
    assert not v["ok"] and v["value"] == 5.0 and v["limit"] == 4.0


def test_a_fault_recovered_in_20_s_fails() -> None:
    v = _by_target(judge(GOOD, _quiet_run(fault_recovery_s=20.0)))["recovery[broker_stop@1200s]"]
    assert not v["ok"] and v["value"] == pytest.approx(20.0) and v["limit"] == 15.0
    tl = _quiet_run()
    tl.fault("network_cut", 2000.0, 2030.0, None)
    v = _by_target(judge(GOOD, tl))["recovery[network_cut@2000s]"]
    assert not v["ok"] and v["value"] is None and "never healthy" in v["detail"]


def test_no_fault_at_all_fails_unless_none_was_expected() -> None:
    tl = Timeline()
    _steady(tl, "replica-a", 0.0)
    assert not _by_target(judge(GOOD, tl))["recovery"]["ok"]
    assert "recovery" not in _by_target(judge(GOOD, tl, faults_expected=False))


@pytest.mark.parametrize(("factor", "ok"), [(3.5, False), (2.0, True)])
def test_p99_against_the_first_quiet_minute(factor: float, ok: bool) -> None:
    v = _by_target(judge(GOOD, _quiet_run(p99_late_factor=factor)))["p99_per_minute[ingest_to_decision]"]
    assert v["ok"] is ok
    assert v["value"] == pytest.approx(factor, rel=0.02) and v["limit"] == 3.0
    # The minutes of the broker stop (1000 ms, 10 ×) are not judged, nor the warm-up's.
    assert "baseline minute 5 " in v["detail"]


def test_a_reported_latency_gets_the_targets_ratio_but_is_not_a_target(tmp_path: Path) -> None:
    """The camera-side measure is worked out like the judged one and shown beside the targets, never in them."""
    from peep.lab.bench.soak.targets import latency_ratios

    tl = _quiet_run(p99_late_factor=2.0)
    for minute in range(60):  # the release side: ten times slower from minute 40
        for i in range(60):
            tl.latency("release_to_decision", 60.0 * minute + i, (1000.0 if minute >= 40 else 100.0) if i < 2 else 40.0)
    targets = _by_target(judge(GOOD, tl, reported_only=("release_to_decision",)))
    assert "p99_per_minute[release_to_decision]" not in targets and targets["p99_per_minute[ingest_to_decision]"]["ok"]
    assert not _by_target(judge(GOOD, tl))["p99_per_minute[release_to_decision]"]["ok"]  # judged unless said
    (ratio,) = latency_ratios(tl, ("release_to_decision",))
    assert ratio["target"] == "p99_per_minute[release_to_decision]" and not ratio["ok"]
    assert ratio["value"] == pytest.approx(10.0, rel=0.02) and "baseline minute 5 " in ratio["detail"]
    assert latency_ratios(tl, ("never_recorded",))[0]["value"] is None
    summary = {**GOOD, "targets": list(targets.values()), "reported": {"latency": [ratio]}}
    doc = write_report(summary, tl, tmp_path).read_text(encoding="utf-8")
    reported = doc.split("<table id='reported'>", 1)[1].split("</table>", 1)[0]
    assert "beyond" in reported and "release_to_decision" in reported
    assert "release_to_decision" not in doc.split("<table id='targets'>", 1)[1].split("</table>", 1)[0]


@pytest.mark.parametrize(
    ("summary", "target", "value"),
    [
        ({**GOOD, "devices": {"cam-1": {**GOOD["devices"]["cam-1"], "lost": 1}}}, "lost", 1),
        ({**GOOD, "devices": {"cam-1": {**GOOD["devices"]["cam-1"], "duplicated": 2}}}, "duplicated", 2),
        ({**GOOD, "wrong_lock_drives": 1}, "wrong_lock_drives", 1),
        ({"wrong_lock_drives": 0}, "lost", None),
        ({"devices": GOOD["devices"]}, "wrong_lock_drives", None),
        ({**GOOD, "devices": {"cam-1": {"sent": 3}}}, "duplicated", None),
    ],
)
def test_counts_fail_when_nonzero_or_missing(summary: dict[str, Any], target: str, value: int | None) -> None:
    v = _by_target(judge(summary, _quiet_run()))[target]
    assert not v["ok"] and v["value"] == value and v["limit"] == 0


# -- report ----------------------------------------------------------------------------------


def test_the_report_has_a_chart_per_measure_and_the_fault_table(tmp_path: Path) -> None:
    tl = _quiet_run()
    for t in np.arange(0.0, HOUR, 60.0):
        tl.add(LIFE, "replica-b", float(t), 1.0 if t < 1800 else 2.0)  # restarted half way
        tl.add("rss_mb", "replica-b", float(t), 150.0)
        for table in ("templates", "events"):
            tl.add("db_mb", table, float(t), 10.0 + t / 600)
        tl.add("spool_bytes", "cam-1", float(t), 0.0)
        tl.add("broker_queue", "mosquitto", float(t), 3.0)
    tl.fault("clock_step", 2400.0, 2400.0, 2401.0)
    summary = {**GOOD, "targets": judge(GOOD, tl), "note": "<script>alert(1)</script>"}
    path = write_report(summary, tl, tmp_path / "out")
    assert path == tmp_path / "out" / "soak.html"
    doc = path.read_text(encoding="utf-8")
    measures = set(re.findall(r"data-measure='([^']+)'", doc))
    assert measures == set(tl.measures()) == {"rss_mb", "fds", "threads", "db_mb", "spool_bytes", "broker_queue"}
    assert re.findall(r"data-latency='([^']+)'", doc) == ["ingest_to_decision", "claim_to_lock"]
    assert doc.count("src='data:image/png;base64,") == 8
    pngs = sorted(p.name for p in (tmp_path / "out" / "plots").iterdir())
    assert len(pngs) == 8 and all((tmp_path / "out" / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    faults = doc[doc.index("<table id='faults'>") :]
    faults = faults[: faults.index("</table>")]
    assert "broker_stop" in faults and "1,200.0" in faults and "1,265.0" in faults
    devices = doc[doc.index("<table id='devices'>") :]
    devices = devices[: devices.index("</table>")]
    for column in ("sent", "decided_once", "dead_lettered", "lost", "duplicated", "cam-1", "door", "all devices"):
        assert column in devices
    assert "1,050" in devices  # sent, all devices
    assert "clock_step" in doc and "<table id='targets'>" in doc
    assert "<script>" not in doc


def test_the_report_of_an_empty_timeline(tmp_path: Path) -> None:
    doc = write_report({}, Timeline(), tmp_path).read_text(encoding="utf-8")
    assert "The timeline holds no samples" in doc and "no per-device counts" in doc


@pytest.mark.parametrize(
    ("extra", "target", "value"),
    [
        ({"events": {"expected": 9, "missing": 1, "repeats": 0, "out_of_order": 0, "unexpected": 0}}, "events", 1),
        ({"events": {"expected": 9, "missing": 0, "repeats": 2, "out_of_order": 1, "unexpected": 0}}, "events", 3),
        ({"strangers_kept": 4}, "strangers_kept", 4),
        ({"epsilon": {"devices": 3, "mismatches": {"cam-1": {"device": 32.0, "shown": 16.0}}}}, "epsilon_shown", 1),
        ({"desk": {"enrolments": 3, "mismatched": ["Ann"], "failed": [{"subject": "Bo"}]}}, "enrolments", 2),
    ],
)
def test_the_other_histories_fail_when_they_do_not_hold(extra: dict[str, Any], target: str, value: int) -> None:
    v = _by_target(judge({**GOOD, **extra}, _quiet_run()))[target]
    assert not v["ok"] and v["value"] == value and v["limit"] == 0
    clean = {"events": {"expected": 9, "missing": 0, "repeats": 0, "out_of_order": 0, "unexpected": 0},
             "strangers_kept": 0, "epsilon": {"devices": 3, "mismatches": {}},
             "desk": {"enrolments": 3, "mismatched": [], "failed": []}}  # fmt: skip
    assert _by_target(judge({**GOOD, **clean}, _quiet_run()))[target]["ok"]
