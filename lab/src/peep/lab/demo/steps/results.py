"""The demo's results: the summary (``summary.json``) from the steps' outputs and the server's database."""

from __future__ import annotations

from typing import Any

from peep.core.release import TemplateReleaser
from peep.lab.demo.scenario import CameraScript, Scenario
from peep.lab.demo.steps.bundle import FittedBundle, Keys
from peep.lab.demo.steps.context import RunContext
from peep.lab.demo.summary import epsilon_per_appearance, identification_per_camera, stranger_keys


def kept_in_store(app: Any, releases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the server's database keeps after the run, counted there (``recognition.keep``, default none).

    ``strangers`` counts the stored templates of the never-enrolled people the cameras released (their
    message ids are known here, not to the server): 0 unless ``keep = "all"``.
    """
    services = app.services
    counts = services.store.kept_counts(services.config.training.background_prefix)
    strangers = sum(services.store.get_template(mid, device_id=dev) is not None for dev, mid in stranger_keys(releases))
    return {
        "templates": {
            "enrolment": counts.enrolment,
            "background": counts.background,
            "recognised": counts.recognised,
            "strangers": strangers,
        },
        "keep": services.config.recognition.keep,
        "unknown_identify_verify_templates": counts.unknown,
        "decisions": counts.decisions,
        "unknown_decisions": counts.unknown_decisions,
        "ledger_entries": counts.ledger,
        "track_memory": counts.track_memory,
    }


def identification(
    ctx: RunContext, releases: dict[str, dict[str, Any]], events: dict[str, Any], scripts: list[CameraScript]
) -> dict[str, Any]:
    """The summary's ``identification``: each release's event judged against who was in front of the camera."""
    o = ctx.opts
    enrolled_hits = enrolled_n = enrolled_unknown = 0
    strangers_unknown = strangers_n = 0
    fused = 0
    for mid, r in releases.items():
        ev = events.get(mid)
        if ev is None or r["person"] is None:
            continue
        fused += int(ev.releases_fused > 1)
        if r["enrolled"]:
            enrolled_n += 1
            enrolled_hits += int((not ev.unknown) and ev.subject == r["person"])
            enrolled_unknown += int(ev.unknown)
        else:
            strangers_n += 1
            strangers_unknown += int(ev.unknown)
    return {
        "accuracy": enrolled_hits / enrolled_n if enrolled_n else None,
        "enrolled_templates": enrolled_n,
        "enrolled_called_unknown": enrolled_unknown / enrolled_n if enrolled_n else None,
        "unknown_rejection_rate": strangers_unknown / strangers_n if strangers_n else None,
        "stranger_templates": strangers_n,
        "appearances": sum(len(s.appearances) for s in scripts),
        # Decisions fused with the same track's previous release (training.track_fusion_s).
        "fused_decisions": fused,
        # Judged as NIST's FRVT judges 1:N: enrolled captures not named as themselves, strangers named.
        "decided_on": o.decide,
        "fnir": 1.0 - enrolled_hits / enrolled_n if enrolled_n else None,
        "fpir": 1.0 - strangers_unknown / strangers_n if strangers_n else None,
        "epsilon_per_appearance": epsilon_per_appearance(releases, [s.device_id for s in scripts], ctx.out),
        "per_camera": identification_per_camera(releases, events),
        **({"epsilon_label": o.epsilon_label} if o.decide == "device" else {}),
    }


def summarise(
    ctx: RunContext,
    *,
    scenario: Scenario,
    fitted: FittedBundle,
    keys: Keys,
    model: dict[str, Any],
    scripts: list[CameraScript],
    releases: dict[str, dict[str, Any]],
    events: dict[str, Any],
    edge: dict[str, Any],
    verification: dict[str, Any],
    kept: dict[str, Any],
    steps_s: dict[str, float],
    steps_cpu_s: dict[str, float],
    wall_s: float,
    scene_judgement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's summary from what its steps returned.

    ``steps_s`` and ``steps_cpu_s`` are the step timer's own dicts: a step timed after this call (the
    console's) still shows in them. ``scene_judgement``: the cameras' passes judged on their scenes
    (``--scenes``, :func:`peep.lab.demo.steps.scenes.scene_summary`).
    """
    o, bundle = ctx.opts, fitted.bundle
    ident = identification(ctx, releases, events, scripts)
    scenes = {"scenes": scene_judgement} if scene_judgement is not None else {}
    g = TemplateReleaser(bundle, kind=o.mechanism, epsilon=o.epsilon, delta=o.delta).mechanism.guarantee
    return {
        "data": {
            "subjects": len(scenario.enrolled),
            "enrolment_images": sum(len(v) for v in scenario.enrolled.values()),
            "probe_appearances": sum(1 for s in scripts for a in s.appearances if a.enrolled),
            "stranger_appearances": sum(1 for s in scripts for a in s.appearances if not a.enrolled),
            "background_people": len(scenario.background),
            # The share of each subject's enrolment photos drawn as the scenes' camera sees a face.
            "enrolment_as_seen": o.enrol_as_seen,
            # Who set the devices' thresholds (--decide device): "lfw_singles" or the "lfw" fallback.
            **(
                {
                    "calibration_population": fitted.calibration_population.name,
                    "calibration_people": len(fitted.calibration_population.people),
                    "calibration_views": fitted.calibration_population.views or "photos",
                    "device_fpir": o.device_fpir,
                }
                if fitted.calibration_population is not None and fitted.calibration_population.name
                else {}
            ),
            "soft_traits": "age and gender: estimated from photos (enrolment) and released on-device with LDP "
            "(observation); height and weight: SYNTHETIC (NHANES-based draws), labelled as such",
        },
        "bundle": {
            "bundle_id": bundle.bundle_id,
            "projection": bundle.projection_kind,
            "n_components": bundle.n_components,
            # What it was fitted on (the demo's public faces: never an enrolled person or a stranger).
            "public_faces": fitted.public_faces[0],
            "public_people": fitted.public_faces[1],
        },
        "privacy": {
            "mechanism": o.mechanism,
            "epsilon_parameter": o.epsilon,
            "epsilon_coordinate": g.epsilon_coordinate,
            "epsilon_vector": g.epsilon_vector,
            "delta": g.delta,
            "sampler": "secure (OS CSPRNG, discrete Laplace/Gaussian on a 2^-20-scale grid)",
            "soft_traits_epsilon_per_release": 2.0 if o.soft else 0.0,
            "per_track_budget_epsilon_vector": 2.0 * (g.epsilon_vector + (2.0 if o.soft else 0.0)),
            "note": "per-vector ε above a few units is not a meaningful guarantee; see docs/AUDIT.md",
            # Every template rotated by this run's site key before the noise (same ε and δ); "" = unkeyed.
            "site_key_id": keys.site_key.key_id if keys.site_key else "",
        },
        "model": model,
        "identification": ident,
        **scenes,
        "verification": {k: v for k, v in verification.items() if k != "rows"},
        "kept_templates": kept["templates"],
        "kept": kept,
        "edge": edge,
        "mqtt": ctx.use_mqtt,
        "site": ctx.site,
        "steps_s": steps_s,
        "steps_cpu_s": steps_cpu_s,
        "wall_s": round(wall_s, 1),
    }
