"""``peep bench --sections door``: a door's claim → lock latency per bundle and decision mode, and how often a door
deciding on the device opens for genuine and for impostor claims.

For each bundle (``dlib-resnet``: dlib's ResNet descriptor reduced to k = 16, PrivUnit ε = 16, the demo's
default; ``fisherfaces``: k = 24 on pixels, PrivUnit ε = 16; ``dlib-resnet-k32``: the descriptor at k = 32,
deciding on the device only) a server runs in this process (gRPC over TLS on loopback, SQLite, MQTT on the
local broker when one answers, the ``lda`` preset, issuing a signed device model on every promotion), with
public LFW people of 5–9 photos as the bundle's faces and background, and the LFW people with the most photos
enrolled through the admin's ``EnrolSubject`` (released as a device would, under the site's key; see
:mod:`peep.lab.bench.door_accuracy` for who and how many). Then a **door agent in a child process pinned to
one core** (the real :class:`peep.edge.agent.Agent` and :class:`peep.edge.door_session.DoorSession`; the lock a
GPIO pin of gpiozero's mock factory) serves genuine claims on a composed video (each claim while its person
stands at the door), deciding over gRPC ``Verify``, over MQTT (the template on the device's templates topic, the
server's decision on its events topic), and on the device (``door.decision = "device"``: the agent fetches its
signed model with ``GetDeviceModel`` before the first claim; the claimed subject is scored on the face's clean
projection, rotated by the site key, and the lock driven at once). The server is pinned to the other core.

Per claim, stages in milliseconds: ``face_search`` (reading and detecting the frames looked at for the best
face: the time until a face is chosen), ``descriptor`` (normalise, descriptor network where there is one,
projection), ``perturb``, ``encode`` (template, ε spent in the device's ledger, protobuf), ``transport`` (the
decision's call until the server starts scoring: TLS, the broker, the server's validation and batching),
``server_score`` (the recogniser's verification score), ``return`` (from the score to the device holding the
decision), on the device ``score`` (the device model and the claim rule), ``actuate`` (the pin), and
``face_to_lock`` — from the chosen face to the lock, the figure the targets apply to (p95 ≤ 400 ms with
dlib-resnet and ≤ 150 ms with Fisherfaces when the server decides; ≤ 150 ms when the device decides) — and
``claim_to_lock``. The server's scoring is timed inside the server process; both processes read the one
monotonic clock of the machine, which splits the round trip. A Raspberry Pi 4 figure is an estimate (an assumed
per-core ratio).

The door deciding on the device then (in the same child, with the model it fetched) decides every held-out photo
of every enrolled person claimed with every enrolled subject's badge (``accuracy``: at least 3,000 impostor
claims in a full run), and, after the server is stopped, replays the first claims of the video
(``device.server_away``): a door deciding on the device opens with no server at all.

``descriptor_per_face`` times the descriptor on both back ends (dlib's own network and its onnxruntime graph)
on the door's held-out faces, back to back; the claims run the one ``PEEP_DESCRIPTOR_BACKEND`` names
(``descriptor_backend``).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from peep.lab.bench import door_accuracy
from peep.server.descriptors import descriptor_backend

#: (name in the section, projection, components, decision modes) of the bundles measured; every template is
#: released with one mechanism.
BUNDLES = (
    ("dlib-resnet", "dlib-resnet", 16, ("grpc", "mqtt", "device")),
    ("fisherfaces", "fisherfaces", 24, ("grpc", "mqtt", "device")),
    ("dlib-resnet-k32", "dlib-resnet", 32, ("device",)),
)
MECHANISM, EPSILON = "privunit", 16.0
#: face → lock p95 targets when the server decides, per projection, and when the device decides.
TARGET_P95_MS = {"dlib-resnet": 400.0, "fisherfaces": 150.0}
DEVICE_TARGET_P95_MS = 150.0
# The edge bench's assumed single-core slowdown of a Raspberry Pi 4 against one core of this machine.
PI4_PER_CORE_RATIO = 6.0
#: Claims of the video replayed at its end, with the server stopped (decision on the device only).
SERVER_AWAY_CLAIMS = 3
#: Seconds from one claim's start to the next at least: a door takes claims from people walking up, and the
#: server answers one device's claim checks at 5 a second after a burst of 20 (faster ones end ``unreachable``).
CLAIM_INTERVAL_S = 0.25
_DOOR = "door-bench"
#: What the door child says when it holds its model and wants the server stopped; the parent's answer.
_AWAY_ASK, _AWAY_DONE = "peep-door-bench: stop the server", "stopped"


def _broker_up(host: str = "127.0.0.1", port: int = 1883) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _percentiles(values: list[float]) -> dict[str, float | None]:
    a = np.asarray([v for v in values if v is not None], dtype=float)
    if a.size == 0:
        return {"p50": None, "p95": None, "worst": None, "n": 0}
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "worst": float(a.max()),
            "n": int(a.size)}  # fmt: skip


class _ScoreClock:
    """Records when the server's recogniser scored a verification (monotonic start and end)."""

    def __init__(self, recogniser: Any) -> None:
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        inner = recogniser.verify_scores

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return inner(*a, **kw)
            finally:
                with self._lock:
                    self.spans.append((t0, time.monotonic()))

        recogniser.verify_scores = timed

    def within(self, start: float, end: float) -> tuple[float, float] | None:
        with self._lock:
            inside = [s for s in self.spans if start <= s[0] and s[1] <= end]
        return inside[-1] if inside else None


