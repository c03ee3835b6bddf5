"""The figures of ``peep qbbs evaluate``, drawn from its ``qbbs.json`` result.

Each figure is one function that reads the result dict
(:func:`peep.lab.qbbs.evaluation.run_evaluation`), writes one PNG into the
output directory and returns its file name; :func:`write_figures` draws them
all. matplotlib is imported when drawing, not with the module, so the
evaluation's modules import without the plotting stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.server.qbbs.matcher import ParzenScoreModel

_DPI = 110


def write_figures(
    out: Path,
    result: dict[str, Any],
    parzen: ParzenScoreModel,
    genuine: NDArray[np.float64],
    impostor: NDArray[np.float64],
) -> list[str]:
    """Draw every figure of ``result`` into ``out``; returns the PNG file names.

    Parameters
    ----------
    out : Path
        Output directory.
    result : dict
        The evaluation's result (the content of ``qbbs.json`` so far).
    parzen : ParzenScoreModel
        The face-score model, drawn over the validation scores.
    genuine, impostor : ndarray of shape (n_genuine,) and (n_impostor,)
        Validation face scores of genuine and impostor claims.
    """
    import matplotlib

    # no display: the figures are files
    matplotlib.use("Agg")
    return [
        roc_figure(out, result),
        deviation_figure(out, result),
        distortion_figure(out, result),
        verification_figure(out, result),
        parzen_figure(out, parzen, genuine, impostor),
    ]


def _save(fig: Any, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=_DPI)
    plt.close(fig)
    return name


def _subtitle(result: dict[str, Any]) -> str:
    """The templates' mechanism and the synthetic traits, under the ROC figure's title."""
    mech = result["face"]["mechanism"]
    synth = ", ".join(result["synthetic"]) or "none"
    return (
        f"templates: {mech['kind']} ε={mech['epsilon']:g} (per vector {mech['epsilon_vector']:.4g}); "
        f"synthetic traits: {synth}"
    )


def _roc_panel(ax: Any, result: dict[str, Any], noised: bool) -> None:
    """One panel of the ROC figure: face alone, face with each trait, face with all; noise-free or noised."""
    far = np.array(result["roc"]["far"])
    curves = result["roc"]["curves"]
    suffix = "_noised" if noised else ""
    ax.plot(far, curves["face"], color="black", lw=2, label="face")
    for key in [f"face_{n}" for n in result["gar_at_far_1pct"]["per_trait"]]:
        ax.plot(far, curves[key + suffix], lw=1.2, label=key.replace("_", " + ", 1))
    ax.plot(far, curves["face_all" + suffix], color="tab:red", lw=2.2, label="face + all")
    if noised:
        ax.plot(
            far,
            curves["face_all_noised_clean_weights"],
            color="tab:orange",
            ls="--",
            lw=1.5,
            label="face + all, noise-free weights",
        )
        ax.plot(
            far,
            curves["face_all_noised_shared_noise"],
            color="tab:red",
            ls=":",
            lw=1.5,
            label="face + all, chapter shared noise",
        )
    eps = result["query_structure"]["epsilon_per_response"]
    ax.axvline(0.01, color="grey", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("FAR")
    ax.set_title(f"with query noise, ε={eps:g} per response" if noised else "without noise")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def roc_figure(out: Path, result: dict[str, Any]) -> str:
    """``roc.png``: GAR against FAR on the test split, without and with query noise."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    for ax, noised in zip(axes, (False, True), strict=True):
        _roc_panel(ax, result, noised)
    axes[0].set_ylabel("GAR")
    fig.suptitle(f"QBBS ROC (test split)\n{_subtitle(result)}", fontsize=10)
    return _save(fig, out, "roc.png")


def deviation_figure(out: Path, result: dict[str, Any]) -> str:
    """``deviation.png``: each trait's Deviation against ε, in its unit and relative to its declared range."""
    import matplotlib.pyplot as plt

    dev = result["deviation"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for n, d in dev["traits"].items():
        label = f"{n}{' (synthetic)' if n in result['synthetic'] else ''} [{result['soft_traits'][n]['unit']}]"
        axes[0].plot(dev["epsilons"], d["mean_abs"], marker="o", label=label)
        axes[1].plot(dev["epsilons"], d["relative_to_range"], marker="o", label=label)
    axes[0].set_ylabel("Deviation: mean over claims of |Y' − Y| (trait units)")
    axes[1].set_ylabel("Deviation / declared range")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ε per SUM response")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Deviation vs ε (m = {result['query_structure']['m']} SUM queries per trait value)", fontsize=10)
    return _save(fig, out, "deviation.png")


