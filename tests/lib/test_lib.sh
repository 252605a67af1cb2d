# The shell tests' one library (sourced): a private temp dir, results that count, a skip that
# ctest reports as skipped, waits with a deadline, and assertions on exit codes and logs.
#
#   source "$(dirname "$0")/../lib/test_lib.sh"
#   expect_code 0 first "$thetad" run job.yaml      # output in $WORK/first.log
#   expect_in first "final params hash"
#   wait_for 60 test -e "$WORK/ckpt/step-5" || fail "no checkpoint"
#   finish                                           # exit 0 only if nothing failed
#
# pass/fail record a result and go on; die fails and ends the test now; skip ends it as skipped
# (exit 77, ctest's SKIP_RETURN_CODE: cmake/ThetadTesting.cmake).
# shellcheck shell=bash
set -euo pipefail

TEST_SKIP_CODE=77
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thetad-test.XXXXXX")
KEEP_WORK=${KEEP_WORK:-}
trap '[ -n "$KEEP_WORK" ] && echo "kept $WORK" >&2 || rm -rf "$WORK"' EXIT
FAILS=0
PASSES=0

pass() { echo "ok   $*"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
die() { fail "$@"; finish; }
skip() { echo "SKIP: $*"; exit "$TEST_SKIP_CODE"; }
# The results so far; exits 0 when nothing failed, 1 otherwise.
finish() {
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" -eq 0 ] || exit 1
  exit 0
}

# wait_for SECONDS CMD...: runs CMD every 0.1 s until it succeeds (returns 0) or SECONDS pass
# (returns 1; the caller decides whether that fails the test).
wait_for() {
  local limit=$1; shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}
# exists GLOB: a path matching GLOB exists (for wait_for).
exists() { compgen -G "$1" >/dev/null; }

# expect_code CODE NAME CMD...: runs CMD, its output in $WORK/NAME.log, checks its exit code.
expect_code() {
  local want=$1 name=$2; shift 2
  local got=0
  "$@" > "$WORK/$name.log" 2>&1 || got=$?
  if [ "$got" -eq "$want" ]; then pass "$name (exit $got)"; else
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
