#!/usr/bin/env bash
# Fault: rank 1 stalls (SIGSTOP). Rank 0 must exit 3 within comm.timeout_s + 15 s with a message
# naming the collective and the step; the launcher kills the stopped rank and exits 3; nothing is
# left; rerunning resumes and matches an uninterrupted run.  Usage: sigstop.sh PATH/TO/thetad
set -euo pipefail
# shellcheck source=tests/launch/faults/common.sh
source "$(dirname "$0")/common.sh"

job=$T/job.yaml
fault_job "$job" sigstop
start_fault_run "$job"
victim=$(rank_pid 1)
kill -STOP "$victim"
limit=$((COMM_TIMEOUT + 15))
start=$SECONDS
wait_for "$limit" test -e "$T/logs-fault/rank-0.exit"
read -r code _ <"$T/logs-fault/rank-0.exit"
((code == 3)) || { tail -n 20 "$T/logs-fault/rank-0.log" >&2; fail "rank 0: want exit 3 after the stall, got $code"; }
pass "rank 0 exited 3 $((SECONDS - start))s after rank 1 stopped (limit ${limit}s)"
# One line names the operation that timed out and the step, e.g.
# "count exchange at step 70 did not finish within 20 s".
grep -iE 'time ?out|timed out|did not (finish|complete)|within [0-9.]+ ?s' "$T/logs-fault/rank-0.log" \
  | grep -iE 'allreduce|all_reduce|barrier|bcast|broadcast|allgather|gather|reduce|exchange|bucket|collective' \
  | grep -qiE 'step[ =:#]*[0-9]+' || { tail -n 20 "$T/logs-fault/rank-0.log" >&2; fail "rank 0's log has no line naming the timed-out collective and step"; }
wait_launcher 15
((RC == 3)) || { tail -n 30 "$T/fault.err" >&2; fail "want launcher exit 3, got $RC"; }
assert_grep 'rank 0 exited with code 3' "$T/fault.err"
! alive "$victim" || fail "the stopped rank $victim is still there ($(ps -o stat=,args= -p "$victim"))"
no_leftovers
pass "stalled rank 1: launcher exit 3, the stopped rank was killed; nothing left"
resume_and_compare "$job"
