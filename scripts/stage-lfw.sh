#!/usr/bin/env bash
# Prints a writable scikit-learn data home whose lfw_home/ links to a read-only
# LFW copy in scikit-learn's layout (and lfw_singles/ to the copy's one-image people, if it has them) (scikit-learn writes a cache next to the
# images, so the read-only folder itself cannot be the data home). Never writes
# into the copy.
# Usage: eval "$(bash scripts/stage-lfw.sh [TARGET [SOURCE]])"  -> exports SCIKIT_LEARN_DATA
#   TARGET  data home to create (default .data/scikit_learn_data in the repository)
#   SOURCE  folder holding lfw_home/lfw_funneled/; default: $PEEP_DATASETS, then
#           ../shared/datasets next to the repository, then next to the local checkout
#           it was cloned from (a clone in a temporary folder)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target="${1:-$root/.data/scikit_learn_data}"
if [ $# -ge 2 ]; then
  candidates=("$2")
else
  candidates=()
  [ -z "${PEEP_DATASETS:-}" ] || candidates+=("$PEEP_DATASETS")
  candidates+=("$(cd "$root/.." && pwd)/shared/datasets")
  # A clone made elsewhere (a temporary folder) of a local checkout: next to the checkout it came from.
  origin=$(git -C "$root" remote get-url origin 2>/dev/null || true)
  if [ -n "$origin" ] && [ -d "$origin" ]; then candidates+=("$(cd "$origin/.." && pwd)/shared/datasets"); fi
fi
src=""
for c in "${candidates[@]}"; do
  if [ -d "$c/lfw_home/lfw_funneled" ]; then src=$(cd "$c" && pwd); break; fi
done
if [ -z "$src" ]; then
  looked=""
  for c in "${candidates[@]}"; do looked="$looked${looked:+, }$c/lfw_home/lfw_funneled"; done
  echo "stage-lfw: no LFW copy found; looked for $looked (give the folder as the second argument or set PEEP_DATASETS)" >&2
  exit 1
fi
mkdir -p "$target/lfw_home"
target=$(cd "$target" && pwd)
for f in "$src/lfw_home/"*; do
  name=$(basename "$f")
  [ -e "$target/lfw_home/$name" ] || ln -s "$f" "$target/lfw_home/$name"
done
# LFW's one-image people (the calibration population of open-set thresholds), beside lfw_home/ when present.
if [ -d "$src/lfw_singles" ] && [ ! -e "$target/lfw_singles" ]; then ln -s "$src/lfw_singles" "$target/lfw_singles"; fi
echo "export SCIKIT_LEARN_DATA='$target'"
