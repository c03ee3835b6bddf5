"""Figures (PNG) and the self-contained HTML report of an audit."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from peep.lab.audit.bystander_report import bystander_html, plot_bystander
from peep.lab.audit.open_set_report import open_set_html, plot_open_set
from peep.lab.audit.report_parts import (
    atomic_write,
    embedded_image,
    eps_axis,
    fmt_g,
    html_table,
    num,
    plus_minus,
    pyplot,
    save_figure,
    series,
)


class AuditResult(Protocol):
    """What :func:`write_outputs` reads of :class:`peep.lab.audit.run.AuditResult` (the audit's JSON document and
    the arrays behind the reconstruction figure); named here so that the report does not import the run."""

    data: dict[str, Any]
    grid: dict[str, Any]


PLOTS = {
    "utility_vs_epsilon": "utility_vs_epsilon.png",
    "privacy_vs_epsilon": "privacy_vs_epsilon.png",
    "linkage_subsets": "linkage_subsets.png",
    "utility_vs_components": "utility_vs_components.png",
    "utility_vs_images": "utility_vs_images.png",
    "reconstruction_grid": "reconstruction_grid.png",
    "frontier": "frontier.png",
    "bystander": "bystander_linkage.png",
    "open_set": "open_set_fnir.png",
}


def plot_utility(audit: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    res = audit["results"]
    eps = np.array([r["epsilon"] for r in res])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key, label in (
        ("accuracy", "accuracy"),
        ("weighted_f1", "weighted F1"),
        ("weighted_precision", "weighted precision"),
        ("weighted_recall", "weighted recall"),
        ("balanced_accuracy", "balanced accuracy"),
    ):
        m, s = series(res, key)
        ax.errorbar(eps, m, yerr=s, marker="o", capsize=3, label=label)
    ax.axhline(audit["no_privacy"]["accuracy"], color="k", ls="--", label="no privacy (accuracy)")
    ax.axhline(audit["chance"]["majority"], color="grey", ls=":", label="majority class")
    ax.axhline(audit["chance"]["uniform"], color="grey", ls="-.", label="uniform guess")
    eps_axis(ax, audit)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("score (mean ± std over splits)")
    ax.set_title(f"Utility vs ε — {audit['mechanism']['kind']}, nc={audit['components']}")
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def plot_privacy(audit: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    res = audit["results"]
    eps = np.array([r["epsilon"] for r in res])
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    chance = audit["chance"]["majority"]
    ax = axes[0, 0]
    for adv in ("knn", "svm", "logreg", "mlp", "bayes", "max"):
        m, s = series(res, "linkage", adv)
        ax.errorbar(
            eps, m, yerr=s, marker="o" if adv == "max" else ".", capsize=2, label=adv, lw=2.5 if adv == "max" else 1
        )
    ax.axhline(chance, color="grey", ls=":", label="chance (majority)")
    ax.set_title("(b) linkage: parrot adversaries, all identities")
    ax.set_ylabel("accuracy")
    ax = axes[0, 1]
    for k in sorted(res[0]["averaging"], key=int):
        m, s = series(res, "averaging", k)
        ax.errorbar(eps, m, yerr=s, marker="o", capsize=2, label=f"k = {k} releases averaged")
    ax.axhline(chance, color="grey", ls=":", label="chance (majority)")
    ax.set_title("(c) averaging attack (best adversary)")
    ax.set_ylabel("accuracy")
    ax = axes[1, 0]
    for meth in ("direct", "shrinkage"):
        m, s = series(res, "reconstruction", meth, "ssim")
        ax.errorbar(eps, m, yerr=s, marker="o", capsize=2, label=f"SSIM, {meth}")
    base = audit["reconstruction_baselines"]
    ax.axhline(base["mean_face"]["ssim"], color="grey", ls=":", label="mean face (chance)")
    ax.axhline(base["pca_ceiling"]["ssim"], color="k", ls="--", label="clean PCA reconstruction")
    ax.set_title("(a) reconstruction (Eq. 14 direct, shrinkage)")
    ax.set_ylabel("SSIM vs original")
    ax = axes[1, 1]
    for path_, label in (
        (("reconstruction_reid",), "re-identification of reconstructions"),
        (("membership_auc",), "membership AUC (fresh release)"),
        (("membership_auc_template",), "membership AUC (stored template)"),
        (("identity_mixture", "mixture"), "identity mixture (posterior on truth)"),
    ):
        m, s = series(res, *path_)
        ax.errorbar(eps, m, yerr=s, marker="o", capsize=2, label=label)
    ax.axhline(0.5, color="grey", ls="-.", label="AUC chance")
    ax.axhline(base["mean_face"]["reid"], color="grey", ls=":", label="re-id chance (mean face)")
    ax.set_title("(a, d, e) re-identification, membership, identity mixture")
    for a in axes.ravel():
        eps_axis(a, audit)
        a.set_ylim(0, 1.02)
        a.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Privacy vs ε — {audit['mechanism']['kind']}, nc={audit['components']}")
    save_figure(fig, path)


def plot_subsets(audit: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    res = audit["results"]
    eps = np.array([r["epsilon"] for r in res])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    keys = [(s["size"], s["strategy"]) for s in res[0]["linkage_subsets"]]
    for i, (size, strategy) in enumerate(keys):
        m = np.array([r["linkage_subsets"][i]["max"] for r in res])
        ch = np.array([r["linkage_subsets"][i]["chance"] for r in res])
        line = ax.plot(eps, m, marker="o", label=f"{size} identities, {strategy}")[0]
        ax.plot(eps, ch, ls=":", color=line.get_color(), lw=1)
    eps_axis(ax, audit)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("best adversary accuracy (dotted: its chance)")
    ax.set_title("(b) linkage on reduced candidate sets (Hanisch et al.)")
    ax.legend(fontsize=7, loc="upper right")
    save_figure(fig, path)


def plot_sweep(audit: dict[str, Any], name: str, xlabel: str, path: Path) -> bool:
    pts = audit["sweeps"][name]
    if not pts:
        return False
    plt = pyplot()
    x = np.array([p["n_components"] if name == "components" else p["images_per_subject_mean"] for p in pts])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    eps = audit["sweeps"]["epsilon"]
    for which, label in (("no_privacy", "no privacy"), ("private", f"{audit['sweeps']['mechanism']} ε = {eps:g}")):
        for key, ls in (("accuracy", "-"), ("weighted_f1", "--")):
            m, s = series(pts, which, key)
            ax.errorbar(x, m, yerr=s, marker="o", ls=ls, capsize=3, label=f"{label}: {key.replace('_', ' ')}")
    ax.axhline(audit["chance"]["majority"], color="grey", ls=":", label="majority class")
    if name == "components":
        ax.set_xscale("log", base=2)
        for p in pts:
            ax.annotate(
                f"ε/vec={p['epsilon_vector']:.4g}",
                (p["n_components"], p["private"]["accuracy"]),
                fontsize=6,
                textcoords="offset points",
                xytext=(0, -12),
                ha="center",
            )
    ax.set_xlabel(xlabel)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("score (mean ± std)")
    ax.legend(fontsize=7, loc="upper right")
    save_figure(fig, path)
    return True


def plot_grid(grid: dict[str, Any], path: Path, max_eps: int = 4) -> bool:
    if not grid:
        return False
    plt = pyplot()
    eps = grid["epsilons"]
    pick = sorted(set(np.linspace(0, len(eps) - 1, min(max_eps, len(eps))).round().astype(int).tolist()))
    cols = [("original", grid["originals"]), ("clean PCA", grid["ceiling"])]
    for i in pick:
        cols.append((f"ε={eps[i]:g} Eq.14", grid["direct"][i]))
        cols.append((f"ε={eps[i]:g} shrink", grid["shrinkage"][i]))
    n = len(grid["names"])
    fig, axes = plt.subplots(n, len(cols), figsize=(1.15 * len(cols), 1.45 * n), squeeze=False)
    for r in range(n):
        for c, (title, imgs) in enumerate(cols):
            ax = axes[r, c]
            ax.imshow(np.asarray(imgs[r]), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=6)
            if c == 0:
                ax.set_ylabel(grid["names"][r], fontsize=6)
    fig.suptitle("Reconstructions from releases (PEEP Fig. 12 style)", fontsize=8)
    save_figure(fig, path)
    return True


def plot_frontier(audit: dict[str, Any], path: Path) -> bool:
    fr = audit.get("frontier")
    if not fr:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    pts = fr["points"]
    x = np.array([p["epsilon_vector"] for p in pts])
    for which, label, style in (
        ("best", "frontier: best configuration", "o-"),
        ("paper_mode", f"paper mode (peep, nc={pts[0]['paper_mode']['configuration']['n_components']})", "s--"),
    ):
        m = np.array([p[which]["accuracy"] for p in pts])
        s = np.array([p[which]["std"]["accuracy"] for p in pts])
        ax.errorbar(x, m, yerr=s, fmt=style, capsize=3, label=label, lw=2)
    for p in pts:
        c = p["best"]["configuration"]
        ax.annotate(
            f"{c['mechanism']}\n{c.get('projection', 'eigenfaces')} {c['n_components']}, {c['bounds']}",
            (p["epsilon_vector"], p["best"]["accuracy"]),
            fontsize=6,
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    sel = fr["selection"]["points"]
    for kind in fr["searched"]["mechanisms"]:
        best = [
            max(
                (r["accuracy"] for r in sel if r["mechanism"] == kind and r["target_epsilon_vector"] == t),
                default=np.nan,
            )
            for t in x
        ]
        ax.plot(x, best, ls=":", lw=1, marker=".", label=f"{kind}: best nc/bounds (selection split)")
    for p in pts:
        ax.plot([p["epsilon_vector"]], [p["best"]["linkage"]["max"]], "kx")
    ax.plot([], [], "kx", label="linkage (best adversary) at the frontier point")
    ax.axhline(audit["no_privacy"]["accuracy"], color="k", ls="--", lw=1, label="no privacy")
    ax.axhline(audit["chance"]["majority"], color="grey", ls=":", label="majority class")
    ax.set_xscale("log")
    ax.set_xlabel("ε per vector")
    ax.set_ylabel("accuracy (mean ± std, fresh splits)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Privacy–utility frontier vs paper mode")
    ax.legend(fontsize=6, loc="lower right")
    save_figure(fig, path)
    return True


# --------------------------------------------------------------------------- HTML


CSS = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}.warn{background:#fff4e5;border-left:4px solid #f90;padding:.6em 1em}
.note{background:#eef5ff;border-left:4px solid #39f;padding:.6em 1em}img{max-width:100%}code{font-size:12px}
"""


