"""What ``peep demo`` reports: the door's outcome (its claims, the lock-out replayed on them, its ε from its
own ledger), the devices' ledger totals, and the printed summary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from peep.lab.demo.logfile import log_line


def door_summary(
    rows: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    *,
    pin_openings: int,
    lockout: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """The summary's ``door`` from the door's claims and fail-secure checks (:func:`peep.lab.demo.devices.run_door`).

    ``p50_ms``/``p95_ms``/``worst_ms``: from the chosen face to the lock (its release, the server's Verify over
    TLS, driving the pin), over the claims that reached the server; the time spent looking for the best face
    is ``face_search_p50_ms``. ``lockout`` (failures, window seconds): a lock-out replayed on the claims in
    order, ``lockout_would_refuse`` counting the genuine and impostor claims it would have refused (the demo's
    claims come seconds apart; see ``Demo._door``).
    """
    genuine = [r for r in rows if r["genuine"]]
    impostor = [r for r in rows if not r["genuine"]]
    lat = np.array([r["face_to_lock_ms"] for r in rows if r["face_to_lock_ms"] is not None], dtype=float)
    search = np.array([r["stages_ms"].get("capture", 0.0) + r["stages_ms"].get("detect", 0.0) for r in rows])
    refusals: dict[str, int] = {}
    for r in rows:
        if not r["opened"]:
            refusals[r["reason"]] = refusals.get(r["reason"], 0) + 1

    def q(a: np.ndarray, p: float) -> float | None:
        return float(np.percentile(a, p)) if a.size else None

    replayed: dict[str, Any] = {}
    if lockout is not None:
        replayed = {"lockout_would_refuse": _lockout_replay(rows, *lockout), "lockout_replayed": list(lockout)}

    return {
        "genuine": len(genuine),
        "genuine_opened": sum(bool(r["opened"]) for r in genuine),
        "impostor": len(impostor),
        "impostor_opened": sum(bool(r["opened"]) for r in impostor),
        "p50_ms": q(lat, 50),
        "p95_ms": q(lat, 95),
        "worst_ms": float(lat.max()) if lat.size else None,
        "face_search_p50_ms": q(search, 50),
        "fail_secure_checks": sum(bool(c["held"]) for c in checks),
        "fail_secure_run": len(checks),
        "fail_secure_failed": [c["check"] for c in checks if not c["held"]],
        "refusals": refusals,
        # Driven by the mock GPIO pin's own record: equal to the openings above, or the door misbehaved.
        "pin_openings": pin_openings,
        **replayed,
    }


def _lockout_replay(rows: list[dict[str, Any]], failures: int, window_s: float) -> dict[str, int]:
    """How many genuine and impostor claims a lock-out of ``failures`` in ``window_s`` would have refused.

    The claims in the order they were made (each row's ``claim_to_lock`` stage spaced them; the demo's
    whole door run is shorter than any sensible window, so every earlier failure counts), with the door's
    rule: a refused claim counts, an opening clears the subject's count, a locked-out claim is not made.
    """
    streak: dict[str, int] = {}
    refused = {"genuine": 0, "impostor": 0}
    for r in rows:
        s = r["subject"]
        if streak.get(s, 0) >= failures:
            refused["genuine" if r["genuine"] else "impostor"] += 1
            continue
        if r["opened"]:
            streak.pop(s, None)
        elif r["reason"] != "locked_out":
            streak[s] = streak.get(s, 0) + 1
    return refused


def door_epsilon(state_dir: Path) -> dict[str, Any]:
    """What a door's ledger recorded (``door:<nonce>`` keys): a release per claim that found a face, including the
    fail-secure checks that release one."""
    from peep.edge.ledger import SqliteLedger

    path = state_dir / "ledger.sqlite3"
    spends = []
    if path.is_file():
        ledger = SqliteLedger(path)
        try:
            spends = [e for e in ledger.entries() if e.key.startswith("door:")]
        finally:
            ledger.close()
    return {
        "releases": len(spends),
        "epsilon_vector_spent": sum(e.epsilon for e in spends),
        "epsilon_coordinate_per_release": max((e.epsilon_coordinate for e in spends), default=0.0),
        "epsilon_vector_per_release": max((e.epsilon for e in spends), default=0.0),
    }


def stranger_keys(releases: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["device"], mid) for mid, r in releases.items() if r["person"] is not None and not r["enrolled"]]


def ledger_totals(state_dir: Path) -> dict[str, float]:
    """Per-vector ε a device's persistent ledger recorded (total and the largest track)."""
    from peep.edge.ledger import SqliteLedger

    path = state_dir / "ledger.sqlite3"
    if not path.is_file():
        return {"epsilon_vector": 0.0, "max_per_track": 0.0}
    ledger = SqliteLedger(path)
    try:
        per_key: dict[str, float] = {}
        for spend in ledger.entries():
            per_key[spend.key] = per_key.get(spend.key, 0.0) + spend.epsilon
    finally:
        ledger.close()
    tracks = [v for k, v in per_key.items() if k.startswith("track:")]
    device = [v for k, v in per_key.items() if k.startswith("device:")]
    return {
        "epsilon_vector": sum(device) if device else sum(tracks),
        "max_per_track": max(tracks) if tracks else 0.0,
    }


