"""The demo's self-contained HTML report (plots embedded as PNG data URIs)."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _identification_plot(releases: dict[str, dict[str, Any]], events: dict[str, Any]) -> str:
    people: dict[str, dict[str, int]] = {}
    strangers = {"unknown": 0, "misidentified": 0}
    for mid, r in releases.items():
        ev = events.get(mid)
        if ev is None or r["person"] is None:
            continue
        if r["enrolled"]:
            c = people.setdefault(r["person"], {"correct": 0, "wrong person": 0, "unknown": 0})
            if ev.unknown:
                c["unknown"] += 1
            elif ev.subject == r["person"]:
                c["correct"] += 1
            else:
                c["wrong person"] += 1
        else:
            strangers["unknown" if ev.unknown else "misidentified"] += 1
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 1]})
    names = sorted(people)
    bottom = [0] * len(names)
    for label, colour in (("correct", "#2a9d8f"), ("wrong person", "#e76f51"), ("unknown", "#adb5bd")):
        vals = [people[n][label] for n in names]
        ax1.bar([n.replace("_", " ") for n in names], vals, bottom=bottom, label=label, color=colour)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax1.set_ylabel("captures")
    ax1.set_title("Enrolled people: what the server answered")
    ax1.tick_params(axis="x", rotation=45, labelsize=8)
    ax1.legend(fontsize=8, loc="upper right")
    ax2.bar(
        ["unknown", "misidentified"], [strangers["unknown"], strangers["misidentified"]], color=["#2a9d8f", "#e76f51"]
    )
    ax2.set_title("Never-enrolled people")
    return _png(fig)


def _probability_plot(releases: dict[str, dict[str, Any]], events: dict[str, Any], threshold: float | None) -> str:
    enrolled = [events[m].probability for m, r in releases.items() if m in events and r["enrolled"]]
    strangers = [events[m].probability for m, r in releases.items() if m in events and r["enrolled"] is False]
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    bins = [i / 20 for i in range(21)]
    ax.hist(enrolled, bins=bins, alpha=0.7, label="enrolled people", color="#264653")
    ax.hist(strangers, bins=bins, alpha=0.7, label="never enrolled", color="#e9c46a")
    if threshold:
        ax.axvline(threshold, color="k", ls="--", lw=1, label="unknown threshold")
    ax.set_xlabel("probability of the best candidate")
    ax.set_ylabel("captures")
    ax.legend(fontsize=8, loc="upper center")
    return _png(fig)


def _epsilon_plot(summary: dict[str, Any]) -> str:
    devs = summary["edge"]["devices"]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    names = list(devs)
    ax.bar(names, [devs[d]["epsilon_vector_spent"] for d in names], color="#6d597a")
    for i, d in enumerate(names):
        ax.text(
            i, devs[d]["epsilon_vector_spent"], f"{devs[d]['releases']} releases", ha="center", va="bottom", fontsize=8
        )
    ax.set_ylabel("per-vector ε spent (sum over tracks)")
    p = summary["privacy"]
    ax.set_title(
        f"{p['mechanism']}: ε per release {p['epsilon_vector']:,.4g} per vector, "
        f"{p['epsilon_coordinate']:,.4g} per coordinate",
        fontsize=9,
    )
    return _png(fig)


def _verification_plot(rows: list[dict[str, Any]]) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    for ax, key, title in (
        (axes[0], "face_score", "Face score"),
        (axes[1], "fused_score", "Fused score (face + soft traits)"),
    ):
        g = [r[key] for r in rows if r["genuine"]]
        i = [r[key] for r in rows if not r["genuine"]]
        ax.hist(g, bins=20, alpha=0.7, label="genuine claims", color="#2a9d8f")
        ax.hist(i, bins=20, alpha=0.7, label="impostor claims", color="#e76f51")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper center")
    return _png(fig)


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}"
    "th{background:#f4f4f4}img{max-width:100%}"
    ".note{background:#fff8e1;border-left:4px solid #f0ad4e;padding:.6em 1em}"
)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _kept_text(summary: dict[str, Any]) -> str:
    kept, counts = summary.get("kept", {}), summary.get("kept_templates", {})
    numbers = " / ".join(str(counts.get(k, "n/a")) for k in ("enrolment", "background", "recognised", "strangers"))
    return f"{numbers} (recognition.keep = {kept.get('keep', 'n/a')}; decisions kept: {kept.get('decisions', 'n/a')})"


def _door_rows(door: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not door:
        return []

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0f} ms"

    return [
        ("Door: genuine claims opened", f"{door['genuine_opened']} of {door['genuine']}"),
        ("Door: impostor claims opened", f"{door['impostor_opened']} of {door['impostor']}"),
        (
            "Door: from the chosen face to the lock, p50 / p95 / worst",
            f"{ms(door['p50_ms'])} / {ms(door['p95_ms'])} / {ms(door.get('worst_ms'))}",
        ),
        ("Door: fail-secure checks held", f"{door['fail_secure_checks']} of {door.get('fail_secure_run', '?')}"),
        *(
            [
                (
                    "Door: ε spent (per vector, in all; per release per vector / per coordinate)",
                    f"{e['epsilon_vector_spent']:,.0f} over {e['releases']} releases; "
                    f"{e['epsilon_vector_per_release']:g} / {e['epsilon_coordinate_per_release']:g}",
                )
            ]
            if (e := door.get("epsilon"))
            else []
        ),
    ]


def _scenes_html(sc: dict[str, Any] | None, out: Path) -> str:
    """The cameras on scenes: passes judged per face-height bin, the detector's recall, annotated frames."""
    if not sc:
        return ""
    det = sc["detection"]
    head = "<tr><th>largest face of the pass</th><th>enrolled passes identified</th><th>not decided</th>" \
        "<th>misnamed</th><th>stranger passes named</th><th>detector recall (faces)</th></tr>"  # fmt: skip
    body = []
    for k, c in sc["per_bin"].items():
        rate = _pct(c["identified_rate"])
        srate = _pct(c["strangers_named_rate"])
        body.append(
            f"<tr><td>{html.escape(k)} px</td><td>{c['identified']} of {c['enrolled_passes']} ({rate})</td>"
            f"<td>{c['enrolled_not_decided']}</td><td>{c['enrolled_misnamed']}</td>"
            f"<td>{c['strangers_named']} of {c['stranger_passes']} ({srate})</td>"
            f"<td>{_pct(det['recall'].get(k))} of {det['faces'].get(k, 0)}</td></tr>"
        )
    frames = []
    for name in sc.get("frames", []):
        path = out / name
        if path.is_file():
            b64 = base64.b64encode(path.read_bytes()).decode()
            frames.append(f"<img alt='{html.escape(name)}' src='data:image/png;base64,{b64}'>")
    return (
        "<h2>What the cameras saw: scenes, judged per pass</h2>"
        f"<p>Each camera watched one rendered scene ({sc['passes']} passes in all; the detector "
        f"{html.escape(sc['detector']['kind'])}, {det['false_per_1000_frames']:.1f} false detections per 1,000 "
        "frames). A pass is one person crossing once; an enrolled person's pass is identified when its "
        "decisions named them and no one else, a stranger's is named when any decision named an enrolled "
        "person. Detector recall counts faces at least half visible, binned by each face's height in its frame; "
        "passes are binned by their largest face.</p>"
        f"<table>{head}{''.join(body)}</table>"
        "<p>Green: the ground truth's faces. Yellow: a released face whose decision was right; red: one that "
        "named the wrong person or a stranger. These frames are the lab's own rendered video; no device sent "
        "a pixel.</p>" + "".join(frames)
    )