def render_html(audit: dict[str, Any], out: Path) -> str:
    """The self-contained report of ``audit``, its plots (already written to ``out``) embedded.

    One function per section, each returning its HTML fragments; sections the audit did not
    measure (bystanders, open set, frontier) are left out.
    """
    parts = _header_html(audit)
    parts += _utility_html(audit, out)
    parts += _privacy_html(audit, out)
    parts += _subsets_html(audit, out)
    if audit.get("bystander"):
        parts += bystander_html(audit, out, PLOTS["bystander"])
    parts += _sweeps_html(audit, out)
    if audit.get("open_set"):
        parts += open_set_html(audit, out, PLOTS["open_set"])
    if audit.get("frontier"):
        parts += _frontier_html(audit, out)
    parts.append(METHOD_HTML)
    parts.append("</body></html>")
    return "\n".join(parts)


def _header_html(audit: dict[str, Any]) -> list[str]:
    """Title, dataset and protocol, the noise sampler and the privacy guarantee."""
    ds, mech, sampler = audit["dataset"], audit["mechanism"], audit["sampler"]
    protocol, timing = audit["protocol"], audit["timing"]
    per_subject = ", ".join(f"{n} ({c})" for n, c in zip(ds["subjects"], ds["images_per_subject"], strict=False))
    return [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>PEEP audit — {html.escape(mech['kind'])}"
        f"</title><style>{CSS}</style></head><body>",
        f"<h1>PEEP audit: <code>{html.escape(mech['kind'])}</code>, nc = {audit['components']}</h1>",
        f"<p>Dataset <b>{html.escape(str(ds['source']))}</b>: {ds['n_subjects']} identities, {ds['n_images']} images "
        f"({html.escape(per_subject)}); "
        f"normalisation <code>{html.escape(str(ds['normalisation'].get('method')))}</code>. "
        f"{protocol['repeats']} stratified {1 - protocol['test_size']:.0%}/"
        f"{protocol['test_size']:.0%} splits; recogniser {html.escape(protocol['recogniser'])}, "
        f"{html.escape(protocol['recogniser_training'])}. "
        f"Run took {timing['wall_seconds']:.0f} s wall, {timing['cpu_seconds']:.0f} s CPU "
        f"({timing['workers']} workers).</p>",
        f"<p class='{'warn' if not sampler['is_secure'] else 'note'}'><b>Noise sampler: "
        f"{html.escape(sampler['name'])}</b> — {html.escape(sampler['note'])}</p>",
        f"<p class='note'><b>Privacy guarantee.</b> {html.escape(mech['description'])}. The mechanism's ε "
        f"parameter is {html.escape(mech['epsilon_parameter'])}; every table shows the per-coordinate and "
        f"the per-vector ε side by side. <b>Basis.</b> {html.escape(audit['basis']['note'])}</p>",
    ]


