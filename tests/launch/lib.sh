# Shared helpers for the launcher tests (sourced): a private temp dir whose name is a unique
# marker, assertions, waiting with a deadline, and a cleanup that kills only processes whose
# command line carries this test's marker.
# shellcheck shell=bash

LAUNCH_TEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LAUNCH_TEST_DIR/../.." && pwd)
# shellcheck disable=SC2034  # used by the scripts that source this file
LAUNCHER=${THETAD_LAUNCH:-$REPO_ROOT/launch/thetad-launch}
T=$(mktemp -d "${TMPDIR:-/tmp}/thetad-launch-test.XXXXXX")
MARKER=$(basename "$T")

# Processes (pids) whose command line mentions the marker, this shell excluded.
marker_pids() { pgrep -f -- "$MARKER" | grep -v -x -e "$$" -e "${BASHPID:-$$}" || true; }

test_cleanup() {
  local pid
  for pid in $(marker_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  if [[ -z ${KEEP_TEST_DIR:-} ]]; then rm -rf "$T"; else echo "kept $T" >&2; fi
}
trap test_cleanup EXIT

# alive PID: the process exists and is not a zombie (an exited child nobody has reaped yet).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }
skip() { echo "SKIP: $*"; exit 77; }  # ctest: SKIP_RETURN_CODE 77

# wait_for SECONDS CMD...: polls CMD every 0.1 s until it succeeds; fails the test on timeout.
wait_for() {
  local limit=$1; shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || fail "timed out after ${limit}s waiting for: $*"
    sleep 0.1
  done
}

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

# assert_grep PATTERN FILE [what]: extended regex must match a line of FILE.
assert_grep() {
  grep -q -E -- "$1" "$2" || { echo "---- $2:" >&2; tail -n 40 "$2" >&2; fail "${3:-no line matching /$1/ in $2}"; }
}
assert_no_grep() {
  if grep -q -E -- "$1" "$2"; then
    echo "---- $2:" >&2; grep -E -- "$1" "$2" | head -n 5 >&2; fail "${3:-unexpected /$1/ in $2}"
  fi
}

# no_leftovers: no process with the marker may remain (waits up to 5 s for exits to settle).
no_leftovers() {
  local deadline=$((SECONDS + 5)) left
  while :; do
    left=$(marker_pids)
    [[ -z $left ]] && return 0
    if ((SECONDS >= deadline)); then
      ps -o pid,stat,args -p "$(echo "$left" | paste -sd,)" >&2 || true
      fail "processes left behind: $(echo "$left" | paste -sd' ')"
    fi
    sleep 0.2
  done
}
