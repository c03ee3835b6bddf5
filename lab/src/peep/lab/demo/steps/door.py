"""The demo's door step: badge claims at a door, each decided on the best face, the lock a mock GPIO pin."""

from __future__ import annotations

import json
from typing import Any

from peep.lab.demo.scenario import CameraScript
from peep.lab.demo.steps.context import DOOR, RunContext
from peep.lab.demo.steps.edge import EdgeConfigs
from peep.lab.demo.summary import door_epsilon, door_summary


def door_claims(ctx: RunContext, edge: EdgeConfigs, script: CameraScript) -> dict[str, Any]:
    """The door's claims through the real door path in a device process; the summary's ``door``.

    Every held-out photo in ``script`` is shown at the door twice, with the person's own badge and with
    another subject's; the rows are written to ``<out>/door.json``.

    Raises
    ------
    RuntimeError
        When the door's process stopped.
    """
    from peep.edge.config import DetectorConfig, DoorConfig
    from peep.lab.demo.devices import run_devices
    from peep.lab.demo.steps.scenes import find_yunet

    cfg = edge(DOOR, "grpc", str(script.video), soft=False)
    # The demo shows each subject's badge about a dozen times in twenty seconds, half of them by impostors:
    # traffic a real door sees over weeks. The lock-out is set above it, so the figures are the door's
    # verification; the summary says what the default lock-out would have refused (replayed on the
    # outcomes), and a fail-secure check runs the lock-out itself. The lock opens for 50 ms, shorter
    # than a claim, so every opening shows on the pin.
    per_subject: dict[str, int] = {}
    for a in script.appearances:
        per_subject[str(a.claim)] = per_subject.get(str(a.claim), 0) + 1
    # Likewise its throttle and hourly budgets: weeks of claims in twenty seconds would pass the defaults
    # (ten claims a minute, ε 1,600 an hour, 96 per subject); the ε the door spent is in the summary.
    door = DoorConfig(enabled=True, lock="gpio", decision="device" if ctx.opts.decide == "device" else "grpc",
                      open_s=0.05, decision_timeout_s=5.0,
                      lockout_failures=max(per_subject.values(), default=0) + 1, max_claims_per_minute=600,
                      epsilon_per_hour=1e7, subject_epsilon_per_hour=1e7)  # fmt: skip
    # A door's camera runs the detector a deployer would mount there: YuNet where its file is (the default
    # ``auto`` finds it once fetched). The default Haar at 320 px missed a face in about one genuine claim
    # in twenty, each a locked-out resident; the cameras keep the defaults a fresh install has.
    yunet = find_yunet(ctx.opts.data_home)
    update: dict[str, Any] = {"door": door}
    if yunet is not None:
        update["detector"] = DetectorConfig(kind="yunet", model_path=yunet)
    cfg = cfg.model_copy(update=update)
    claims = [{"subject": a.claim, "genuine": a.claim == a.person, "start": a.start, "stop": a.stop}
              for a in script.appearances]  # fmt: skip
    work = {"config": cfg.model_dump(mode="json"), "video": str(script.video), "claims": claims}
    result = run_devices([ctx.device_job(DOOR, "door", work)], lambda *_: None)[DOOR]
    if not result["ok"]:
        raise RuntimeError(f"the door failed: {result['error']}")
    rows = result["claims"]
    (ctx.out / "door.json").write_text(json.dumps(rows, indent=1) + "\n")
    summary = door_summary(rows, result["fail_secure"], pin_openings=result["pin_openings"],
                           lockout=(DoorConfig().lockout_failures, DoorConfig().lockout_window_s))  # fmt: skip
    summary["epsilon"] = door_epsilon(ctx.out / "devices" / DOOR)
    summary["decided_on"] = ctx.opts.decide
    summary["detector"] = cfg.detector.kind
    ctx.say(f"    {summary['genuine_opened']} of {summary['genuine']} genuine claims opened, "
            f"{summary['impostor_opened']} of {summary['impostor']} impostor claims; face to lock p95 "
            f"{summary['p95_ms']:.0f} ms; {summary['fail_secure_checks']} of {summary['fail_secure_run']} "
            "fail-secure checks held")  # fmt: skip
    return summary
