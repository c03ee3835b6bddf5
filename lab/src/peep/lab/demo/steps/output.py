"""The demo's output folder: emptied of an earlier run's state when a run starts, its results written at the end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from peep.lab.demo.logfile import LOG_FILE
from peep.server.errors import UsageError

# What a run leaves in --out that the next run must not build on (removed when it starts), and the file that
# marks a folder as the demo's own.
_RUN_STATE = ("server", "devices", "enrol", "videos", "summary.json", "releases.json", "verification.json",
              "door.json", "report.html", LOG_FILE)  # fmt: skip
_OUT_MARKER = ".peep-demo"


def fresh_out(out: Path) -> None:
    """Start from nothing in ``out`` (``--out``): an earlier run's database, device ledgers and spools are removed.

    A second run into the same folder used to enrol on top of the first (twice the templates, the
    devices' ε added up). Only a folder the demo marked as its own is cleared, and only what the demo
    writes there; the caches (age/gender estimates) and the bundle's signing key pair stay.

    Raises
    ------
    UsageError
        When ``out`` holds what a run leaves but is not a folder an earlier demo made.
    """
    marker = out / _OUT_MARKER
    made = [out / d for d in _RUN_STATE]
    if out.exists() and not marker.exists() and any(p.exists() for p in made):
        raise UsageError(
            f"--out {out}: holds {', '.join(p.name for p in made if p.exists())} but is not a folder an "
            "earlier peep demo made; choose a new or empty folder"
        )
    for p in made:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text("a peep demo output folder: each run replaces its server, devices and enrolments\n")


def write_results(
    out: Path, summary: dict[str, Any], releases: dict[str, dict[str, Any]], events: dict[str, Any]
) -> None:
    """Write ``summary.json``, ``releases.json`` and ``report.html`` in ``out``."""
    from peep.lab.demo.report import write_report

    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    # The ground truth of what the cameras released (who was in front of which camera when; never a
    # template): what the summary's figures and kept_templates.strangers are counted against.
    truth = [{k: v for k, v in r.items() if k != "payload"} | {"message_id": m} for m, r in releases.items()]
    (out / "releases.json").write_text(json.dumps(truth, indent=1) + "\n")
    write_report(summary, releases, events, out)
