"""``peep qbbs ...``: the soft-biometric query module's evaluation and admin commands.

``evaluate`` reproduces the chapter's experiments (``DIR/qbbs.json`` and PNG
plots). ``enrol``, ``query``, ``odometer`` and ``erase`` act on the store and
ledger named by a QBBS configuration (a TOML file, or the ``[qbbs]`` table of
``server.toml``); running them needs file access to the store, i.e. the
service account -- that is the admin credential on the command line (the
gRPC service checks a bearer token instead).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
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


def _trait_value(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE such as age=42, received {text!r}")
    try:
        return name.strip(), float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number after '=', received {text!r}") from exc


def register(sub: Any) -> None:
    from peep.server.recognition.fitting import DEFAULT_PRESET, PRESETS

    p = sub.add_parser("qbbs", help="soft-biometric query module: evaluation and admin commands")
    q = p.add_subparsers(dest="qbbs_command", metavar="ACTION", required=True)

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

    def admin(name: str, help_text: str) -> argparse.ArgumentParser:
        a: argparse.ArgumentParser = q.add_parser(name, help=help_text)
        a.add_argument("--config", required=True, help="QBBS configuration TOML (or server.toml with a [qbbs] table)")
        return a

    a = admin("enrol", help_text="store a subject's soft traits")
    a.add_argument("--subject", required=True)
    a.add_argument(
        "--trait",
        type=_trait_value,
        action="append",
        required=True,
        metavar="NAME=VALUE",
        help="repeat per trait, e.g. --trait age=42 --trait height=180",
    )
    a.set_defaults(handler=enrol)
    a = admin("query", help_text="one permissible query (spends the subject's ε)")
    a.add_argument("--subject", required=True)
    a.add_argument("--trait", required=True)
    a.set_defaults(handler=query)
    a = admin("odometer", help_text="cumulative ε of a subject (or every subject) and the spend audit log")
    a.add_argument("--subject", default=None)
    a.add_argument("--log", action="store_true", help="print the audit log (JSON lines)")
    a.set_defaults(handler=odometer)
    a = admin("erase", help_text="delete a subject's soft traits (the spend ledger is kept)")
    a.add_argument("--subject", required=True)
    a.set_defaults(handler=erase)


def _config(path: str | None, **overrides: Any) -> Any:
    from peep.server.config.qbbs import load_qbbs_config

    try:
        return load_qbbs_config(path, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        raise UsageError(f"--config: {exc}") from exc


def _module(args: argparse.Namespace) -> Any:
    from peep.server.qbbs import QbbsModule, QueryStructureChangedError

    cfg = _config(args.config)
    if cfg.store_path is None or cfg.ledger_path is None:
        raise UsageError(
            f"--config {args.config}: expected store_path and ledger_path (an in-memory store would be lost)"
        )
    try:
        return QbbsModule(cfg)
    except QueryStructureChangedError as exc:
        raise UsageError(f"--config {args.config}: {exc}") from exc


def evaluate(args: argparse.Namespace) -> int:
    from peep.core.mechanisms import MECHANISM_KINDS, mechanism_class
    from peep.server.datasets import DatasetError
    from peep.server.progress import progress_printer
    from peep.server.qbbs.evaluation import DEFAULT_SWEEP, EvaluateOptions, run_evaluation

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


def enrol(args: argparse.Namespace) -> int:
    from peep.server.qbbs import QbbsError

    traits: dict[str, float] = {}
    for name, value in args.trait:
        if name in traits:
            raise UsageError(f"--trait: expected each trait once, received {name!r} twice")
        traits[name] = value
    with _module(args) as module:
        try:
            n = module.enrol(args.subject, traits)
        except QbbsError as exc:
            raise UsageError(f"--trait: {exc}") from exc
    print(f"enrolled {n} soft trait(s) for {args.subject!r}")
    return 0


def query(args: argparse.Namespace) -> int:
    from peep.core.exceptions import BudgetError
    from peep.server.qbbs import QbbsError

    with _module(args) as module:
        try:
            r = module.query(args.subject, args.trait, requester="cli")
        except BudgetError as exc:
            print(f"peep qbbs query: refused: {exc}", file=sys.stderr)
            return 1
        except QbbsError as exc:
            raise UsageError(str(exc)) from exc
        cap = module.config.epsilon_cap
    print(
        f"{r.subject} {r.trait}: Y' = {r.value:.6g} (noise sd {r.noise_std:.4g}, Δf {r.sensitivity:g}, "
        f"{r.responses} SUM responses); ε spent {r.epsilon_spent:g}, total {r.epsilon_total:g} of {cap:g}"
    )
    return 0


def odometer(args: argparse.Namespace) -> int:
    from peep.server.qbbs import QbbsError

    with _module(args) as module:
        try:
            entries = module.audit_log(args.subject)
            subjects = [args.subject] if args.subject else list(dict.fromkeys(e["subject"] for e in entries))
            readings = [module.odometer(s) for s in subjects]
        except QbbsError as exc:
            raise UsageError(str(exc)) from exc
    for r in readings:
        print(
            f"{r.subject}: ε {r.epsilon_spent:g} of {r.epsilon_cap:g} ({r.releases} releases, "
            f"{r.epsilon_remaining:g} left)"
        )
    if not readings:
        print("no spends recorded")
    if args.log:
        for e in entries:
            print(json.dumps(e))
    return 0


def erase(args: argparse.Namespace) -> int:
    with _module(args) as module:
        n = module.erase(args.subject)
    if n == 0:
        # A mistyped id must not read as done: say nothing was there (the spend ledger is untouched either way).
        print(f"peep qbbs erase: no soft traits of {args.subject[:64]!r} are stored; nothing erased", file=sys.stderr)
        return 1
    print(f"erased {n} soft trait(s) of {args.subject!r}")
    return 0
