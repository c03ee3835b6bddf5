"""``peep audit``: utility and strong-adversary privacy evaluation of a mechanism."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from peep.core.mechanisms import mechanism_class
from peep.core.projections import projection_kinds
from peep.server.errors import UsageError


def _list(cast: Callable[[str], Any], option: str) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        if text.strip().lower() in ("", "none"):
            return ()
        try:
            values = tuple(cast(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {cast.__name__} values such as 1,4,8, received {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one value, received {text!r}")
        return values

    parse.__name__ = f"{option} list"
    return parse


def register(sub: Any) -> None:
    """Add ``peep audit`` to the subcommand parser ``sub``.

    The options are added in the order ``--help`` lists them, one small function per concern.
    """
    from peep.lab.audit.config import AuditConfig

    d = AuditConfig()
    p = sub.add_parser(
        "audit",
        help="measure utility and what strong adversaries achieve, vs epsilon",
        description="Utility (accuracy, weighted P/R/F1) and attacks (reconstruction, parrot linkage, "
        "averaging, membership inference, identity mixture, linkage of strangers' appearances from what the "
        "server keeps) vs epsilon; writes OUT/audit.json, PNG plots and a self-contained OUT/report.html.",
    )
    _add_data_options(p, d)
    _add_mechanism_options(p)
    _add_projection_options(p, d)
    # --help lists options in the order they were added, so these stay where the help has always shown them
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"random stratified splits (default {d.repeats})")
    p.add_argument(
        "--frontier",
        action="store_true",
        help="also search projection × nc × mechanism × bounds for the best accuracy at each per-vector ε",
    )
    p.add_argument(
        "--normalisation",
        choices=("detector", "lfw-crop"),
        default=d.normalisation,
        help="face crop: the edge agent's detector path (default) or scikit-learn's fixed LFW crop "
        "(as in the PEEP paper)",
    )
    p.add_argument(
        "--delta", type=float, default=d.delta, help=f"δ, for kinds that take one, gaussian-l2 (default {d.delta:g})"
    )
    p.add_argument("--out", required=True, help="output directory")
    g = p.add_argument_group("protocol")
    _add_basis_options(g, d)
    _add_recogniser_options(g, d)
    _add_sweep_options(g, d)
    _add_attack_options(g, d)
    _add_frontier_options(g, d)
    _add_bystander_options(g, d)
    _add_protection_options(g)
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    _register_open_set(p, d)
    p.set_defaults(handler=handler)


# Each ``_add_*`` function below adds one concern's options to ``p`` (the parser) or ``g`` (the
# "protocol" group); ``d`` is a default AuditConfig, the source of every default the help shows.


def _add_data_options(p: Any, d: Any) -> None:
    """What is audited: the dataset and which of its identities."""
    p.add_argument("--dataset", required=True, help="'lfw' or a folder-per-identity image directory")
    p.add_argument(
        "--data-home", default=None, help="scikit-learn data home holding lfw_home/ (default: $SCIKIT_LEARN_DATA)"
    )
    p.add_argument(
        "--min-faces", type=int, default=d.min_faces, help=f"identities with at least N images (default {d.min_faces})"
    )


def _add_mechanism_options(p: Any) -> None:
    """The privacy mechanism and the ε values it is audited at."""
    from peep.core.mechanisms import MECHANISM_KINDS
    from peep.lab.audit.config import DEFAULT_EPSILONS

    p.add_argument("--mechanism", required=True, choices=MECHANISM_KINDS, help="the privacy mechanism to audit")
    p.add_argument(
        "--epsilons",
        type=_list(float, "--epsilons"),
        default=DEFAULT_EPSILONS,
        metavar="LIST",
        help="ε values, comma-separated (the mechanism's parameter: per coordinate for peep and "
        "peep-raw, per vector otherwise; reports show both) (default "
        + ",".join(f"{e:g}" for e in DEFAULT_EPSILONS)
        + ")",
    )


def _add_projection_options(p: Any, d: Any) -> None:
    """What a template is: the projection and its dimension."""
    p.add_argument(
        "--projection",
        choices=projection_kinds(),
        default=d.projection,
        help="what a template is (default eigenfaces, the paper's; fisherfaces needs --basis background)",
    )
    p.add_argument(
        "--components",
        type=int,
        default=d.components,
        help=f"dimension of a template: nc eigenfaces or K Fisherfaces (default {d.components})",
    )


def _add_basis_options(g: Any, d: Any) -> None:
    """Whose faces the projection and bounds are fitted on."""
    g.add_argument(
        "--basis",
        choices=("train", "background"),
        default=d.basis,
        help="fit the projection and bounds on each split's training part (default, as the paper) or on a "
        "disjoint public background (as a deployed bundle): every LFW identity in the data home that is not "
        "audited (for lfw, the people with 5 to min-faces - 1 images)",
    )
    g.add_argument(
        "--mirror",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fit the projection on the basis faces' mirror images too (default: on for fisherfaces)",
    )
    g.add_argument(
        "--background-max-faces",
        type=int,
        default=None,
        metavar="N",
        help="with --basis background: only LFW people with at most N images (default: min-faces - 1 for lfw)",
    )


def _add_recogniser_options(g: Any, d: Any) -> None:
    """The splits, the recogniser trained on them, the noise and the workers that run it all."""
    from peep.server.recognition.presets import PRESETS

    g.add_argument("--test-size", type=float, default=d.test_size, help=f"held-out fraction (default {d.test_size})")
    g.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=d.preset,
        help=f"recogniser preset, trained by the server's own training code (default {d.preset}, the server's "
        "default; 'reference' is the MLP behind the eigenface table of docs/AUDIT.md)",
    )
    g.add_argument(
        "--hidden",
        type=int,
        default=None,
        help="one hidden layer of N units instead of the MLP preset's layers (default: the preset's)",
    )
    g.add_argument("--seed", type=int, default=d.seed, help="seed of splits, recognisers and simulated noise")
    g.add_argument(
        "--secure-noise",
        action="store_true",
        help="draw noise from the secure sampler a device uses (slower, not reproducible) instead "
        "of the seeded simulation sampler",
    )
    g.add_argument("--jobs", type=int, default=d.jobs, help="worker processes (default: one per CPU)")


def _add_sweep_options(g: Any, d: Any) -> None:
    """The utility-vs-components and utility-vs-images curves."""
    g.add_argument(
        "--sweep-components",
        type=_list(int, "--sweep-components"),
        default=d.sweep_components,
        metavar="LIST",
        help="nc values of the utility-vs-components curve ('none' to skip)",
    )
    g.add_argument(
        "--sweep-images",
        type=_list(int, "--sweep-images"),
        default=d.sweep_images,
        metavar="LIST",
        help="training images per subject of the utility-vs-images curve ('none' to skip)",
    )
    g.add_argument(
        "--sweep-epsilon",
        type=float,
        default=None,
        help="ε of the private curve in both sweeps (default 8 if listed, else the median)",
    )


def _add_attack_options(g: Any, d: Any) -> None:
    """The linkage candidate sets and the averaging attack's numbers of releases."""
    g.add_argument(
        "--subset-sizes",
        type=_list(int, "--subset-sizes"),
        default=d.subset_sizes,
        metavar="LIST",
        help="reduced candidate-set sizes for linkage (default 3,5,10)",
    )
    g.add_argument(
        "--averaging",
        type=_list(int, "--averaging"),
        default=d.averaging,
        metavar="LIST",
        help="extra numbers of averaged releases (1, 5 and 20 are always measured)",
    )


