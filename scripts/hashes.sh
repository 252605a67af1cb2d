#!/usr/bin/env bash
# Final parameter hashes of a fixed set of CPU jobs (the demo, the equivalence job under several
# schedules and modes, offload, clipping, the sharded extreme classifier, adapters), one line
# each: to compare two builds of thetad after a change that must not alter the numbers.
#   scripts/hashes.sh THETAD [SRC_ROOT] > hashes.txt      # then diff two such files
set -uo pipefail
thetad=$1
src=${2:-$(cd "$(dirname "$0")/.." && pwd)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
flags=(--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
       --mca oob_tcp_if_include lo --mca pml ob1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # run NAME RANKS JOB --set ...
  local name=$1 np=$2 job=$3; shift 3
  mpirun "${flags[@]}" -np "$np" "$thetad" run "$job" --no-resume --set checkpoint.dir="$work/$name" \
    --set metrics.path="$work/$name.jsonl" --set log.level=info "$@" > "$work/$name.log" 2>&1
  echo "$name rc=$? $(grep -o 'final params hash: [0-9a-f]*' "$work/$name.log" | awk '{print $4}')"
}
eq=$src/tests/integration/jobs/equiv.yaml
sm=$src/tests/integration/jobs/small.yaml
off=(--set steps=20 --set offload.enabled=true --set offload.device_slots=2)
xc=(--set model.kind=extreme_classifier --set model.classes=400 --set optimizer.lr=0.03 --set offload.shard_mb=0.004)
run demo 2 "$src/config/examples/demo.yaml"
run eq_rr_np2 2 "$eq" --set data.schedule=round_robin
run eq_rr_np3_world_discover 3 "$eq" --set data.schedule=round_robin --set comm.average=world --set comm.active=discover
run eq_acc2_np2 2 "$eq" --set data.schedule=round_robin --set accumulate_steps=2
run eq_alt_np4 4 "$eq" --set data.schedule=alternate --set 'data.alternate=[shared,tasks,task:2]'
run eq_weighted_np2_noprune 2 "$eq" --set data.schedule=weighted --set 'data.weights=[1,1,1,1,0]' --set comm.prune=false
run eq_clip_cos_np2 2 "$eq" --set optimizer.clip_norm=0.5 --set optimizer.lr_schedule=cosine --set optimizer.warmup_steps=2
run off_np2 2 "$sm" "${off[@]}" --set model.tasks=6
run off_np4 4 "$sm" "${off[@]}" --set model.tasks=6
run off_clip_np2 2 "$sm" "${off[@]}" --set model.tasks=6 --set optimizer.clip_norm=0.3
run xc_np2 2 "$sm" "${off[@]}" "${xc[@]}"
run xcn_acc_np2 2 "$sm" "${off[@]}" "${xc[@]}" --set model.negatives_per_step=20 --set accumulate_steps=2
run adapter_np2 2 "$sm" --set steps=20 --set model.kind=multitask_adapter
