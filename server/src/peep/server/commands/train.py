"""``peep train --config server.toml [--preset paper|default]``: train and promote a model version."""

from __future__ import annotations

import argparse
import json
from typing import Any

from peep.server.commands._config import add_config_option, load, say, services
from peep.server.recognition.presets import PRESETS


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train a recogniser on the stored perturbed templates and promote it")
    add_config_option(p)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="model preset (default: training.preset)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=train)


def train(args: argparse.Namespace) -> int:
    from peep.server.progress import progress_printer
    from peep.server.recognition.presets import TrainingError
    from peep.server.recognition.thresholds import calibration_summary

    config = load(args)
    s = services(config)
    try:
        try:
            r = s.train(args.preset, progress=progress_printer("training (epochs)"))
        except TrainingError as exc:
            print(f"peep train: {exc}")
            return 1
        device_model = device_model_line(s)
    finally:
        s.close()
    if args.json:
        say(
            json.dumps(
                {
                    "version": r.version,
                    "validation_accuracy": r.validation_accuracy,
                    "n_templates": r.n_templates,
                    "n_subjects": r.n_subjects,
                    "seconds": r.seconds,
                    "metrics": r.metrics,
                    "device_model": device_model,
                },
                default=str,
            )
        )
    else:
        say(
            f"model {r.version} promoted: {r.n_subjects} subjects, {r.n_templates} templates, "
            f"validation accuracy {r.validation_accuracy:.3f}, {r.seconds:.1f} s"
        )
        summary = calibration_summary(r.metrics)
        if summary:
            say(f"  {summary}")
        say(f"  {device_model}")
    return 0


def device_model_line(s: Any) -> str:
    """One line on the device model the promotion issued, or why none was."""
    dm = s.device_models
    if not dm.enabled:
        return f"device models: none issued ({dm.disabled_reason})"
    st = dm.status()
    newest = st["newest"]
    if st["last_error"]:
        return f"device models: none issued for this model ({st['last_error']})"
    if newest is None:
        return "device models: none issued yet"
    return f"device model serial {newest.serial} issued ({newest.subjects} subjects, {newest.erased} erased)"
