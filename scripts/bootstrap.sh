#!/usr/bin/env bash
# Creates the venv (.venv, or $PEEP_VENV; Python >= 3.11) and installs the PEEP distributions (editable)
# with what one job needs:
#
#   bash scripts/bootstrap.sh [all]   everything the tests need (scripts/test.sh, .ci/run): every extra of
#                                     peep-server and of peep-lab (OpenDP for the bench, PyTorch for
#                                     `peep sgap train`), the dev tools, Debian's Chromium for the
#                                     console's browser tests, and the `ha` step below
#   bash scripts/bootstrap.sh demo    what `peep demo` needs (scripts/demo.sh): peep-lab without its extras
#                                     (no OpenDP, no PyTorch), the edge agent with age/gender and dlib, and
#                                     the console (`peep demo --console`); no dev tools, no Chromium
#   bash scripts/bootstrap.sh ha      a real Home Assistant for the tests that run against one
#                                     (peep.lab.processes.homeassistant): its own venv, .venv-ha at the
#                                     checkout's root (or $PEEP_HA_VENV), with the exact locked set of
#                                     lab/homeassistant/requirements-*.txt, bytecode compiled (lab/homeassistant/)
#
# A backend needs neither: `pip install ./shared ./server` is the serving install (README.md, deploy/).
#   bash scripts/bootstrap.sh --print demo|all|ha
#                                     prints that set's pip arguments, one a line, and changes nothing
#
# Idempotent: installs only when the set's pyproject.toml files or its pip arguments changed since its last
# successful run here. The sets have their own stamps and `all` contains `demo`, so a venv made by
# scripts/demo.sh gets the rest when scripts/test.sh runs later, and one made for the tests is never
# reinstalled for the demo. The Home Assistant venv has its own stamp (its requirements file and interpreter).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="${PEEP_VENV:-$root/.venv}"
ha_venv="${PEEP_HA_VENV:-$root/.venv-ha}"
# The Home Assistant the tests run: 2024.3.3 is the newest whose Requires-Python admits 3.11, this machine's
# Python (lab/homeassistant/README.md).
ha_python=3.11
ha_requirements=lab/homeassistant/requirements-2024.3.3.txt
# What `uv pip sync` takes: the file itself (pip, the fallback, reads it with -r).
ha_pkgs=("$ha_requirements")

usage() { echo "usage: bash scripts/bootstrap.sh [--print] [all|demo|ha]" >&2; exit 2; }
print=0
if [ "${1:-}" = --print ]; then print=1; shift; fi
[ $# -le 1 ] || usage
set_name="${1:-all}"
# peep-lab depends on peep-server and peep-edge[soft]; every local distribution is named so that pip takes the
# local folders (the edge with [door]: gpiozero, which the door's GPIO lock and its tests use).
demo_pkgs=(-e ./shared -e "./edge[soft,dlib,door]" -e "./server[dlib,console]" -e "./lab[dlib]")
all_pkgs=(-e ./shared -e "./edge[soft,dlib,door]" -e "./server[dlib,console]" -e "./lab[bench,dlib,sgap]" --group dev)
case "$set_name" in
  demo) pkgs=("${demo_pkgs[@]}") ;;
  all) pkgs=("${all_pkgs[@]}") ;;
  ha) pkgs=("${ha_pkgs[@]}") ;;
  *) usage ;;
esac
if [ "$print" = 1 ]; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi

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

