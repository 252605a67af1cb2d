#!/usr/bin/env bash
# Fault: kill -9 of rank 1 in the middle of a run (real thetad, 2 CPU ranks under thetad-launch).
# The launcher and rank 0 must end within 30 s, non-zero, naming the lost rank, leaving no
# process; rerunning the job then resumes from the newest checkpoint and ends with the same
# parameters as a run that never failed.  Usage: kill9.sh PATH/TO/thetad
set -euo pipefail
# shellcheck source=tests/launch/faults/common.sh
source "$(dirname "$0")/common.sh"

job=$T/job.yaml
fault_job "$job" kill9
start_fault_run "$job"
victim=$(rank_pid 1)
kill -KILL "$victim"
wait_launcher 30
((RC != 0)) || fail "launcher exited 0 after rank 1 was killed"
((RC == 3)) || { tail -n 30 "$T/fault.err" >&2; fail "want launcher exit 3 (lost peer), got $RC"; }
assert_grep 'rank 1 lost' "$T/fault.err" "the launcher does not name the lost rank"
[[ -z $(thetad_pids) ]] || fail "thetad processes left: $(thetad_pids | paste -sd' ')"
no_leftovers
pass "kill -9 of rank 1: launcher exit $RC after ${ELAPSED}s naming rank 1; nothing left"
resume_and_compare "$job"
