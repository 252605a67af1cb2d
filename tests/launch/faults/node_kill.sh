#!/usr/bin/env bash
# Fault: a whole node lost. 2 simulated nodes x 2 CPU ranks (thetad-launch --simulate-nodes 2);
# kill -9 of both ranks of node 1 in the middle of a run. The launcher must end within the
# communication timeout with exit 3, naming the node and its ranks, leaving no process; a rerun
# of the job resumes from the newest checkpoint and finishes.  Usage: node_kill.sh PATH/TO/thetad
set -euo pipefail
# shellcheck source=tests/launch/faults/common.sh
source "$(dirname "$0")/common.sh"

LAUNCH_ARGS=(--simulate-nodes 2 --nproc-per-node 2)
job=$T/job.yaml
fault_job "$job" nodekill
start_fault_run "$job"
wait_for 10 rank_pid 3 >/dev/null
victims=("$(rank_pid 2)" "$(rank_pid 3)")
kill -KILL "${victims[@]}"
# Within the communication timeout (comm.timeout_s), naming the node and its ranks.
expect_lost "$COMM_TIMEOUT" 'simulated node 1 lost ranks 2,3 \(its ranks: 2,3\)' 'node 1 (ranks 2,3)'
# The rerun resumes and finishes. (That a resume is bitwise equal to an uninterrupted run, also
# across node counts, simulated_nodes checks on short runs; kill9 after a lost rank. Here it would
# cost a rerun of the thousands of steps done before the kill.)
resume_run "$job"
pass "rerun resumed from step $RESUMED_FROM and finished at $RESUMED_TO"
