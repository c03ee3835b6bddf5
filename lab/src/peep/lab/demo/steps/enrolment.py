"""The demo's enrolment steps: subjects at the enrolment desks, the public background population, training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from peep.core import wire
from peep.core.bundle import ProjectionBundle
from peep.core.release import TemplateReleaser
from peep.lab.demo.scenario import Scenario, link_folder
from peep.lab.demo.steps.context import DESKS, HEARTBEAT_S, RunContext
from peep.lab.demo.steps.edge import EdgeConfigs
from peep.lab.demo.steps.server import DemoServer
from peep.server.progress import Progress
from peep.v1 import recognition_pb2


def enrol_at_desks(ctx: RunContext, edge: EdgeConfigs, scenario: Scenario) -> None:
    """Enrol every subject from a folder of their photos at the site's enrolment desks (a process each).

    Raises
    ------
    RuntimeError
        When a desk stopped: the demo cannot go on without its subjects.
    """
    from peep.lab.demo.devices import run_devices
    from peep.lab.scenes.views import redraw_as_seen

    # Two enrolment desks, each its own edge agent in its own process, share the subjects: on the
    # enrolment right they are alike, and a descriptor per photo keeps one core busy per desk.
    work: dict[str, list[dict[str, Any]]] = {d: [] for d in DESKS}
    drawn: list[Path] = []
    rng = np.random.default_rng(ctx.opts.seed + 8)
    accept = _desk_finds_a_face() if ctx.opts.enrol_as_seen > 0 else None
    for i, (subject, images) in enumerate(scenario.enrolled.items()):
        desk = DESKS[i % len(DESKS)]
        folder = link_folder(images, ctx.out / "enrol" / subject)
        if accept is not None:
            drawn += redraw_as_seen(folder, ctx.opts.enrol_as_seen, rng, accept)
        cfg = edge(desk, "grpc", str(folder), soft=False)
        work[desk].append({"subject": subject, "config": cfg.model_dump(mode="json"), "source": str(folder),
                           "count": len(images)})  # fmt: skip
    jobs = [ctx.device_job(d, "desk", {"subjects": w}) for d, w in work.items() if w]
    # A few seconds a subject (a descriptor per photo): a line for each, not a silent minute.
    with Progress("    subjects enrolled", len(scenario.enrolled), heartbeat=HEARTBEAT_S) as bar:
        bar.update(0)
        try:
            result = run_devices(jobs, lambda _kind, _device, _subject: bar.advance())
        finally:
            for f in drawn:  # drawn for this run's enrolment only: the desks' releases are what stays
                f.unlink(missing_ok=True)
    failed = [f"{d}: {r['error']}" for d, r in result.items() if not r["ok"]]
    if failed:
        raise RuntimeError("enrolment desk failed: " + "; ".join(failed))
    n = sum(len(v) for v in scenario.enrolled.values())
    seen = f", {len(drawn)} of the photos drawn as the scenes' camera sees a face" if drawn else ""
    ctx.say(f"    {len(scenario.enrolled)} subjects, {n} enrolment templates (one per photo{seen}) at {len(jobs)} "
            "desks")  # fmt: skip


def _desk_finds_a_face() -> Any:
    """Whether the desks' detector (the edge defaults, as the photos were chosen) finds a face in an image."""
    from peep.core.imaging import primary_face
    from peep.edge.config import DetectorConfig
    from peep.edge.detection import build_detector

    detector = build_detector(DetectorConfig())
    return lambda img: primary_face(detector.detect(img), img.shape) is not None


def enrol_background(
    ctx: RunContext, server: DemoServer, bundle: ProjectionBundle, faces: Any, site_key: Any | None
) -> None:
    """Enrol up to ``--background-templates`` of the public background ``faces``, one subject per person.

    The deployer's public background faces are released exactly as a device would release them (same
    bundle, mechanism, site key and secure sampler) and enrolled by the administrator: they teach the
    recogniser "unknown".
    """
    o = ctx.opts
    releaser = TemplateReleaser(bundle, kind=o.mechanism, epsilon=o.epsilon, delta=o.delta, site_key=site_key)
    take = np.random.default_rng(o.seed + 3).permutation(faces.n_images)[: o.background_templates]
    faces = faces.subset(np.isin(np.arange(faces.n_images), take))
    values = releaser.release(faces.inputs(bundle.input_kind))
    groups: dict[str, list[Any]] = {}
    for i, (row, label) in enumerate(zip(values, faces.labels, strict=True)):
        # One background subject per person: validation holds out whole people, and pairs of one
        # person's templates calibrate the threshold of a decision fused from a track's two releases.
        subject = f"background:{int(label)}"
        groups.setdefault(subject, []).append(
            wire.make_template(row, device_id="desk-1", site=ctx.site, bundle_id=bundle.bundle_id,
                               mechanism=releaser.description, purpose="enroll", subject=subject, track_id=f"bg{i}",
                               key_id=releaser.key_id)
        )  # fmt: skip
    for subject, msgs in groups.items():
        server.recognition.EnrolSubject(
            recognition_pb2.EnrolSubjectRequest(subject=subject, templates=msgs), metadata=server.admin_md, timeout=60
        )
    ctx.say(f"    {len(values)} background templates of {len(groups)} people")


def train(ctx: RunContext, server: DemoServer) -> dict[str, Any]:
    """Train the server's model on the enrolled templates; returns the summary's ``model``."""
    rec, md = server.recognition, server.admin_md
    resp = rec.Train(recognition_pb2.TrainRequest(), metadata=md, timeout=600)
    status = rec.GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=md, timeout=10)
    ctx.say(f"    model {resp.model_version}: {resp.n_templates} templates, {resp.n_subjects} classes, "
            f"validation accuracy {resp.validation_accuracy:.3f}")  # fmt: skip
    return {
        "model_version": resp.model_version,
        "n_templates": resp.n_templates,
        "n_subjects": resp.n_subjects,
        "validation_accuracy": resp.validation_accuracy,
        "unknown_threshold": status.unknown_threshold,
        "verify_threshold": status.verify_threshold,
    }
