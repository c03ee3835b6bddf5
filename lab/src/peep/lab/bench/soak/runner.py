"""``peep bench --sections soak``: the whole system under load, faults on a schedule, a checker over the history.

One run: build the system (:class:`~peep.lab.bench.soak.world.SoakWorld`, its door
:mod:`~peep.lab.bench.soak.door`), start its other users (:mod:`~peep.lab.bench.soak.actors`: the
decision log, the enrolment desk, the console operator, a training run half way), sample every process and
store every few seconds (:mod:`~peep.lab.bench.soak.sampler`), let the nemesis work through its seeded
schedule (:mod:`~peep.lab.bench.soak.nemesis`), stop the door and the cameras (each drains its spool), then
read the histories each party kept and check them (:mod:`~peep.lab.bench.soak.history`), judge the targets
(:mod:`~peep.lab.bench.soak.targets`) and draw the report (:mod:`~peep.lab.bench.soak.report`).

``--quick`` runs about five minutes with one fault of each kind the world injects; without it the run lasts
``--duration`` seconds (an hour by default) with faults drawn until it is full. Latency here is a release's
``ingest_to_decision``: from the server's receipt (its ingest ledger) to the decision event's time, and, reported
beside it, ``release_to_decision`` from the camera's ledger entry, all on this machine's wall clock; a door
claim's ``claim_to_verdict`` (to the door's answer) and ``claim_to_lock`` (to the lock's drive); a console
page's load time.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from peep.lab.bench.soak.actors import DecisionLog, MidRunTraining, device_row_text, shown_epsilon
from peep.lab.bench.soak.history import check_epsilon, check_events, check_templates, in_flight
from peep.lab.bench.soak.nemesis import FAULT_KINDS, Nemesis, schedule
from peep.lab.bench.soak.sampler import ResourceSampler, callable_source, directory_bytes_source, process_source
from peep.lab.bench.soak.targets import judge, latency_ratios
from peep.lab.bench.soak.timeline import Timeline
from peep.lab.bench.soak.world import DESK, DOOR, KINDS, REPLICAS, SoakWorld

QUICK_S = 300.0
HOUR_S = 3600.0


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


#: Seconds the run's last Devices page may take to agree with the cameras' ledgers once the cameras have stopped.
SETTLE_S = 30.0

#: Quiet seconds after each fault's settling in which no fault starts: minutes whose latency can be judged.
QUIET_S = 150.0


class SoakStopped(BaseException):
    """A signal asked the run to stop before its end (a ``BaseException``: nothing on the way may swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


#: Latencies recorded and reported with the p99 target's ratio, but not judged. ``release_to_decision`` starts
#: at a camera's ledger entry, so it holds the camera's own time to send on a rig where three camera processes
#: share two cores with everything else: when two cameras release at the same instants (their phases line up
#: after one restarts), their sends wait on each other's work, 100-370 ms, for minutes, while the server's part
#: (``ingest_to_decision``, judged) stays flat. On a deployment each camera has its own processor.
REPORTED_LATENCIES = ("release_to_decision",)

#: Signals that stop a run early. Left at their default, SIGTERM and SIGHUP end Python without its ``finally``
#: blocks: the run's database, broker, balancer, replicas and cameras would keep running, the cameras' state
#: filesystems stay mounted. SIGINT (Ctrl-C) too, so that a second one cannot cut the stopping short.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, the first of :data:`STOP_SIGNALS` raises :class:`SoakStopped` in the main thread.

    Later ones are only noted while the run stops what it started (each of those waits is bounded; SIGKILL
    still ends it at once). Outside the main thread, where Python cannot handle signals, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopping(_signum: int, _frame: Any) -> None:
        # A Python handler, not SIG_IGN: an ignored signal would stay ignored in the processes started meanwhile.
        _say("peep bench soak: already stopping")

    def handler(signum: int, _frame: Any) -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, stopping)
        raise SoakStopped(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run(quick: bool = False, *, duration_s: float | None = None, out_dir: str | None = None, seed: int = 0,
        data_home: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the soak; returns the bench's ``soak`` section (the report and series are written to ``out_dir``).

    Raises
    ------
    SystemExit
        With ``128 + signal`` when SIGTERM, SIGHUP or SIGINT stopped the run, after everything it started has stopped.
    """
    try:
        with stop_on_signals():
            return _run(quick, duration_s=duration_s, out_dir=out_dir, seed=seed, data_home=data_home)
    except SoakStopped as exc:
        _say(f"peep bench soak: {exc}; every part the run started has been stopped")
        raise SystemExit(128 + exc.signum) from None


def _run(quick: bool, *, duration_s: float | None, out_dir: str | None, seed: int,
         data_home: str | None) -> dict[str, Any]:  # fmt: skip
    duration = float(duration_s or (QUICK_S if quick else HOUR_S))
    warmup = 30.0 if quick else 300.0
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="peep-soak-"))
    timeline = Timeline()
    # Decisions are deleted this long after they are made: short, so retention races ingest all run long.
    world = SoakWorld(out / "system", seed=seed, data_home=data_home, say=_say,
                      retention_s=120.0 if quick else 600.0)  # fmt: skip
    # Refused before anything starts when the run is too short for its faults (the real schedule is drawn once
    # the world says which kinds this machine can inject and on which parts).
    schedule(seed, duration, lambda _k: ["-"], quick=quick, warmup_s=warmup, kinds=KINDS, quiet_s=QUIET_S)
    _say(f"peep bench soak: {duration:.0f} s, seed {seed}; folder {out}")
    sampler: ResourceSampler | None = None
    nemesis: Nemesis | None = None
    actors: list[Any] = []
    try:
        world.start()
        for kind, why in world.unavailable.items():
            _say(f"    fault kind {kind} left out: {why}")
        faults = schedule(seed, duration, world.targets, quick=quick, warmup_s=warmup, kinds=world.kinds(),
                          quiet_s=QUIET_S)  # fmt: skip
        for f in faults:
            _say(f"    scheduled {f.describe()}")
        t0 = timeline.now()
        wall0 = time.time()

        def clock() -> float:
            return timeline.now() - t0

        decisions = DecisionLog(world.pg.dsn if world.pg else "", interval_s=2.0).start()
        desk = world.desk(world.lfw, interval_s=45.0 if quick else 60.0, clock=clock)
        operator = world.operator(interval_s=5.0, clock=clock, timeline=timeline)
        actors = [decisions, desk.start(), operator.start()]
        door = world.door
        door.start_feeder(interval_s=5.0, max_claims=int(duration / 5) + 10, duration_s=duration)
        training = MidRunTraining(at_s=duration / 2)
        trainer = threading.Thread(target=_train_at, args=(training, world, clock, timeline), name="soak-train",
                                   daemon=True)  # fmt: skip
        trainer.start()
        sampler = ResourceSampler(timeline, 2.0, _sources(world)).start()
        nemesis = Nemesis(world, timeline, faults, t0=t0, say=_say).start()
        while clock() < duration:
            time.sleep(min(5.0, max(0.0, duration - clock())))
        nemesis.stop(timeout_s=120.0)
        door.stop()
        desk.stop(timeout_s=200.0)
        trainer.join(600.0)
        world.stop_cameras()
        time.sleep(5.0)  # the last decisions reach the database and the subscriber, the last reports the console
        operator.stop()
        # The Devices page as the run ends: the ε it shows against the cameras' ledgers. A camera's last release
        # can still be on its way (a stopped camera drains its spool): the page is read again, at most
        # SETTLE_S, until it agrees; a page that never agrees is the mismatch reported.
        ledgers = world.ledger_epsilon()
        settle_until = time.monotonic() + SETTLE_S
        while True:
            operator.step()
            shown = {
                d: e for d, e in shown_epsilon(operator.last_devices).items() if d in ledgers or d in world.cameras
            }
            if not check_epsilon(ledgers, shown, tolerance=1e-3)["mismatches"] or time.monotonic() > settle_until:
                break
            time.sleep(2.0)
        operator.close()
        decisions.stop()
        decisions.read_now()
        devices, _decided, _committed = world.histories()
        # The door's VERIFY decisions are the door's history, checked claim by claim below.
        per_device, totals = check_templates(devices, [(d, m) for d, m in decisions.decided() if d != DOOR])
        door_summary = _door(world, decisions)
        for at, ms in door.claim_to_lock():
            timeline.latency("claim_to_lock", t0 + (at - wall0), ms)
        for at, ms in door.claim_to_verdict():
            timeline.latency("claim_to_verdict", t0 + (at - wall0), ms)
        events = check_events(decisions.committed(), [(s, e) for s, e, *_ in world.received])
        latency_counts = _latencies(world, timeline, t0, wall0, out)
        kept = world.kept_of_cameras()
        faults_out = [r.as_dict() for r in nemesis.records]
        windows = [(wall0 + r["at_s"], wall0 + (r["recovered_s"] or r["ended_s"] or r["at_s"])) for r in faults_out]
        for row, n in zip(faults_out, in_flight(world.release_times(), windows), strict=True):
            row["in_flight"] = n
        # The devices the soak holds ledgers of; the console also lists the administrator's sends apart.
        epsilon = check_epsilon(ledgers, shown, tolerance=1e-3)
        counts = world.ledger_releases() if epsilon["mismatches"] else {}
        for dev, row in epsilon["mismatches"].items():
            row["releases"] = counts.get(dev)
            row["page_row"] = device_row_text(operator.last_devices, dev)
        summary: dict[str, Any] = {
            "duration_s": round(timeline.now() - t0, 1),
            "seed": seed,
            "load": world.describe(),
            "started_at": wall0,
            "faults": faults_out,
            "fault_kinds_not_run": {
                k: world.unavailable.get(k, "not built") for k in FAULT_KINDS if k not in world.kinds()
            },
            "devices": per_device,
            "totals": totals,
            "events": events,
            "wrong_lock_drives": door_summary["wrong_lock_drives"],
            "door": door_summary,
            "strangers_kept": kept["kept"],
            "kept_of_cameras": kept,
            "epsilon": epsilon,
            "desk": desk.check(world.pg.dsn if world.pg else "", world.out / "devices" / DESK / "ledger.sqlite3"),
            "console": operator.summary(),
            "training": training.result,
            "decisions_by_model": decisions.by_model(),
            "retention_s": world.retention_s,
            "actor_errors": {a._thread.name: a.errors[:5] for a in actors if a.errors},
            # Beside the targets, not judged: see REPORTED_LATENCIES.
            "reported": {"latency_counts": latency_counts},
        }
        # Written at once: what follows (slopes, targets, plots) cannot lose the checked history.
        (out / "soak.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    finally:
        for a in actors:
            a.stop(timeout_s=5.0)
        if sampler is not None:
            sampler.stop()
        world.close()
    # The same warm-up as the targets below: a quick run's JSON and verdicts must not disagree.
    summary["rss_mb_per_hour"] = _per_process(timeline, "rss_mb",
                                              lambda s: timeline.slope_per_hour("rss_mb", s, warmup))  # fmt: skip
    summary["fds_growth"] = _per_process(timeline, "fds", lambda s: timeline.growth("fds", s, warmup))
    summary["p99_ms_per_minute"] = timeline.percentiles_per_minute("ingest_to_decision")
    summary["p99_ms_per_minute_from_release"] = timeline.percentiles_per_minute("release_to_decision")
    summary["cpu"] = _cpu(timeline, summary)
    # A claim every 5 s: twelve a minute at most, so its minutes are judged from eight verdicts.
    verdicts = judge(summary, timeline, warmup_s=warmup, latency_kinds=("ingest_to_decision", "claim_to_verdict"),
                     min_per_minute={"claim_to_verdict": 8, "claim_to_lock": 8},
                     reported_only=REPORTED_LATENCIES)  # fmt: skip
    summary["targets"] = [dict(v) for v in verdicts]
    summary["reported"]["latency"] = [dict(v) for v in latency_ratios(timeline, REPORTED_LATENCIES, warmup_s=warmup)]
    (out / "timeline.json").write_text(timeline.to_json())
    (out / "soak.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    from peep.lab.bench.soak.report import write_report

    summary["report"] = str(write_report(summary, timeline, out))
    return summary


def _door(world: SoakWorld, decisions: DecisionLog) -> dict[str, Any]:
    """The door's claims, lock drives and the server's decisions on them (:func:`door.check_door_history`).

    The server's decisions come from the decision log (retention deletes them from the database within
    minutes). A Verify decision is written before its answer, so every drive must have its accepted decision
    in that record: no fault window excuses one.
    """
    from peep.lab.bench.soak.door import ServerDecision

    assert world.door is not None
    return dict(world.door.history([ServerDecision(*row) for row in decisions.verify_decisions(DOOR)]))


def _train_at(training: MidRunTraining, world: SoakWorld, clock: Any, timeline: Timeline) -> None:
    """Train and promote a model through the balancer at ``training.at_s`` into the run.

    The run is a known step for both replicas (see :meth:`Timeline.step`): the one that trains imports the
    fitting libraries on its first training run (measured: about 60 MB), and both load the new model.
    """
    while clock() < training.at_s:
        time.sleep(1.0)
    _say(f"    training a model mid-run ({clock():.0f} s)")
    start = timeline.now()
    try:
        training.run(world.stub, world.admin_md, clock)
    finally:
        for name in REPLICAS:
            timeline.step(f"replica-{name}", start, timeline.now(), "the mid-run training and its promotion")
    _say(f"    mid-run training: {training.result}")


def _cpu(timeline: Timeline, summary: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds per process over the run, and per template: what the load would cost at another rate.

    This machine's two cores cap the rate three real cameras reach; CPU per decided template says what a
    given rate needs (the server's side: replicas, broker, database; the cameras' side apart).
    """
    used = {}
    for series in timeline.series("cpu_s"):
        g = timeline.growth("cpu_s", series, after_s=0.0, life_warmup_s=0.0)
        used[series] = round(float(g or 0.0), 2)
    decided = int(summary.get("totals", {}).get("decided_once", 0)) or 1
    server = sum(v for k, v in used.items() if k.startswith("replica") or k in ("broker", "postgres"))
    cameras = sum(v for k, v in used.items() if k.startswith("cam-"))
    per_server = 1000.0 * server / decided
    return {
        "seconds": used,
        "decided": decided,
        "server_ms_per_template": round(per_server, 2),
        "cameras_ms_per_template": round(1000.0 * cameras / decided, 2),
        "templates_per_s_per_server_core": round(1000.0 / per_server, 1) if per_server > 0 else None,
        "note": "server side = the replicas, the broker and PostgreSQL; a release's own cost is on the camera",
    }


def _per_process(timeline: Timeline, measure: str, fn: Any) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for series in timeline.series(measure):
        try:
            value = fn(series)
        except (ValueError, ZeroDivisionError):
            value = None
        out[series] = None if value is None else round(float(value), 3)
    return out


def _sources(world: SoakWorld) -> list[Any]:
    def pid_of(name: str) -> Any:
        return lambda: world.pids().get(name)

    sources = [process_source(name, pid_of(name)) for name in world.pids()]
    sources += [directory_bytes_source(d, c.state_dir) for d, c in world.cameras.items()]

    def db_mb() -> dict[str, float] | None:
        assert world.pg is not None
        return {t: b / 1e6 for t, b in world.pg.table_sizes().items()}

    def queue() -> float | None:
        assert world.broker is not None
        q = world.broker.queue_depth(timeout=2.0)
        return None if q is None else float(q)

    sources.append(callable_source(db_mb, measure="db_mb"))
    sources.append(callable_source(queue, measure="broker_queue", series="broker"))
    return sources


def _latencies(world: SoakWorld, timeline: Timeline, t0: float, wall0: float, out: Path) -> dict[str, int]:
    """Each decided release on the timeline twice: from the server's receipt (``ingest_to_decision``) and from
    the camera's ledger entry (``release_to_decision``) to its decision event; every one also in
    ``decisions.csv`` (times in seconds since the epoch) for a look afterwards.

    Returns how many decisions had each start time (a decision without one is counted, not guessed).
    """
    import csv

    released: dict[tuple[str, str], float] = {}
    for d, cam in world.cameras.items():
        with sqlite3.connect(f"file:{cam.state_dir / 'ledger.sqlite3'}?mode=ro", uri=True) as db:
            for t, m in db.execute("SELECT time, message_id FROM spends WHERE message_id != ''"):
                released[(d, m)] = float(t)
    received = world.receipts()
    counts = {"decided": 0, "with_release": 0, "with_receipt": 0}
    with open(out / "decisions.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["device", "message_id", "released_at", "received_at", "decided_at"])
        for _seq, _event, at, device, message in world.received:
            t, r = released.get((device, message)), received.get((device, message))
            if t is None and r is None:
                continue  # not a camera's release (the door's, the desk's)
            counts["decided"] += 1
            on_timeline = t0 + (at - wall0)
            if t is not None:
                counts["with_release"] += 1
                timeline.latency("release_to_decision", on_timeline, max(0.0, (at - t) * 1000.0))
            if r is not None:
                counts["with_receipt"] += 1
                timeline.latency("ingest_to_decision", on_timeline, max(0.0, (at - r) * 1000.0))
            rows.writerow([device, message, "" if t is None else f"{t:.6f}", "" if r is None else f"{r:.6f}",
                           f"{at:.6f}"])  # fmt: skip
    return counts
