"""``peep sgap train --lambda L[,L2,...] --out DIR``: train SGAP generators on the background population.

Training needs the ``sgap`` extra (PyTorch); the ONNX models it writes run
without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from peep.server.errors import UsageError


def _lambdas(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of numbers in (0, 1) such as 0.05,0.1,0.2, received {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one value, received {text!r}")
    return values


def register(sub: Any) -> None:
    p = sub.add_parser("sgap", help="SGAP, the learned face privatizer: train generators")
    ssub = p.add_subparsers(dest="sgap_command", metavar="SUBCOMMAND", required=True)
    t = ssub.add_parser(
        "train",
        help="train SGAP generators on the public background population and export them to ONNX",
        description="Trains a generator and its Siamese discriminator for each λ on LFW's background people "
        "(5-19 images; never the evaluated people with >= 20), then writes OUT/sgap.onnx, sgap.json (λ, "
        "population, achieved SSIM, held-out discriminator accuracy, ONNX check), training.png and samples.png. "
        "With several λ, one folder OUT/lambda-L per value plus OUT/sweep.json and OUT/sweep.png.",
    )
    add_train_arguments(t)


def add_train_arguments(t: Any) -> None:
    """The options of ``peep sgap train`` (also ``peep anonymize train-sgap``), handler included."""
    from peep.lab.sgap.config import SgapConfig

    d = SgapConfig(lam=0.1)
    t.add_argument("--lambda", dest="lambdas", type=_lambdas, required=True, metavar="L[,L...]",
                   help="distortion constraint(s): SSIM(original, privatized) >= 1 - L, each in (0, 1)")  # fmt: skip
    t.add_argument("--out", required=True, type=Path, help="output folder")
    t.add_argument("--dataset", default="lfw", help="'lfw' or a folder-per-identity image directory (default lfw)")
    t.add_argument(
        "--data-home", default=None, help="scikit-learn data home holding lfw_home/ (default: $SCIKIT_LEARN_DATA)"
    )
    t.add_argument("--min-faces", type=int, default=5, help="background people with at least N faces (default 5)")
    t.add_argument("--max-faces", type=int, default=19, help="... and at most N image files (default 19, < 20)")
    t.add_argument("--max-subjects", type=int, default=None, help="use only the first N people (quick runs)")
    t.add_argument("--max-per-subject", type=int, default=None, help="use at most N images per person")
    t.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the faces (default {d.epochs})")
    t.add_argument("--pretrain-epochs", type=int, default=d.pretrain_epochs,
                   help=f"discriminator epochs on real pairs first (default {d.pretrain_epochs})")  # fmt: skip
    t.add_argument("--batch-size", type=int, default=d.batch_size, help=f"pairs per step (default {d.batch_size})")
    t.add_argument("--lr", type=float, default=d.lr_generator, help=f"Adam learning rate (default {d.lr_generator})")
    t.add_argument("--penalty", type=float, default=d.penalty, help=f"SSIM penalty weight (default {d.penalty:g})")
    t.add_argument("--width", type=int, default=d.width, help=f"generator width (default {d.width})")
    t.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    t.add_argument("--resume", action="store_true", help="continue from OUT's checkpoint.pt (same options)")
    t.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    t.add_argument("--json", action="store_true", help="print the summary as JSON")
    t.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    t.set_defaults(handler=train)


def _config(args: argparse.Namespace, lam: float) -> Any:
    from peep.lab.sgap.config import SgapConfig

    option = {
        "lambda": "--lambda",
        "epochs": "--epochs",
        "pretrain_epochs": "--pretrain-epochs",
        "batch_size": "--batch-size",
        "lr_generator": "--lr",
        "lr_discriminator": "--lr",
        "penalty": "--penalty",
        "width": "--width",
        "seed": "--seed",
    }
    try:
        return SgapConfig(
            lam=lam,
            epochs=args.epochs,
            pretrain_epochs=args.pretrain_epochs,
            batch_size=args.batch_size,
            lr_generator=args.lr,
            lr_discriminator=args.lr,
            penalty=args.penalty,
            width=args.width,
            seed=args.seed,
        )
    except (TypeError, ValueError) as exc:
        name, _, rest = str(exc).partition(":")
        raise UsageError(f"{option.get(name, name)}:{rest}") from exc


def train(args: argparse.Namespace) -> int:
    from peep.lab.sgap import require_torch
    from peep.lab.sgap.config import check_background

    configs = [_config(args, lam) for lam in args.lambdas]  # every option checked before any work
    if len(set(args.lambdas)) != len(args.lambdas):
        raise UsageError(f"--lambda: expected distinct values, received {','.join(map(str, args.lambdas))}")
    try:
        check_background(min_faces=args.min_faces, max_faces=args.max_faces)
    except (TypeError, ValueError) as exc:
        name, _, rest = str(exc).partition(":")
        raise UsageError(f"--{name.replace('_', '-')}:{rest}") from exc
    for opt, low in (("max_subjects", 4), ("max_per_subject", 2), ("threads", 1)):
        v = getattr(args, opt)
        if v is not None and v < low:
            raise UsageError(f"--{opt.replace('_', '-')}: expected an int >= {low}, received {v}")
    require_torch("peep sgap train")

    import torch
    from peep.lab.sgap.train import train_sgap, write_model
    from peep.server.datasets import load_dataset
    from peep.server.progress import Progress

    if args.threads:
        torch.set_num_threads(args.threads)
    show = not args.no_progress
    ds = load_dataset(
        args.dataset,
        data_home=args.data_home,
        min_faces=args.min_faces,
        max_faces=args.max_faces,
        max_per_subject=args.max_per_subject,
        progress=Progress("loading faces", enabled=show),
    )
    if args.max_subjects is not None:
        ds = ds.subset(ds.labels < args.max_subjects)
    population = {
        "dataset": ds.source,
        "min_faces": args.min_faces,
        "max_faces": args.max_faces,
        "max_subjects": args.max_subjects,
        "max_per_subject": args.max_per_subject,
        "normalisation": ds.normalisation,
        "rule": "background only: people with at most max_faces (< 20) image files; "
        "the evaluated people (>= 20 images) are never trained on",
    }
    say = print if not args.json else (lambda *a, **k: print(*a, file=sys.stderr, **k))
    say(
        f"SGAP: {ds.n_images} faces of {ds.n_subjects} background people "
        f"({args.min_faces}-{args.max_faces} images each), λ = {', '.join(f'{c.lam:g}' for c in configs)}, "
        f"{configs[0].epochs} epochs"
    )
    rows: list[dict[str, Any]] = []
    for cfg in configs:
        out = args.out if len(configs) == 1 else args.out / f"lambda-{cfg.lam:g}"
        t0 = time.perf_counter()
        with Progress(f"SGAP λ={cfg.lam:g} (steps)", enabled=show) as bar:
            result = train_sgap(
                ds.images, ds.labels, cfg, checkpoint_dir=out, resume=args.resume, progress=bar, log=say
            )
        report = write_model(result, ds.images, ds.labels, out, population)
        ach = report["achieved"]
        row = {
            "lambda": cfg.lam,
            "out": str(out),
            "ssim_floor": cfg.ssim_floor,
            "ssim_train_mean": ach["ssim_train"]["mean"],
            "ssim_train_min": ach["ssim_train"]["min"],
            "ssim_train_fraction_ok": ach["ssim_train"]["fraction_at_or_above_floor"],
            "ssim_held_out_mean": ach["ssim_held_out"]["mean"],
            "held_out_d_accuracy_real": ach["held_out"]["val_d_accuracy_real"],
            "held_out_d_accuracy_privatized": ach["held_out"]["val_d_accuracy_privatized"],
            "held_out_fooling_rate": ach["held_out"]["val_fooling_rate"],
            "onnx_max_abs_difference": report["onnx"]["max_abs_difference_vs_torch"],
            "onnx_ms_per_face": report["onnx"]["ms_per_face_single"],
            "seconds": time.perf_counter() - t0,
        }
        rows.append(row)
        say(
            f"λ={cfg.lam:g}: {out / 'sgap.onnx'}; SSIM train mean {row['ssim_train_mean']:.3f} min "
            f"{row['ssim_train_min']:.3f} (floor {cfg.ssim_floor:.3f}), held-out discriminator accuracy "
            f"{row['held_out_d_accuracy_real']:.3f} real / {row['held_out_d_accuracy_privatized']:.3f} privatized, "
            f"fooling rate {row['held_out_fooling_rate']:.3f}; ONNX vs torch max |Δ| "
            f"{row['onnx_max_abs_difference']:.1e}, {row['onnx_ms_per_face']:.2f} ms/face; {row['seconds']:.0f}s"
        )
    if len(configs) > 1:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps({"population": population, "rows": rows}, indent=2) + "\n")
        _plot_sweep(rows, args.out / "sweep.png")
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], default=float))
    return 0


def _plot_sweep(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lam = [r["lambda"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(lam, [r["ssim_held_out_mean"] for r in rows], "o-", label="SSIM (held out, mean)")
    ax.plot(lam, [r["held_out_fooling_rate"] for r in rows], "s-", label="fooling rate (held out)")
    ax.plot(lam, [r["held_out_d_accuracy_privatized"] for r in rows], "^-", label="D accuracy, privatized")
    ax.set_xlabel("λ (SSIM floor 1 − λ)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("SGAP λ sweep (held-out background people)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
