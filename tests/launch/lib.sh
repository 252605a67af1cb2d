# The launcher tests' helpers (sourced), on the shell tests' one library (tests/lib/test_lib.sh:
# pass/fail/skip, wait_for, assert_grep, marker_pids, alive, no_leftovers, MPIRUN_FLAGS and the
# clean-up that kills every process carrying the test's marker). A launcher test fails fast:
# each of its steps needs the one before. $T is the test's temp dir ($WORK), whose name is the
# marker; $LAUNCHER the launcher under test.
# shellcheck shell=bash
TEST_FAIL_FAST=1
KEEP_WORK=${KEEP_WORK:-${KEEP_TEST_DIR:-}}
# shellcheck source=tests/lib/test_lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../lib" && pwd)/test_lib.sh"

LAUNCH_TEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LAUNCH_TEST_DIR/../.." && pwd)
# shellcheck disable=SC2034  # used by the scripts that source this file
LAUNCHER=${THETAD_LAUNCH:-$REPO_ROOT/launch/thetad-launch}
# shellcheck disable=SC2034
T=$WORK

# wait_exit PID LIMIT: waits for a background launcher (its stderr in
# $LERR); sets RC and ELAPSED.
# shellcheck disable=SC2034  # RC, ELAPSED: read by the scripts that source this file
wait_exit() {
  local pid=$1 limit=$2 start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS - start >= limit)); then
      { echo "---- the launcher's stderr, without step lines:"; grep -v '\] info: step ' "${LERR:-/dev/null}" | tail -n 30; } >&2
      fail "launcher still running after ${limit}s"
    fi
    sleep 0.1
  done
  RC=0
  wait "$pid" || RC=$?
  ELAPSED=$((SECONDS - start))
}