def _add_frontier_options(g: Any, d: Any) -> None:
    """What ``--frontier`` searches."""
    from peep.lab.audit.config import DEFAULT_FRONTIER_EPSILONS

    g.add_argument(
        "--frontier-epsilons",
        type=_list(float, "--frontier-epsilons"),
        default=DEFAULT_FRONTIER_EPSILONS,
        metavar="LIST",
        help="per-vector ε of the frontier",
    )
    g.add_argument(
        "--frontier-components",
        type=_list(int, "--frontier-components"),
        default=d.frontier_components,
        metavar="LIST",
        help="nc values the frontier searches",
    )
    g.add_argument(
        "--frontier-projections",
        type=_list(str.strip, "--frontier-projections"),
        default=(),
        metavar="LIST",
        help="projections the frontier searches (default: every one the basis allows)",
    )


def _add_bystander_options(g: Any, d: Any) -> None:
    """The bystander section: whether it runs, and its decision mode's label mechanism."""
    g.add_argument(
        "--no-bystander",
        action="store_true",
        help="skip the bystander section (how well an operator holding what the server kept, with "
        "recognition.keep = all and = none, links a stranger's appearances; strangers are LFW people outside "
        "the audited ones)",
    )
    g.add_argument(
        "--bystander-label-epsilons",
        type=_list(float, "--bystander-label-epsilons"),
        default=None,
        metavar="LIST",
        help="the bystander section's decision mode: ε of the k-ary randomized response a device releases each "
        "decision through (the labels are all the server keeps of a stranger; default "
        + ",".join(f"{e:g}" for e in d.bystander_label_epsilons)
        + "; the decision without a label mechanism is measured too)",
    )