def _server(work: Path, bundle_dir: Path, pub: Path, tokens: dict[str, str], admin: str, mqtt: bool,
            decision_key: Path, device_models: dict[str, Any], signing_keys: dict[str, str]) -> Any:  # fmt: skip
    from peep.lab.processes.pki import make_local_pki
    from peep.server.app import ServerApp
    from peep.server.config import parse_config, token_sha256

    pki = make_local_pki(work / "tls")
    site = f"bench-{secrets.token_hex(2)}"
    cfg = {
        "grpc": {"listen": "127.0.0.1:0", "grace_s": 1.0,
                 "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)}},
        "storage": {"backend": "sqlite", "path": str(work / "peep.db")},
        "bundle": {"public_key": str(pub), "dir": str(bundle_dir)},
        "auth": {"admin_token_sha256": token_sha256(admin),
                 "devices": [{"id": d, "site": site, "token_sha256": token_sha256(t), "signing_key": signing_keys[d],
                              "door": True} for d, t in tokens.items()]},
        # A topic root of the run's own: on a broker others use, the bench neither takes their templates nor
        # hands them its decisions.
        "mqtt": {"enabled": mqtt, "host": "127.0.0.1", "port": 1883, "username": "", "share_group": f"peep-{site}",
                 "client_id": f"peep-{site}-server", "session_expiry_s": 0, "clear_retained": False,
                 "decision_signing_key": str(decision_key), "topic_prefix": f"{site}/v1"},
        "training": {"model_dir": str(work / "models"), "preset": "lda", "device_models": device_models},
        # Thousands of claims in minutes: the per-device rate of claim checks above the bench's traffic.
        "recognition": {"claim_checks_per_s": 1000.0, "claim_checks_burst": 1000},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "warning"},
    }  # fmt: skip
    app = ServerApp(parse_config(cfg))
    app.start(mqtt_wait=10.0 if mqtt else None)
    return app, pki, site