# Runs a long quiet command with a line every 10 s on stderr (a terminal or a CI log): never a silent minute.
with_heartbeat() {
  local what=$1 t0=$SECONDS pid rc
  shift
  "$@" &
  pid=$!
  while ! wait_for "$pid" 10; do
    echo "bootstrap: $what ... $((SECONDS - t0)) s" >&2
  done
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" != 0 ] || echo "bootstrap: $what: done in $((SECONDS - t0)) s" >&2
  return "$rc"
}
# True once process $1 has ended, false after $2 seconds while it still runs.
wait_for() {
  local i
  for ((i = 0; i < $2 * 5; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.2
  done
  ! kill -0 "$1" 2>/dev/null
}

if [ ! -x "$venv/bin/python" ]; then
  py=$(pick_python)
  echo "bootstrap: creating $venv with $py" >&2
  "$py" -m venv "$venv"
fi

# Debian packages some tests drive: installed when missing (root with apt-get, as on CI's machines); elsewhere
# say how, and those tests say why they skip. apt_install WHAT BINARY PACKAGE...
apt_install() {
  what=$1; binary=$2; shift 2
  [ -x "$binary" ] && return 0
  # A library (not executable) is there when its file is.
  case $binary in *.so|*.so.*) [ -f "$binary" ] && return 0 ;; esac
  apt_get "$what" "$@"
}
# apt_get WHAT PACKAGE...: the install itself, for a need no single file stands for.
apt_get() {
  what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing $* ($what)" >&2
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }) \
      || echo "bootstrap: could not install $*; the $what will skip" >&2
  else
    echo "bootstrap: $* missing (apt-get install $*); the $what will skip" >&2
  fi
}
if [ "$set_name" = all ]; then
  # The console's browser tests (tests/console) drive Debian's Chromium through its chromedriver (which
  # needs chromium: one binary stands for both).
  apt_install "console's browser tests" /usr/bin/chromedriver chromium chromium-driver
  # The replicas' balancer tests and bench run the shipped deploy/cluster/haproxy.cfg.
  apt_install "balancer tests (deploy/cluster/haproxy.cfg)" /usr/sbin/haproxy haproxy
  # The soak's clock_step fault steps a camera's wall clock with libfaketime (LD_PRELOAD): a library, under the
  # architecture's folder, so its path is looked up rather than named.
  # (`|| true`: under pipefail a missing library would otherwise end the script here, silently.)
  faketime_lib=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n 1 || true)
  apt_install "soak's clock_step fault (libfaketime)" "${faketime_lib:-/usr/lib/faketime/libfaketime.so.1}" libfaketime
  # The RTSP tests (tests/edge/test_rtsp.py) serve H.264 from GStreamer's RTSP server under Debian's Python:
  # its bindings and the elements the server uses (appsrc: base, rtph264pay: good, x264enc: ugly), checked
  # the way the server loads them rather than by a file.
  rtsp_probe="import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0')
from gi.repository import Gst, GstRtspServer
Gst.init(None)
assert all(Gst.ElementFactory.find(e) for e in ('appsrc', 'x264enc', 'rtph264pay'))"
  if ! /usr/bin/python3 -c "$rtsp_probe" >/dev/null 2>&1; then
    apt_get "RTSP tests (GStreamer's RTSP server)" python3-gi gir1.2-gst-rtsp-server-1.0 \
      gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly
  fi
fi

# uv installs the same set as pip in a third of its time (a fresh venv with warm caches: 22 s against 66 s, the
# whole set, measured back to back), so it is fetched into the venv and used; pip is the fallback where uv cannot
# be had, and PEEP_INSTALLER=pip forces it. uv reads no pip configuration: pip's own (`pip config list`: indexes,
# find-links, constraints, from files and PIP_* variables) is handed to it, with pip's rule of taking the best
# version across every index.
uv_args() {
  "$venv/bin/python" - <<'PY'
import ast, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf = {}
for line in out.splitlines():  # files first, then the environment: later lines win, as in pip
    key, sep, value = line.partition("=")
    if sep:
        conf[key.split(".", 1)[-1]] = ast.literal_eval(value)
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
args = ["--index-strategy", "unsafe-best-match"]
for key, flag in flags.items():
    for v in conf.get(key, "").split():
        args += [flag, v]
if conf.get("no-index", "").lower() in ("1", "true", "yes", "on"):
    args.append("--no-index")
print("\n".join(args))
PY
}
installer=${PEEP_INSTALLER:-uv}
if [ "$installer" = uv ] && ! "$venv/bin/python" -m uv --version >/dev/null 2>&1; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 || installer=pip
fi