def _add_protection_options(g: Any) -> None:
    """The template-protection section (site keys)."""
    g.add_argument(
        "--site-keys",
        type=int,
        default=0,
        metavar="N",
        help="template protection: N sites each with its own site key (simulated); reports accuracy with and "
        "without the key, cross-site unlinkability (D_sys), retrieval without the key, and attacks that estimate "
        "the key (insider pairs, the public background, moments alone); privunit, privunit-g or gaussian-l2",
    )


_OPEN_SET_DESCRIPTION = (
    "--open-set measures 1:N identification as NIST FRVT does: FNIR (enrolled people's probes not named as "
    "themselves) at a fixed FPIR (strangers named as someone), for the server deciding on a released query "
    "(today) and for a device that runs the same model on its clean projection and releases only the decision "
    "through k-ary randomized response at each --open-set-label-epsilons value (and without label noise). "
    "Its people follow its own rule, whatever --min-faces: LFW people with at least 26 images enrolled (20 "
    "enrolment releases at the audited ε, 6 probes each), one-capture strangers from the 5-9 image people; "
    "of the public (everyone else), the background class (releases: the model's unknown class) takes the "
    "shares --open-set-background-rare and --open-set-background-frequent; LFW's one-image people (where "
    "lfw_singles/ is found) calibrate the device's thresholds and give a second stranger population, dealt "
    "per split, and the public people the background class does not take are left out (without the singles, "
    "they calibrate with every photo, each person weighing alike); the projection is fitted on the background "
    "people only. --open-set-enrol-sweep also measures models learning from fewer enrolment releases. "
    "Infeasible rows (the label mechanism alone names more strangers "
    "than the "
    "FPIR target allows) are measured and marked. "
    "Needs --dataset lfw; writes open_set[] and open_set_setup to audit.json, a plot and a report section."
)


def _register_open_set(p: Any, d: Any) -> None:
    """The ``--open-set`` section's options (every one but ``--open-set`` itself needs it)."""
    g = p.add_argument_group("open set", _OPEN_SET_DESCRIPTION)
    g.add_argument("--open-set", action="store_true", help="add the open-set identification section")
    _add_open_set_people_options(g, d)
    _add_open_set_decision_options(g, d)
    _add_open_set_public_options(g, d)
    g.add_argument(
        "--open-set-label-draws",
        type=int,
        default=None,
        metavar="N",
        help=f"independent label releases per decision, averaged (default {d.open_set_label_draws})",
    )


