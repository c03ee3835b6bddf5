"""The bystander section's figure and its part of ``report.html`` (:mod:`peep.lab.audit.bystander`)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def plot_bystander(audit: dict[str, Any], path: Path) -> bool:
    """Pairwise F1 (and precision/recall) of linking strangers' appearances vs ε: keep = all, keep = none, chance."""
    by = audit.get("bystander")
    if not by:
        return False
    # The report's helpers, so that every figure of the report is drawn and saved alike (imported here:
    # report imports this module).
    from peep.lab.audit.bystander import LINK_METHODS
    from peep.lab.audit.report_parts import eps_axis, pyplot, save_figure, series

    plt = pyplot()
    eps = np.array([b["epsilon"] for b in by])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    ax = axes[0]
    for method in LINK_METHODS:
        m, _ = series(by, "keep_all", "methods", method, "f1")
        ax.plot(eps, m, ls=":", marker=".", lw=1, label=f"keep = all: {method}")
    m, s = series(by, "keep_all", "best", "f1")
    ax.errorbar(eps, m, yerr=s, marker="o", capsize=3, lw=2.5, color="C3", label="keep = all: best method")
    m, s = series(by, "keep_none", "events", "f1")
    ax.errorbar(eps, m, yerr=s, marker="s", capsize=3, lw=2, color="C0", label="keep = none: events only")
    m, _ = series(by, "keep_none", "background_class", "events", "f1")
    ax.plot(eps, m, marker="s", ls="--", lw=1, color="C0", label="keep = none: events, recogniser with background")
    for i, eps_label in enumerate(_decision_label_epsilons(by)):
        f1 = np.array([_decision_row(b, eps_label)["best"]["f1"] for b in by], dtype=float)
        name = "no label mechanism" if eps_label is None else f"k-RR ε_label {eps_label:g}"
        ax.plot(eps, f1, marker="^", ls="-", lw=1.2, color=f"C{4 + i}", label=f"decision mode: released label, {name}")
    ch, _ = series(by, "chance_f1")
    ax.plot(eps, ch, color="grey", ls="-.", label="chance F1 (everything one cluster)")
    ax.set_ylabel("pairwise F1 of the clustering (mean ± std)")
    ax.set_title("Linking a stranger's appearances: F1")
    ax = axes[1]
    for path_, label, marker, color in (
        (("keep_all", "best"), "keep = all, best", "o", "C3"),
        (("keep_none", "events"), "keep = none, events", "s", "C0"),
    ):
        for key, ls in (("precision", "-"), ("recall", "--")):
            m, s = series(by, *path_, key)
            ax.errorbar(eps, m, yerr=s, marker=marker, ls=ls, color=color, capsize=2, label=f"{label}: {key}")
    cp, _ = series(by, "chance_precision")
    ax.plot(eps, cp, color="grey", ls=":", label="chance precision (same-person share of pairs)")
    ax.set_ylabel("pairwise precision / recall (mean ± std)")
    ax.set_title("Precision and recall")
    for a in axes:
        eps_axis(a, audit)
        a.set_ylim(0, 1.02)
        a.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Bystanders — {audit['mechanism']['kind']}, nc={audit['components']}")
    save_figure(fig, path)
    return True


BYSTANDER_INTRO = """
<p>A <i>stranger</i> is a person who never enrolled. This section asks what an operator holding everything
the server kept — its database and its event history — learns about strangers: how well it can tell which of
their appearances, across cameras and days, are the same person. Each photo of a stranger (LFW people outside
the audited ones) is one appearance, released once through the audited mechanism at the audited ε. With
<code>recognition.keep = "all"</code> the server stores every stranger's released template for
<code>keep_days</code>; the operator links them with the strongest similarities we have (cosine of the
releases; a <i>parrot</i> metric learned on released templates of public people — LDA, and the PLDA
likelihood ratio; their combination), clusters them, and is scored by pairwise precision (share of linked
pairs that are one person) and recall (share of one person's pairs linked). With the default
<code>keep = "none"</code> no template is kept (<code>templates_kept: 0</code>): template linkage is impossible by
construction, and what remains is each release's recognition event — site, device, time, decision, the
recogniser's best enrolled-class probability, model version, and a track id that links the releases of one
appearance only. Events are linked by that probability (and the decision) the same way. The linking
threshold is chosen on separate calibration people to maximise pairwise F1 there; chance is the share of
pairs that are one person (the precision of any clustering that ignores the data) and the F1 of putting every
appearance in one cluster.</p>
"""


