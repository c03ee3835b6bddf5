#!/usr/bin/env bash
# The whole test suite on a fresh machine: creates the venv (.venv, or $PEEP_VENV), installs
# everything the tests need (scripts/bootstrap.sh all), stages the LFW data home, runs pytest on
# several workers (pytest-xdist; PEEP_TEST_WORKERS, 4 by default: most of the suite waits on brokers,
# servers and subprocesses rather than computing, and 4 finished soonest on 2 cores; docs/DEVELOPING.md), then
# the tests marked quiet (a wall-clock latency) alone on one worker.
#
#   bash scripts/test.sh [--fast] [PYTEST ARGS...]
#     --fast   a developer's inner loop: leaves out the tests marked slow, soak, demo, bench, browser and
#              processes (CI runs everything). Extra arguments go to pytest (`-n 0` runs in one process).
set -euo pipefail
t0=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="${PEEP_VENV:-$root/.venv}"
bash scripts/bootstrap.sh all
if [ -z "${SCIKIT_LEARN_DATA:-}" ]; then
  eval "$(bash scripts/stage-lfw.sh)"
fi
export SCIKIT_LEARN_DATA
# The face cache (found faces and descriptors, keyed by each image file's bytes: peep.server.facecache) in the
# user's cache folder rather than in the data home: a fresh clone (CI's, a developer's second checkout) then
# describes the public faces once per machine, not once per clone. Tests of the cache itself use their own.
export PEEP_CACHE_DIR="${PEEP_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/peep}"
# One BLAS / OpenMP thread per process. The workers already keep both cores busy, and OpenBLAS's threads spin
# while they wait for work: on a loaded machine a test's eigendecomposition took 46 s of CPU with its default
# threads against 8 s with one (an LFW eigenfaces test, both cores busy). Set them to override.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
  MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# Bytecode is written (into .venv and the clone's __pycache__ folders, which git ignores) even where the
# environment says otherwise: with PYTHONDONTWRITEBYTECODE set, pytest rewrote every test module's asserts
# again in each worker (collection 14.8 s of CPU instead of 7.1) and each of the hundreds of server and device
# processes the suite starts compiled PEEP's own modules afresh.
unset PYTHONDONTWRITEBYTECODE
fast=()
args=()
for a in "$@"; do
  case $a in
    --fast) fast=(-m "not (slow or soak or demo or bench or browser or processes)") ;;
    *) args+=("$a") ;;
  esac
done
workers="${PEEP_TEST_WORKERS:-4}"
# The suite's wall time from this script's start (install included; .ci/run sets its own start), printed by tests/conftest.py above
# pytest's closing line.
export PEEP_TEST_STARTED_S="${PEEP_TEST_STARTED_S:-$(( $(date +%s) - (SECONDS - t0) ))}"
set +e
if [ ${#args[@]} -gt 0 ]; then
  # A selection of the developer's own: as asked, in one run.
  "$venv/bin/python" -m pytest -n "$workers" --dist loadgroup --durations=30 ${fast[@]+"${fast[@]}"} "${args[@]}"
  rc=$?
  quiet_rc=0
else
  # The tests that assert a wall-clock latency (marked quiet) run after the rest, alone on one worker: beside
  # the other workers' load the figure they check would be the machine's, not the code's.
  sel="not quiet"
  [ ${#fast[@]} -gt 0 ] && sel="not quiet and ${fast[1]}"
  "$venv/bin/python" -m pytest -n "$workers" --dist loadgroup --durations=30 -m "$sel"
  rc=$?
  sel="quiet"
  [ ${#fast[@]} -gt 0 ] && sel="quiet and ${fast[1]}"
  echo "test.sh: the tests marked quiet, on one worker"
  "$venv/bin/python" -m pytest -n 0 -m "$sel"
  quiet_rc=$?
  # --fast may leave no quiet test to run: that part is then empty, not failed.
  [ "$quiet_rc" -eq 5 ] && [ ${#fast[@]} -gt 0 ] && quiet_rc=0
fi
set -e
if [ "$rc" -eq 5 ] || [ "$quiet_rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
[ "$rc" -ne 0 ] && exit "$rc"
exit "$quiet_rc"
