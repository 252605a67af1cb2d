#!/usr/bin/env bash
# Installs what thetad needs on Debian 12 (only the packages that are missing) and builds it into
# build/. Idempotent: a second run installs nothing and rebuilds only what changed.
#   scripts/setup.sh            # Release build in build/
#   BUILD_DIR=/tmp/b scripts/setup.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

packages=(build-essential cmake git pkg-config
  libtorch-dev libopenmpi-dev openmpi-bin libspdlog-dev libyaml-cpp-dev libgtest-dev nlohmann-json3-dev zlib1g-dev
  python3 python3-torch python3-numpy python3-yaml python3-matplotlib
  clang libclang-rt-14-dev shellcheck ccache)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"
echo "setup: built $build/daemon/thetad"
