"""peep-server without its extra `demo` (so without peep-edge): the commands that run
the edge agent say which extra to install instead of failing on an import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# `peep` as a server-only install sees it: importing peep.edge fails as if it were absent.
WITHOUT_EDGE = (
    "import sys; sys.modules['peep.edge'] = None; from peep.server.cli import main; sys.exit(main(sys.argv[1:]))"
)
HINT = "pip install 'peep-server[demo]'"


def _peep_without_edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EDGE, *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_demo_without_peep_edge_is_a_usage_error_naming_the_extra(tmp_path):
    out = tmp_path / "demo"
    r = _peep_without_edge("demo", "--data-home", str(tmp_path / "no-lfw"), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert HINT in r.stderr and "peep-edge is not installed" in r.stderr
    assert not out.exists()  # refused before doing anything


def test_bench_edge_section_without_peep_edge_records_the_extra(tmp_path):
    out = tmp_path / "bench.json"
    r = _peep_without_edge("bench", "--quick", "--sections", "edge", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert HINT in r.stderr
    assert HINT in json.loads(out.read_text())["edge"]["error"]