# The ``--open-set-*`` options default to None: the config then applies its own default, and refuses any
# option given without ``--open-set``, by name; ``d`` only supplies the defaults the help shows.


def _add_open_set_people_options(g: Any, d: Any) -> None:
    """Who is enrolled and who is a stranger, and the template dimensions measured."""
    g.add_argument(
        "--open-set-enrolled",
        type=int,
        default=None,
        metavar="N",
        help=f"enrolled people per split (default {d.open_set_enrolled})",
    )
    g.add_argument(
        "--open-set-strangers",
        type=int,
        default=None,
        metavar="N",
        help=f"one-capture strangers per split, LFW people with 5-9 images (default {d.open_set_strangers})",
    )
    g.add_argument(
        "--open-set-single-strangers",
        type=int,
        default=None,
        metavar="N",
        help="one-capture strangers per split drawn from LFW's one-image people, a second stranger population "
        f"(with --open-set-calibration singles; default {d.open_set_single_strangers})",
    )
    g.add_argument(
        "--open-set-enrol-sweep",
        type=_list(int, "--open-set-enrol-sweep"),
        default=None,
        metavar="LIST",
        help="enrolment releases per person also measured, each below the 20 enrolled ('none': no sweep; default "
        + ",".join(str(n) for n in d.open_set_enrol_sweep)
        + ")",
    )
    g.add_argument(
        "--open-set-components",
        type=_list(int, "--open-set-components"),
        default=None,
        metavar="LIST",
        help="template dimensions K measured, e.g. 16,32 (default: --components)",
    )


def _add_open_set_decision_options(g: Any, d: Any) -> None:
    """How a decision is released and judged: label noise, FPIR and FAR targets, recogniser presets."""
    from peep.server.recognition.presets import PRESETS

    g.add_argument(
        "--open-set-label-epsilons",
        type=_list(float, "--open-set-label-epsilons"),
        default=None,
        metavar="LIST",
        help="ε of the device's randomized response on the decision label ('none': only the decision without "
        "label noise, which is always measured) (default "
        + ",".join(f"{e:g}" for e in d.open_set_label_epsilons)
        + ")",
    )
    g.add_argument(
        "--open-set-fpir",
        type=_list(float, "--open-set-fpir"),
        default=None,
        metavar="LIST",
        help="FPIR targets (default " + ",".join(f"{t:g}" for t in d.open_set_fpir) + ")",
    )
    g.add_argument(
        "--open-set-far",
        type=float,
        default=None,
        help=f"FAR target of the door's verification (default {d.open_set_far:g})",
    )
    g.add_argument(
        "--open-set-presets",
        type=_list(str.strip, "--open-set-presets"),
        default=None,
        metavar="LIST",
        help=f"recogniser presets measured, among {', '.join(PRESETS)} (default "
        + ",".join(d.open_set_presets)
        + "; the report names the one with the lower FNIR on clean queries)",
    )


def _add_open_set_public_options(g: Any, d: Any) -> None:
    """How the public people divide between the model's background class and calibration, and the basis."""
    from peep.lab.audit.config import OPEN_SET_CALIBRATIONS

    g.add_argument(
        "--open-set-background-rare",
        type=float,
        default=None,
        metavar="SHARE",
        help="share of the public people with 5-9 images (the strangers' range) in the model's background class; "
        f"the rest calibrate the device's thresholds (default {d.open_set_background_rare:g})",
    )
    g.add_argument(
        "--open-set-background-frequent",
        type=float,
        default=None,
        metavar="SHARE",
        help="share of the other public people (photographed more often, not enrolled) in the background class; "
        f"the rest calibrate, with every photo (default {d.open_set_background_frequent:g})",
    )
    g.add_argument(
        "--open-set-calibration",
        choices=OPEN_SET_CALIBRATIONS,
        default=None,
        help="who sets the device's thresholds: LFW's one-image people (singles; lfw_singles/ in the data home or "
        "$PEEP_DATASETS), the public LFW people the background class does not take (public), or the singles when "
        "the folder is found (auto, the default)",
    )
    g.add_argument(
        "--open-set-calibration-people",
        type=int,
        default=None,
        metavar="N",
        help=f"calibration people per split with the singles (default {d.open_set_calibration_people})",
    )
    g.add_argument(
        "--open-set-basis",
        choices=("background", "public"),
        default=None,
        help="whose faces the projection is fitted on: the background people only (default), so that calibration "
        "faces are as new to it as strangers', or every public person",
    )