def distortion_figure(out: Path, result: dict[str, Any]) -> str:
    """``distortion.png``: the chapter's Distortion (mean difference) and its squared form against ε."""
    import matplotlib.pyplot as plt

    dis = result["distortion"]
    m, n_traits = dis["m"], dis["n_traits"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    axes[0].plot(dis["epsilons"], dis["mean_difference"], marker="o", color="black", lw=2, label="all traits")
    for n, d in dis["traits"].items():
        axes[0].plot(dis["epsilons"], d["mean_difference"], marker=".", lw=1, label=n)
        line = axes[1].plot(dis["epsilons"], d["mean_squared_difference"], marker="o", label=n)[0]
        axes[1].plot(dis["epsilons"], d["expected_mean_squared_difference"], ls=":", color=line.get_color(), lw=1)
    axes[1].plot(dis["epsilons"], dis["mean_squared_difference"], marker="s", color="black", lw=2, label="all traits")
    axes[0].axhline(0.0, color="grey", lw=0.8)
    axes[0].set_xscale("log")
    axes[0].set_yscale("symlog", linthresh=1e-2)
    axes[0].set_ylabel(f"Dist = (1/(m·n)) Σ (R − R′)   (m = {m}, n = {n_traits})")
    axes[0].set_title("Distortion (chapter): mean difference", fontsize=10)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("(1/(m·n)) Σ (R − R′)²   (trait units²)")
    axes[1].set_title("Distortion as MSE (dotted: expected 2(Δf/ε)²)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("ε per SUM response")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("Distortion vs ε: true vs perturbed SUM responses of each verification", fontsize=10)
    return _save(fig, out, "distortion.png")


def verification_figure(out: Path, result: dict[str, Any]) -> str:
    """``verification.png``: decision flips, score change and GAR of face + all traits against ε."""
    import matplotlib.pyplot as plt

    ver = result["verification_vs_epsilon"]
    eps = ver["epsilons"]
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.plot(eps, ver["decision_flip_rate"], marker="o", label="decisions flipped (at clean 1%-FAR threshold)")
    ax.plot(eps, ver["score_change"], marker="s", color="tab:purple", label="mean |g' − g| / sd(g)")
    ax.plot(
        eps,
        ver["gar_at_far_1pct"],
        marker="^",
        color="tab:red",
        label="GAR at FAR 1% (face + all, noised, weights refitted)",
    )
    ax.plot(
        eps,
        ver["gar_at_far_1pct_clean_weights"],
        marker="v",
        color="tab:orange",
        label="GAR at FAR 1% (face + all, noised, noise-free weights)",
    )
    g = result["gar_at_far_1pct"]
    ax.axhline(g["face_all"], color="tab:red", ls=":", lw=1, label="GAR face + all, no noise")
    ax.axhline(g["face"], color="black", ls=":", lw=1, label="GAR face alone")
    ax.set_xscale("log")
    ax.set_xlabel("ε per SUM response")
    ax.set_title("Verification vs query noise ε (independent transform)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, out, "verification.png")


def parzen_figure(
    out: Path, parzen: ParzenScoreModel, genuine: NDArray[np.float64], impostor: NDArray[np.float64]
) -> str:
    """``parzen.png``: the genuine and impostor densities over the validation scores, and P(genuine | s)."""
    import matplotlib.pyplot as plt

    lo = float(min(genuine.min(), impostor.min()))
    hi = float(max(genuine.max(), impostor.max()))
    xs = np.linspace(lo, hi, 400)
    lg, li = parzen.log_densities(xs)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.plot(xs, np.exp(lg), label="p(s | genuine)")
    ax.plot(xs, np.exp(li), label="p(s | impostor)")
    ax.set_yscale("log")
    ax.set_ylim(1e-4, None)
    ax2 = ax.twinx()
    ax2.plot(xs, np.exp(parzen.log_posterior(xs)), color="black", ls="--", label="P(genuine | s)")
    ax2.set_ylim(0, 1.02)
    ax.set_xlabel("face score s = log P(claimed | template)")
    ax.set_title("Parzen-window densities (validation)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="center left", fontsize=8)
    return _save(fig, out, "parzen.png")
