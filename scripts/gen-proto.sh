#!/usr/bin/env bash
# Regenerates shared/src/peep/v1 from proto/peep/v1 (never hand-edit the output).
# tests/core/test_proto_generated.py fails when the committed code is stale.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="${1:-$root/shared/src}"
py="${PYTHON:-$root/.venv/bin/python}"
"$py" -m grpc_tools.protoc -I "$root/proto" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$root"/proto/peep/v1/*.proto
