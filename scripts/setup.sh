#!/usr/bin/env bash
# Installs what thetad needs on Debian 12 (only the packages that are missing, without their
# recommendations) and builds it into build/. Idempotent: a second run installs nothing and
# rebuilds only what changed.
#   scripts/setup.sh                  # the test suite's set: every package, every target
#   scripts/setup.sh --demo           # the demo's set: thetad and thetad-launch only
#   BUILD_DIR=/tmp/b scripts/setup.sh
# apt's output goes to BUILD_DIR/setup-apt.log; with --demo the build's too (setup-build.log),
# and the terminal gets a few lines of progress (a failure prints the log's last lines).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
demo=0
case "${1:-}" in
  --demo) demo=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--demo]" >&2; exit 2 ;;
esac

# What building and running thetad and its launcher needs, and the demo's plots. Debian's
# libtorch-dev brings most of the packages (its OpenCV dependencies among them): it is the
# LibTorch of Debian 12, CPU only (GPUs: docs/gpu.md).
packages=(build-essential cmake ccache
  libtorch-dev libopenmpi-dev openmpi-bin libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev
  python3-matplotlib)
# What the test suite adds: GoogleTest, the PyTorch references, the sanitizer and fuzzing
# compiler, shellcheck.
if [ "$demo" = 0 ]; then
  packages+=(git pkg-config libgtest-dev python3 python3-torch python3-numpy python3-yaml
    clang libclang-rt-14-dev shellcheck)
fi

mkdir -p "$build"
# Runs a step with its output in a log; on failure, shows the log's end and stops.
quietly() {
  local log=$1; shift
  if ! "$@" >> "$log" 2>&1; then
    echo "setup: failed: $*" >&2
    echo "setup: the last lines of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt_log="$build/setup-apt.log"
  : > "$apt_log"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  echo "setup: installing ${missing[*]} and what they depend on (log: $apt_log)"
  t0=$SECONDS
  quietly "$apt_log" "${sudo_cmd[@]}" apt-get update
  quietly "$apt_log" "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
  echo "setup: installed in $((SECONDS - t0)) s"
fi

jobs=$(nproc 2>/dev/null || echo 2)
if [ "$demo" = 1 ]; then
  # Only the daemon and the launcher. A configured build tree is kept as it is (scripts/test.sh's
  # has the tests; the build step reconfigures it when a CMakeLists.txt changed). A new one is
  # for the CPU (Debian's LibTorch has no CUDA), without the tests (no GoogleTest needed), and
  # compiles the LibTorch sources in a few batches (THETAD_UNITY_DAEMON): a cold build on 2
  # cores then takes about half the time.
  build_log="$build/setup-build.log"
  : > "$build_log"
  echo "setup: building thetad and thetad-launch in $build (log: $build_log)"
  t0=$SECONDS
  if [ ! -f "$build/CMakeCache.txt" ]; then
    quietly "$build_log" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTHETAD_BUILD_TESTS=OFF \
      -DTHETAD_ENABLE_CUDA=OFF -DTHETAD_UNITY_DAEMON=ON
  fi
  quietly "$build_log" cmake --build "$build" -j "$jobs" --target thetad thetad-launch
  echo "setup: built in $((SECONDS - t0)) s"
else
  # The suite's configuration, whatever a demo build left in the tree. A new tree compiles the
  # LibTorch sources in unity batches, as the demo's does (a newcomer's cold build: each LibTorch
  # source costs ~25 s of headers on two cores); a tree configured before keeps its choice (one
  # source per unit rebuilds faster after an edit: -DTHETAD_UNITY_DAEMON=OFF).
  unity=()
  [ -f "$build/CMakeCache.txt" ] || unity=(-DTHETAD_UNITY_DAEMON=ON)
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTHETAD_BUILD_TESTS=ON -DTHETAD_ENABLE_CUDA=ON "${unity[@]}"
  cmake --build "$build" -j "$jobs"
  echo "setup: built $build/daemon/thetad"
fi