def bystander_html(audit: dict[str, Any], out: Path, plot_name: str) -> list[str]:
    """Section 3: linkage of strangers' appearances for keep = all, keep = none and decision mode."""
    from peep.lab.audit.bystander import LINK_METHODS
    from peep.lab.audit.report_parts import embedded_image, fmt_g, html_table, num, plus_minus

    by = audit["bystander"]
    setup = audit.get("bystander_setup") or {}
    parts = ["<h2>3. Bystanders: linking a stranger's appearances from what the server kept</h2>", BYSTANDER_INTRO]
    groups = setup.get("groups", {})
    appearances = setup.get("appearances", {})

    def _counts(g: str) -> str:
        people, seen = groups.get(g) or [0], appearances.get(g) or [0]
        return f"{int(np.mean(people))} people ({int(np.mean(seen))} appearances)"

    parts.append(
        "<p class='note'>"
        + html.escape(
            f"Per split: strangers {_counts('strangers')}, calibration {_counts('calibration')}, public "
            f"{_counts('public')}: disjoint thirds of the never-enrolled people, dealt in threes by number of "
            f"images. Projection and bounds: {setup.get('basis', '')}."
        )
        + " <b>Time and device</b> are not measured: the audit has no deployment timeline, and how much they link "
        "is decided by a site's traffic (a regular at the same door at the same hour is linkable by time alone, "
        "whatever the templates); a server keeps events <code>recognition.events_days</code> and, with "
        '<code>keep = "all"</code>, templates <code>recognition.keep_days</code>.</p>'
    )
    head = [
        "ε",
        "ε / vector",
        "strangers (appearances)",
        "chance precision",
        "chance F1",
        "keep = all: best method",
        "precision",
        "recall",
        "F1",
        "keep = none: events linked by",
        "precision",
        "recall",
        "F1",
        "events F1, recogniser with background",
        "keep = recognised: strangers' templates kept (share)",
    ]
    rows = []
    for b in by:
        best, ev = b["keep_all"]["best"], b["keep_none"]["events"]
        kr = b["keep_recognised"]
        rows.append(
            [
                fmt_g(b["epsilon"]),
                num(b["epsilon_vector"], 1),
                f"{b['n_strangers']:.0f} ({b['n_appearances']:.0f})",
                num(b["chance_precision"], 4),
                num(b["chance_f1"], 4),
                html.escape(best["method"]),
                plus_minus(b, "keep_all", "best", "precision"),
                plus_minus(b, "keep_all", "best", "recall"),
                plus_minus(b, "keep_all", "best", "f1"),
                html.escape(ev["method"]),
                plus_minus(b, "keep_none", "events", "precision"),
                plus_minus(b, "keep_none", "events", "recall"),
                plus_minus(b, "keep_none", "events", "f1"),
                plus_minus(b, "keep_none", "background_class", "events", "f1"),
                f"{num(kr['share'])} / {num(kr['background_class']['share'])}",
            ]
        )
    parts.append(html_table(head, rows))
    parts.append(
        "<p>Events: the recogniser every other section measures (enrolled subjects only) and, in its own column or "
        "after the slash, one that also learned the public people as its background class, as a server with an "
        "enrolled background population does. <i>keep = recognised</i> stores the templates of releases named as an "
        "enrolled subject: for strangers, the recogniser's false accepts.</p>"
    )
    head = ["ε", "ε / vector"] + [f"{m}: F1 (precision / recall)" for m in LINK_METHODS]
    head += [f"{m}: pair AUC" for m in LINK_METHODS] + ["events: pair AUC"]
    rows = []
    for b in by:
        ms = b["keep_all"]["methods"]
        row = [fmt_g(b["epsilon"]), num(b["epsilon_vector"], 1)]
        row += [
            f"{plus_minus(b, 'keep_all', 'methods', m, 'f1')} ({num(ms[m]['precision'])} / {num(ms[m]['recall'])})"
            for m in LINK_METHODS
        ]
        row += [plus_minus(b, "keep_all", "methods", m, "pair_auc") for m in LINK_METHODS]
        row += [plus_minus(b, "keep_none", "methods", b["keep_none"]["events"]["method"], "pair_auc")]
        rows.append(row)
    parts.append(html_table(head, rows))
    parts.extend(_decision_html(by))
    if (out / plot_name).exists():
        parts.append(embedded_image(out, plot_name))
    return parts