#: ``--open-set-*`` options, named as the AuditConfig fields they set (None on the command line: the default).
_OPEN_SET_OPTIONS = (
    "open_set_enrolled",
    "open_set_strangers",
    "open_set_components",
    "open_set_label_epsilons",
    "open_set_fpir",
    "open_set_far",
    "open_set_presets",
    "open_set_label_draws",
    "open_set_background_rare",
    "open_set_background_frequent",
    "open_set_basis",
    "open_set_calibration",
    "open_set_calibration_people",
    "open_set_single_strangers",
    "open_set_enrol_sweep",
)


def handler(args: argparse.Namespace) -> int:
    from peep.lab.audit.config import AuditConfig, AuditConfigError
    from peep.lab.audit.run import run_audit
    from peep.server.datasets import DatasetError

    # Only the open-set options given: the config refuses any of them without --open-set, by name.
    open_set: dict[str, Any] = {f: v for f in _OPEN_SET_OPTIONS if (v := getattr(args, f)) is not None}
    try:
        cfg = AuditConfig(
            dataset=args.dataset,
            data_home=args.data_home,
            min_faces=args.min_faces,
            normalisation=args.normalisation,
            mechanism=args.mechanism,
            epsilons=tuple(sorted(args.epsilons)),
            delta=args.delta,
            projection=args.projection,
            components=args.components,
            repeats=args.repeats,
            test_size=args.test_size,
            preset=args.preset,
            hidden=args.hidden,
            basis=args.basis,
            background_max_faces=args.background_max_faces,
            mirror=args.mirror,
            seed=args.seed,
            secure_noise=args.secure_noise,
            jobs=args.jobs,
            sweep_components=tuple(args.sweep_components),
            sweep_images=tuple(args.sweep_images),
            sweep_epsilon=args.sweep_epsilon,
            subset_sizes=tuple(args.subset_sizes),
            averaging=tuple(args.averaging),
            frontier=args.frontier,
            frontier_epsilons=tuple(args.frontier_epsilons),
            frontier_components=tuple(args.frontier_components),
            frontier_projections=tuple(args.frontier_projections),
            bystander=not args.no_bystander,
            **(
                {}
                if args.bystander_label_epsilons is None
                else {"bystander_label_epsilons": args.bystander_label_epsilons}
            ),
            site_keys=args.site_keys,
            progress=not args.no_progress,
            open_set=args.open_set,
            **open_set,
        )
    except AuditConfigError as exc:
        raise UsageError(str(exc)) from exc
    try:
        if cfg.open_set and cfg.open_set_calibration == "auto":
            # Recorded resolved, so that the reproduction command asks for the population this run used.
            from peep.lab.audit.open_set import resolve_calibration

            cfg = dataclasses.replace(cfg, open_set_calibration=resolve_calibration(cfg)[0])
        result = run_audit(cfg, command=command_line(cfg, args.out))
    except (AuditConfigError, DatasetError) as exc:
        raise UsageError(str(exc)) from exc
    report = result.write(args.out)
    print(summary(result.data), file=sys.stdout)
    print(f"wrote {args.out}/audit.json, {len(result.data['plots'])} plots and {report}", file=sys.stdout)
    return 0


