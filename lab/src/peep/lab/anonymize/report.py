"""Plots (PNG) and the self-contained HTML report of ``peep anonymize evaluate``."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.lab.audit.report import CSS, jsonable
from peep.lab.audit.report_parts import atomic_write, embedded_image, html_table, num, pyplot, save_figure

PLOTS = {
    "privacy_utility": "privacy_utility.png",
    "reduced_sets": "reduced_sets.png",
    "samples": "samples.png",
    "sgap_sweep": "sgap_sweep.png",
}


def plot_privacy_utility(doc: Mapping[str, Any], path: Path) -> None:
    """Attribute balanced accuracy vs identity accuracy: per method (both protocols) and UPBA's sweep."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    methods = doc["methods"]
    first = next(iter(methods.values()))
    for ax, (ident, attr, title) in zip(
        axes,
        (
            ("source", "original_model_on_anonymised", "source protocol: owner's models (trained on originals)"),
            (
                "parrot",
                "trained_on_anonymised",
                "Hanisch: parrot (max of recognisers), attribute model trained on anonymised",
            ),
        ),
        strict=True,
    ):
        for name, r in methods.items():
            x = r["identity_mixture"]["accuracy"] if ident == "source" else r["parrot_accuracy"]["max"]
            ax.plot([x], [r["attribute_accuracy"][attr]["balanced_accuracy"]], "o", ms=9, label=name)
            ax.annotate(name, (x, r["attribute_accuracy"][attr]["balanced_accuracy"]), fontsize=7,
                        textcoords="offset points", xytext=(5, 5))  # fmt: skip
        sw = doc.get("sweep")
        if sw:
            xs = [
                p["identity_accuracy_source"] if ident == "source" else p["parrot_accuracy"]["max"]
                for p in sw["points"]
            ]
            key = "attribute_original_model_on_anonymised" if ident == "source" else "attribute_trained_on_anonymised"
            ys = [p[key]["balanced_accuracy"] for p in sw["points"]]
            ax.plot(xs, ys, "k.", alpha=0.6, label="UPBA sweep (t, g, w, r_p)")
            for p, x, y in zip(sw["points"], xs, ys, strict=True):
                q = p["parameters"]
                ax.annotate(f"t{q['t']:.2g} g{q['g']} w{q['w']:g} r{q['r_p']:g}", (x, y), fontsize=5, alpha=0.7)
        orig = doc["original"]
        ox = orig["owner_identity_accuracy"] if ident == "source" else orig["identity_accuracy"]["max"]
        ax.plot([ox], [orig["attribute"]["balanced_accuracy"]], "k*", ms=12, label="original faces")
        ch = first["chance"]
        ax.axvline(ch["identity_majority"], color="grey", ls=":", label="identity chance (majority)")
        ax.axhline(ch["attribute_uniform"], color="grey", ls="--", label="attribute chance (balanced)")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("identity accuracy (privacy: lower is better)")
        ax.set_title(title, fontsize=8)
    axes[0].set_ylabel(f"{doc['dataset']['attribute']} balanced accuracy (utility)")
    axes[1].legend(fontsize=6, loc="lower right")
    save_figure(fig, path)


def plot_reduced_sets(doc: Mapping[str, Any], path: Path) -> None:
    """Best parrot accuracy vs candidate-set size, per strategy, one panel per method; chance 1/size."""
    plt = pyplot()
    methods = doc["methods"]
    n = len(methods)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 1, 3.6), squeeze=False, sharey=True)
    for ax, (name, r) in zip(axes[0], methods.items(), strict=True):
        for strategy, by_size in r["reduced_sets"].items():
            sizes = sorted(by_size, key=int)
            x = [int(s) for s in sizes]
            ax.errorbar(x, [by_size[s]["mean"] for s in sizes], yerr=[by_size[s]["std"] for s in sizes],
                        marker="o", ms=3, capsize=2, label=strategy)  # fmt: skip
        sizes = sorted({int(s) for v in r["reduced_sets"].values() for s in v})
        ax.plot(sizes, [1.0 / s for s in sizes], "k:", label="chance 1/size")
        ax.set_xscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes], fontsize=6)
        ax.set_ylim(0, 1.02)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("candidate identities")
    axes[0, 0].set_ylabel("parrot accuracy (max, mean ± std over draws)")
    axes[0, -1].legend(fontsize=6, loc="upper right")
    save_figure(fig, path)


