"""The soak's door: a real ``peep-edge door`` taking a claim every few seconds, and the check of what it did.

:class:`SoakDoor` composes a door camera's video (one enrolled person's face in every frame: the genuine
claimant), writes the door's configuration (``decision = "grpc"`` through a cuttable :class:`TcpProxy` to the
balancer, ``lock = "command"``: each drive of the lock appends ``open <unix time>`` or ``lock <unix time>`` to a
file of the door's folder) and runs the door process with its claims on a local socket. A feeder thread writes a
claim there every ``interval_s``: in turn the person on camera (genuine) and another enrolled person (an
impostor, who should be refused ``rejected``). :meth:`SoakDoor.kill` and :meth:`SoakDoor.start` let a fault kill
the door and bring it back; the feeder connects again by itself.

The check (:func:`check_door_history`, behind :meth:`SoakDoor.history`) reads what each party kept:

* the feeder's own list of the claims it wrote, each with the process id of the door that took the line
  (``SO_PEERCRED`` of the socket: which door process read it, not which one the feeder meant);
* the door's JSON log, one file per run of the process: ``door_claim`` (its nonce), ``door_opened`` and
  ``door_refused`` (nonce, reason) — claims are taken one after another, so a run's n-th claim start is the
  n-th line written to it;
* the lock's own file: every ``open`` line is a drive, laid to the claim in progress at that moment;
* the server's ``recognition_events``: the door's VERIFY template carries the claim's nonce as its message id
  (:mod:`peep.edge.door_session`), so the server's row for ``(door, nonce)`` is its decision on that claim,
  recorded independently of anything the door says.

A drive is right only when it falls in a claim the door logged as opened (or that a kill cut short) and the
server recorded an *accepted* decision for that claim's nonce. The server's decision writer keeps Verify's
decisions off the call's path (committed within a second, dropped while the database is down), so a replica
killed right after answering, or a database stopped, can lose the record of a decision the door acted on:
``loss_windows`` names the wall-clock spans when that may happen (the caller's fault records); a drive without
any server record is ``excused`` inside one and wrong outside.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from peep.lab.bench.soak.history import check_door
from peep.lab.processes.control import unit_environment
from peep.lab.processes.sockets import SocketPlace

PEEP_EDGE = str(Path(sys.executable).parent / "peep-edge")
#: The door runs with its shipped unit's environment (deploy/systemd), as a deployment runs it.
DOOR_UNIT = "peep-edge-door.service"
#: The door's log events the check reads (peep.edge.door).
DOOR_EVENTS = ("door_claim", "door_opened", "door_refused")
#: Refusals the controller gives as a claim is taken, before it has a nonce: each is a claim start of its own.
START_REFUSALS = frozenset({"busy", "throttled", "locked_out"})
#: Seconds of clock slack between the lock's file (``date``) and the log's millisecond timestamps.
SLACK_S = 0.05


@dataclass(frozen=True)
class SentClaim:
    """One claim line the feeder wrote: which, for whom, when (wall clock) and to which door process."""

    seq: int
    subject: str
    genuine: bool
    at: float
    pid: int


@dataclass
class DoorRun:
    """One run of the door process: its id, log file, wall-clock span and whether a fault killed it."""

    pid: int
    log: Path
    started: float
    ended: float | None = None
    killed: bool = False


@dataclass(frozen=True)
class ServerDecision:
    """The server's row of ``recognition_events`` for one of the door's VERIFY templates."""

    message_id: str
    claimed_subject: str
    accepted: bool
    at: float


# --------------------------------------------------------------------------- reading what each party kept


def _ts(value: str) -> float:
    """The log's ``2024-05-01T12:00:00.123Z`` as unix seconds."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def read_door_log(path: Path) -> list[dict[str, Any]]:
    """The door events of one run's log (``event``, ``t`` in unix seconds, ``nonce``, ``reason``), in order.

    Lines that are not JSON (the door's own ``print`` output shares the file) and other events are skipped;
    a missing file (the process never started) is no events.
    """
    out: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if not isinstance(doc, dict) or doc.get("event") not in DOOR_EVENTS:
            continue
        try:
            t = _ts(str(doc.get("ts", "")))
        except ValueError:
            continue
        out.append({"event": doc["event"], "t": t, "nonce": str(doc.get("nonce", "") or ""),
                    "reason": str(doc.get("reason", "") or "")})  # fmt: skip
    return out


