#!/usr/bin/env bash
# train.backward: a forward and backward per task (one task's graph alive at a time) against one
# backward over the sum of a micro-step's task losses. Where Θ is frozen the passes only split
# the work: bitwise the same final parameters on 1 and 2 ranks, with prune, accumulation,
# discovered groups, θ[t] in the host store and the transformer's fused loss, equal to the
# single-process reference; with offload.activations the stash holds half the pinned buffers (two
# tasks' blocks were alive at once, now one task's). auto picks per_task there and joint where Θ
# is trained; per_task with a trained Θ accumulates Θ's gradient over the tasks (within 1e-5 of
# joint). A bad value exits 2.
# The transformer runs a joint pass fused: the base once over every task's rows, each task's
# adapters on its own rows (batched GEMMs for equal rows, a GEMM pair per task otherwise); where Θ
# is frozen that is bitwise a pass per task in fp32, with 2 and 4 tasks, equal and unequal rows,
# gpt2 and llama, and within bf16's rounding in bf16. auto fuses the transformer's tasks where the
# joint pass's activations fit the device's free memory (on the CPU: always; a device too small
# stands in through THETAD_TEST_DEVICE_MEMORY, and auto then splits, into passes of as many tasks
# as fit). The slot pass that a GPU replays from a CUDA graph
# (train.cuda_graphs) runs on the CPU without a graph (a test aid): bitwise the plain fused pass.
# train.tasks_per_pass: passes of 2 and of 3 of 4 tasks (the last pass what is left), on 1 and 2
# ranks with prune and the host store, bitwise joint's; their stash holds half joint's bytes.
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
# bf16 on the CPU: LibTorch's bf16 GEMMs round differently with the operands' shapes (a batched
# GEMM against a GEMM per task, a batched matmul with its batch's size), so the fused pass keeps
# the values of a pass per task within bf16's rounding, not their bits.
for mode in joint per_task; do
  queue_np "tfm_llama_bf16_np2_$mode" 2 "$tfm" "${frozen[@]}" --set model.arch=llama --set model.kv_heads=1 \
    --set precision=bf16 --set train.backward=$mode
done
joint_vs mlp_np2 2 "$mlp" "${frozen[@]}" --set model.trunk_layers=3
joint_vs tfm_discover_np2 2 "$tfm" "${frozen[@]}" --set comm.active=discover
joint_vs tfm_store_np2 2 "$tfm" "${frozen[@]}" --set offload.enabled=true --set offload.device_slots=2
queue_ref tfm_np2_reference 0 "$tfm" --world 2 "${frozen[@]}" --set comm.prune=true \
  --compare "$WORK/tfm_np2_per_task.ckpt"
queue_np tfm_trained_auto 2 "$tfm" --set data.tasks_per_rank=2 --set steps=8
# The fused pass: four tasks of 2 rows (batched adapters), two tasks of 4 and 3 rows (an adapter
# pair per task).
for mode in joint per_task; do
  queue_np "four_tasks_$mode" 1 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set model.arch=llama \
    --set model.kv_heads=1 --set lora.targets=[q,k,v,o,gate,up,down] --set train.backward=$mode
  queue_np "uneven_$mode" 1 "$tfm" "${frozen[@]}" --set data.batch_per_rank=7 --set train.backward=$mode
done
queue_np tfm_long_auto 1 "$tfm" "${frozen[@]}" --set model.seq_len=256 --set steps=1
queue_np tfm_long_four_joint 1 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set model.seq_len=256 --set steps=2 \
  --set train.backward=joint
# Passes of several tasks: 4 llama tasks as 2 + 2 and 3 + 1; on 2 ranks, prune and the host store.
four=(--set data.tasks_per_rank=4 --set model.arch=llama --set model.kv_heads=1 --set lora.targets=[q,k,v,o,gate,up,down])
for k in 2 3; do
  queue_np "four_tasks_k$k" 1 "$tfm" "${frozen[@]}" "${four[@]}" --set train.backward=per_task --set train.tasks_per_pass=$k