def command_line(cfg: Any, out: str) -> list[str]:
    """An equivalent ``peep audit`` command (recorded in audit.json for reproduction)."""
    return [
        *_core_arguments(cfg),
        *_optional_arguments(cfg),
        *_open_set_arguments(cfg),
        *_frontier_arguments(cfg),
        "--out",
        out,
    ]


def _join(v: Any) -> str:
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)


def _core_arguments(cfg: Any) -> list[str]:
    """The options every recorded command spells out, whatever their value."""
    return [
        "peep",
        "audit",
        "--dataset",
        cfg.dataset,
        "--min-faces",
        str(cfg.min_faces),
        "--mechanism",
        cfg.mechanism,
        "--epsilons",
        _join(cfg.epsilons),
        "--projection",
        cfg.projection,
        "--components",
        str(cfg.components),
        "--repeats",
        str(cfg.repeats),
        "--normalisation",
        cfg.normalisation,
        "--basis",
        cfg.basis,
        *(["--background-max-faces", str(cfg.background_max_faces)] if cfg.background_max_faces is not None else []),
        *([] if cfg.mirror is None else ["--mirror" if cfg.mirror else "--no-mirror"]),
        "--seed",
        str(cfg.seed),
        "--preset",
        cfg.preset,
        "--test-size",
        f"{cfg.test_size:g}",
        "--sweep-components",
        _join(cfg.sweep_components) or "none",
        "--sweep-images",
        _join(cfg.sweep_images) or "none",
        "--subset-sizes",
        _join(cfg.subset_sizes),
        "--averaging",
        _join(cfg.averaging),
    ]


def _optional_arguments(cfg: Any) -> list[str]:
    """The options recorded only where they apply or differ from their default."""
    cmd: list[str] = []
    if cfg.hidden is not None:
        cmd += ["--hidden", str(cfg.hidden)]
    if cfg.data_home:
        cmd += ["--data-home", cfg.data_home]
    if mechanism_class(cfg.mechanism).takes_delta:
        cmd += ["--delta", f"{cfg.delta:g}"]
    if cfg.sweep_epsilon is not None:
        cmd += ["--sweep-epsilon", f"{cfg.sweep_epsilon:g}"]
    if cfg.secure_noise:
        cmd.append("--secure-noise")
    if not cfg.bystander:
        cmd.append("--no-bystander")
    else:
        cmd += ["--bystander-label-epsilons", _join(cfg.bystander_label_epsilons) or "none"]
    if cfg.site_keys:
        cmd += ["--site-keys", str(cfg.site_keys)]
    return cmd


def _open_set_arguments(cfg: Any) -> list[str]:
    """The open-set section's options, each at the value the run used (none without ``--open-set``)."""
    if not cfg.open_set:
        return []
    return [
        "--open-set",
        "--open-set-enrolled",
        str(cfg.open_set_enrolled),
        "--open-set-strangers",
        str(cfg.open_set_strangers),
        "--open-set-components",
        _join(cfg.open_set_dimensions),
        "--open-set-label-epsilons",
        _join(cfg.open_set_label_epsilons) or "none",
        "--open-set-fpir",
        _join(cfg.open_set_fpir),
        "--open-set-far",
        f"{cfg.open_set_far:g}",
        "--open-set-presets",
        ",".join(cfg.open_set_presets),
        "--open-set-label-draws",
        str(cfg.open_set_label_draws),
        "--open-set-background-rare",
        f"{cfg.open_set_background_rare:g}",
        "--open-set-background-frequent",
        f"{cfg.open_set_background_frequent:g}",
        "--open-set-basis",
        cfg.open_set_basis,
        "--open-set-calibration",
        cfg.open_set_calibration,
        "--open-set-calibration-people",
        str(cfg.open_set_calibration_people),
        "--open-set-single-strangers",
        str(cfg.open_set_single_strangers),
        "--open-set-enrol-sweep",
        _join(cfg.open_set_enrol_sweep) or "none",
    ]