def _door_lines(door: dict[str, Any] | None) -> list[str]:
    if not door:
        return []

    def frac(n: int, d: int) -> str:
        return f"{n} of {d}" + (f" ({100 * n / d:.1f} %)" if d else "")

    failed = door.get("fail_secure_failed") or []
    p50, p95 = door.get("p50_ms"), door.get("p95_ms")
    lines = [
        f"  door                genuine claims opened {frac(door['genuine_opened'], door['genuine'])}, impostor "
        f"claims opened {frac(door['impostor_opened'], door['impostor'])}; face to lock p50 "
        f"{p50 if p50 is None else round(p50)} ms, p95 {p95 if p95 is None else round(p95)} ms; fail-secure "
        f"checks held {door['fail_secure_checks']} of {door.get('fail_secure_run', door['fail_secure_checks'])}"
        + (f" — FAILED: {', '.join(failed)}" if failed else ""),
    ]
    eps = door.get("epsilon")
    if door.get("decided_on") == "device":
        lines.append("                      decided on the door with the server's signed model: no template left "
                     "it; its access records were spooled and sent")  # fmt: skip
    elif eps:
        lines.append(
            f"                      ε spent at the door: {eps['releases']} releases (each claim that found a face; "
            "the fail-secure checks release nothing), "
            f"ε per vector {eps['epsilon_vector_per_release']:g} and per coordinate "
            f"{eps['epsilon_coordinate_per_release']:g} each, {eps['epsilon_vector_spent']:,.0f} per vector in all"
        )
    lw = door.get("lockout_would_refuse")
    if lw:
        lines.append(
            f"                      the default lock-out ({door['lockout_replayed'][0]} failures) on these claims, "
            f"seconds apart, would have refused {lw['genuine']} genuine and {lw['impostor']} impostor claims"
        )
    return lines


def _decided_on(ident: dict[str, Any]) -> str:
    """Where identification was decided and what one appearance cost its person (per vector)."""
    per = ident.get("epsilon_per_appearance") or {}
    cost = (f"; ε per appearance {per['mean']:.3g} (max {per['max']:.3g}, {per['appearances']} appearances)"
            if per.get("mean") is not None else "")  # fmt: skip
    if ident.get("decided_on") == "device":
        return (f"the devices: the server's signed model on each camera's clean projection, a label released by "
                f"k-ary randomized response at ε {ident.get('epsilon_label', 0):g}, no template{cost}")  # fmt: skip
    return f"the server, on one perturbed template per appearance{cost}"


def _verification_lines(ver: dict[str, Any], every: dict[str, Any], pct: Any) -> list[str]:
    if ver.get("skipped"):
        return [f"  verification        skipped: {ver['skipped']}"]
    return [
        f"  verification        face alone: GAR {pct(ver['face']['gar'])}, FAR {pct(ver['face']['far'])}; "
        f"fused with soft traits: GAR {pct(ver['fused']['gar'])}, FAR {pct(ver['fused']['far'])} "
        f"({ver['claims']} claims); face alone against every other subject: FAR {pct(every.get('far'))} of "
        f"{every.get('claims', 0)} impostor claims"
    ]


