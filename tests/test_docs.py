"""Documentation that is generated from code stays current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-config-docs.py"), "--check"], capture_output=True)
    assert r.returncode == 0, "docs/CONFIG.md is stale: run .venv/bin/python scripts/gen-config-docs.py"


def test_readme_names_the_two_setup_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_cli_contract_command_is_documented():
    readme = (ROOT / "README.md").read_text()
    for cmd in (
        "peep keys generate", "peep bundle build", "peep bundle verify", "peep serve", "peep train", "peep audit",
        "peep qbbs evaluate", "peep bench", "peep demo", "peep-edge run", "peep-edge enroll", "peep-edge bundle verify",
    ):  # fmt: skip
        assert cmd in readme, cmd