# install_main: the PEEP distributions into $venv (the set $set_name, ${pkgs[@]}).
install_main() {
  # `all` keeps the stamp name earlier versions of this script wrote for the same set.
  stamp_all="$venv/.peep-installed"
  stamp_demo="$venv/.peep-installed-demo"
  # A set's stamp: the five pyproject.toml files and its pip arguments (set name first).
  stamp_of() {
    { cat pyproject.toml shared/pyproject.toml edge/pyproject.toml server/pyproject.toml lab/pyproject.toml; printf '%s\n' "$@"; } \
      | sha256sum | cut -d' ' -f1
  }
  if [ "$set_name" = demo ]; then stamp=$stamp_demo; else stamp=$stamp_all; fi
  want=$(stamp_of "$set_name" "${pkgs[@]}")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  if [ "$set_name" = demo ]; then
    # Everything the tests need includes the demo's set.
    if [ -f "$stamp_all" ] && [ "$(cat "$stamp_all")" = "$(stamp_of all "${all_pkgs[@]}")" ]; then
      return 0
    fi
    echo "bootstrap: installing what peep demo needs into $venv (peep-core, peep-edge[soft,dlib,door]," \
      "peep-server[dlib,console], peep-lab[dlib]; the tests' extras and tools come with scripts/test.sh)" >&2
  else
    echo "bootstrap: installing peep-core, peep-edge[soft,dlib,door], peep-server[dlib,console], peep-lab[bench,dlib,sgap]" \
      "and dev tools into $venv" >&2
  fi
  if [ "$installer" = uv ]; then
    mapfile -t from < <(uv_args)
    # Bytecode: for the demo's set it is compiled now (where PYTHONDONTWRITEBYTECODE is set, each process would
    # otherwise compile scikit-learn, SciPy, gRPC... afresh: 4.3 s of CPU per server start instead of 1.8 s);
    # the tests' set leaves it to the first import, which scripts/test.sh lets write it (compiling the whole set
    # up front, PyTorch included, took 21 s of the install's 43).
    compile=()
    [ "$set_name" = demo ] && compile=(--compile-bytecode)
    with_heartbeat "installing (uv)" "$venv/bin/python" -m uv pip install --quiet --python "$venv/bin/python" \
      ${compile[@]+"${compile[@]}"} "${from[@]}" "${pkgs[@]}"
  else
    # pip >= 25.1 reads --group (the dev tools); the demo's set does not need it, nor the time its upgrade takes.
    if [ "$set_name" = all ]; then
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=25.1"
    fi
    # pip byte-compiles what it installs, for the reason given above.
    with_heartbeat "installing (pip)" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pkgs[@]}"
  fi
  echo "$want" > "$stamp"
}

# install_ha: Home Assistant into its own venv, never into $venv (its pins, aiohttp's, cryptography's..., are not
# the project's). The interpreter is $venv's own, so both run on the Python this checkout was set up with.
install_ha() {
  local base version want_ha stamp_ha
  # --clear below empties the folder: never one that holds anything but a venv.
  if [ -e "$ha_venv" ] && [ ! -f "$ha_venv/pyvenv.cfg" ] && [ -n "$(ls -A "$ha_venv" 2>/dev/null || echo x)" ]; then
    echo "bootstrap: $ha_venv exists and is no venv; move it away or set PEEP_HA_VENV" >&2
    return 1
  fi
  base=$("$venv/bin/python" -c 'import sys; print(sys._base_executable)')
  version=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$version" != "$ha_python" ]; then
    echo "bootstrap: $ha_requirements is locked for Python $ha_python, $venv runs $version ($base);" \
      "the Home Assistant tests will skip" >&2
    [ "$set_name" != ha ] || return 1
    return 0
  fi
  stamp_ha="$ha_venv/.peep-installed-ha"
  want_ha=$({ cat "$ha_requirements"; echo "$base"; printf '%s\n' "${ha_pkgs[@]}"; } | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp_ha" ] && [ "$(cat "$stamp_ha")" = "$want_ha" ] && [ -x "$ha_venv/bin/hass" ]; then
    return 0
  fi
  # A venv whose interpreter is gone or another one cannot take the set: made afresh.
  if ! "$ha_venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, sys.argv[1].split("."))))' \
    "$ha_python" 2>/dev/null; then
    echo "bootstrap: creating $ha_venv with $base" >&2
    "$base" -m venv --clear --without-pip "$ha_venv"
  fi
  echo "bootstrap: installing Home Assistant (exactly $ha_requirements) into $ha_venv" >&2
  if [ "$installer" = uv ]; then
    mapfile -t from < <(uv_args)
    # sync, not install: exactly the locked set, so a changed file also removes what it no longer names.
    # Bytecode is compiled now: without it each first start of hass compiles its thousands of modules (20 s to
    # RUNNING instead of 4, measured), and a test's timeout would pay for it.
    with_heartbeat "installing Home Assistant (uv)" "$venv/bin/python" -m uv pip sync --quiet \
      --python "$ha_venv/bin/python" --compile-bytecode "${from[@]}" "${ha_pkgs[@]}"
  else
    [ -x "$ha_venv/bin/pip" ] || "$ha_venv/bin/python" -m ensurepip --upgrade >/dev/null
    # pip byte-compiles what it installs.
    with_heartbeat "installing Home Assistant (pip)" "$ha_venv/bin/python" -m pip install --quiet \
      --disable-pip-version-check -r "$ha_requirements"
  fi
  echo "$want_ha" > "$stamp_ha"
}

case "$set_name" in
  demo) install_main ;;
  # Home Assistant first: its quick checks (a PEEP_HA_VENV that is no venv) fail before the long install, not after.
  all) install_ha; install_main ;;
  ha) install_ha ;;
esac
