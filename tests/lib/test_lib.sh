# The shell tests' one library, sourced by every shell test (directly, or through its folder's
# lib.sh): a private temp dir, results that count, a skip that ctest reports as skipped, waits
# with a deadline, assertions on exit codes and logs, the mpirun flags of every multi-rank test,
# and a clean-up that leaves no process of the test behind.
#
#   source "$(dirname "$0")/../lib/test_lib.sh"
#   expect_code 0 first "$thetad" run job.yaml      # output in $WORK/first.log
#   expect_in first "final params hash"
#   wait_for 60 test -e "$WORK/ckpt/step-5" || fail "no checkpoint"
#   finish                                           # exit 0 only if nothing failed
#
# pass/fail record a result and go on; die fails and ends the test now; skip ends it as skipped
# (exit 77: every test's SKIP_RETURN_CODE, cmake/ThetadTesting.cmake). A test whose every step
# needs the one before sets TEST_FAIL_FAST=1 before sourcing: then fail ends the test as die
# does, and so does a wait_for that times out. However it ends, a test with a failure recorded
# never exits 0, and one that stops early on an error says so.
# shellcheck shell=bash
set -euo pipefail

TEST_SKIP_CODE=77
TEST_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thetad-test.XXXXXX")
# A word found only in this test's paths: a process whose command line carries it (its temp dir
# in the arguments) is the test's (marker_pids), and is killed when the test ends.
MARKER=$(basename "$WORK")
KEEP_WORK=${KEEP_WORK:-}
TEST_FAIL_FAST=${TEST_FAIL_FAST:-}
FAILS=0
PASSES=0
TEST_AT_EXIT=()
TEST_DONE=""

# The mpirun flags: the build's (ctest passes THETAD_TEST_MPIRUN_FLAGS), else the file's.
# shellcheck disable=SC2034  # used by the scripts that source this file
read -r -a MPIRUN_FLAGS <<<"${THETAD_TEST_MPIRUN_FLAGS:-$(grep -v '^#' "$TEST_LIB_DIR/mpirun.flags" | tr '\n' ' ')}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

pass() { echo "ok   $*"; PASSES=$((PASSES + 1)); }
fail() {
  echo "FAIL $*"
  FAILS=$((FAILS + 1))
  [ -z "$TEST_FAIL_FAST" ] || finish
}
die() {
  TEST_FAIL_FAST=1
  fail "$@"
}
skip() {
  echo "SKIP: $*"
  TEST_DONE=1
  exit "$TEST_SKIP_CODE"
}
# The results so far; exits 0 when nothing failed, 1 otherwise.
finish() {
  TEST_DONE=1
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" -eq 0 ] || exit 1
  exit 0
}
# at_exit CMD...: CMD runs when the test ends (before its processes are killed and $WORK removed).
at_exit() { TEST_AT_EXIT+=("$(printf '%q ' "$@")"); }

test_exit() {
  local rc=$? cmd pid
  set +e
  for cmd in "${TEST_AT_EXIT[@]}"; do eval "$cmd"; done
  for pid in $(marker_pids); do kill -KILL "$pid" 2>/dev/null; done
  if [ -n "$KEEP_WORK" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
  if [ -z "$TEST_DONE" ] && [ "$rc" -ne 0 ]; then
    echo "FAIL the test stopped early (exit $rc) after $PASSES passed, $FAILS failed"
  elif [ "$rc" -eq 0 ] && [ "$FAILS" -gt 0 ]; then
    echo "FAIL $FAILS failure(s) recorded"
    rc=1
  fi
  exit "$rc"
}
trap test_exit EXIT

# wait_for SECONDS CMD...: runs CMD every 0.1 s until it succeeds (returns 0) or SECONDS pass
# (returns 1, and the caller decides; with TEST_FAIL_FAST the test fails there).
wait_for() {
  local limit=$1; shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      [ -z "$TEST_FAIL_FAST" ] || die "timed out after ${limit}s waiting for: $*"
      return 1
    fi
    sleep 0.1
  done
}
# exists GLOB: a path matching GLOB exists (for wait_for).
exists() { compgen -G "$1" >/dev/null; }

# expect_code CODE NAME CMD...: runs CMD, its output in $WORK/NAME.log, checks its exit code
# (and says how long it took: where a test's time goes).
expect_code() {
  local want=$1 name=$2; shift 2
  local got=0 start=${EPOCHREALTIME/./} tenths
  "$@" > "$WORK/$name.log" 2>&1 || got=$?
  tenths=$(( (${EPOCHREALTIME/./} - start) / 100000 ))
  if [ "$got" -eq "$want" ]; then pass "$name (exit $got, $((tenths / 10)).$((tenths % 10)) s)"; else
    fail "$name: exit $got, expected $want"; tail -15 "$WORK/$name.log"; fi
}
# expect_in NAME PATTERN: the log of NAME has a line matching PATTERN (grep -E).
expect_in() {
  if grep -qE -- "$2" "$WORK/$1.log"; then pass "$1 says /$2/"; else
    fail "$1 lacks /$2/"; tail -15 "$WORK/$1.log"; fi
}
# expect_not_in NAME PATTERN: no line of NAME's log matches PATTERN.
expect_not_in() {
  if grep -qE -- "$2" "$WORK/$1.log"; then fail "$1 says /$2/"; grep -E -- "$2" "$WORK/$1.log" | head -5
  else pass "$1 does not say /$2/"; fi
}
# assert_grep PATTERN FILE [WHAT]: a line of FILE matches PATTERN (grep -E); else a failure
# named WHAT, after FILE's last lines.
assert_grep() {
  grep -q -E -- "$1" "$2" && return 0
  { echo "---- $2:"; tail -n 40 "$2"; } >&2
  fail "${3:-no line matching /$1/ in $2}"
}
# assert_no_grep PATTERN FILE [WHAT]: no line of FILE matches PATTERN.
assert_no_grep() {
  grep -q -E -- "$1" "$2" || return 0
  { echo "---- $2:"; grep -E -- "$1" "$2" | head -n 5; } >&2
  fail "${3:-unexpected /$1/ in $2}"
}

# Processes (pids) whose command line carries the marker, this shell excluded.
marker_pids() { pgrep -f -- "$MARKER" | grep -v -x -e "$$" -e "${BASHPID:-$$}" || true; }
# alive PID: the process exists and is not a zombie (an exited child nobody has reaped yet).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}
# no_leftovers: no process of the test remains (waits up to 5 s for exits to settle).
no_leftovers() {
  local deadline=$((SECONDS + 5)) left
  while :; do
    left=$(marker_pids)
    [[ -z $left ]] && return 0
    if ((SECONDS >= deadline)); then
      ps -o pid,stat,args -p "$(echo "$left" | paste -sd,)" >&2 || true
      fail "processes left behind: $(echo "$left" | paste -sd' ')"
      return 0
    fi
    sleep 0.2
  done
}