def _scene_lines(sc: dict[str, Any] | None, pct: Any) -> list[str]:
    """The cameras on scenes (``--scenes``): detection recall and passes judged, per face-height bin."""
    if not sc:
        return []
    det = sc["detection"]
    recall = ", ".join(f"{k} px {pct(v)}" for k, v in det["recall"].items() if det["faces"].get(k))
    up = sc[next(k for k in sc if k.startswith("face_") and k.endswith("_px_up"))]
    bins = "; ".join(
        f"{k} px: {c['identified']}/{c['enrolled_passes']} identified, {c['strangers_named']}/{c['stranger_passes']} "
        "strangers named"
        for k, c in sc["per_bin"].items()
        if c["enrolled_passes"] or c["stranger_passes"]
    )
    return [
        f"  scenes              {sc['passes']} passes ({sc['never_half_visible']} never half visible), "
        f"{det['frames']} frames; detector {sc['detector']['kind']}: recall {recall}, "
        f"{det['false_per_1000_frames']:.1f} false per 1,000 frames",
        f"  passes, face >= {sc['target']['face_px']:g} px  identified {pct(up['identified_rate'])} of "
        f"{up['enrolled_passes']} enrolled (not decided {up['enrolled_not_decided']}, misnamed "
        f"{up['enrolled_misnamed']}); strangers named {pct(up['strangers_named_rate'])} of {up['stranger_passes']}",
        f"  passes by face      {bins}",
    ]


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The human summary printed at the end."""
    p, ident, ver, edge = s["privacy"], s["identification"], s["verification"], s["edge"]
    every = ver.get("face_every_impostor", {})

    def pct(v: float | None) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f} %"

    steps = ", ".join(f"{k.split(' (')[0]}: {v:.0f}s" for k, v in s["steps_s"].items())
    kept = s.get("kept", {})
    kt = s.get("kept_templates", {"enrolment": 0, "background": 0, "recognised": 0, "strangers": 0})
    eps_dev = ", ".join(
        f"{d}: {v['epsilon_vector_spent']:,.0f} ({v['releases']} releases, {v['transport']})"
        for d, v in edge["devices"].items()
    )
    return [
        "",
        "PEEP demo summary",
        f"  mechanism           {p['mechanism']}, ε = {p['epsilon_parameter']:g}: "
        f"ε per coordinate {p['epsilon_coordinate']:,.4g}, ε per vector {p['epsilon_vector']:,.4g}"
        + (f", δ = {p['delta']:g}" if p["delta"] else "")
        + (
            f"; site key {p['site_key_id']} (the server holds its id only)" if p.get("site_key_id") else "; no site key"
        ),
        f"  bundle              {s['bundle'].get('projection', 'eigenfaces')}, nc = {s['bundle']['n_components']}"
        + (
            f", fitted on {s['bundle']['public_faces']} public faces of {s['bundle']['public_people']} people"
            if s["bundle"].get("public_faces")
            else ""
        ),
        f"  decided on          {_decided_on(ident)}",
        *(
            [
                f"  thresholds set on   {s['data']['calibration_people']} public people the model never saw "
                f"({s['data']['calibration_population']}; a camera names "
                f"{s['data'].get('device_fpir', 0.01) * 100:.1f} % of them)"
            ]
            if s.get("data", {}).get("calibration_population")
            else []
        ),
        f"  identification      {pct(ident['accuracy'])} of {ident['enrolled_templates']} captures of enrolled people "
        f"(called unknown: {pct(ident['enrolled_called_unknown'])}; "
        f"{ident.get('fused_decisions', 0)} decisions fused with their track's previous release)",
        f"  unknown rejection   {pct(ident['unknown_rejection_rate'])} of {ident['stranger_templates']} "
        "captures of never-enrolled people",
        f"  as FRVT judges 1:N  FNIR {pct(ident.get('fnir'))}, FPIR {pct(ident.get('fpir'))}"
        + "".join(f"; {d} {pct(c['fnir'])} / {pct(c['fpir'])}" for d, c in ident.get("per_camera", {}).items()),
        *_scene_lines(s.get("scenes"), pct),
        *_verification_lines(ver, every, pct),
        *_door_lines(s.get("door")),
        f"  ε spent per device  (per vector) {eps_dev}",
        f"  kept by the server  templates: enrolment {kt['enrolment']}, background {kt['background']}, "
        f"recognised {kt['recognised']}, strangers {kt['strangers']} (recognition.keep = {kept.get('keep', '?')}); "
        f"{kept.get('decisions', 0)} decisions ({kept.get('unknown_decisions', 0)} unknown), "
        f"{kept.get('ledger_entries', 0)} ledger entries (message ids and times, no template)",
        *(
            [
                f"  QBBS                ε {ver['qbbs_epsilon_per_answer']:g} per answer; per subject max "
                f"{max(ver['qbbs_epsilon_per_subject'].values(), default=0):g} (odometer); fused threshold "
                f"{ver['fused_threshold']:.3g} (calibrated for 1 % FAR on simulated public-population impostors)"
            ]
            if ver.get("fused_threshold") is not None
            else []
        ),
        f"  throughput          {edge['templates']} templates from {edge['frames']} frames in "
        f"{edge['edge_seconds']:.1f} s ({edge['templates_per_s']:.1f} templates/s, "
        f"{edge['frames_per_s']:.0f} frames/s over {len(edge['devices'])} agents)",
        f"  model               {s['model']['model_version']}: {s['model']['n_templates']} templates, "
        f"validation accuracy {s['model']['validation_accuracy']:.3f}",
        f"  wall time           {s['wall_s']:.0f} s ({steps})",
        *([log_line(s["log"])] if "log" in s else []),
    ]


def identification_per_camera(releases: dict[str, dict[str, Any]], events: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """FNIR and FPIR of each camera's releases (the summary's pooled figures, split by device)."""
    per: dict[str, dict[str, Any]] = {}
    for mid, r in releases.items():
        ev = events.get(mid)
        if ev is None or r["person"] is None:
            continue
        c = per.setdefault(r["device"], {"enrolled": 0, "named": 0, "strangers": 0, "strangers_named": 0})
        if r["enrolled"]:
            c["enrolled"] += 1
            c["named"] += int((not ev.unknown) and ev.subject == r["person"])
        else:
            c["strangers"] += 1
            c["strangers_named"] += int(not ev.unknown)
    for c in per.values():
        c["fnir"] = 1.0 - c["named"] / c["enrolled"] if c["enrolled"] else None
        c["fpir"] = c["strangers_named"] / c["strangers"] if c["strangers"] else None
    return dict(sorted(per.items()))


def epsilon_per_appearance(releases: dict[str, dict[str, Any]], devices: list[str], out: Path) -> dict[str, Any]:
    """Per-vector ε each appearance cost its person at the cameras: the sum over its releases, from the
    devices' own ledgers (a release's entry carries its message id)."""
    from peep.edge.ledger import SqliteLedger

    cost: dict[str, float] = {}
    for device in devices:
        path = out / "devices" / device / "ledger.sqlite3"
        if not path.exists():
            continue
        ledger = SqliteLedger(path)
        try:
            for e in ledger.entries():
                if e.key.startswith("track:") and e.message_id:
                    cost[e.message_id] = cost.get(e.message_id, 0.0) + float(e.epsilon)
        finally:
            ledger.close()
    per: dict[tuple[str, str], float] = {}
    for mid, r in releases.items():
        key = (r["device"], str(r["track"]))
        per[key] = per.get(key, 0.0) + cost.get(mid, 0.0)
    values = sorted(per.values())
    return {
        "appearances": len(values),
        "mean": float(sum(values) / len(values)) if values else None,
        "max": values[-1] if values else None,
        "per_release": sorted({round(v, 6) for v in cost.values()}),
    }
