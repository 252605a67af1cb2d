#!/usr/bin/env bash
# The shell tests' library (test_lib.sh) keeps its promises: a failure is never exit 0 (with or
# without finish), skip is 77, fail-fast ends at the first failure and at a wait_for that times
# out, an error that ends a test early says so, and the test's processes and temp dir are gone
# after it.
source "$(dirname "$0")/test_lib.sh"
lib=$TEST_LIB_DIR/test_lib.sh
# outcome NAME WANT_EXIT WANT_LINE [FAST] BODY: a test of BODY on the library ends WANT_EXIT and
# prints a line matching WANT_LINE (grep -E).
outcome() {
  local name=$1 want=$2 line=$3 fast=$4 body=$5 got=0
  printf 'TEST_FAIL_FAST=%s\nsource %q\n%s\n' "$fast" "$lib" "$body" > "$WORK/$name.sh"
  bash "$WORK/$name.sh" > "$WORK/$name.log" 2>&1 || got=$?
  if [ "$got" -ne "$want" ]; then fail "$name: exit $got, expected $want"; cat "$WORK/$name.log"
  elif ! grep -qE -- "$line" "$WORK/$name.log"; then fail "$name: no line /$line/"; cat "$WORK/$name.log"
  else pass "$name: exit $got, /$line/"; fi
}
outcome passes 0 '^1 passed, 0 failed$' "" 'pass one; finish'
outcome fail_then_finish 1 '^0 passed, 1 failed$' "" 'fail one; finish'
outcome fail_without_finish 1 '^FAIL 1 failure\(s\) recorded$' "" 'fail one; true'
outcome fail_goes_on 1 '^ok   after$' "" 'fail one; pass after; finish'
outcome die_stops 1 '^0 passed, 1 failed$' "" 'die one; pass never'
outcome skip_is_77 77 '^SKIP: no tool$' "" 'skip "no tool"; pass never'
outcome fast_fail_stops 1 '^0 passed, 1 failed$' 1 'fail one; pass never; finish'
outcome fast_wait_fails 1 'timed out after 1s waiting for: false' 1 'wait_for 1 false; pass never'
outcome slow_wait_returns 0 '^ok   timed out$' "" 'wait_for 1 false || pass "timed out"; finish'
outcome error_says_so 3 'stopped early \(exit 3\)' "" 'pass one; (exit 3); pass never'
outcome mpirun_flags 0 '^ok   --oversubscribe' "" 'pass "${MPIRUN_FLAGS[*]}"; finish'

# The temp dir goes, and so do the processes that carry its name (a tail left running).
body='echo "$WORK" > '"$WORK/leftover.dir"'; touch "$WORK/alive"; tail -f "$WORK/alive" & echo "$!" > '"$WORK/leftover.pid"'; finish'
outcome cleans_up 0 '^0 passed, 0 failed$' "" "$body"
left=$(cat "$WORK/leftover.dir")
if [ -n "$left" ] && [ ! -e "$left" ]; then pass "its temp dir is removed"; else fail "its temp dir $left is left"; fi
if wait_for 5 bash -c "! kill -0 $(cat "$WORK/leftover.pid") 2>/dev/null"; then pass "its processes are killed"
else fail "its process $(cat "$WORK/leftover.pid") is left"; fi
finish