def read_lock_drives(path: Path) -> list[float]:
    """The times (unix seconds) of every ``open`` line of the lock's file, in order."""
    drives: list[float] = []
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return drives
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "open":
            with contextlib.suppress(ValueError):
                drives.append(float(parts[1]))
    return drives


def read_releases(ledger: Path) -> set[str]:
    """Message ids of the door's VERIFY releases in its privacy ledger (keys ``door:...``; each is a nonce)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute("SELECT message_id FROM spends WHERE key LIKE 'door:%' AND message_id != ''")
            return {str(r[0]) for r in rows}
    except sqlite3.Error:  # never opened (the door never released): nothing released
        return set()


def read_decisions(conn: Any, device_id: str) -> list[ServerDecision]:
    """The server's VERIFY decisions for ``device_id`` from a DB-API connection (sqlite3 or psycopg).

    No query parameters (the two drivers spell them differently): every VERIFY row is read and filtered here;
    a soak's cameras identify, so VERIFY rows are the doors' few.
    """
    rows = conn.execute(
        "SELECT device_id, message_id, claimed_subject, accepted, at FROM recognition_events WHERE purpose = 'verify'"
    ).fetchall()
    return [ServerDecision(str(r[1]), str(r[2]), bool(r[3]), float(r[4])) for r in rows if r[0] == device_id]


# --------------------------------------------------------------------------- the check (pure)


def door_claims(sent: Sequence[SentClaim], runs: Sequence[DoorRun],
                events: Mapping[int, Sequence[Mapping[str, Any]]]) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """Each claim the feeder wrote with what the door made of it; and how many claims the door took unasked.

    Parameters
    ----------
    sent : sequence of SentClaim
    runs : sequence of DoorRun
    events : mapping of pid to the events of that run's log (:func:`read_door_log`)

    Returns
    -------
    claims : list of dict
        Per sent claim: ``seq, subject, genuine, pid, nonce, outcome, reason, started, ended``; ``outcome`` is
        ``opened``, ``refused``, ``interrupted`` (its door was killed before it ended) or ``""`` (never ended).
    unexpected : int
        Claim starts in a log beyond the lines written to that run (a claim from somewhere else).
    """
    killed = {r.pid: r.killed for r in runs}
    by_pid: dict[int, list[SentClaim]] = {}
    for c in sorted(sent, key=lambda c: c.seq):
        by_pid.setdefault(c.pid, []).append(c)
    claims: list[dict[str, Any]] = []
    unexpected = 0
    for pid, mine in by_pid.items():
        evs = list(events.get(pid, ()))
        starts = [e for e in evs if e["event"] == "door_claim"
                  or (e["event"] == "door_refused" and not e["nonce"] and e["reason"] in START_REFUSALS)]  # fmt: skip
        ends: dict[str, Mapping[str, Any]] = {}
        for e in evs:
            if e["event"] == "door_claim" or not e["nonce"]:
                continue
            # An opening is final; of several refusals naming a nonce the last ended it (an earlier one can be a
            # stray decision refused while that claim waited).
            if e["event"] == "door_opened" or ends.get(e["nonce"], {}).get("event") != "door_opened":
                ends[e["nonce"]] = e
        unexpected += max(0, len(starts) - len(mine))
        for i, c in enumerate(mine):
            row: dict[str, Any] = {"seq": c.seq, "subject": c.subject, "genuine": c.genuine, "pid": pid, "nonce": "",
                                   "outcome": "", "reason": "", "started": None, "ended": None}  # fmt: skip
            if i < len(starts):
                s = starts[i]
                row["started"] = s["t"]
                if s["event"] == "door_refused":  # refused as it was taken: no nonce, nothing asked
                    row.update(outcome="refused", reason=s["reason"], ended=s["t"])
                else:
                    row["nonce"] = s["nonce"]
                    end = ends.get(s["nonce"])
                    if end is not None:
                        opened = end["event"] == "door_opened"
                        row.update(outcome="opened" if opened else "refused", reason="" if opened else end["reason"],
                                   ended=end["t"])  # fmt: skip
            if not row["outcome"] and killed.get(pid, False):
                row["outcome"] = "interrupted"
            claims.append(row)
    claims.sort(key=lambda r: r["seq"])
    return claims, unexpected


def _claim_in_progress(
    t: float, runs: Sequence[DoorRun], claims: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The claim of the run alive at ``t`` that was started and not yet ended at ``t`` (None if there is none)."""
    run = next((r for r in runs if r.started - SLACK_S <= t <= (r.ended if r.ended is not None else float("inf"))
                + SLACK_S), None)  # fmt: skip
    if run is None:
        return None
    mine = [c for c in claims if c["pid"] == run.pid and c["nonce"] and c["started"] is not None
            and c["started"] <= t + SLACK_S]  # fmt: skip
    if not mine:
        return None
    last = max(mine, key=lambda c: c["started"])
    if last["ended"] is not None and last["ended"] < t - SLACK_S:
        return None  # the last claim had ended: the lock was driven between claims
    return last


