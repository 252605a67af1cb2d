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
expect_lost 30 'rank 1 lost' 'rank 1'
resume_and_compare "$job"