def _decision_label_epsilons(by: Sequence[dict[str, Any]]) -> list[float | None]:
    """The ε_label values of decision mode, the decision without a label mechanism first."""
    rows = (by[0].get("keep_decision") or {}).get("per_label") or []
    return [r["epsilon_label"] for r in rows]


def _decision_row(b: dict[str, Any], eps_label: float | None) -> dict[str, Any]:
    return next(r for r in b["keep_decision"]["per_label"] if r["epsilon_label"] == eps_label)


def _decision_html(by: Sequence[dict[str, Any]]) -> list[str]:
    """Decision mode: linkage of strangers' appearances from the one label per appearance the server keeps."""
    from peep.lab.audit.report_parts import fmt_g, html_table, num

    if not by or "keep_decision" not in by[0]:
        return []
    dec0 = by[0]["keep_decision"]
    parts = [
        "<h3>Decision mode: what the released labels link</h3>",
        "<p>In decision mode the device decides on its own clean projection and releases only the decision: one "
        f"of {dec0['labels']} labels (an opaque class id of the current device model, or unknown) per appearance, "
        "through k-ary randomized response at ε_label. The server receives and keeps that label, device, time and "
        "a per-run track id — no template, no probability, no score. The device's model is the recogniser with "
        "a background class (trained on releases at the template ε), its thresholds set as a device sets them "
        f"on the calibration people's clean projections (FPIR target {num(dec0['fpir_target'], 3)}, each person "
        "weighing alike). The operator's best linker is the label itself: <i>same_label</i> clusters appearances "
        "by released label (unknown included), <i>same_named_label</i> only those released as one enrolled "
        "subject. Named: the share of the strangers' appearances released as some enrolled subject (before the "
        "label mechanism in brackets). ✗: the label mechanism alone names more strangers than the FPIR target "
        "allows.</p>",
    ]
    head = ["ε (template)", "ε_label", "named (model)", "best linker", "precision", "recall", "F1", "pair AUC"]
    head += ["chance precision", "chance F1"]
    rows = []
    for b in by:
        for r in b["keep_decision"]["per_label"]:
            best = r["best"]
            std = r.get("std", {}).get("methods", {}).get(best["method"], {})
            rows.append(
                [
                    fmt_g(b["epsilon"]),
                    "none"
                    if r["epsilon_label"] is None
                    else fmt_g(r["epsilon_label"]) + ("" if r["feasible"] else " ✗"),
                    f"{num(r['named_share'])} ({num(r['named_share_model'])})",
                    html.escape(best["method"]),
                    _with_std(best["precision"], std.get("precision")),
                    _with_std(best["recall"], std.get("recall")),
                    _with_std(best["f1"], std.get("f1")),
                    num(r["methods"][best["method"]]["pair_auc"]),
                    num(b["chance_precision"], 4),
                    num(b["chance_f1"], 4),
                ]
            )
    parts.append(html_table(head, rows))
    return parts


def _with_std(m: Any, s: Any) -> str:
    from peep.lab.audit.report_parts import num

    return num(m) if not isinstance(s, (int, float)) else f"{num(m)} ± {num(s)}"
