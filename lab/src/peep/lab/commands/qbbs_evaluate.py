"""``peep qbbs evaluate``: the chapter's experiments on a dataset (``DIR/qbbs.json`` and PNG plots).

Lab: it runs :mod:`peep.lab.qbbs.evaluation` (age and gender estimates,
plots), so it needs the lab install; the ``qbbs`` command and its admin
actions (:mod:`peep.server.commands.qbbs`) are serving. :mod:`peep.server.cli`
adds this action to the actions that module's ``register`` returns.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from peep.server.errors import UsageError


def _epsilons(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 0.1,1,10, received {text!r}"
        ) from exc
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive finite numbers, received {text!r}")
    return values


def register(q: Any) -> None:
    """Add ``evaluate`` to the actions of ``peep qbbs`` (``q``)."""
    from peep.server.recognition.presets import DEFAULT_PRESET, PRESETS

    e = q.add_parser("evaluate", help="ROC, Deviation and Distortion of face + soft-trait fusion on a dataset")
    e.add_argument("--dataset", required=True, help="'lfw' or a folder-per-identity image directory")
    e.add_argument(
        "--data-home", default=None, help="scikit-learn data home holding lfw_home/ (default: $SCIKIT_LEARN_DATA)"
    )
    e.add_argument("--min-faces", type=int, default=20, help="identities with at least N images (default 20)")
    e.add_argument("--max-per-subject", type=int, default=None, help="use at most N images per identity (faster runs)")
    e.add_argument("--epsilon", type=float, required=True, help="ε of every SUM query response")
    e.add_argument(
        "--epsilons",
        type=_epsilons,
        default=None,
        help="ε sweep for Deviation/Distortion (default 0.1,0.3,1,3,10,30,100,300)",
    )
    e.add_argument("--config", default=None, help="QBBS configuration TOML (traits, widths, m, transform)")
    e.add_argument("--queries-per-trait", type=int, default=None, help="m, even >= 2 (overrides the config)")
    e.add_argument("--mechanism", default="peep-raw", help="template mechanism (default peep-raw)")
    e.add_argument("--template-epsilon", type=float, default=8.0, help="template mechanism's ε (default 8)")
    e.add_argument(
        "--template-delta", type=float, default=None, help="δ, for template kinds that take one (gaussian-l2)"
    )
    e.add_argument("--components", type=int, default=128, help="eigenfaces in the bundle (default 128)")
    e.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=DEFAULT_PRESET,
        help=f"face recogniser preset, trained by the server's own training code (default {DEFAULT_PRESET}, "
        "the server's default)",
    )
    e.add_argument("--seed", type=int, default=0, help="seed of the simulation (splits, noise, synthetic traits)")
    e.add_argument("--out", required=True, help="output directory (qbbs.json, *.png)")
    e.set_defaults(handler=evaluate)


def _config(path: str | None, **overrides: Any) -> Any:
    from peep.server.config.qbbs import load_qbbs_config

    try:
        return load_qbbs_config(path, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        raise UsageError(f"--config: {exc}") from exc


def evaluate(args: argparse.Namespace) -> int:
    from peep.core.mechanisms import MECHANISM_KINDS, mechanism_class
    from peep.lab.qbbs.evaluation import DEFAULT_SWEEP, EvaluateOptions, run_evaluation
    from peep.server.datasets import DatasetError
    from peep.server.progress import progress_printer

    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise UsageError(f"--epsilon: expected a positive finite number, received {args.epsilon}")
    if args.mechanism not in MECHANISM_KINDS:
        raise UsageError(f"--mechanism: expected one of {', '.join(MECHANISM_KINDS)}, received {args.mechanism!r}")
    if mechanism_class(args.mechanism).takes_delta and args.template_delta is None:
        raise UsageError(f"--template-delta: expected a δ in (0, 1) for --mechanism {args.mechanism}, received none")
    if args.components < 1:
        raise UsageError(f"--components: expected >= 1, received {args.components}")
    if args.seed < 0:
        raise UsageError(f"--seed: expected >= 0, received {args.seed}")
    cfg = _config(args.config, queries_per_trait=args.queries_per_trait, epsilon=args.epsilon)
    opts = EvaluateOptions(
        dataset=args.dataset,
        out=Path(args.out),
        epsilon=args.epsilon,
        data_home=args.data_home,
        min_faces=args.min_faces,
        max_per_subject=args.max_per_subject,
        mechanism=args.mechanism,
        template_epsilon=args.template_epsilon,
        template_delta=args.template_delta,
        components=args.components,
        epsilons=args.epsilons or DEFAULT_SWEEP,
        seed=args.seed,
        config=cfg,
        preset=args.preset,
    )
    try:
        result = run_evaluation(opts, progress=progress_printer)
    except DatasetError as exc:
        raise UsageError(str(exc)) from exc
    g = result["gar_at_far_1pct"]
    mech = result["face"]["mechanism"]
    print(f"QBBS evaluation -> {args.out}/qbbs.json ({result['runtime_s']:.0f} s)")
    print(
        f"  {result['dataset']['n_subjects']} subjects, {result['dataset']['n_images']} images; templates "
        f"{mech['kind']} ε={mech['epsilon']:g} ({mech['guarantee']}); recogniser (preset "
        f"{result['face']['recogniser']['preset']}) test accuracy {result['face']['recogniser']['test_accuracy']:.3f}"
    )
    print(
        f"  query noise: ε={args.epsilon:g} per response, "
        f"{result['query_structure']['epsilon_per_verification_all_traits']:g} per verification with all traits; "
        f"synthetic traits: {', '.join(result['synthetic']) or 'none'}"
    )
    print("  GAR at FAR = 1 %         no noise   noised")
    print(f"    face alone             {g['face']:.3f}")
    for n, row in g["per_trait"].items():
        print(f"    face + {n:<15} {row['face_trait']:.3f}      {row['face_trait_noised']:.3f}")
    print(
        f"    face + all traits      {g['face_all']:.3f}      {g['face_all_noised']:.3f}"
        f"   (chapter shared-noise: {g['face_all_noised_shared_noise']:.3f})"
    )
    dev, dist = result["deviation"], result["distortion"]
    i = dist["epsilons"].index(float(args.epsilon))
    print(
        f"  at ε={args.epsilon:g}: Deviation mean |Y' − Y| "
        + ", ".join(f"{n} {d['mean_abs'][i]:.3g}" for n, d in dev["traits"].items())
        + f"; Distortion (1/(m·n)) Σ (R − R') = {dist['mean_difference'][i]:.3g}, "
        f"(1/(m·n)) Σ (R − R')² = {dist['mean_squared_difference'][i]:.4g}"
    )
    return 0