def _frontier_arguments(cfg: Any) -> list[str]:
    """The frontier's options, the projections it searched spelled out (none without ``--frontier``)."""
    if not cfg.frontier:
        return []
    return [
        "--frontier",
        "--frontier-epsilons",
        _join(cfg.frontier_epsilons),
        "--frontier-components",
        _join(cfg.frontier_components),
        "--frontier-projections",
        ",".join(cfg.searched_projections),
    ]


def _decision_summary(labels: list[dict[str, Any]]) -> str:
    """Decision mode's linkage per ε_label: precision / recall / F1 of the best label linker."""
    parts = []
    for r in labels:
        eps = "no label noise" if r["epsilon_label"] is None else f"ε_label {r['epsilon_label']:g}"
        best = r["best"]
        parts.append(f"{eps} {_frac(best['precision'])} / {_frac(best['recall'])} / {_frac(best['f1'])}")
    return "; ".join(parts)


def summary(audit: dict[str, Any]) -> str:
    """A plain-text table of the headline numbers."""
    np_ = audit["no_privacy"]
    lines = [
        f"peep audit: {audit['mechanism']['kind']}, {audit.get('projection', 'eigenfaces')} nc={audit['components']}, "
        "recogniser preset "
        f"{audit['protocol']['preset']}, {audit['dataset']['n_subjects']} "
        f"identities / {audit['dataset']['n_images']} images, {audit['protocol']['repeats']} splits, "
        f"sampler={audit['sampler']['name']}, {audit['timing']['wall_seconds']:.0f} s wall / "
        f"{audit['timing']['cpu_seconds']:.0f} s CPU",
        f"  no privacy: accuracy {np_['accuracy']:.3f} ± {np_['std']['accuracy']:.3f}, "
        f"chance (majority) {audit['chance']['majority']:.3f}",
        f"  {'ε':>8} {'ε/coord':>9} {'ε/vector':>10} {'accuracy':>15} {'bal.acc':>7} {'linkage':>7} "
        f"{'avg20':>6} {'SSIM':>6} {'re-id':>6} {'MIA':>5}",
    ]
    for r in audit["results"]:
        lines.append(
            f"  {r['epsilon']:>8.4g} {r['epsilon_coordinate']:>9.4g} {r['epsilon_vector']:>10.5g} "
            f"{r['accuracy']:>7.3f} ± {r['std']['accuracy']:.3f} {r['balanced_accuracy']:>7.3f} "
            f"{r['linkage']['max']:>7.3f} {r['averaging']['20']:>6.3f} {r['reconstruction_ssim']:>6.3f} "
            f"{r['reconstruction_reid']:>6.3f} {r['membership_auc']:>5.2f}"
        )
    by = audit.get("bystander")
    if by:
        lines.append(
            "  bystanders (pairwise precision / recall / F1 of linking a stranger's appearances; chance precision, "
            "chance F1)"
        )
        for b in by:
            best, ev = b["keep_all"]["best"], b["keep_none"]["events"]
            lines.append(
                f"  {b['epsilon']:>8.4g} ε/vector {b['epsilon_vector']:<8.5g} keep=all ({best['method']}): "
                f"{_frac(best['precision'])} / {_frac(best['recall'])} / {_frac(best['f1'])}; keep=none "
                f"(events, {ev['method']}): {_frac(ev['precision'])} / {_frac(ev['recall'])} / {_frac(ev['f1'])}; "
                f"chance {b['chance_precision']:.3f}, {b['chance_f1']:.3f}"
            )
            labels = (b.get("keep_decision") or {}).get("per_label") or []
            if labels:
                lines.append("           decision mode, linked by released label: " + _decision_summary(labels))
    tp = audit.get("template_protection")
    if tp:
        lines.append(
            "  template protection (site keys): accuracy unkeyed → keyed; D_sys same key / other key; retrieval "
            "re-id with / without the key (chance); attacks' re-id"
        )
        for t in tp:
            a = t["attacks"]
            insider = ", ".join(f"k={p['k']}: {_frac(p['reid'])}" for p in a["insider_procrustes"]) or "n/a"
            photos = ", ".join(f"{p['photos']}: {_frac(p['reid'])}" for p in a["insider_procrustes_photos"]) or "n/a"
            lines.append(
                f"  {t['epsilon']:>8.4g} ε/vector {t['epsilon_vector']:<8.5g} accuracy {t['accuracy_unkeyed']:.3f} → "
                f"{t['accuracy_keyed']:.3f}; D_sys {t['dsys_same_key']:.3f} / {t['dsys_cross_key']:.3f} "
                f"({t['unlinkability_people']:.0f} people); re-id {t['retrieval_reid_with_key']:.3f} / "
                f"{t['retrieval_reid_without_key']:.3f} ({t['chance']:.3f})"
            )
            lines.append(
                f"           insider, known people: {insider}; known photos of one: {photos}; public background: "
                f"{_frac(a['public_background']['reid'])}; moments only: {_frac(a['distribution_only']['reid'])}"
            )
            lines.append(
                f"           renewal: a model under a new key, accuracy {t['renewal_accuracy_new_key']:.3f} on its "
                f"key's captures, {t['renewal_accuracy_old_key']:.3f} on the old key's"
            )
    lines += _open_set_summary(audit)
    fr = audit.get("frontier")
    if fr:
        lines.append("  frontier (per-vector ε: best configuration → accuracy; paper mode accuracy)")
        for p in fr["points"]:
            c = p["best"]["configuration"]
            lines.append(
                f"  {p['epsilon_vector']:>8.5g}: {c['mechanism']} {c.get('projection', 'eigenfaces')} "
                f"nc={c['n_components']} {c['bounds']} → "
                f"{p['best']['accuracy']:.3f} ± {p['best']['std']['accuracy']:.3f}; paper mode "
                f"{p['paper_mode']['accuracy']:.3f}"
            )
    return "\n".join(lines)