def _enrol_and_train(app: Any, pki: Any, admin: str, bundle: Any, enrolled: Any, background: Any,
                     site_key: Any) -> None:  # fmt: skip
    import grpc
    from peep.core import wire
    from peep.core.release import TemplateReleaser
    from peep.v1 import recognition_pb2, recognition_pb2_grpc

    releaser = TemplateReleaser(bundle, kind=MECHANISM, epsilon=EPSILON, site_key=site_key)
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes())
    with grpc.secure_channel(f"localhost:{app.port}", creds) as channel:
        stub = recognition_pb2_grpc.RecognitionServiceStub(channel)  # type: ignore[no-untyped-call]
        md = [("authorization", f"Bearer {admin}")]
        for faces, name_of in ((enrolled, lambda lab: enrolled.target_names[lab].replace(" ", "_")),
                               (background, lambda lab: f"background:{lab}")):  # fmt: skip
            values = releaser.release(faces.inputs(bundle.input_kind))
            groups: dict[str, list[Any]] = {}
            for i, (row, label) in enumerate(zip(values, faces.labels, strict=True)):
                subject = name_of(int(label))
                groups.setdefault(subject, []).append(wire.make_template(
                    row, device_id="admin", site="bench", bundle_id=bundle.bundle_id, mechanism=releaser.description,
                    purpose="enroll", subject=subject, track_id=f"e{i}", key_id=releaser.key_id))  # fmt: skip
            for subject, msgs in groups.items():
                stub.EnrolSubject(recognition_pb2.EnrolSubjectRequest(subject=subject, templates=msgs), metadata=md,
                                  timeout=60)  # fmt: skip
        stub.Train(recognition_pb2.TrainRequest(), metadata=md, timeout=600)


def _door_config(work: Path, bundle_dir: Path, pub: Path, pki: Any, site: str, port: int, video: Path,
                 decision: str, decision_pub: Path, site_key: Path, model_pub: Path) -> dict[str, Any]:  # fmt: skip
    cfg: dict[str, Any] = {
        "device": {"id": _DOOR, "site": site, "state_dir": str(work / f"door-{decision}"),
                   "signing_key": str(work / "door-signing.key")},
        "bundle": {"path": str(bundle_dir), "public_key": str(pub), "accept_updates": False},
        "privacy": {"mechanism": MECHANISM, "epsilon": EPSILON, "track_budget": 2 * EPSILON,
                    "site_key": str(site_key)},
        "capture": {"source": str(video), "max_fps": 0.0},
        # The descriptor's back end as the lab's (PEEP_DESCRIPTOR_BACKEND): one run per back end compares them.
        "descriptor": {"backend": descriptor_backend()},
        "mqtt": {"enabled": decision == "mqtt", "host": "127.0.0.1", "port": 1883, "tls": False,
                 "topic_prefix": f"{site}/v1"},
        # Deciding on the device, gRPC fetches the model (GetDeviceModel) and carries the spooled access records.
        "grpc": {"enabled": decision in ("grpc", "device"), "target": f"localhost:{port}", "tls": True,
                 "ca_file": str(pki.ca_cert), "token_env": "PEEP_BENCH_DOOR_TOKEN"},
        "metrics": {"port": 0},
        "log": {"level": "warning", "format": "text"},
        # The bench's claims come seconds apart: its door takes them all (throttle and budgets above them). The
        # local broker has no TLS and no password, which a door deciding over MQTT must be told to accept; its
        # decisions are signed all the same.
        "door": {"enabled": True, "decision": decision, "lock": "gpio", "open_s": 0.2, "decision_timeout_s": 5.0,
                 "lockout_failures": 1000, "max_claims_per_minute": 600, "epsilon_per_hour": 1e7,
                 "subject_epsilon_per_hour": 1e7, "decision_public_key": str(decision_pub),
                 "insecure_broker": decision == "mqtt"},
    }  # fmt: skip
    if decision == "device":
        cfg["recognition"] = {"model_public_key": str(model_pub)}
    return cfg


