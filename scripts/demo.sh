#!/usr/bin/env bash
# The main job on a fresh machine: creates the venv, installs, stages the LFW
# data home (or uses $SCIKIT_LEARN_DATA / --data-home), runs `peep demo`.
# Extra arguments go to `peep demo` (e.g. --out DIR, --mechanism peep --epsilon 8).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/bootstrap.sh
if [ -z "${SCIKIT_LEARN_DATA:-}" ]; then
  if staged=$(bash scripts/stage-lfw.sh 2>/dev/null); then
    eval "$staged"
  else
    echo "demo.sh: no local LFW copy found; scikit-learn will download LFW where a network exists" >&2
  fi
fi
export SCIKIT_LEARN_DATA="${SCIKIT_LEARN_DATA:-}"
[ -n "$SCIKIT_LEARN_DATA" ] || unset SCIKIT_LEARN_DATA
exec .venv/bin/peep demo "$@"
