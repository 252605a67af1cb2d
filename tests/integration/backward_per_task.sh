#!/usr/bin/env bash
# train.backward: a forward and backward per task (one task's graph alive at a time) against one
# backward over the sum of a micro-step's task losses. Where Θ is frozen the passes only split
# the work: bitwise the same final parameters on 1 and 2 ranks, with prune, accumulation,
# discovered groups, θ[t] in the host store and the transformer's fused loss, equal to the
# single-process reference; with offload.activations the stash holds half the pinned buffers (two
# tasks' blocks were alive at once, now one task's). auto picks per_task there and joint where Θ
# is trained; per_task with a trained Θ accumulates Θ's gradient over the tasks (within 1e-5 of
# joint). A bad value exits 2.
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
tfm=$HERE/jobs/transformer.yaml
mlp=$HERE/jobs/small.yaml
frozen=(--set model.train_shared=false --set data.tasks_per_rank=2 --set steps=8)

# Every run is queued first and run by world size, one start each (run_queue); the checks after.
# joint_vs NAME NP JOB ARGS...: train.backward joint, per_task and auto, queued: one final hash.
JOINT=()
joint_vs() {
  local name=$1 np=$2 job=$3; shift 3
  for mode in joint per_task auto; do
    queue_np "${name}_$mode" "$np" "$job" "$@" --set train.backward=$mode
  done
  JOINT+=("$name")
}
joint_vs tfm_np1 1 "$tfm" "${frozen[@]}"
joint_vs tfm_np2 2 "$tfm" "${frozen[@]}" --set comm.prune=true
joint_vs tfm_accumulate_np2 2 "$tfm" "${frozen[@]}" --set accumulate_steps=2
joint_vs tfm_llama_bf16_np2 2 "$tfm" "${frozen[@]}" --set model.arch=llama --set model.kv_heads=1 --set precision=bf16
joint_vs mlp_np2 2 "$mlp" "${frozen[@]}" --set model.trunk_layers=3
joint_vs tfm_discover_np2 2 "$tfm" "${frozen[@]}" --set comm.active=discover
joint_vs tfm_store_np2 2 "$tfm" "${frozen[@]}" --set offload.enabled=true --set offload.device_slots=2
queue_ref tfm_np2_reference 0 "$tfm" --world 2 "${frozen[@]}" --set comm.prune=true \
  --compare "$WORK/tfm_np2_per_task.ckpt"
queue_np tfm_trained_auto 2 "$tfm" --set data.tasks_per_rank=2 --set steps=8
# The stash's pinned buffers: the blocks of one task alive at a time, not of both.
for mode in joint per_task; do
  queue_np "act_$mode" 1 "$tfm" "${frozen[@]}" --set offload.activations=true --set train.backward=$mode
done
# A trained Θ, per_task: gradient accumulation over the tasks, the same parameters up to rounding.
queue_np trained_joint 2 "$tfm" --set data.tasks_per_rank=2 --set steps=8 --set train.backward=joint
queue_np trained_per_task 2 "$tfm" --set data.tasks_per_rank=2 --set steps=8 --set train.backward=per_task
run_queue

for name in "${JOINT[@]}"; do
  same_hash "$name: per_task == joint bitwise" "${name}_joint" "${name}_per_task"
  same_hash "$name: auto == joint bitwise" "${name}_joint" "${name}_auto"
done
# auto says what it picked, once.
expect_in tfm_np2_auto "train.backward auto: a forward and backward per task"
if grep -q "a forward and backward per task" "$WORK/tfm_trained_auto.log"; then
  fail "auto with a trained Θ: split the backward"
else
  pass "auto with a trained Θ: one backward over the sum"
fi
same_hash "activations: per_task == joint bitwise" act_joint act_per_task
/usr/bin/python3 - "$WORK/act_joint.jsonl" "$WORK/act_per_task.jsonl" <<'PY' \
  && pass "activations: per_task holds half the stash's buffers" || fail "activations: stash buffers"
import json, sys
joint, per_task = ([json.loads(l)["act_pool_allocations"] for l in open(p)] for p in sys.argv[1:3])
assert joint[0] > 0 and per_task[0] * 2 == joint[0], (joint[0], per_task[0])
print("pinned buffers: joint %d, per_task %d" % (joint[0], per_task[0]))
PY
if out=$(/usr/bin/python3 "$HERE/compare_checkpoints.py" "$WORK/trained_joint.ckpt" "$WORK/trained_per_task.ckpt" 1e-5 2>&1); then
  pass "trained Θ: per_task == joint within 1e-5 ($out)"
else
  fail "trained Θ: per_task != joint: $out"
fi

expect_code 2 bad_value "$thetad" validate "$tfm" --set train.backward=sometimes
expect_in bad_value "train.backward: must be one of auto, joint, per_task"
finish
