"""What a device says about itself: its report to the server, and its summary at start.

:func:`device_report` is the bounded :class:`~peep.core.reports.DeviceReport` the server's Devices and Privacy
views show (counts and ε, never a face), published by the agent over MQTT or sent by its gRPC forwarder.
:func:`device_summary` is what the agent will do with its configuration and bundle, logged at start and printed by
``peep-edge run --validate-config``. Both read the agent's parts and change nothing.
"""

from __future__ import annotations

import time
from typing import Any

from peep.core.accounting import ReleaseCost
from peep.core.release import TemplateReleaser
from peep.core.reports import DECISION_KEYS, MAX_REASONS, DeviceReport
from peep.edge.config import EdgeConfig
from peep.edge.ledger import SqliteLedger
from peep.edge.pipeline import FramePipeline


def device_report(
    cfg: EdgeConfig,
    cost: ReleaseCost,
    releaser: TemplateReleaser,
    *,
    ledger: SqliteLedger | None,
    pipeline: FramePipeline | None,
    decisions: Any,
    insecure_broker: bool,
) -> DeviceReport:
    """The device's report: what one release costs under ``releaser``'s bundle, what ``ledger`` holds spent, what
    ``pipeline``'s policy suppressed and, deciding on the device, the model ``decisions`` holds."""
    p = cfg.privacy
    vec, _, n = ledger.lifetime() if ledger is not None else (0.0, 0.0, 0)
    suppressed = dict(pipeline.policy.suppressed) if pipeline is not None else {}
    return DeviceReport(
        at=round(time.time(), 3),
        bundle_id=releaser.bundle_id,
        mechanism=p.mechanism,
        epsilon_vector=float(cost.epsilon_vector),
        epsilon_coordinate=float(cost.epsilon_coordinate),
        # Deciding on the device, what a camera releases per track window is the label alone (a door in
        # decision mode releases nothing of the face).
        epsilon_vector_per_release=_release_epsilon(cfg, float(cost.total_vector)),
        track_budget_vector=p.track_budget,
        device_budget_vector=p.device_budget,
        releases=int(n),
        epsilon_vector_spent=float(vec),
        suppressed={str(k): int(v) for k, v in sorted(suppressed.items())[:MAX_REASONS]},
        insecure_broker=insecure_broker,
        decision=_decision_report(decisions),
    )


def _release_epsilon(cfg: EdgeConfig, template: float) -> float:
    r = cfg.recognition
    if r.decide == "device":
        return float(r.epsilon_label)
    if cfg.door.enabled and cfg.door.decision == "device":
        return 0.0
    return template


def _decision_report(decisions: Any) -> dict[str, Any] | None:
    if decisions is None:
        return None
    d = decisions.describe()
    return {k: d.get(k) for k in DECISION_KEYS}


def device_summary(cfg: EdgeConfig, cost: ReleaseCost, releaser: TemplateReleaser) -> dict[str, Any]:
    """What the agent will do: its device, its bundle and mechanism, what a release costs, its budgets."""
    p = cfg.privacy
    return {
        "device": cfg.device.id,
        "site": cfg.device.site,
        "bundle_id": releaser.bundle_id,
        "n_components": releaser.n_components,
        "mechanism": p.mechanism,
        "epsilon": p.epsilon,
        "delta": p.delta,
        "epsilon_coordinate": cost.epsilon_coordinate,
        "epsilon_vector": cost.epsilon_vector,
        "soft_epsilon": cost.soft_epsilon,
        "track_budget_epsilon_vector": p.track_budget,
        "releases_per_track_max": cost.releases_within(p.track_budget),
        "releases_per_window": p.releases_per_window,
        "window_seconds": p.window_seconds,
        "secure_sampler": bool(releaser.mechanism.is_secure),
        "transports": [n for n, on in (("mqtt", cfg.mqtt.enabled), ("grpc", cfg.grpc.enabled)) if on],
    }