def _utility_html(audit: dict[str, Any], out: Path) -> list[str]:
    """Section 1: utility at each ε, the no-privacy row first."""
    np_ = audit["no_privacy"]
    head = [
        "ε",
        "ε / coordinate",
        "ε / vector",
        "accuracy",
        "balanced acc.",
        "weighted F1",
        "weighted precision",
        "weighted recall",
        "chance (majority)",
    ]
    scores = ("accuracy", "balanced_accuracy", "weighted_f1", "weighted_precision", "weighted_recall")
    rows = [["no privacy", "∞", "∞", *(plus_minus(np_, k) for k in scores), num(audit["chance"]["majority"])]]
    rows += [
        [
            fmt_g(r["epsilon"]),
            fmt_g(r["epsilon_coordinate"]),
            plus_minus(r, "epsilon_vector", nd=1),
            *(plus_minus(r, k) for k in scores),
            num(r["chance"]),
        ]
        for r in audit["results"]
    ]
    return [
        "<h2>1. Utility vs ε (PEEP Fig. 7)</h2>",
        html_table(head, rows),
        embedded_image(out, PLOTS["utility_vs_epsilon"]),
    ]


def _privacy_html(audit: dict[str, Any], out: Path) -> list[str]:
    """Section 2: every attack at each ε, then what chance and the clean ceilings score."""
    res = audit["results"]
    head = ["ε", "ε / vector", "linkage kNN", "SVM", "logreg", "MLP", "bayes", "max", "chance"]
    head += [f"avg k={k}" for k in sorted(res[0]["averaging"], key=int)]
    head += [
        "SSIM Eq.14",
        "SSIM shrink",
        "PSNR best",
        "re-id",
        "MIA AUC fresh",
        "MIA AUC template",
        "id. mixture",
        "top-2",
        "KL(rand)",
    ]
    rows = [_privacy_row(r) for r in res]
    return [
        "<h2>2. Privacy vs ε, against chance</h2>",
        html_table(head, rows),
        _privacy_chance_html(audit),
        embedded_image(out, PLOTS["privacy_vs_epsilon"]),
    ]


