"""No Python module in the repository is over 800 lines (generated protobuf code aside): past that a module
holds several things, and the next reader has to find the seam the writer did not cut."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 800
GENERATED = ("shared/src/peep/v1/",)


def long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path: lines`` of each tracked ``.py`` file over ``limit`` lines, generated code aside."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True)
    out = []
    for rel in tracked.stdout.split():
        if rel.startswith(GENERATED) or not (root / rel).is_file():
            continue
        n = len((root / rel).read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{rel}: {n} lines")
    return out


def test_no_module_is_over_800_lines():
    assert not long_modules(ROOT), "modules over 800 lines:\n" + "\n".join(long_modules(ROOT))


def test_the_check_names_a_long_module(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "short.py").write_text("x = 1\n" * 3)
    (tmp_path / "long.py").write_text("x = 1\n" * 5)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert long_modules(tmp_path, limit=4) == ["long.py: 5 lines"]
