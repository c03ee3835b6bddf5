"""Documentation that is generated from code stays current."""

from __future__ import annotations

import re
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
        "peep keys generate", "peep bundle build", "peep bundle verify", "peep serve", "peep mqtt retire", "peep train",
        "peep audit",
        "peep qbbs evaluate", "peep bench", "peep demo", "peep-edge run", "peep-edge enroll", "peep-edge bundle verify",
        "peep anonymize run", "peep anonymize evaluate", "peep sgap train",
    ):  # fmt: skip
        assert cmd in readme, cmd


def _project_texts() -> list[Path]:
    roots = ["shared/src", "edge/src", "server/src", "tests", "scripts", "deploy", "docs", ".ci"]
    files = [ROOT / "README.md", *(f for r in roots for f in (ROOT / r).rglob("*") if f.is_file())]
    return [f for f in files if f.suffix in {".py", ".md", ".sh", ".toml", ""} and f != Path(__file__).resolve()]


def test_design_documents_cited_are_in_the_repository():
    """The blueprint and conventions are cited as docs/DESIGN.md and docs/CONVENTIONS.md, which exist;
    nothing points at a team folder outside the repository."""
    outside = "/work/" + "shared"
    for f in _project_texts():
        text = f.read_text(errors="replace")
        rel = f.relative_to(ROOT)
        for page in re.findall(r"\bdocs/([\w-]+\.md)", text):
            assert (ROOT / "docs" / page).is_file(), f"{rel} cites docs/{page}, which does not exist"
        if rel.parts[0] != "docs":  # pages in docs/ link to each other relatively
            for doc in set(re.findall(r"\b(DESIGN|CONVENTIONS)\b", text)):
                assert f"docs/{doc}.md" in text, f"{rel} cites {doc} without its path docs/{doc}.md"
        assert outside not in text, f"{rel} refers to {outside}, outside the repository"
