"""The open-set section's figure and its part of ``report.html`` (:mod:`peep.lab.audit.open_set`)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _label_axis(entries: Sequence[dict[str, Any]]) -> tuple[list[float], list[str]]:
    """ε_label values in order, the decision without a label mechanism last (it is ε_label = ∞)."""
    eps = sorted({float(e["epsilon_label"]) for e in entries if e["epsilon_label"] is not None})
    return eps, [f"{e:g}" for e in eps] + ["none (∞)"]


def plot_open_set(audit: dict[str, Any], path: Path) -> bool:
    """FNIR and released FPIR vs ε_label per mode: the device's lines, the server's as flat references."""
    # The report's helpers, so that every figure of the report is drawn and saved alike (imported here:
    # report imports this module).
    from peep.lab.audit.report_parts import pyplot, save_figure, series

    rows = audit.get("open_set")
    if not rows:
        return False
    plt = pyplot()
    dims = sorted({int(e["n_components"]) for e in rows})
    eps, ticks = _label_axis(rows)
    x_of: dict[float | None, int] = {**{e: i for i, e in enumerate(eps)}, None: len(eps)}
    targets = sorted({float(e["fpir_target"]) for e in rows}, reverse=True)
    presets = list(dict.fromkeys(e["preset"] for e in rows))
    fig, axes = plt.subplots(2, len(dims), figsize=(6.5 * len(dims), 8), squeeze=False)
    eps_t = sorted({float(e["epsilon_template"]) for e in rows})[-1]
    for c, k in enumerate(dims):
        for r, key in enumerate(("fnir", "fpir")):
            ax = axes[r, c]
            for pi, preset in enumerate(presets):
                for ti, t in enumerate(targets):
                    color, ls = f"C{pi * len(targets) + ti}", ("-", "--", ":")[min(ti, 2)]
                    sel = [
                        e
                        for e in rows
                        if e["n_components"] == k and e["preset"] == preset and e["fpir_target"] == t
                        and e["epsilon_template"] == eps_t
                    ]  # fmt: skip
                    dev = sorted((e for e in sel if e["mode"] == "device"), key=lambda e: x_of[e["epsilon_label"]])
                    if dev:
                        xs = np.array([x_of[e["epsilon_label"]] for e in dev], dtype=float)
                        m, s = series(dev, key)
                        ax.errorbar(xs, m, yerr=s, color=color, ls=ls, marker="o", capsize=3,
                                    label=f"device, {preset}, FPIR target {t:g}")  # fmt: skip
                        bad = np.array([not e["feasible"] for e in dev])
                        if bad.any():
                            ax.plot(xs[bad], m[bad], "x", color="k", ms=9)
                    for e in sel:
                        if e["mode"] == "server":
                            ax.axhline(e[key], color=color, ls=ls, lw=1, alpha=0.6,
                                       label=f"server (released query), {preset}, FPIR target {t:g}")  # fmt: skip
                    if key == "fpir" and pi == 0:
                        ax.axhline(t, color="grey", ls=ls, lw=2, alpha=0.4, label=f"target {t:g}")
            ax.plot([], [], "x", color="k", label="infeasible: the label mechanism alone exceeds the target")
            ax.set_xticks(range(len(ticks)), ticks)
            ax.set_xlabel("ε_label of the device's randomized response (none: no label mechanism)")
            if key == "fnir":
                ax.set_ylim(0, 1.02)
                ax.set_ylabel("FNIR (mean ± std over splits)")
                ax.set_title(f"K = {k}: FNIR at fixed FPIR, template ε = {eps_t:g}")
            else:
                ax.set_yscale("symlog", linthresh=1e-3)
                ax.set_ylim(0, 1.0)
                ax.set_ylabel("FPIR released (mean ± std; linear below 0.001)")
                ax.set_title(f"K = {k}: the FPIR strangers meet")
            if c == 0:
                ax.legend(fontsize=6, loc="upper right")
    fig.suptitle(f"Open-set identification (NIST FRVT 1:N) — {audit['mechanism']['kind']}, {audit.get('projection')}")
    save_figure(fig, path)
    return True


OPEN_SET_INTRO = """
<p>Open-set identification as NIST's FRVT judges 1:N search: <b>FNIR</b> (share of enrolled people's probes not
named as themselves: called unknown or named as someone else) at a fixed <b>FPIR</b> (share of strangers named as
some enrolled subject). <b>server</b>: the device releases a perturbed template of the query at the template ε and
the server's model decides, with the server's own unknown threshold (held-out background people's releases).
<b>device</b>: the device runs the same model — trained only on releases, so sending it widens nothing — on its own
<i>clean</i> projection and releases only the decision through k-ary randomized response at ε_label (none: no label
mechanism, as a door deciding locally). Its thresholds come from clean projections of public calibration people the
model never saw (every photo of each, every person weighing alike), accounting for the label mechanism so that the
<i>released</i> FPIR meets the target; where the label mechanism alone names more strangers than the target allows
(its floor), no threshold can, and the row is marked infeasible. No ε-LDP label mechanism does better: one that
names each enrolled subject's probes as themselves with probability 1 − FNIR names a stranger as one of the k − 1
subjects with probability at least (k − 1)·e<sup>−ε</sup>·(1 − FNIR) (the bound column). Door: every probe claims
its own subject and every other enrolled subject; GAR at the verify
threshold set for the FAR target.</p>
"""


def open_set_html(audit: dict[str, Any], out: Path, plot: str) -> list[str]:
    """Section 6: FNIR at fixed FPIR, server vs device, per preset, template dimension and ε_label.

    ``plot`` is the figure's file name in ``out`` (embedded when it was drawn).
    """
    from peep.lab.audit.report_parts import embedded_image, fmt_g, html_table, num, plus_minus

    rows = audit["open_set"]
    setup = audit.get("open_set_setup") or {}
    parts = ["<h2>6. Open-set identification: where the decision is made</h2>", OPEN_SET_INTRO]
    people, faces = setup.get("people", {}), setup.get("faces", {})

    def _mean(v: Any) -> str:
        return f"{np.mean(v):.0f}" if v else "–"

    parts.append(
        "<p class='note'>"
        + html.escape(
            f"{setup.get('rule', '')} Per split: {_mean(people.get('enrolled'))} enrolled people "
            f"({_mean(faces.get('enrolment'))} enrolment releases, {_mean(faces.get('probes'))} probes), "
            f"{_mean(people.get('strangers'))} strangers with 5-9 images"
            + (
                f" and {_mean(people.get('single_strangers'))} one-image strangers"
                if any(people.get("single_strangers") or [])
                else ""
            )
            + f", {_mean(people.get('background'))} background people "
            f"({_mean(faces.get('background'))} releases), {_mean(people.get('calibration'))} calibration people "
            f"({_calibration_source(setup)}; {_mean(faces.get('calibration'))} clean faces, each person weighing "
            "alike). Projection: "
            f"{setup.get('basis', '')}. "
            f"{setup.get('label_draws_note', '')}"
        )
        + "</p>"
    )
    choice = setup.get("decision_preset")
    if choice:
        means = ", ".join(f"{p} {v:.3f}" for p, v in choice["mean_fnir"].items())
        margin = "" if choice["margin"] is None else f", by {choice['margin']:.3f}"
        parts.append(
            f"<p><b>Preset for decision mode: {html.escape(choice['winner'])}</b>{margin} "
            f"({html.escape(choice['criterion'])}: {html.escape(means)}).</p>"
        )
    head = [
        "K",
        "mode",
        "preset",
        "ε template (/ vector)",
        "ε label",
        "FPIR target",
        "FNIR",
        "FPIR",
        "FPIR, one-image strangers",
        "FPIR of the model",
        "label floor (k-RR)",
        "FPIR bound, any ε-LDP label mechanism",
        "rank-1 miss",
        "door GAR (FAR) at FAR target",
        "FNIR per split",
    ]
    body = []
    for e in rows:
        door = "–" if e.get("gar_at_far") is None else f"{plus_minus(e, 'gar_at_far')} ({num(e.get('far'), 4)})"
        label = "none" if e["epsilon_label"] is None else fmt_g(e["epsilon_label"])
        if not e["feasible"]:
            label += " (infeasible)"
        body.append(
            [
                str(e["n_components"]),
                e["mode"],
                html.escape(e["preset"]),
                f"{fmt_g(e['epsilon_template'])} ({fmt_g(e.get('epsilon_template_vector'))})",
                label,
                fmt_g(e["fpir_target"]),
                plus_minus(e, "fnir"),
                plus_minus(e, "fpir", nd=4),
                num(e.get("fpir_single"), 4),
                num(e["fpir_model"], 4),
                num(e["fpir_floor"], 4),
                num(e.get("fpir_bound"), 4) + (" &gt; target" if (e.get("fpir_bound") or 0) > e["fpir_target"] else ""),
                num(e.get("rank1_miss")),
                door,
                " ".join(f"{v:.2f}" for v in e["per_repeat"]["fnir"]),
            ]
        )
    parts.append(html_table(head, body))
    ref = setup.get("no_noise") or []
    if ref:
        parts.append(
            "<p>Reference: the same people with no noise anywhere (a model fitted on clean templates, deciding on "
            "clean queries, thresholds from the calibration people): what the device's model would reach without "
            "the template mechanism.</p>"
        )
        body = [
            [
                str(e["n_components"]),
                html.escape(e["preset"]),
                fmt_g(e["fpir_target"]),
                plus_minus(e, "fnir"),
                plus_minus(e, "fpir", nd=4),
                f"{plus_minus(e, 'gar_at_far')} ({num(e.get('far'), 4)})",
            ]
            for e in ref
        ]
        parts.append(html_table(["K", "preset", "FPIR target", "FNIR", "FPIR", "door GAR (FAR)"], body))
    cost = setup.get("noise_cost") or []
    if cost:
        parts.append(
            "<p>Where the template noise costs FNIR: the served discriminant (trained on releases) deciding on clean "
            "queries with its class means, or its shared covariance, taken from the model fitted on clean templates. "
            "FNIR that falls to the no-noise reference with the clean means is the cost of estimating each enrolled "
            "person's mean from a few noisy releases.</p>"
        )
        what = {
            "clean_means": "means clean, covariance from releases",
            "clean_covariance": "covariance clean, means from releases",
        }
        body = [
            [
                str(e["n_components"]),
                html.escape(e["preset"]),
                fmt_g(e["epsilon_template"]),
                what.get(e["mode"], html.escape(e["mode"])),
                "none" if e["epsilon_label"] is None else fmt_g(e["epsilon_label"]),
                fmt_g(e["fpir_target"]),
                plus_minus(e, "fnir"),
                plus_minus(e, "fpir", nd=4),
            ]
            for e in cost
        ]
        parts.append(html_table(["K", "preset", "ε template", "model", "ε label", "FPIR target", "FNIR", "FPIR"], body))
    sweep = setup.get("enrolment_sweep") or []
    if sweep:
        parts.append(_sweep_table(rows, sweep))
    if (out / plot).exists():
        parts.append(embedded_image(out, plot))
    return parts


def _calibration_source(setup: dict[str, Any]) -> str:
    cal = setup.get("calibration") or {}
    if cal.get("population") == "singles":
        return "LFW's one-image people, one photo each"
    return "public LFW people, every photo"


def _sweep_table(rows: Sequence[dict[str, Any]], sweep: Sequence[dict[str, Any]]) -> str:
    """FNIR (released FPIR) per enrolment releases per person, for each mode, preset and ε_label."""
    from peep.lab.audit.report_parts import fmt_g, html_table, num

    every = [*rows, *sweep]
    counts = sorted({int(e["enrol_images"]) for e in every})
    cells: dict[tuple[Any, ...], dict[int, str]] = {}
    for e in every:
        key = (e["n_components"], e["mode"], e["preset"], e["epsilon_template"], e["epsilon_label"], e["fpir_target"])
        single = "" if e.get("fpir_single") is None else f" / {num(e['fpir_single'], 4)}"
        cells.setdefault(key, {})[int(e["enrol_images"])] = f"{num(e['fnir'])} ({num(e['fpir'], 4)}{single})"
    body = [
        [str(k[0]), k[1], html.escape(k[2]), fmt_g(k[3]), "none" if k[4] is None else fmt_g(k[4]), fmt_g(k[5])]
        + [v.get(n, "–") for n in counts]
        for k, v in cells.items()
    ]
    head = ["K", "mode", "preset", "ε template", "ε label", "FPIR target"] + [f"{n} enrolment releases" for n in counts]
    return (
        "<h3>How many photos to enrol</h3><p>The same people, probes and strangers; each model learns from the "
        "first n releases of each enrolled person. FNIR (released FPIR on the 5-9 image strangers / on the "
        "one-image strangers).</p>" + html_table(head, body)
    )
