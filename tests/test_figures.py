"""Every figure's legend is placed where it is drawn: matplotlib's default ``loc="best"`` searches the data for a
free corner, slowly on large plots, and warns when it took long — a warning that depends on how loaded the machine
is, which the suite (warnings as errors) would turn into a failure now and then."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / d / "src" for d in ("shared", "edge", "server", "lab")]


def _legends_without_a_place(sources: list[Path]) -> list[str]:
    found = []
    for src in sources:
        for path in sorted(src.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "legend"
                        and not any(k.arg == "loc" for k in node.keywords)):  # fmt: skip
                    found.append(f"{path.relative_to(src.parent)}:{node.lineno}")
    return found


def test_every_legend_names_its_place():
    assert _legends_without_a_place(SOURCES) == []


def test_the_check_names_a_legend_without_a_place(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "plots.py").write_text("ax.legend(fontsize=8, loc='upper right')\nax.legend(fontsize=8)\n")
    assert _legends_without_a_place([tmp_path / "src"]) == ["src/plots.py:2"]
