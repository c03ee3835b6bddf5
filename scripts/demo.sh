#!/usr/bin/env bash
# The main job on a fresh machine: creates the venv (.venv, or $PEEP_VENV), installs what `peep demo`
# needs (scripts/bootstrap.sh demo: no PyTorch, no dev tools), stages the LFW data home (or uses
# $SCIKIT_LEARN_DATA / --data-home), runs `peep demo`.
# Extra arguments go to `peep demo` (e.g. --out DIR, --mechanism peep --epsilon 8, --console).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="${PEEP_VENV:-$root/.venv}"
bash scripts/bootstrap.sh demo
if [ -z "${SCIKIT_LEARN_DATA:-}" ]; then
  if staged=$(bash scripts/stage-lfw.sh 2>/dev/null); then
    eval "$staged"
  else
    echo "demo.sh: no local LFW copy found; scikit-learn will download LFW where a network exists" >&2
  fi
fi
export SCIKIT_LEARN_DATA="${SCIKIT_LEARN_DATA:-}"
[ -n "$SCIKIT_LEARN_DATA" ] || unset SCIKIT_LEARN_DATA
exec "$venv/bin/peep" demo "$@"