def _privacy_row(r: dict[str, Any]) -> list[str]:
    """One ``results[]`` entry's row of the privacy table."""
    row = [fmt_g(r["epsilon"]), num(r["epsilon_vector"], 1)]
    row += [plus_minus(r, "linkage", a) for a in ("knn", "svm", "logreg", "mlp", "bayes", "max")]
    row += [num(r["chance"])]
    row += [plus_minus(r, "averaging", k) for k in sorted(r["averaging"], key=int)]
    row += [
        plus_minus(r, "reconstruction", "direct", "ssim"),
        plus_minus(r, "reconstruction", "shrinkage", "ssim"),
        num(r["reconstruction_psnr"], 1),
        plus_minus(r, "reconstruction_reid"),
        plus_minus(r, "membership_auc"),
        plus_minus(r, "membership_auc_template"),
        num(r["identity_mixture"]["mixture"]),
        num(r["identity_mixture"]["top_k"].get("2")),
        num(r["identity_mixture"]["kl_from_random"]),
    ]
    return row


def _privacy_chance_html(audit: dict[str, Any]) -> str:
    """What each attack scores without any release: the mean face, the clean ceiling, chance."""
    base = audit["reconstruction_baselines"]
    return (
        f"<p>Reconstruction chance: the mean face alone scores SSIM {num(base['mean_face']['ssim'])}, PSNR "
        f"{num(base['mean_face']['psnr'], 1)} dB, re-id {num(base['mean_face']['reid'])}; the clean PCA reconstruction "
        f"(no noise, the ceiling of any attack on templates) SSIM {num(base['pca_ceiling']['ssim'])}, PSNR "
        f"{num(base['pca_ceiling']['psnr'], 1)} dB, re-id {num(base['pca_ceiling']['reid'])}. Membership: "
        f"no-privacy recogniser AUC {num(audit['no_privacy']['membership_auc'])}; chance 0.5. Identity mixture chance "
        f"{num(audit['chance']['uniform'])} (uniform), top-2 chance {num(2 * audit['chance']['uniform'])}.</p>"
    )