def plot_samples(originals: NDArray[np.float32], grids: Mapping[str, NDArray[np.float32]], path: Path) -> bool:
    """Original test faces (first column) and each method's anonymised version."""
    if originals.shape[0] == 0:
        return False
    plt = pyplot()
    cols = [("original", originals), *grids.items()]
    rows = originals.shape[0]
    fig, axes = plt.subplots(rows, len(cols), figsize=(1.2 * len(cols), 1.5 * rows), squeeze=False)
    for c, (title, imgs) in enumerate(cols):
        for r in range(rows):
            ax = axes[r, c]
            ax.imshow(np.asarray(imgs[r]), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=7)
    fig.suptitle("Original vs anonymised test faces", fontsize=8)
    save_figure(fig, path)
    return True


def plot_sgap_sweep(doc: Mapping[str, Any], path: Path) -> bool:
    """SGAP's privacy–utility over its distortion constraint λ: one panel each, privacy and utility."""
    sw = doc.get("sgap_sweep")
    if not sw or not sw["points"]:
        return False
    plt = pyplot()
    pts = sw["points"]
    lam = [p["lambda"] for p in pts]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = (
        ("parrot_accuracy_max", "parrot (max of recognisers)", "o-"),
        ("naive_accuracy_max", "naive (max of recognisers)", "s-"),
        ("owner_identity_accuracy", "owner's classifier (source protocol)", "^-"),
    )
    for key, label, style in curves:
        left.plot(lam, [p[key] for p in pts], style, label=label)
    if all(p["fooling_rate"] is not None for p in pts):
        left.plot(lam, [p["fooling_rate"] for p in pts], "r*--", label="paper: own discriminator fooled (same pairs)")
        left.plot(lam, [p["discriminator_accuracy_real"] for p in pts], "r:", label="own discriminator on real pairs")
    ch = next(iter(doc["methods"].values()))["chance"]
    left.axhline(ch["identity_majority"], color="grey", ls=":", label="identity chance (majority)")
    left.set_title("privacy: identity recovered (lower is better)", fontsize=8)
    right.plot(lam, [p["ssim_mean"] for p in pts], "k.-", label="SSIM(original, privatized)")
    for key, label, style in (
        ("attribute_original_model_on_anonymised", "attribute: original model on privatized", "o-"),
        ("attribute_trained_on_anonymised", "attribute: trained on privatized", "s-"),
    ):
        right.plot(lam, [p[key]["balanced_accuracy"] for p in pts], style, label=f"{label} (balanced)")
    right.axhline(ch["attribute_uniform"], color="grey", ls="--", label="attribute chance (balanced)")
    right.set_title(f"utility: {doc['dataset']['attribute']} and image quality (higher is better)", fontsize=8)
    for ax in (left, right):
        ax.set_xlabel("λ (SSIM floor 1 − λ)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=6, loc="upper right")
    fig.suptitle("SGAP λ sweep", fontsize=9)
    save_figure(fig, path)
    return True


def _acc(d: Mapping[str, Any]) -> str:
    return f"{num(d['accuracy'])} ({num(d['balanced_accuracy'])})"


def render_html(doc: Mapping[str, Any], out: Path) -> str:
    ds, methods = doc["dataset"], doc["methods"]
    counts = ", ".join(f"{v} {c}" for v, c in zip(ds["attribute_values"], ds["attribute_counts"], strict=True))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>PEEP anonymize evaluate</title>"
        f"<style>{CSS}</style></head><body><h1>Anonymised faces: what each method buys</h1>",
        f"<p>Dataset <b>{html.escape(str(ds['source']))}</b>: {ds['n_subjects']} identities, {ds['n_images']} faces"
        f"{' (identities balanced by attribute)' if ds['balanced'] else ''}. Attribute of interest "
        f"<b>{html.escape(ds['attribute'])}</b> ({html.escape(counts)}); {html.escape(ds['labels'])}. "
        f"Split {1 - doc['protocol']['test_size']:.0%}/{doc['protocol']['test_size']:.0%} by identity, seed "
        f"{doc['protocol']['seed']}. Run took {doc['timing']['wall_seconds']:.0f} s.</p>",
        "<h2>Findings</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in doc["findings"]) + "</ul>",
    ]
    head = [
        "method",
        "SSIM",
        "owner id. acc. (source)",
        "id. mixture",
        "top-2",
        "KL(rand)",
        "naive max",
        "parrot max",
        "25 %",
        "50 %",
        "75 %",
        "attr. orig. model (bal.)",
        "attr. trained on anon. (bal.)",
        "attr. majority",
    ]
    rows = []
    for name, r in methods.items():
        mix = r["identity_mixture"]
        att = r["attribute_accuracy"]
        rows.append(
            [
                html.escape(name),
                num(r["ssim_mean"]),
                num(mix["accuracy"]),
                num(mix["mixture"]),
                num(mix["top_k"].get("2")),
                num(mix["kl_from_random"]),
                num(r["naive_accuracy"]["max"]),
                num(r["parrot_accuracy"]["max"]),
            ]
            + [num(r["percent_parrot"][p]["max"]) for p in r["percent_parrot"]]
            + [
                _acc(att["original_model_on_anonymised"]),
                _acc(att["trained_on_anonymised"]),
                num(r["chance"]["attribute_majority"]),
            ]
        )
    o = doc["original"]
    rows.append(
        [
            "original faces",
            "1.000",
            num(o["owner_identity_accuracy"]),
            "–",
            "–",
            "–",
            num(o["identity_accuracy"]["max"]),
            "–",
            "–",
            "–",
            "–",
            _acc(o["attribute"]),
            "–",
            num(o["attribute"]["majority"]),
        ]
    )
    first = next(iter(methods.values()))["chance"]
    parts.append("<h2>1. Both protocols per method</h2>" + html_table(head, rows))
    parts.append(
        f"<p>Identity chance: majority {num(first['identity_majority'])}, uniform {num(first['identity_uniform'])}; "
        f"identity-mixture random guess {num(first['identity_uniform'])}. Attribute chance: majority "
        f"{num(first['attribute_majority'])}, balanced {num(first['attribute_uniform'])}.</p>"
    )
    head = ["method", *doc["protocol"]["recognisers"], "max"]
    rows = [
        [
            f"{html.escape(name)} {kind}",
            *[num(r[key].get(k)) for k in doc["protocol"]["recognisers"]],
            num(r[key]["max"]),
        ]
        for name, r in methods.items()
        for key, kind in (("naive_accuracy", "naive"), ("parrot_accuracy", "parrot"))
    ]
    parts.append("<h3>Recognisers (Hanisch: naive and parrot)</h3>" + html_table(head, rows))
    parts.append(embedded_image(out, PLOTS["privacy_utility"]))
    parts.append("<h2>2. Reduced identity sets (parrot, best recogniser; chance 1/size)</h2>")
    for name, r in methods.items():
        sizes = sorted({s for v in r["reduced_sets"].values() for s in v}, key=int, reverse=True)
        rows = [
            [html.escape(strategy)] + [f"{num(v[s]['mean'])} ± {num(v[s]['std'])}" if s in v else "–" for s in sizes]
            for strategy, v in r["reduced_sets"].items()
        ]
        parts.append(f"<h3>{html.escape(name)}</h3>" + html_table(["strategy", *[f"{s} ids" for s in sizes]], rows))
    parts.append(embedded_image(out, PLOTS["reduced_sets"]))
    sw = doc.get("sweep")
    if sw:
        head = ["t", "g", "w", "r_p", "owner id. acc.", "id. mixture", "parrot max", "attr. orig. model (bal.)",
                "attr. trained on anon. (bal.)", "SSIM"]  # fmt: skip
        rows = [
            [num(p["parameters"]["t"]), str(p["parameters"]["g"]), f"{p['parameters']['w']:g}",
             f"{p['parameters']['r_p']:g}", num(p["identity_accuracy_source"]), num(p["identity_mixture"]),
             num(p["parrot_accuracy"]["max"]), _acc(p["attribute_original_model_on_anonymised"]),
             _acc(p["attribute_trained_on_anonymised"]), num(p["ssim_mean"])]
            for p in sw["points"]
        ]  # fmt: skip
        parts.append(
            "<h2>3. UPBA sweep over (t, g, w, r_p)</h2><p>Parrot recognisers: "
            f"{html.escape(', '.join(sw['recognisers']))}.</p>" + html_table(head, rows)
        )
    ss = doc.get("sgap_sweep")
    if ss:
        head = ["λ", "SSIM", "own discriminator: real pairs", "fooled (same pairs)", "owner id. acc.", "naive max",
                "parrot max", "attr. orig. model (bal.)", "attr. trained on anon. (bal.)"]  # fmt: skip
        rows = [
            [f"{p['lambda']:g}", num(p["ssim_mean"]), num(p["discriminator_accuracy_real"]), num(p["fooling_rate"]),
             num(p["owner_identity_accuracy"]), num(p["naive_accuracy_max"]), num(p["parrot_accuracy_max"]),
             _acc(p["attribute_original_model_on_anonymised"]), _acc(p["attribute_trained_on_anonymised"])]
            for p in ss["points"]
        ]  # fmt: skip
        parts.append(
            "<h2>3b. SGAP over its distortion constraint λ</h2><p>The paper's figure is the share of same-person "
            "pairs its own Siamese discriminator calls different once one face is privatized; the parrot is "
            "Hanisch's adversary, who privatizes clear photos with the same generator and trains on them.</p>"
            + html_table(head, rows)
        )
        if (out / PLOTS["sgap_sweep"]).exists():
            parts.append(embedded_image(out, PLOTS["sgap_sweep"]))
    if (out / PLOTS["samples"]).exists():
        parts.append("<h2>4. Samples</h2>" + embedded_image(out, PLOTS["samples"]))
    parts.append("<h2>Methods and guarantees</h2><ul>")
    for name, r in methods.items():
        parts.append(
            f"<li><b>{html.escape(name)}</b> <code>{html.escape(json.dumps(r['parameters']))}</code>: "
            f"{html.escape(r['guarantee'])}</li>"
        )
    parts.append("</ul>" + METHOD_HTML + "</body></html>")
    return "\n".join(parts)


