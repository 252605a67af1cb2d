#!/usr/bin/env bash
# The README's second command (and CI's): set up, build, and run the whole test suite (ctest),
# then a bounded fuzzing run of the job loader and the .npy header parser.
#   FUZZ_SECONDS=0 scripts/test.sh   # skip fuzzing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
ctest --test-dir "${BUILD_DIR:-$root/build}" --output-on-failure -j 2 --timeout 900
if [ "${FUZZ_SECONDS:-30}" -gt 0 ] && [ -x "$root/scripts/fuzz.sh" ]; then
  "$root/scripts/fuzz.sh" "${FUZZ_SECONDS:-30}"
fi