def _subsets_html(audit: dict[str, Any], out: Path) -> list[str]:
    """Section 2, continued: linkage on reduced candidate sets, then the reconstruction grid if drawn."""
    res = audit["results"]
    sets = res[0]["linkage_subsets"]
    head = ["ε", "ε / vector"] + [f"{s['size']} ({s['strategy']})" for s in sets]
    rows = [
        [fmt_g(r["epsilon"]), num(r["epsilon_vector"], 1)]
        + [f"{plus_minus(s, 'max')} [{num(s['chance'])}]" for s in r["linkage_subsets"]]
        for r in res
    ]
    parts = ["<h3>Linkage on reduced candidate sets (best adversary; chance in brackets)</h3>", html_table(head, rows)]
    skipped = audit.get("linkage_subsets_skipped") or []
    if skipped:
        parts.append(
            "<p>Not formed: "
            + html.escape("; ".join(f"{s['size']} identities ({s['reason']})" for s in skipped))
            + ".</p>"
        )
    parts.append(embedded_image(out, PLOTS["linkage_subsets"]))
    # only where the run drew it: the grid's arrays are not kept in audit.json
    if (out / PLOTS["reconstruction_grid"]).exists():
        parts.append(embedded_image(out, PLOTS["reconstruction_grid"]))
    return parts


def _sweeps_html(audit: dict[str, Any], out: Path) -> list[str]:
    """Section 4: utility vs number of components and vs training images per subject."""
    sw = audit["sweeps"]
    parts = [
        f"<h2>4. Utility vs number of components and images per subject (PEEP Figs. 9, 10)</h2>"
        f"<p>Private curve: {html.escape(sw['mechanism'])} at ε = {sw['epsilon']:g}; note that for "
        f"per-coordinate mechanisms the per-vector ε grows with nc.</p>"
    ]
    for name, label in (("components", "nc"), ("images_per_subject", "training images / subject (cap)")):
        if sw[name]:
            parts.append(_sweep_table(sw[name], label))
            key = "utility_vs_components" if name == "components" else "utility_vs_images"
            if (out / PLOTS[key]).exists():
                parts.append(embedded_image(out, PLOTS[key]))
    return parts


def _sweep_table(points: Sequence[dict[str, Any]], label: str) -> str:
    """One sweep's table, a row per swept value; ``label`` names the swept quantity."""
    head = [
        label,
        "nc",
        "ε / coordinate",
        "ε / vector",
        "no privacy: accuracy",
        "F1",
        "private: accuracy",
        "F1",
        "balanced acc.",
    ]
    rows = [
        [
            str(p["value"]),
            str(p["n_components"]),
            fmt_g(p["epsilon_coordinate"]),
            num(p["epsilon_vector"], 1),
            plus_minus(p, "no_privacy", "accuracy"),
            plus_minus(p, "no_privacy", "weighted_f1"),
            plus_minus(p, "private", "accuracy"),
            plus_minus(p, "private", "weighted_f1"),
            plus_minus(p, "private", "balanced_accuracy"),
        ]
        for p in points
    ]
    return html_table(head, rows)


