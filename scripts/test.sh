#!/usr/bin/env bash
# The README's second command (and CI's): set up, build, and run the whole test suite (ctest,
# both cores; docs/architecture.md, "Tests"), then a bounded fuzzing run of the parsers
# (scripts/fuzz.sh). Says at the end how long each part took.
#   FUZZ_SECONDS=0 scripts/test.sh   # skip fuzzing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
"$root/scripts/setup.sh"
built=$SECONDS
ctest --test-dir "${BUILD_DIR:-$root/build}" --output-on-failure -j 2 --timeout 900
tested=$SECONDS
if [ "${FUZZ_SECONDS:-30}" -gt 0 ] && [ -x "$root/scripts/fuzz.sh" ]; then
  "$root/scripts/fuzz.sh" "${FUZZ_SECONDS:-30}"
fi
echo "test.sh: set-up and build $((built - start)) s, tests $((tested - built)) s," \
     "fuzzing $((SECONDS - tested)) s, in all $((SECONDS - start)) s"
