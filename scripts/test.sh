#!/usr/bin/env bash
# The whole test suite on a fresh machine: creates the venv (.venv, or $PEEP_VENV), installs
# everything the tests need (scripts/bootstrap.sh all), stages the LFW data home, runs pytest.
# Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="${PEEP_VENV:-$root/.venv}"
bash scripts/bootstrap.sh all
if [ -z "${SCIKIT_LEARN_DATA:-}" ]; then
  eval "$(bash scripts/stage-lfw.sh)"
fi
export SCIKIT_LEARN_DATA
set +e
"$venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
