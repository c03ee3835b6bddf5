"""The committed peep/v1 code is exactly what proto/ generates (never stale, never hand-edited)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path):
    protos = sorted((REPO / "proto" / "peep" / "v1").glob("*.proto"))
    assert protos, "no .proto files found"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            *map(str, protos),
        ],
        check=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed_dir = REPO / "shared" / "src"
    assert generated, "protoc generated nothing"
    stale = [str(rel) for rel in generated if (committed_dir / rel).read_bytes() != (tmp_path / rel).read_bytes()]
    assert not stale, f"regenerate with scripts/gen-proto.sh: stale {stale}"
    committed = {p.relative_to(committed_dir) for p in (committed_dir / "peep" / "v1").glob("*_pb2*.py*")}
    assert committed == set(generated), f"committed files differ from generated: {committed ^ set(generated)}"