def claim_to_lock(sent: Sequence[SentClaim], runs: Sequence[DoorRun], events: Mapping[int, Sequence[Mapping[str, Any]]],
                  drives: Sequence[float]) -> list[tuple[float, float]]:  # fmt: skip
    """``(the claim's write time, milliseconds until the lock was driven)`` for each claim a drive fell in.

    From the feeder's write, not the door's log: the time a person at the door would wait after the badge.
    """
    claims, _ = door_claims(sent, runs, events)
    at = {c.seq: c.at for c in sent}
    out: dict[int, tuple[float, float]] = {}
    for t in sorted(drives):
        c = _claim_in_progress(t, runs, claims)
        if c is not None and c["outcome"] != "refused" and c["seq"] not in out:
            out[c["seq"]] = (at[c["seq"]], max(0.0, (t - at[c["seq"]]) * 1000.0))
    return [out[k] for k in sorted(out)]


def claim_to_verdict(sent: Sequence[SentClaim], runs: Sequence[DoorRun],
                     events: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[tuple[float, float]]:  # fmt: skip
    """``(the claim's write time, milliseconds until the door ended it)`` for each claim the server decided:
    opened, or refused ``rejected``. What a person at the door waits for either answer (a claim every few
    seconds, of which a fraction open, gives too few drives a minute to judge a percentile of those alone)."""
    claims, _ = door_claims(sent, runs, events)
    at = {c.seq: c.at for c in sent}
    return [
        (at[c["seq"]], max(0.0, (c["ended"] - at[c["seq"]]) * 1000.0))
        for c in claims
        if c["ended"] is not None and (c["outcome"] == "opened" or c["reason"] == "rejected")
    ]


def check_door_history(
    sent: Sequence[SentClaim],
    runs: Sequence[DoorRun],
    events: Mapping[int, Sequence[Mapping[str, Any]]],
    drives: Sequence[float],
    decisions: Iterable[ServerDecision],
    *,
    releases: Iterable[str] | None = None,
    loss_windows: Sequence[tuple[float, float]] = (),
    undelivered: int = 0,
) -> dict[str, Any]:
    """The door's ``{claims, opened, refused, wrong_lock_drives, ...}``: every claim ended, every drive justified.

    Parameters
    ----------
    sent, runs, events
        As for :func:`door_claims`.
    drives : sequence of float
        Unix times of the lock's ``open`` lines (:func:`read_lock_drives`).
    decisions : iterable of ServerDecision
        The server's VERIFY decisions for this door (:func:`read_decisions`).
    releases : iterable of str, optional
        Nonces the door's ledger charged a release for (:func:`read_releases`); None: not checked.
    loss_windows : sequence of (start, end)
        Wall-clock spans in which the server may have lost decisions it made (a replica killed, its database
        stopped: see the module docstring). A drive with no server record is excused when its claim began in one.
    undelivered : int
        Claim lines the feeder could not write (no door listening): reported, not claims.

    Returns
    -------
    dict
        :func:`peep.lab.bench.soak.history.check_door`'s keys — ``claims, opened, refused, unended,
        refused_without_reason, wrong_lock_drives, refusals`` — where ``unended`` leaves out ``interrupted``
        claims (their door was killed), plus ``interrupted``, ``lock_drives``, ``unattributed_lock_drives``
        (outside any claim in progress), ``unconfirmed_lock_drives`` (no server record for the claim) and
        ``excused_lock_drives`` (of those, within a loss window), ``server_rejected_but_opened``,
        ``accepted_but_refused`` (the server said yes, the door stayed locked: a late answer...),
        ``subject_mismatches`` (the server's claimed subject is not the one the feeder wrote),
        ``unknown_decisions`` (server rows for no claim of ours), ``unexpected_claims``, ``released`` and
        ``decided_without_release`` (when ``releases`` is given), ``genuine``/``impostor``
        ``{claims, opened, refused}``, ``undelivered`` and ``examples`` (a few nonces per anomaly).
    """
    claims, unexpected = door_claims(sent, runs, events)
    server: dict[str, list[ServerDecision]] = {}
    for d in decisions:
        server.setdefault(d.message_id, []).append(d)
    accepted = {n for n, ds in server.items() if any(d.accepted for d in ds)}
    by_nonce = {c["nonce"]: c for c in claims if c["nonce"]}

    def in_window(t: float | None) -> bool:
        return t is not None and any(a <= t <= b for a, b in loss_windows)

    keys: list[str] = []
    unattributed = unconfirmed = excused = rejected_opened = 0
    examples: dict[str, list[str]] = {}

    def example(kind: str, value: str) -> None:
        got = examples.setdefault(kind, [])
        if len(got) < 5:
            got.append(value)

    excused_nonces: set[str] = set()
    for t in sorted(drives):
        c = _claim_in_progress(t, runs, claims)
        if c is None:
            unattributed += 1
            keys.append(f"<none@{t:.3f}>")  # no claim: matches no accepted nonce, so a wrong drive
            example("unattributed_lock_drives", f"{t:.3f}")
            continue
        nonce = c["nonce"]
        if c["outcome"] == "refused":  # the door said locked, yet the lock was driven
            keys.append(f"<refused:{nonce}>")
            example("drive_in_refused_claim", nonce)
            continue
        if nonce in server and nonce not in accepted:
            rejected_opened += 1
            example("server_rejected_but_opened", nonce)
        elif nonce not in server:
            unconfirmed += 1
            if in_window(c["started"]):
                excused += 1
                excused_nonces.add(nonce)
            else:
                example("unconfirmed_lock_drives", nonce)
        keys.append(nonce)
    base = check_door(claims, keys, accepted | excused_nonces)
    interrupted = sum(1 for c in claims if c["outcome"] == "interrupted")
    accepted_refused = [c for c in claims if c["outcome"] == "refused" and c["nonce"] in accepted]
    mismatched = [c["nonce"] for c in claims if c["nonce"] in server
                  and any(d.claimed_subject != c["subject"] for d in server[c["nonce"]])]  # fmt: skip
    unknown = sorted(n for n in server if n not in by_nonce)
    for n in mismatched:
        example("subject_mismatches", n)
    for n in unknown:
        example("unknown_decisions", n)
    for c in claims:
        if not c["outcome"]:
            example("unended", f"#{c['seq']} {c['nonce'] or '(not taken)'}")

    def side(genuine: bool) -> dict[str, int]:
        mine = [c for c in claims if c["genuine"] == genuine]
        o = Counter(c["outcome"] for c in mine)
        return {"claims": len(mine), "opened": o.get("opened", 0), "refused": o.get("refused", 0)}

    out = {
        **base,
        "unended": base["unended"] - interrupted,
        "interrupted": interrupted,
        "lock_drives": len(drives),
        "unattributed_lock_drives": unattributed,
        "unconfirmed_lock_drives": unconfirmed,
        "excused_lock_drives": excused,
        "server_rejected_but_opened": rejected_opened,
        "accepted_but_refused": dict(Counter(c["reason"] for c in accepted_refused)),
        "subject_mismatches": len(mismatched),
        "unknown_decisions": len(unknown),
        "unexpected_claims": unexpected,
        "genuine": side(True),
        "impostor": side(False),
        "undelivered": undelivered,
        "examples": examples,
    }
    if releases is not None:
        released = set(releases)
        out["released"] = sum(1 for c in claims if c["nonce"] in released)
        out["decided_without_release"] = sum(1 for n in server if n not in released)
    return out


# --------------------------------------------------------------------------- the door's configuration


def door_config(*, device_id: str, site: str, state_dir: Path, bundle_dir: Path, public_key: Path, video: Path,
                ca_cert: Path, port: int, lock_log: Path, fps: float = 8.0,
                privacy: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The door's edge.toml as a dict (see the module docstring); its token comes from ``PEEP_SOAK_DOOR_TOKEN``."""
    sh = 'echo "{} $(date +%s.%N)" >> "$0"'  # $0: the file, passed as an argument, never spliced in
    return {
        "device": {"id": device_id, "site": site, "state_dir": str(state_dir)},
        "bundle": {"path": str(bundle_dir), "public_key": str(public_key), "accept_updates": False},
        "privacy": dict(privacy or {"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e9}),
        "capture": {"source": str(video), "max_fps": fps, "loop": True},
        "mqtt": {"enabled": False},
        "grpc": {"enabled": True, "target": f"localhost:{port}", "tls": True, "ca_file": str(ca_cert),
                 "token_env": "PEEP_SOAK_DOOR_TOKEN"},
        "metrics": {"port": 0},
        # info: door_claim and door_opened are logged at info (door_refused at warning).
        "log": {"level": "info", "format": "json"},
        # A claim every few seconds for an hour: budgets, throttle and lock-out far above it, so that every
        # refusal the soak sees is the system's answer (rejected, unreachable, timeout), not the door's limits.
        # The deadline leaves room for a replica's failover on a shared two-core machine.
        "door": {"enabled": True, "decision": "grpc", "lock": "command",
                 "open_command": ["/bin/sh", "-c", sh.format("open"), str(lock_log)],
                 "close_command": ["/bin/sh", "-c", sh.format("lock"), str(lock_log)],
                 "open_s": 0.5, "decision_timeout_s": 10.0, "lockout_failures": 1000, "lockout_window_s": 60.0,
                 "max_claims_per_minute": 600, "epsilon_per_hour": 1e7, "subject_epsilon_per_hour": 1e7},
    }  # fmt: skip


# --------------------------------------------------------------------------- the door and its feeder


class SoakDoor:
    """A ``peep-edge door`` under soak, its claims fed on a local socket (see the module docstring).

    Parameters
    ----------
    out : Path
        The door's folder (video, config, state, logs, the lock's file).
    site, device_id, token : str
        The door's site, id and gRPC bearer token (a device the server's ``auth.devices`` lists).
    bundle_dir, public_key : Path
        The signed bundle and its key.
    ca_cert : Path
        The CA the server's certificate (valid for ``localhost``) is checked against.
    target : (host, port)
        The server (the balancer); reached through a :class:`TcpProxy` of the door's own (:attr:`proxy`) so
        that its network can be cut.
    enrolled : sequence of str
        Enrolled subjects (at least two): the genuine one on camera is ``enrolled[seed % len]``; the others
        are claimed by impostors.
    people : mapping of str to sequence of Path
        LFW image paths per subject; the genuine one's first photo is on camera.
    seed : int
    fps : float
        The door camera's frame rate cap.
    privacy : mapping, optional
        The ``[privacy]`` section: the mechanism and ε the server's model was trained for (default privunit
        at ε 16, as the soak's cameras).
    video_frames : int
        Frames of the door's video (played in a loop, at 10 frames a second of video time).
    """

    def __init__(self, out: Path, *, site: str, device_id: str, token: str, bundle_dir: Path, public_key: Path,
                 ca_cert: Path, target: tuple[str, int], enrolled: Sequence[str],
                 people: Mapping[str, Sequence[Path]], seed: int = 0, fps: float = 8.0,
                 privacy: Mapping[str, Any] | None = None, video_frames: int = 60) -> None:  # fmt: skip
        if len(enrolled) < 2:
            raise ValueError(f"enrolled: expected at least two subjects (one genuine, one to impersonate), "
                             f"received {len(enrolled)}")  # fmt: skip
        self.out, self.site, self.device_id, self.token = Path(out), site, device_id, token
        self.bundle_dir, self.public_key, self.ca_cert, self.target = bundle_dir, public_key, ca_cert, target
        if video_frames < 1:
            raise ValueError(f"video_frames: expected at least 1, received {video_frames}")
        self.seed, self.fps, self.privacy, self.video_frames = seed, fps, privacy, video_frames
        self.genuine = enrolled[seed % len(enrolled)]
        self.impostors = [s for s in enrolled if s != self.genuine]
        if not people.get(self.genuine):
            raise ValueError(f"people: expected photos of {self.genuine!r}, the genuine subject, received none")
        # One of the photos the world enrolled the subject with: the soak checks what the door does with a
        # decision, not how well one noisy release verifies a new photo (with a held-out photo about one genuine
        # claim in fifteen opened at ε 16, too few drives to check anything by).
        self.photo = Path(people[self.genuine][0])
        self.state_dir = self.out / "state"
        self.lock_log = self.out / "lock.log"
        self.config = self.out / "door.toml"
        self._socket = SocketPlace(self.out, "claims.sock", prefix="peep-door-")
        self.socket_path = self._socket.path
        self.proxy: Any = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs: list[DoorRun] = []
        self.sent: list[SentClaim] = []
        self.undelivered = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._feeder: threading.Thread | None = None
        self._conn: socket.socket | None = None
        self._conn_pid = 0

    # ------------------------------------------------------------------ building it

    def prepare(self) -> SoakDoor:
        """Compose the video, open the proxy and write the configuration (no process yet)."""
        from peep.core.configfile import to_toml
        from peep.edge.testing import FaceTrack, compose_video
        from peep.lab.processes.tcpproxy import TcpProxy

        self.out.mkdir(parents=True, exist_ok=True)
        video = self.out / "door.mp4"
        # One face, all the time, moving a little: whichever frames a claim reads show the genuine person.
        n = self.video_frames
        compose_video(video, [FaceTrack(image=self.photo, start=0, stop=n, x0=220, y0=120, amplitude=15,
                                        period_frames=30)], n_frames=n, fps=10.0, seed=self.seed)  # fmt: skip
        if self.proxy is None:
            self.proxy = TcpProxy(0, self.target)
        cfg = door_config(device_id=self.device_id, site=self.site, state_dir=self.state_dir,
                          bundle_dir=self.bundle_dir, public_key=self.public_key, video=video, ca_cert=self.ca_cert,
                          port=self.proxy.port, lock_log=self.lock_log, fps=self.fps, privacy=self.privacy)  # fmt: skip
        self.config.write_text(to_toml(cfg))
        return self

    def start(self, timeout_s: float = 120.0) -> None:
        """Start a run of the door and wait (at most ``timeout_s``) until it listens for claims.

        Raises
        ------
        RuntimeError
            When the process ends or does not listen in time (the tail of its log says why).
        """
        if self.alive():
            raise RuntimeError(f"door {self.device_id}: already running (pid {self.proc.pid if self.proc else '?'})")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a killed run's socket: its presence must mean the new run listens
        log = self.out / f"door-{len(self.runs) + 1}.log"
        env = {**os.environ, **unit_environment(DOOR_UNIT), "PEEP_SOAK_DOOR_TOKEN": self.token}
        argv = [PEEP_EDGE, "door", "--config", str(self.config), "--claims", f"unix:{self.socket_path}"]
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        with self._lock:
            self.runs.append(DoorRun(self.proc.pid, log, time.time()))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._ended(killed=False)
                raise RuntimeError(f"door {self.device_id}: exited with {self.proc.returncode} before listening; "
                                   f"{log}: {_tail(log)}")  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(self.socket_path.stat().st_mode):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"door {self.device_id}: not listening on {self.socket_path} after {timeout_s:g} s; "
                           f"{log}: {_tail(log)}")  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive() and self.proc is not None else None

    def _ended(self, *, killed: bool) -> None:
        with self._lock:
            if self.runs and self.runs[-1].ended is None:
                self.runs[-1].ended = time.time()
                self.runs[-1].killed = killed

    def kill(self) -> None:
        """SIGKILL the door (a fault): the claim in progress and the lines not yet read end ``interrupted``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._ended(killed=True)

    # ------------------------------------------------------------------ the claims

    def start_feeder(self, *, interval_s: float = 5.0, max_claims: int = 1000, duration_s: float = 3600.0) -> None:
        """Write a claim every ``interval_s`` (genuine and impostor in turn), at most ``max_claims`` within
        ``duration_s``, until :meth:`stop_feeder`."""
        if not (interval_s > 0 and max_claims >= 1 and duration_s > 0):
            raise ValueError(f"feeder: expected interval_s > 0, max_claims >= 1 and duration_s > 0, received "
                             f"{interval_s}, {max_claims}, {duration_s}")  # fmt: skip
        if self._feeder is not None and self._feeder.is_alive():
            raise RuntimeError(f"door {self.device_id}: the feeder is already running")
        self._stop.clear()
        self._feeder = threading.Thread(target=self._feed, args=(interval_s, max_claims, duration_s),
                                        name=f"soak-{self.device_id}-claims", daemon=True)  # fmt: skip
        self._feeder.start()

    def _feed(self, interval_s: float, max_claims: int, duration_s: float) -> None:
        end = time.monotonic() + duration_s
        i = 0
        while i < max_claims and time.monotonic() < end and not self._stop.is_set():
            genuine = i % 2 == 0
            subject = self.genuine if genuine else self.impostors[(i // 2) % len(self.impostors)]
            pid = self._send(f"{subject}\n".encode())
            with self._lock:
                if pid:
                    self.sent.append(SentClaim(len(self.sent), subject, genuine, time.time(), pid))
                else:
                    self.undelivered += 1
            i += 1
            self._stop.wait(interval_s)
        self._disconnect()

    def _connect(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2.0)
        try:
            s.connect(str(self.socket_path))
            # The process that listens on the socket: the run this connection's lines go to.
            pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        except OSError:
            s.close()
            return False
        self._conn, self._conn_pid = s, int(pid)
        return True

    def _disconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn, self._conn_pid = None, 0

    def _send(self, line: bytes) -> int:
        """Write ``line`` to the door; the pid of the process it went to, or 0 when no door took it.

        A connection to a run that has since died fails on write (the peer is gone): connect again, a few
        times within about two seconds (a run just started binds its socket before it listens).
        """
        for attempt in range(5):
            if self._conn is None and not self._connect():
                if self._stop.wait(0.4 if attempt < 4 else 0):
                    return 0
                continue
            assert self._conn is not None
            try:
                self._conn.sendall(line)
                return self._conn_pid
            except OSError:
                self._disconnect()
        return 0

    def stop_feeder(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join(timeout_s)

    def ended_all(self) -> bool:
        """Whether the run alive now has ended every claim written to it (so far as its log says)."""
        if self.proc is None:
            return True
        with self._lock:
            sent = [c for c in self.sent if c.pid == self.proc.pid]
            runs = [r for r in self.runs if r.pid == self.proc.pid]
        events = {r.pid: read_door_log(r.log) for r in runs}
        claims, _ = door_claims(sent, runs, events)
        return all(c["outcome"] for c in claims)

    def stop(self, *, drain_s: float = 30.0, term_s: float = 20.0) -> None:
        """Stop feeding, let the door end the claims it was given (at most ``drain_s``), then SIGTERM it."""
        self.stop_feeder()
        deadline = time.monotonic() + drain_s
        while self.alive() and not self.ended_all() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(term_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._ended(killed=False)

    def close(self) -> None:
        """Stop everything at once (every wait bounded): the feeder, the process, the proxy."""
        self.stop_feeder(5.0)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self._ended(killed=False)
        if self.proxy is not None:
            self.proxy.close()
        self._socket.remove()

    # ------------------------------------------------------------------ the check

    def history(self, decisions: Iterable[ServerDecision], *,
                loss_windows: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:  # fmt: skip
        """The check of everything this door did (:func:`check_door_history`) against the server's ``decisions``
        (:func:`read_decisions` for :attr:`device_id`); call it after :meth:`stop`."""
        with self._lock:
            sent, runs, undelivered = list(self.sent), list(self.runs), self.undelivered
        events = {r.pid: read_door_log(r.log) for r in runs}
        out = check_door_history(sent, runs, events, read_lock_drives(self.lock_log), decisions,
                                 releases=read_releases(self.state_dir / "ledger.sqlite3"), loss_windows=loss_windows,
                                 undelivered=undelivered)  # fmt: skip
        out["runs"] = len(runs)
        out["killed"] = sum(1 for r in runs if r.killed)
        out["genuine_subject"] = self.genuine
        return out

    def claim_to_lock(self) -> list[tuple[float, float]]:
        """Per claim that drove the lock: its write time (wall clock) and milliseconds to the drive."""
        with self._lock:
            sent, runs = list(self.sent), list(self.runs)
        events = {r.pid: read_door_log(r.log) for r in runs}
        return claim_to_lock(sent, runs, events, read_lock_drives(self.lock_log))

    def claim_to_verdict(self) -> list[tuple[float, float]]:
        """Per claim the server decided: its write time (wall clock) and milliseconds until the door ended it."""
        with self._lock:
            sent, runs = list(self.sent), list(self.runs)
        return claim_to_verdict(sent, runs, {r.pid: read_door_log(r.log) for r in runs})

    def describe(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "runs": [asdict(r) | {"log": str(r.log)} for r in self.runs],
                "claims_sent": len(self.sent), "undelivered": self.undelivered}  # fmt: skip


def _tail(path: Path, n: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


__all__ = [
    "DoorRun",
    "SentClaim",
    "ServerDecision",
    "SoakDoor",
    "check_door_history",
    "claim_to_lock",
    "door_claims",
    "door_config",
    "read_decisions",
    "read_door_log",
    "read_lock_drives",
    "read_releases",
]
