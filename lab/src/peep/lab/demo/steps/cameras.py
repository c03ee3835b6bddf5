"""The demo's camera steps: the videos composed from held-out photos, then the camera agents watching them."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from peep.lab.demo.scenario import CameraScript, Scenario, camera_scripts, compose_camera_video, door_script
from peep.lab.demo.steps.context import DOOR, HEARTBEAT_S, RunContext, camera_ids
from peep.lab.demo.steps.edge import EdgeConfigs
from peep.lab.demo.steps.server import IdentificationEvents
from peep.lab.demo.summary import ledger_totals
from peep.server.progress import Progress

# The runner's logger, as before the steps were apart: the run's log names it.
log = logging.getLogger("peep.lab.demo.runner")


@dataclass(frozen=True)
class Videos:
    """What the cameras and the door play: one script per camera, and the door's (None: ``--no-door``)."""

    cameras: list[CameraScript]
    door: CameraScript | None


@dataclass(frozen=True)
class CameraRun:
    """What the cameras released and how their run went.

    Attributes
    ----------
    releases : dict of message id -> release
        Each release's ground truth (device, transport, frame, track, person, enrolled) and payload.
    edge : dict
        The summary's ``edge``: throughput, errors, releases without an event, per-device figures.
    """

    releases: dict[str, dict[str, Any]]
    edge: dict[str, Any]


def compose_videos(ctx: RunContext, scenario: Scenario) -> Videos:
    """Write each camera's video (and the door's) under ``<out>/videos``, seeded by ``--seed``."""
    o = ctx.opts
    devices = camera_ids(o)
    transports = ["grpc"] * len(devices)
    if ctx.use_mqtt:
        transports[-1] = "mqtt"
    vdir = ctx.out / "videos"
    vdir.mkdir(exist_ok=True)
    scripts = camera_scripts(
        scenario, vdir, device_ids=devices, transports=transports,
        visible_frames=o.visible_frames, gap_frames=o.gap_frames, seed=o.seed,
    )  # fmt: skip
    door = None
    if o.door:
        door = door_script(scenario, vdir, device_id=DOOR, visible_frames=o.door_visible_frames,
                           gap_frames=o.door_gap_frames, seed=o.seed)  # fmt: skip
    if o.scenes:
        from peep.lab.demo.steps.scenes import compose_scene_videos

        # the same people dealt to the same cameras, walking through a scene each instead of one by one
        scripts = compose_scene_videos(ctx, scripts)
    videos = ([] if o.scenes else scripts) + ([door] if door else [])
    # One video per thread: OpenCV's encoder and numpy's blending release the GIL.
    with Progress("    videos composed", len(videos), heartbeat=HEARTBEAT_S) as bar, \
            ThreadPoolExecutor(max_workers=max(1, min(len(videos), os.cpu_count() or 1))) as pool:  # fmt: skip
        bar.update(0)
        # At the door a person stands (and sways a little) rather than walking past.
        jobs = [pool.submit(compose_camera_video, s, fps=o.fps, seed=o.seed,
                            amplitude=10.0 if s is door else 60.0) for s in videos]  # fmt: skip
        for done in as_completed(jobs):
            done.result()
            bar.advance()
    return Videos(cameras=scripts, door=door)


def run_cameras(
    ctx: RunContext, edge: EdgeConfigs, events: IdentificationEvents, scripts: list[CameraScript]
) -> CameraRun:
    """Run an edge agent per camera (a process each) over its video; wait for the server's events.

    A camera that stops is reported in the result's ``edge.errors``; the other cameras go on. Every
    released template must come back as an identification event: those that did not within a minute
    are in ``edge.events_missing``.
    """
    from peep.lab.demo.devices import run_devices
    from peep.lab.demo.steps.scenes import SceneTruth

    by_device = {s.device_id: s for s in scripts}
    truths = {s.device_id: SceneTruth(s.scene) for s in scripts if s.scene is not None}
    jobs = []
    for s in scripts:
        cfg = edge(s.device_id, s.transport, str(s.video), soft=ctx.opts.soft)
        jobs.append(ctx.device_job(s.device_id, "camera", {"config": cfg.model_dump(mode="json"),
                                                           "video": str(s.video)}))  # fmt: skip
    releases: dict[str, dict[str, Any]] = {}  # message_id -> ground truth + payload
    t0 = time.perf_counter()
    # The videos play for about half a minute: the templates released so far, every few seconds.
    with Progress("    templates released by the cameras", heartbeat=HEARTBEAT_S) as bar:
        bar.update(0)

        def on_release(_kind: str, device: str, value: Any) -> None:
            message_id, frame, track, payload, box = value
            truth = truths.get(device)
            if truth is not None:
                # a scene: the released box is whoever's face it shows (several people are in view)
                face = truth.face(frame, box) if box is not None else None
                person = face["identity"] if face else None
                enrolled = face["role"] == "enrolled" if face else None
                extra = {"box": box, "pass": face["track"] if face else None,
                         "face_px": face["height_px"] if face else None}  # fmt: skip
            else:
                who = by_device[device].who(frame)
                person, enrolled = (who.person, who.enrolled) if who else (None, None)
                extra = {"box": box}
            releases[message_id] = {
                "device": device,
                "transport": by_device[device].transport,
                "frame": frame,
                "track": track,
                "person": person,
                "enrolled": enrolled,
                "payload": payload,
                **extra,
            }
            bar.update(len(releases))

        result = run_devices(jobs, on_release)
    # Reported in the summary; the other cameras went on.
    errors = [f"{d}: {r['error']}" for d, r in result.items() if not r["ok"]]
    for e in errors:
        log.error("camera %s", e)
    edge_s = time.perf_counter() - t0
    missing = events.wait_for(releases, 60.0)
    frames = sum(s.n_frames for s in scripts)
    per_device: dict[str, Any] = {}
    for s in scripts:
        spent = ledger_totals(ctx.out / "devices" / s.device_id)
        per_device[s.device_id] = {
            "transport": s.transport,
            "frames": s.n_frames,
            "appearances": len(s.appearances),
            "releases": sum(1 for r in releases.values() if r["device"] == s.device_id),
            "suppressed": result.get(s.device_id, {}).get("suppressed"),
            "epsilon_vector_spent": spent["epsilon_vector"],
            "max_epsilon_vector_per_track": spent["max_per_track"],
        }
    return CameraRun(
        releases=releases,
        edge={
            "edge_seconds": edge_s,
            "frames": frames,
            "frames_per_s": frames / edge_s if edge_s > 0 else None,
            "templates": len(releases),
            "templates_per_s": len(releases) / edge_s if edge_s > 0 else None,
            "events_missing": missing,
            "errors": errors,
            "devices": per_device,
        },
    )
