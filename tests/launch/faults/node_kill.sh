#!/usr/bin/env bash
# Fault: a whole node lost. 2 simulated nodes x 2 CPU ranks (thetad-launch --simulate-nodes 2);
# kill -9 of both ranks of node 1 in the middle of a run. The launcher must end within the
# communication timeout with exit 3, naming the node and its ranks, leaving no process; a rerun
# of the job resumes from the newest checkpoint and finishes.  Usage: node_kill.sh PATH/TO/thetad
# FAULT_BACKEND=nccl (tests/integration/gpu_simulated_nodes.sh): 2 nodes x 1 GPU over NCCL
# instead, node 1 being rank 1.
set -euo pipefail
# shellcheck source=tests/launch/faults/common.sh
source "$(dirname "$0")/common.sh"

per=2
[[ ${FAULT_BACKEND:-mpi} == nccl ]] && per=1
LAUNCH_ARGS=(--simulate-nodes 2 --nproc-per-node "$per")
job=$T/job.yaml
fault_job "$job" nodekill
start_fault_run "$job"
ranks=() victims=()
for ((r = per; r < 2 * per; r++)); do ranks+=("$r"); done
wait_for 10 rank_pid "${ranks[-1]}" >/dev/null
for r in "${ranks[@]}"; do victims+=("$(rank_pid "$r")"); done
kill -KILL "${victims[@]}"
# Within the communication timeout (comm.timeout_s), naming the node and its ranks.
list=$(IFS=,; echo "${ranks[*]}")
# (Both killed: both died; where mpirun ended one's wrapper before it recorded the death, that
# rank shows as stopped because of the other.)
expect_lost "$COMM_TIMEOUT" "simulated node 1 lost ranks? [0-9,]+(; ranks? [0-9,]+ stopped because of it)? \\(its ranks: $list\\)" \
  "node 1 (ranks $list)"
# The rerun resumes and finishes. (That a resume is bitwise equal to an uninterrupted run, also
# across node counts, simulated_nodes checks on short runs; kill9 after a lost rank. Here it would
# cost a rerun of the thousands of steps done before the kill.)
resume_run "$job"
pass "rerun resumed from step $RESUMED_FROM and finished at $RESUMED_TO"