def write_report(
    summary: dict[str, Any], releases: dict[str, dict[str, Any]], events: dict[str, Any], out: Path
) -> Path:
    """Write ``out/report.html``; returns its path."""
    rows = summary.get("verification_rows") or []
    if not rows and (out / "verification.json").is_file():
        rows = json.loads((out / "verification.json").read_text())
    ident, ver, p = summary["identification"], summary["verification"], summary["privacy"]
    images = [
        ("Identification", _identification_plot(releases, events)),
        ("Best-candidate probability", _probability_plot(releases, events, summary["model"].get("unknown_threshold"))),
        ("Privacy spent by each device", _epsilon_plot(summary)),
    ]
    if rows:
        images.append(("Verification scores", _verification_plot(rows)))
    table = [
        ("Mechanism", f"{p['mechanism']} (ε parameter {p['epsilon_parameter']:g}; secure sampler)"),
        (
            "ε per coordinate / per vector",
            f"{p['epsilon_coordinate']:,.4g} / {p['epsilon_vector']:,.4g}"
            + (f", δ = {p['delta']:g}" if p["delta"] else ""),
        ),
        ("Identification accuracy (enrolled captures)", f"{_pct(ident['accuracy'])} of {ident['enrolled_templates']}"),
        ("Enrolled captures called unknown", _pct(ident["enrolled_called_unknown"])),
        (
            "Unknown rejection (never-enrolled captures)",
            f"{_pct(ident['unknown_rejection_rate'])} of {ident['stranger_templates']}",
        ),
        ("Verification, face alone: GAR / FAR", f"{_pct(ver['face']['gar'])} / {_pct(ver['face']['far'])}"),
        (
            "Verification, face alone, every capture claimed as every other subject: FAR",
            f"{_pct(ver.get('face_every_impostor', {}).get('far'))} of "
            f"{ver.get('face_every_impostor', {}).get('claims', 0)} claims",
        ),
        (
            "Verification, fused with soft traits: GAR / FAR",
            f"{_pct(ver['fused']['gar'])} / {_pct(ver['fused']['far'])}",
        ),
        (
            "Templates released / per second",
            f"{summary['edge']['templates']} / {summary['edge']['templates_per_s']:.1f}",
        ),
        *_door_rows(summary.get("door")),
        ("Templates the server kept: enrolment / background / recognised / strangers", _kept_text(summary)),
        ("Wall time", f"{summary['wall_s']:.0f} s"),
    ]
    rows_html = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in table)
    cpu = summary.get("steps_cpu_s", {})
    steps_html = "<tr><th>step</th><th>wall</th><th>CPU (all cores)</th></tr>\n" + "\n".join(
        f"<tr><td>{html.escape(k)}</td><td>{v:.1f} s</td><td>{cpu[k]:.1f} s</td></tr>"
        if k in cpu
        else f"<tr><td>{html.escape(k)}</td><td>{v:.1f} s</td><td></td></tr>"
        for k, v in summary["steps_s"].items()
    )
    figs = "\n".join(
        f"<h2>{html.escape(t)}</h2><img alt='{html.escape(t)}' src='data:image/png;base64,{b}'>" for t, b in images
    )
    scenes_html = _scenes_html(summary.get("scenes"), out)
    summary_json = html.escape(json.dumps(summary, indent=2, default=float))
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>PEEP demo report</title>
<style>{_CSS}</style>
</head><body>
<h1>PEEP demo report</h1>
<p>The whole system on one machine: a signed bundle (its projection fitted on public background faces), a recognition
server (gRPC over TLS{", MQTT" if summary["mqtt"] else ""}, SQLite), edge agents releasing perturbed
templates from videos composed of LFW photos, enrolment, training, identification of enrolled and
never-enrolled people, and verification fused with soft traits. No pixels left any edge agent; every
template carries its mechanism and both ε values.</p>
<p class="note"><b>What the ε means.</b> {html.escape(p["note"])}. Each release here is
ε = {p["epsilon_vector"]:,.4g} per vector ({p["epsilon_coordinate"]:,.4g} per coordinate); a track may spend at most
{p["per_track_budget_epsilon_vector"]:,.4g}. Soft traits: {html.escape(summary["data"]["soft_traits"])}.</p>
<table>{rows_html}</table>
{scenes_html}
{figs}
<h2>Steps</h2><table>{steps_html}</table>
<h2>Summary (JSON)</h2><pre>{summary_json}</pre>
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc)
    return path