done
for mode in "joint|" "pairs|--set train.backward=per_task --set train.tasks_per_pass=2"; do
  # shellcheck disable=SC2086  # the variant's words are split on purpose
  queue_np "four_np2_${mode%%|*}" 2 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set comm.prune=true \
    --set offload.enabled=true --set offload.device_slots=4 ${mode#*|}
done
# The stash: the blocks of one task alive at a time, not of both (the fused joint pass stashes
# one tensor per layer over both tasks' rows: as many buffers, each twice the bytes).
for mode in joint per_task; do
  queue_np "act_$mode" 1 "$tfm" "${frozen[@]}" --set offload.activations=true --set train.backward=$mode
done
queue_np act4_joint 1 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set offload.activations=true --set train.backward=joint
queue_np act4_pairs 1 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set offload.activations=true \
  --set train.backward=per_task --set train.tasks_per_pass=2
# A trained Θ, per_task: gradient accumulation over the tasks, the same parameters up to rounding.
queue_np trained_joint 2 "$tfm" --set data.tasks_per_rank=2 --set steps=8 --set train.backward=joint
queue_np trained_per_task 2 "$tfm" --set data.tasks_per_rank=2 --set steps=8 --set train.backward=per_task
run_queue
# The slot pass without a graph (the test aid is read by every job of a queue: a queue of its
# own), with adopted gradients (1 rank), buckets (2 ranks), accumulation, the host store and 4
# llama tasks.
export THETAD_TEST_SLOT_PASS=1
queue_np slots_np1 1 "$tfm" "${frozen[@]}"
queue_np slots_np2 2 "$tfm" "${frozen[@]}" --set comm.prune=true
queue_np slots_accumulate_np2 2 "$tfm" "${frozen[@]}" --set accumulate_steps=2
queue_np slots_store_np2 2 "$tfm" "${frozen[@]}" --set offload.enabled=true --set offload.device_slots=2
queue_np slots_four 1 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set model.arch=llama \
  --set model.kv_heads=1 --set lora.targets=[q,k,v,o,gate,up,down]
run_queue
unset THETAD_TEST_SLOT_PASS
# A device with room for the job but not for the joint pass's activations (MiB free / total).
export THETAD_TEST_DEVICE_MEMORY=3/10
queue_np tfm_long_small_device 1 "$tfm" "${frozen[@]}" --set model.seq_len=256 --set steps=1
queue_np tfm_long_four_small_device 1 "$tfm" "${frozen[@]}" --set data.tasks_per_rank=4 --set model.seq_len=256 --set steps=2
run_queue
unset THETAD_TEST_DEVICE_MEMORY

for name in "${JOINT[@]}"; do
  same_hash "$name: per_task == joint bitwise" "${name}_joint" "${name}_per_task"
  same_hash "$name: auto == joint bitwise" "${name}_joint" "${name}_auto"
done
# same_losses WHAT A B TOL: the runs' per-step losses agree within TOL (relative).
same_losses() {
  if out=$(/usr/bin/python3 - "$WORK/$2.jsonl" "$WORK/$3.jsonl" "$4" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
assert len(a) == len(b) > 0 and worst <= float(sys.argv[3]), (worst, a, b)
print("%d steps, worst relative difference %.2e" % (len(a), worst))
PY
  ); then pass "$1 ($out)"; else fail "$1: $out"; fi
}
same_losses "llama bf16: joint (fused) == per_task within bf16 rounding" tfm_llama_bf16_np2_joint \
  tfm_llama_bf16_np2_per_task 2e-2
same_hash "fused, 4 tasks of 2 rows: joint == per_task bitwise" four_tasks_joint four_tasks_per_task
same_hash "fused, rows 4 and 3: joint == per_task bitwise" uneven_joint uneven_per_task
same_hash "passes of 2 of 4 tasks == joint bitwise" four_tasks_joint four_tasks_k2
same_hash "passes of 3 and 1 of 4 tasks == joint bitwise" four_tasks_joint four_tasks_k3
same_hash "2 ranks, prune, host store: passes of 2 of 4 tasks == joint bitwise" four_np2_joint four_np2_pairs
expect_in four_tasks_k2 "train.backward per_task: a forward and backward per 2 tasks, their graph alive at a time"
expect_in slots_np1 "train.cuda_graphs: passes of equal rows read their tasks' parameters from slots"
same_hash "slots, 1 rank == the plain fused pass bitwise" slots_np1 tfm_np1_joint
same_hash "slots, 2 ranks == the plain fused pass bitwise" slots_np2 tfm_np2_joint
same_hash "slots, accumulate_steps 2 == the plain fused pass bitwise" slots_accumulate_np2 tfm_accumulate_np2_joint
same_hash "slots, host store == the plain fused pass bitwise" slots_store_np2 tfm_store_np2_joint
same_hash "slots, 4 llama tasks == the plain fused pass bitwise" slots_four four_tasks_joint
# auto says what it picked, once: a pass per task for the MLP's frozen trunk, the fused joint
# pass for the transformer where its activations fit, a pass per task where they do not.
expect_in mlp_np2_auto "train.backward auto: a forward and backward per task"
expect_not_in tfm_np2_auto "a forward and backward per task"
expect_in tfm_np2_auto "train.backward auto: the micro-step's tasks in one pass: the joint pass's activations about"
expect_in tfm_long_auto "train.backward auto: the micro-step's tasks in one pass"
expect_not_in tfm_long_auto "a forward and backward per task"
expect_in tfm_long_small_device "train.backward auto: a pass per task: the joint pass's activations about .* do not fit the device of THETAD_TEST_DEVICE_MEMORY"
expect_in tfm_long_small_device "train.backward auto: a forward and backward per task"
# 4 tasks whose joint pass does not fit, 2 of whose do: passes of 2, bitwise the joint pass.
expect_in tfm_long_four_small_device "train.backward auto: passes of 2 tasks: the joint pass's activations about .* do not fit"
same_hash "auto on a small device: passes of 2 of 4 tasks == joint bitwise" tfm_long_four_joint tfm_long_four_small_device
if grep -q "a forward and backward per task" "$WORK/tfm_trained_auto.log"; then
  fail "auto with a trained Θ: split the backward"
else
  pass "auto with a trained Θ: one backward over the sum"
fi
same_hash "activations: per_task == joint bitwise" act_joint act_per_task
# half_stash WHAT JOINT SPLIT: the split run's stash peaks at half the joint run's device bytes.
half_stash() {
  if out=$(/usr/bin/python3 - "$WORK/$2.jsonl" "$WORK/$3.jsonl" <<'PY'
import json, sys
joint, split = ([json.loads(l)["act_device_peak_bytes"] for l in open(p)] for p in sys.argv[1:3])
assert joint[0] > 0 and split[0] * 2 == joint[0], (joint[0], split[0])
print("stash device peak: joint %d, split %d bytes" % (joint[0], split[0]))
PY
  ); then pass "$1 ($out)"; else fail "$1: $out"; fi
}
half_stash "activations: per_task holds half the stash's device bytes" act_joint act_per_task
same_hash "activations, 4 tasks: passes of 2 == joint bitwise" act4_joint act4_pairs
half_stash "activations: passes of 2 of 4 tasks hold half the stash's device bytes" act4_joint act4_pairs
if out=$(/usr/bin/python3 "$HERE/compare_checkpoints.py" "$WORK/trained_joint.ckpt" "$WORK/trained_per_task.ckpt" 1e-5 2>&1); then
  pass "trained Θ: per_task == joint within 1e-5 ($out)"
else
  fail "trained Θ: per_task != joint: $out"
fi

expect_code 2 bad_value "$thetad" validate "$tfm" --set train.backward=sometimes
expect_in bad_value "train.backward: must be one of auto, joint, per_task"
expect_code 2 bad_pass "$thetad" validate "$tfm" --set train.tasks_per_pass=0
expect_in bad_pass "train.tasks_per_pass: must be >= 1, got 0"
expect_code 2 joint_pass "$thetad" validate "$tfm" --set train.backward=joint --set train.tasks_per_pass=2
expect_in joint_pass "train.tasks_per_pass: is 2, but train.backward joint runs every task of a micro-step in one pass"
finish
