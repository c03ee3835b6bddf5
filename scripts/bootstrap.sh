#!/usr/bin/env bash
# Creates .venv (Python >= 3.11) and installs the three PEEP distributions
# (editable) plus the dev tools. Idempotent: reinstalls only when a
# pyproject.toml changed since the last successful run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="${PEEP_VENV:-$root/.venv}"

pick_python() {
  for c in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  echo "bootstrap: need Python >= 3.11 (set PYTHON=...)" >&2
  return 1
}

if [ ! -x "$venv/bin/python" ]; then
  py=$(pick_python)
  echo "bootstrap: creating $venv with $py" >&2
  "$py" -m venv "$venv"
fi

# The console's browser tests (tests/console) drive Debian's Chromium through its chromedriver: install them
# when missing (root with apt-get, as on CI's machines); elsewhere say how, and those tests say why they skip.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing chromium and chromium-driver (console browser tests)" >&2
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }) \
      || echo "bootstrap: could not install chromium/chromium-driver; the console's browser tests will skip" >&2
  else
    echo "bootstrap: chromium and chromium-driver are missing (apt-get install chromium chromium-driver)" >&2
  fi
fi

stamp="$venv/.peep-installed"
want=$(cat pyproject.toml shared/pyproject.toml edge/pyproject.toml server/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "bootstrap: installing peep-core, peep-edge[soft,dlib], peep-server[demo,dlib,sgap,console] and dev tools into $venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=25.1"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -e ./shared -e "./edge[soft,dlib]" -e "./server[demo,dlib,sgap,console]" --group dev
echo "$want" > "$stamp"