METHOD_HTML = """
<h2>How each number is measured</h2>
<ul>
<li><b>Source protocol</b> (Moriarty et al.): the owner's eigenfaces, identity classifier (RBF SVM with Platt
posteriors) and attribute classifier (random forest) are trained on the original training faces and applied to
the anonymised test faces. Identity mixture: posterior mass on the true identity vs the random guess 1/K, top-k
hit rates vs k/K, KL divergence of the posterior from the uniform guess.</li>
<li><b>Hanisch et al.</b>: <i>naive</i> recognisers are trained on original faces; the <i>parrot</i> knows the
method and its parameters, anonymises clear photos of the candidates (the training split) and trains on them;
<i>%-parrot</i> trains on a mix. Reduced sets restrict the parrot's decision to a few candidates chosen at random,
by how well they are classified on clear photos, by metadata (spanning the attribute combinations), as distinctive
(far-apart centroids) or as centred (compact) identities, over several draws.</li>
<li><b>Attribute utility</b>: accuracy with balanced accuracy in brackets and the majority rate next to it; a
classifier at the majority rate shows nothing even when its accuracy looks high.</li>
</ul>
"""


def write_outputs(
    doc: dict[str, Any], out: Path, *, grids: Mapping[str, NDArray[np.float32]], originals: NDArray[np.float32]
) -> Path:
    """Write anonymize.json (validated), anonymize.schema.json, the PNG plots and report.html."""
    from peep.lab.anonymize.schema import ANONYMIZE_SCHEMA, validate_anonymize

    out.mkdir(parents=True, exist_ok=True)
    made = {}
    plot_privacy_utility(doc, out / PLOTS["privacy_utility"])
    made["privacy_utility"] = PLOTS["privacy_utility"]
    plot_reduced_sets(doc, out / PLOTS["reduced_sets"])
    made["reduced_sets"] = PLOTS["reduced_sets"]
    if plot_samples(originals, grids, out / PLOTS["samples"]):
        made["samples"] = PLOTS["samples"]
    if plot_sgap_sweep(doc, out / PLOTS["sgap_sweep"]):
        made["sgap_sweep"] = PLOTS["sgap_sweep"]
    doc["plots"] = made
    clean = jsonable(doc)
    doc.clear()
    doc.update(clean)
    validate_anonymize(doc)
    atomic_write(out / "anonymize.json", json.dumps(doc, indent=1, allow_nan=False) + "\n")
    atomic_write(out / "anonymize.schema.json", json.dumps(ANONYMIZE_SCHEMA, indent=1) + "\n")
    report = out / "report.html"
    atomic_write(report, render_html(doc, out))
    return report