def _open_set_summary(audit: dict[str, Any]) -> list[str]:
    """The open-set section's lines: FNIR (FPIR) per mode, preset and ε_label at each FPIR target."""
    rows = audit.get("open_set")
    if not rows:
        return []
    cal = ((audit.get("open_set_setup") or {}).get("calibration") or {}).get("population", "public")
    lines = [
        "  open set (NIST FRVT 1:N): FNIR (released FPIR) at each FPIR target; * = target infeasible; device "
        + (
            "thresholds set on LFW's one-image people"
            if cal == "singles"
            else "thresholds set on public LFW people (no lfw_singles/)"
        )
    ]
    for r in rows:
        label = "" if r["mode"] == "server" else " no label noise" if r["epsilon_label"] is None else (
            f" ε_label {r['epsilon_label']:g}"
        )  # fmt: skip
        door = "" if r.get("gar_at_far") is None else f"; door GAR {r['gar_at_far']:.3f} at FAR {r['far_target']:g}"
        single = "" if r.get("fpir_single") is None else f", one-image strangers {r['fpir_single']:.4f}"
        lines.append(
            f"  K={r['n_components']} ε={r['epsilon_template']:g} {r['mode']:>6} {r['preset']:<8} FPIR "
            f"{r['fpir_target']:g}{'' if r['feasible'] else '*'}:{label} FNIR {r['fnir']:.3f} ± {r['std']['fnir']:.3f} "
            f"(FPIR {r['fpir']:.4f}{single}){door}"
        )
    choice = (audit.get("open_set_setup") or {}).get("decision_preset")
    if choice:
        margin = "" if choice["margin"] is None else f" by {choice['margin']:.3f}"
        lines.append(f"  preset for decision mode (lowest FNIR on clean queries): {choice['winner']}{margin}")
    return lines


def _frac(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"