def _frontier_html(audit: dict[str, Any], out: Path) -> list[str]:
    """Section 5: what the frontier searched, and its best configuration vs paper mode at each per-vector ε."""
    fr = audit["frontier"]
    searched = fr["searched"]
    intro = (
        "<h2>5. Privacy–utility frontier</h2><p>"
        + html.escape(
            "Search over projections "
            + ", ".join(searched.get("projections", ["eigenfaces"]))
            + " × mechanisms "
            + ", ".join(searched["mechanisms"])
            + f" × nc ∈ {searched['n_components']} × "
            f"bounds {searched['bounds']} on a separate selection split; the chosen configuration and paper "
            "mode are then evaluated, with every attack, on fresh splits. " + searched["note"]
        )
        + "</p>"
    )
    head = [
        "ε / vector",
        "best configuration",
        "ε / coordinate",
        "accuracy",
        "balanced acc.",
        "linkage max",
        "avg k=20",
        "SSIM shrink",
        "re-id",
        "paper mode accuracy",
        "paper ε / coord.",
        "paper linkage max",
    ]
    rows = [_frontier_row(p) for p in fr["points"]]
    return [intro, html_table(head, rows), embedded_image(out, PLOTS["frontier"])]


def _frontier_row(p: dict[str, Any]) -> list[str]:
    """One frontier point's row: the best configuration's numbers, then paper mode's."""
    b, pm = p["best"], p["paper_mode"]
    c = b["configuration"]
    return [
        fmt_g(p["epsilon_vector"]),
        html.escape(f"{c['mechanism']}, {c.get('projection', 'eigenfaces')} nc={c['n_components']}, {c['bounds']}"),
        fmt_g(b["epsilon_coordinate"]),
        plus_minus(b, "accuracy"),
        plus_minus(b, "balanced_accuracy"),
        plus_minus(b, "linkage", "max"),
        plus_minus(b, "averaging", "20"),
        plus_minus(b, "reconstruction", "shrinkage", "ssim"),
        plus_minus(b, "reconstruction_reid"),
        plus_minus(pm, "accuracy"),
        fmt_g(pm["epsilon_coordinate"]),
        plus_minus(pm, "linkage", "max"),
    ]


METHOD_HTML = """
<h2>How each number is measured</h2>
<ul>
<li><b>Utility.</b> The MLP is trained on perturbed releases of the training faces and tested on
perturbed releases of the held-out faces; weighted precision/recall/F1 weight each identity by its test
support. Chance is the majority-class rate (a constant guess); balanced accuracy's chance is 1/K.</li>
<li><b>(a) Reconstruction.</b> Eq. 14 direct inversion undoes the scaling and projects back (eigenfaces);
where no exact inverse exists (Fisherfaces, unit-sphere releases) a ridge decoder learned on the public
basis faces maps releases to pixels; for a descriptor projection (dlib-resnet: a deep network's output,
with no way back to pixels) the adversary retrieves the public face whose template is nearest the
release, and re-identification is measured on that face's descriptor. The
shrinkage (Wiener) estimator knows the mechanism's noise variance per coordinate and the prior
mean/variance of each coordinate from the basis faces, and shrinks each coordinate by v/(v+σ²). SSIM/PSNR
against the original test faces; re-identification by the no-privacy MLP (trained on clean faces) applied
to the reconstructions. Chance = mean face.</li>
<li><b>(b) Linkage.</b> Parrot adversary (Hanisch et al.): knows mechanism and ε, perturbs clean photos
of the candidates (the training split) the same way, and trains kNN (k by leave-one-out), a linear SVM,
logistic regression and the MLP; <i>bayes</i> uses the clean photos and the known noise variance
directly: a Gaussian model of each identity (means and pooled within-identity covariance of the clean
photos) with the noise covariance added, i.e. LDA that knows the noise. Reduced sets: random,
<i>distinctive</i> (centroids far apart, greedy farthest-point) and <i>center</i> (identities whose
photos lie closest to their own centroid), computed on the adversary's clean gallery; the adversary's
decision is restricted to the set.</li>
<li><b>(c) Averaging.</b> k independent releases of the same face are averaged (gallery and probes), then
the adversaries above (the MLP trained at k = 1) classify; <i>bayes</i> uses the noise variance divided
by k.</li>
<li><b>(d) Membership.</b> Confidence-threshold attack on the trained recogniser, score = predicted
probability of the true identity. <i>Fresh release</i>: the adversary releases a training photo again
(what the LDP guarantee bounds); <i>stored template</i>: the very template the server trained on
(memorisation of the template, not of the face).</li>
<li><b>Bystanders.</b> Strangers, calibration people and public people are disjoint thirds of the people the
audit never enrols, drawn per split; with <code>--basis background</code> the projection and bounds are refitted
without the strangers. <i>cosine</i>: cosine of the releases centred on the public people's mean release;
<i>parrot_lda</i>: cosine after a shrinkage LDA fitted on the public people's releases; <i>parrot_plda</i>: the
two-covariance (PLDA) log-likelihood ratio of one person vs two, its covariances (noise included) estimated on
the same releases; <i>combined</i>: cosine + parrot_lda, each standardised on the calibration pairs. Events:
<i>probability</i> links by −|p<sub>i</sub> − p<sub>j</sub>|, <i>decision_probability</i> also puts events with
different decisions a unit apart. Average-linkage clustering cut at the threshold that maximises pairwise F1 on
the calibration people; pair AUC is threshold-free. The best method is the one with the highest mean F1 over
splits.</li>
<li><b>(e) Identity mixture</b> (Moriarty et al.): the noise-aware (<i>bayes</i>) adversary's posterior mass
on the true identity, top-k hit rates vs random guess k/K (and vs guessing the k most frequent identities),
and KL divergence of the posterior from the uniform random guess (and from the class frequencies).</li>
</ul>
"""