def _claim_rows(session: Any, window: Any, claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    last = -CLAIM_INTERVAL_S
    for claim in claims:
        time.sleep(max(0.0, last + CLAIM_INTERVAL_S - time.monotonic()))
        last = time.monotonic()
        window.start, window.stop = claim["start"], claim["stop"]
        out = session.handle(claim["subject"], window.read)
        t = session.last_timing
        rows.append({"subject": claim["subject"], "opened": out.opened, "reason": out.reason, "marks": t.marks,
                     "stages_ms": {k: 1000 * v for k, v in t.stages.items()}})  # fmt: skip
    return rows


def _hold_model(agent: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """Start the agent's transports (its ``GrpcModelPuller`` asks ``GetDeviceModel`` at once) and wait for a
    decider of the fetched model: what the door decides with."""
    t0 = time.monotonic()
    agent.start_transports()
    while (decider := agent.decisions.decider()) is None:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"no device model within {timeout_s:g} s: {agent.decisions.problem}")
        time.sleep(0.02)
    th = decider.thresholds
    return {
        "fetched_s": time.monotonic() - t0,
        "via": "gRPC GetDeviceModel (the agent's GrpcModelPuller)",
        "serial": decider.model.serial,
        "model_version": decider.model.model_version,
        "subjects": int(decider.known.size),
        "verify_threshold": float(th.verify_threshold),
        "far_target": float(th.far_target),
        "far_public": float(th.far_public),
        "calibration_faces": int(th.public_faces),
        "impostor_scores": int(th.impostor_scores),
    }


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _server_away(agent: Any, session: Any, window: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Ask the parent to stop the server, then replay claims: a door deciding on the device needs no server."""
    spool = agent.spool
    t0 = time.monotonic()
    while spool.depth() and time.monotonic() - t0 < 10.0:  # the access records of the claims so far, sent
        time.sleep(0.1)
    pending_before = spool.depth()
    print(_AWAY_ASK, flush=True)
    answer = sys.stdin.readline().strip()
    if answer != _AWAY_DONE:
        raise RuntimeError(f"the bench did not stop the server (it answered {answer[:40]!r})")
    listening = _listening(spec["port"])
    rows = _claim_rows(session, window, spec["away_claims"])
    outcomes = [{"subject": r["subject"], "opened": r["opened"], "reason": r["reason"],
                 "face_to_lock_ms": r["stages_ms"].get("total_after_face")} for r in rows]  # fmt: skip
    return {
        "server_listening": listening,
        "claims": len(rows),
        "opened": sum(bool(r["opened"]) for r in rows),
        "outcomes": outcomes,
        "records_pending_before": pending_before,
        "records_pending_after": spool.depth(),
        "records_refused": len(spool.dead()),
    }


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """The door agent, pinned to one core: every claim of ``spec``; per claim its stages (ms) and marks.

    Deciding on the device it also fetches its model first, decides the accuracy photos with it, and replays the
    server-away claims once the parent has stopped the server.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    import cv2

    cv2.setNumThreads(1)
    from gpiozero.pins.mock import MockFactory  # type: ignore[import-untyped]
    from peep.edge.agent import Agent
    from peep.edge.capture import VideoSource
    from peep.edge.config import EdgeConfig
    from peep.edge.door_session import open_door
    from peep.lab.demo.devices import FrameWindow

    cfg = EdgeConfig.model_validate(spec["config"])
    agent = Agent(cfg, environ={"PEEP_BENCH_DOOR_TOKEN": spec["token"]})
    door = open_door(agent, pin_factory=MockFactory(), face_timeout_s=3.0, settle_frames=3)
    if door.link is not None and not door.link.connected.is_set():
        raise RuntimeError("the door could not reach the MQTT broker on 127.0.0.1:1883")
    on_device = cfg.door.decision == "device"
    model = _hold_model(agent) if on_device else None
    session = door.session
    source = VideoSource(spec["video"], kind="file")
    window = FrameWindow(source)
    cpu0 = time.process_time()
    rows = _claim_rows(session, window, spec["claims"])
    cpu_s = time.process_time() - cpu0
    out: dict[str, Any] = {"claims": rows, "agent_cpu_s": cpu_s, "cpus_used": 1 if cpus else None}
    if on_device:
        out["model"] = model
        decider = agent.decisions.decider()
        out["accuracy"] = door_accuracy.decide_photos(session.pipeline, decider, spec["photos"], spec["subjects"])
        out["server_away"] = _server_away(agent, session, window, spec)
    door.close()
    source.close()
    agent.shutdown(drain_timeout=0)
    return out


def _run_child(spec: dict[str, Any], *, server_away: Any = None, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Run the door child; ``server_away()`` is called when it asks for the server to be stopped."""
    work = Path(spec["work"])
    tag = spec["config"]["door"]["decision"]
    path, result, log = work / f"spec-{tag}.json", work / f"result-{tag}.json", work / f"door-{tag}.log"
    spec = {**spec, "result": str(result)}
    path.write_text(json.dumps(spec))
    with open(log, "w") as err, subprocess.Popen(
        [sys.executable, "-m", "peep.lab.bench.door", "--child", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
    ) as proc:  # fmt: skip
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None and proc.stdin is not None
            for line in proc.stdout:
                if line.strip() == _AWAY_ASK:
                    if server_away is not None:
                        server_away()
                    proc.stdin.write(_AWAY_DONE + "\n" if server_away is not None else "no\n")
                    proc.stdin.flush()
            code = proc.wait()
        finally:
            timer.cancel()
    if code != 0:
        raise RuntimeError(f"door benchmark child failed (exit {code}): {log.read_text()[-2000:]}")
    out: dict[str, Any] = json.loads(result.read_text())
    return out


def _stages(rows: list[dict[str, Any]], scores: _ScoreClock | None) -> dict[str, Any]:
    """Per-stage percentiles over the claims that reached a decision (and how many did not)."""
    per: dict[str, list[float]] = {}
    decided = [r for r in rows if r["opened"] or r["reason"] == "rejected"]
    for r in decided:
        st, marks = r["stages_ms"], r["marks"]
        common = {
            "face_search": st.get("capture", 0.0) + st.get("detect", 0.0),
            "actuate": st.get("actuate", 0.0),
            "face_to_lock": st.get("total_after_face", 0.0),
            "claim_to_lock": st.get("claim_to_lock", 0.0),
        }
        if scores is None:  # decided on the device: the clean projection, then the model's score and rule
            values = {**common, "descriptor": st.get("project", 0.0), "score": st.get("verify", 0.0)}
            # What the face to lock holds beyond its parts, per claim: a median of sums is not the sum of medians,
            # so a hidden stage shows here and not in a difference of percentiles.
            values["unaccounted"] = values["face_to_lock"] - values["descriptor"] - values["score"] - values["actuate"]
        else:
            values = {**common, "descriptor": st.get("descriptor", 0.0), "perturb": st.get("perturb", 0.0),
                      "encode": st.get("encode", 0.0), "verify_round_trip": st.get("verify", 0.0)}  # fmt: skip
            span = scores.within(marks.get("verify_start", 0.0), marks.get("verify_end", 0.0))
            if span is not None:
                values["transport"] = 1000 * (span[0] - marks["verify_start"])
                values["server_score"] = 1000 * (span[1] - span[0])
                values["return"] = 1000 * (marks["verify_end"] - span[1])
        for k, v in values.items():
            per.setdefault(k, []).append(v)
    undecided: dict[str, int] = {}
    for r in rows:
        if not (r["opened"] or r["reason"] == "rejected"):
            undecided[r["reason"]] = undecided.get(r["reason"], 0) + 1
    return {
        "claims": len(rows),
        "decided": len(decided),
        "opened": sum(bool(r["opened"]) for r in rows),
        "not_decided": undecided,
        "stages_ms": {k: _percentiles(v) for k, v in per.items()},
    }


def _pi4(stages: dict[str, Any], on_device: bool) -> dict[str, float | None]:
    """Face to lock on a Raspberry Pi 4, estimated: the device's stages scaled by the assumed per-core ratio."""
    try:
        f2l = stages["face_to_lock"]
        if on_device:  # every stage after the face runs on the device
            return {"face_to_lock_p50_ms": f2l["p50"] * PI4_PER_CORE_RATIO,
                    "face_to_lock_p95_ms": f2l["p95"] * PI4_PER_CORE_RATIO}  # fmt: skip
        device = sum(stages[k]["p50"] for k in ("descriptor", "perturb", "encode"))
        return {"face_to_lock_p50_ms": float(device * PI4_PER_CORE_RATIO + f2l["p50"] - device)}
    except (KeyError, TypeError):
        return {"face_to_lock_p50_ms": None}


def _video(work: Path, picks: list[tuple[str, Path]], away: list[tuple[str, Path]]) -> tuple[Any, list[Any], list[Any]]:
    """The door camera's video: a genuine claim per pick, then the server-away replays; their claim windows."""
    from peep.lab.demo.scenario import Appearance, CameraScript, compose_camera_video

    script = CameraScript(device_id=_DOOR, transport="grpc", video=work / "door.mp4", n_frames=0)
    for person, img in [*picks, *away]:
        start = script.n_frames + 1
        script.appearances.append(Appearance(person=person, enrolled=True, image=img, start=start,
                                             stop=start + 8, claim=person))  # fmt: skip
        script.n_frames = start + 8
    script.n_frames += 1
    compose_camera_video(script, fps=15.0, seed=0)
    claims = [{"subject": a.claim, "start": a.start, "stop": a.stop} for a in script.appearances]
    return script, claims[: len(picks)], claims[len(picks) :]


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the door (see the module docstring); returns the section's JSON-able dict."""
    from peep.core.bundle import load_private_key, write_keypair
    from peep.core.sitekey import SiteKey
    from peep.edge.bench import descriptor_timing
    from peep.edge.device_key import DeviceKey
    from peep.edge.testing import lfw_people
    from peep.server.bundles.build import build_bundle
    from peep.server.datasets import load_dataset
    from peep.server.descriptors import descriptor_encoder

    n_claims = 12 if quick else 40
    mqtt = _broker_up()
    out: dict[str, Any] = {"quick": quick, "mechanism": {"kind": MECHANISM, "epsilon": EPSILON}, "bundles": {},
                           "descriptor_backend": descriptor_backend(),
                           "mqtt": mqtt, "claims_per_run": n_claims}  # fmt: skip
    here = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    with tempfile.TemporaryDirectory(prefix="peep-door-bench-") as tmp:
        work = Path(tmp)
        key, pub = write_keypair(work / "bench")
        decision_key, decision_pub = write_keypair(work / "decisions")
        model_key, model_pub = write_keypair(work / "device-models")  # the deployer's key for device models
        site_key = SiteKey.generate()
        site_key_path = site_key.write(work / "site.key")
        encoder = descriptor_encoder("dlib-resnet")
        people = lfw_people()
        rare = sorted(n for n, p in people.items() if 5 <= len(p) <= 9)
        background_people = rare[: 60 if quick else 200]
        # Only the people asked for are read (and described, once: the face cache keeps descriptors).
        background = load_dataset("lfw", min_faces=5, max_faces=9, encoder=encoder, people=background_people)
        names, n_enrol, held_max = door_accuracy.choose_enrolled(people, quick)
        enrolled = load_dataset("lfw", min_faces=n_enrol + 1, encoder=encoder, people=names,
                                max_per_subject=n_enrol + held_max)  # fmt: skip
        enrol_mask, held = door_accuracy.split_photos(enrolled, n_enrol)
        subjects = sorted({str(n).replace(" ", "_") for n in enrolled.target_names})
        calibration_people = door_accuracy.calibration_people(people, {*background_people, *names}, quick)
        rng = np.random.default_rng(0)
        picks = [held[int(i)] for i in rng.permutation(len(held))[:n_claims]]
        script, claims, away_claims = _video(work, picks, picks[:SERVER_AWAY_CLAIMS])
        out["claims_per_run"] = len(claims)  # fewer than asked when the people have fewer held-out photos
        out["setup"] = {
            "enrolled": subjects, "enrolment_photos_each": n_enrol, "held_out_photos": len(held),
            "held_out_max_each": held_max, "background_people": len(background_people),
            "calibration_people_chosen": len(calibration_people), "site_key": True, "preset": "lda",
            "pi4_per_core_ratio": PI4_PER_CORE_RATIO,
        }  # fmt: skip
        # Both back ends' time per face on the door's own held-out faces, back to back (the claims below run
        # the one PEEP_DESCRIPTOR_BACKEND names).
        out["descriptor_per_face"] = descriptor_timing([Path(p) for _, p in held[: 20 if quick else 60]],
                                                       rounds=1 if quick else 2)  # fmt: skip
        for name, projection, k, decisions in BUNDLES:
            bwork = work / name
            bwork.mkdir()
            bundle = build_bundle(background, n_components=k, signing_key=load_private_key(key),
                                  out_dir=bwork / "bundle", projection=projection,
                                  network=encoder.identity if projection == "dlib-resnet" else None,
                                  mechanism_defaults={"kind": MECHANISM, "epsilon": EPSILON})  # fmt: skip
            calibration = door_accuracy.write_bench_calibration(
                bundle, bwork / "calibration.npz", mechanism=MECHANISM, people=calibration_people,
                exclude=[*names, *background_people])  # fmt: skip
            device_models = {"signing_key": str(model_key), "calibration": str(bwork / "calibration.npz")}
            token, admin = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
            if len(here) > 1:
                os.sched_setaffinity(0, set(sorted(here)[1:]))  # the server off the door's core
            # The door's own signing key (what its templates over MQTT are checked against), registered.
            door_key = DeviceKey(bwork / "door-signing.key").public_text
            app, pki, site = _server(bwork, bwork / "bundle", pub, {_DOOR: token}, admin, mqtt, decision_key,
                                     device_models, {_DOOR: door_key})  # fmt: skip
            try:
                _enrol_and_train(app, pki, admin, bundle, enrolled.subset(enrol_mask), background, site_key)
                dm = app.services.device_models
                if not dm.enabled or dm.last_error:
                    raise RuntimeError(f"no device model issued: {dm.disabled_reason or dm.last_error}")
                scores = _ScoreClock(app.services.recogniser)
                result: dict[str, Any] = {"projection": projection, "n_components": k, "calibration": calibration}
                for decision in decisions:
                    if decision == "mqtt" and not mqtt:
                        result["mqtt"] = {"error": "no MQTT broker on 127.0.0.1:1883"}
                        continue
                    on_device = decision == "device"
                    spec: dict[str, Any] = {
                        "work": str(bwork), "token": token, "video": str(script.video), "claims": claims,
                        "config": _door_config(bwork, bwork / "bundle", pub, pki, site, app.port, script.video,
                                               decision, decision_pub, site_key_path, model_pub),
                    }  # fmt: skip
                    if on_device:
                        spec.update(port=app.port, away_claims=away_claims, subjects=subjects,
                                    photos=[(s, str(p)) for s, p in held])  # fmt: skip
                    child = _run_child(spec, server_away=(lambda a=app: a.stop(0)) if on_device else None)
                    stages = _stages(child["claims"], None if on_device else scores)
                    f2l = stages["stages_ms"].get("face_to_lock", {})
                    target = DEVICE_TARGET_P95_MS if on_device else TARGET_P95_MS[projection]
                    pi4 = _pi4(stages["stages_ms"], on_device)
                    basis = ("all of face to lock (every stage after the face runs on the device)" if on_device
                             else "the device's stages (descriptor, perturb, encode), the server's and the "
                             "network's unchanged")  # fmt: skip
                    row = {
                        **stages,
                        "agent_cpu_s": child["agent_cpu_s"],
                        "agent_cpu_ms_per_claim": 1000 * child["agent_cpu_s"] / max(1, stages["claims"]),
                        "agent_cpus": child["cpus_used"],
                        "target_face_to_lock_p95_ms": target,
                        "target_met": (f2l.get("p95") is not None and f2l["p95"] <= target),
                        "raspberry_pi_4_estimate": {
                            "basis": f"an assumed single-core ratio of {PI4_PER_CORE_RATIO:g} applied to {basis}; "
                            "not a run on a Pi",
                            **pi4,
                        },
                    }
                    if on_device:
                        p95 = pi4.get("face_to_lock_p95_ms")
                        row["raspberry_pi_4_estimate"]["target_met"] = p95 is not None and p95 <= target
                        row["model"] = child["model"]
                        # The same claims, decided while the server was up (the replays' frames are composed anew).
                        row["server_away"] = {**child["server_away"], "same_claims_opened_with_server_up": [
                            bool(r["opened"]) for r in child["claims"][:SERVER_AWAY_CLAIMS]]}  # fmt: skip
                        result["accuracy"] = door_accuracy.summarise(child["accuracy"], child["model"], quick)
                    result[decision] = row
                out["bundles"][name] = result
            finally:
                app.stop(0)
                if here:
                    os.sched_setaffinity(0, here)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        spec = json.loads(Path(sys.argv[2]).read_text())
        Path(spec["result"]).write_text(json.dumps(_child(spec)))
    else:
        print(json.dumps(run("--quick" in sys.argv), indent=1))
