#!/usr/bin/env bash
# Prints a writable scikit-learn data home whose lfw_home/ links to the team's
# read-only LFW copy (scikit-learn writes a cache next to the images, so the
# read-only folder itself cannot be the data home). Never writes into it.
# Usage: eval "$(bash scripts/stage-lfw.sh [DIR])"  -> exports SCIKIT_LEARN_DATA
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target="${1:-$root/.data/scikit_learn_data}"
src=""
for c in "${PEEP_DATASETS:-}" "$root/../shared/datasets" "/work/shared/datasets"; do
  [ -n "$c" ] || continue
  if [ -d "$c/lfw_home/lfw_funneled" ]; then src=$(cd "$c" && pwd); break; fi
done
if [ -z "$src" ]; then
  echo "stage-lfw: no LFW copy found (looked in \$PEEP_DATASETS, ../shared/datasets, /work/shared/datasets)" >&2
  exit 1
fi
mkdir -p "$target/lfw_home"
for f in "$src/lfw_home/"*; do
  name=$(basename "$f")
  [ -e "$target/lfw_home/$name" ] || ln -s "$f" "$target/lfw_home/$name"
done
echo "export SCIKIT_LEARN_DATA='$target'"