def write_outputs(result: AuditResult, out: Path) -> Path:
    """Write audit.json, audit.schema.json, the PNG plots and report.html; return report.html's path."""
    from peep.lab.audit.schema import AUDIT_SCHEMA, validate_audit

    out.mkdir(parents=True, exist_ok=True)
    audit = result.data
    made: dict[str, str] = {}
    plot_utility(audit, out / PLOTS["utility_vs_epsilon"])
    made["utility_vs_epsilon"] = PLOTS["utility_vs_epsilon"]
    plot_privacy(audit, out / PLOTS["privacy_vs_epsilon"])
    made["privacy_vs_epsilon"] = PLOTS["privacy_vs_epsilon"]
    plot_subsets(audit, out / PLOTS["linkage_subsets"])
    made["linkage_subsets"] = PLOTS["linkage_subsets"]
    label = f"template dimension ({audit.get('projection', 'eigenfaces')} nc)"
    if plot_sweep(audit, "components", label, out / PLOTS["utility_vs_components"]):
        made["utility_vs_components"] = PLOTS["utility_vs_components"]
    if plot_sweep(
        audit, "images_per_subject", "training images per subject (mean after cap)", out / PLOTS["utility_vs_images"]
    ):
        made["utility_vs_images"] = PLOTS["utility_vs_images"]
    if plot_grid(result.grid, out / PLOTS["reconstruction_grid"]):
        made["reconstruction_grid"] = PLOTS["reconstruction_grid"]
    if plot_frontier(audit, out / PLOTS["frontier"]):
        made["frontier"] = PLOTS["frontier"]
    if plot_bystander(audit, out / PLOTS["bystander"]):
        made["bystander"] = PLOTS["bystander"]
    if plot_open_set(audit, out / PLOTS["open_set"]):
        made["open_set"] = PLOTS["open_set"]
    audit["plots"] = made
    audit["report"] = "report.html"
    audit = jsonable(audit)
    result.data = audit
    validate_audit(audit)
    atomic_write(out / "audit.json", json.dumps(audit, indent=1, allow_nan=False) + "\n")
    atomic_write(out / "audit.schema.json", json.dumps(AUDIT_SCHEMA, indent=1) + "\n")
    report = out / "report.html"
    atomic_write(report, render_html(audit, out))
    return report


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays converted, NaN and ±inf as ``null``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj
