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
