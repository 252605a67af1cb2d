#!/usr/bin/env bash
# offload.host_groups: scheduled: the host arena holds only the task groups the job's schedule
# uses (40 LoRA adapters, a few steps of round robin: a fraction of them), the others stay at
# their initial values and are drawn where they are read. Bitwise the parameters of offload off
# and of host_groups: all, on 1 and 2 ranks, for every built-in model and with the device cache; checkpoints record the
# untouched groups without values and resume bitwise (also into offload off, and into a longer
# run that holds more groups); a checkpoint whose updated groups this job's schedule does not
# hold is exit 2 naming the key. With lora.init_from, the untouched groups' adapters are read
# again at resume: the checkpoint fingerprints each directory, and one changed, gone or unset
# since is exit 2 naming it.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/transformer.yaml
T=(--set model.tasks=40)
OFF=(--set offload.enabled=false)
ALL=(--set offload.enabled=true --set offload.device_slots=2)
SCH=("${ALL[@]}" --set offload.host_groups=scheduled)
# Every run is queued first and run by world size, one start each (run_queue), the resumes in a
# second round (from copies of the first round's checkpoints); the checks after.
for np in 1 2; do
  queue_np off_np$np $np "$job" --set steps=6 "${T[@]}" "${OFF[@]}"
  queue_np all_np$np $np "$job" --set steps=6 "${T[@]}" "${ALL[@]}"
  queue_np sch_np$np $np "$job" --set steps=6 "${T[@]}" "${SCH[@]}"
done
# The llama transformer the same way, on 2 ranks.
LLAMA=(--set model.arch=llama --set model.kv_heads=1 --set lora.targets=[q,gate,down])
queue_np llama_off 2 "$job" --set steps=6 "${T[@]}" "${LLAMA[@]}" "${OFF[@]}"
queue_np llama_sch 2 "$job" --set steps=6 "${T[@]}" "${LLAMA[@]}" "${SCH[@]}"
# The other built-in models (heads, adapters over the MLP, output slices streamed in row shards).
small=$HERE/jobs/small.yaml
models=("mlp|" "adapter|--set model.kind=multitask_adapter"
        "xc|--set model.kind=extreme_classifier --set model.classes=400 --set offload.shard_mb=0.1 --set optimizer.lr=0.03")
for model in "${models[@]}"; do
  name=${model%%|*}
  # shellcheck disable=SC2086  # the model's words are split on purpose
  queue_np "${name}_off" 2 "$small" --set steps=5 "${T[@]}" ${model#*|} "${OFF[@]}"
  # shellcheck disable=SC2086
  queue_np "${name}_sch" 2 "$small" --set steps=5 "${T[@]}" ${model#*|} "${SCH[@]}"
done
# With the device cache (groups updated on the device, flushed at the end): the same bits.
queue_np cache 2 "$job" --set steps=6 "${T[@]}" "${SCH[@]}" --set offload.device_cache_mb=1
# Checkpoints: untouched groups cost no bytes, and resume gives the uninterrupted run's bits.
queue_np all3 2 "$job" --set steps=3 "${T[@]}" "${ALL[@]}"
queue_np sch3 2 "$job" --set steps=3 "${T[@]}" "${SCH[@]}"
run_queue

resume() {  # resume NAME FROM ARGS...: the checkpoint of run FROM continued to step 6 on 2 ranks
  local name=$1 from=$2; shift 2
  cp -r "$WORK/$from.ckpt" "$WORK/$name.ckpt"
  queue "$name" 2 0 "$job" --set steps=6 "${T[@]}" --set checkpoint.dir="$WORK/$name.ckpt" --set log.level=info "$@"
}
resume sch_sch sch3 "${SCH[@]}"
resume sch_off sch3 "${OFF[@]}"
resume sch_all sch3 "${ALL[@]}"
resume all_sch all3 "${SCH[@]}"
# A checkpoint that holds updates of groups this job never uses (2 ranks trained tasks 0 .. 5 in
# 3 steps; one rank in steps 0 .. 3 uses tasks 0 .. 4): exit 2 naming the key.
cp -r "$WORK/all3.ckpt" "$WORK/narrow.ckpt"
queue narrow 1 2 "$job" --set steps=3 "${T[@]}" "${SCH[@]}" --set checkpoint.dir="$WORK/narrow.ckpt"
run_queue

for np in 1 2; do
  same_hash "np$np: host_groups all == offload off" off_np$np all_np$np
  same_hash "np$np: host_groups scheduled == offload off" off_np$np sch_np$np
done
same_hash "llama: host_groups scheduled == offload off" llama_off llama_sch
# Round robin, one task per rank and step, prefetch 1: steps 0 .. 7 use tasks 0 .. 7 on one rank.
expect_in sch_np1 "holding 8 of 40 groups"
expect_in sch_np2 "holding 16 of 40 groups"
arena_mib() { grep -o 'host arena [0-9.]* MiB' "$WORK/$1.log" | head -1 | awk '{print $3}'; }
if awk -v a="$(arena_mib all_np2)" -v s="$(arena_mib sch_np2)" 'BEGIN { exit !(s > 0 && s * 2 < a) }'; then
  pass "the arena holds less: $(arena_mib sch_np2) MiB against $(arena_mib all_np2) MiB"
else fail "arena: scheduled $(arena_mib sch_np2) MiB vs all $(arena_mib all_np2) MiB"; fi
for model in "${models[@]}"; do
  name=${model%%|*}
  same_hash "$name: host_groups scheduled == offload off" "${name}_off" "${name}_sch"
done
expect_in xc_sch "holding 14 of 40 groups"
same_hash "scheduled with the device cache == offload off" off_np2 cache
du_k() { du -sk "$1" | awk '{print $1}'; }
if [ "$(du_k "$WORK/sch3.ckpt/step-00000003")" -lt "$(du_k "$WORK/all3.ckpt/step-00000003")" ]; then
  pass "the checkpoint of scheduled is smaller ($(du_k "$WORK/sch3.ckpt/step-00000003") KiB against $(du_k "$WORK/all3.ckpt/step-00000003") KiB)"
else fail "checkpoint sizes: scheduled $(du_k "$WORK/sch3.ckpt/step-00000003") KiB, all $(du_k "$WORK/all3.ckpt/step-00000003") KiB"; fi
for name in sch_sch sch_off sch_all all_sch; do expect_in "$name" "resumed from .*step-00000003 at step 3"; done
same_hash "scheduled, resumed (more groups held from then on) == uninterrupted offload off" off_np2 sch_sch
same_hash "scheduled checkpoint resumed with offload off == uninterrupted offload off" off_np2 sch_off
same_hash "scheduled checkpoint resumed with host_groups all == uninterrupted offload off" off_np2 sch_all
same_hash "host_groups all checkpoint resumed with scheduled == uninterrupted offload off" off_np2 all_sch
expect_in narrow "offload.host_groups: scheduled: the checkpoint holds group [0-9]+ after [0-9]+ updates"
# lora.init_from: 40 adapters (a first run trains each task once and exports it), loaded by a
# scheduled run that stores only the groups it held (tasks 0..4 of 40 in 3 steps on one rank).
AD=$WORK/adapters
expect_code 0 make_adapters "$thetad" run "$job" --no-resume --set steps=40 "${T[@]}" "${LLAMA[@]}" \
  --set model.train_shared=false --set export.adapters_dir="$AD/{task}"
INIT=("${T[@]}" "${LLAMA[@]}" --set lora.init_from="$AD/{task}")
run_np init_off 1 "$job" --set steps=6 "${INIT[@]}" "${OFF[@]}"
run_np init_sch3 1 "$job" --set steps=3 "${INIT[@]}" "${SCH[@]}"
resume_init() {  # resume_init NAME CODE ARGS...: init_sch3's checkpoint continued to step 6 on 1 rank
  local name=$1 code=$2; shift 2
  rm -rf "$WORK/$name.ckpt"; cp -r "$WORK/init_sch3.ckpt" "$WORK/$name.ckpt"
  expect_code "$code" "$name" "$thetad" run "$job" --set steps=6 --set checkpoint.dir="$WORK/$name.ckpt" \
    --set log.level=info "${SCH[@]}" "$@"
}
resume_init init_same 0 "${INIT[@]}"
expect_in init_same "resumed from .*step-00000003 at step 3"
same_hash "lora.init_from, scheduled, resumed == uninterrupted offload off" init_off init_same
cp "$AD/21/adapter_model.safetensors" "$AD/20/adapter_model.safetensors"
resume_init init_changed 2 "${INIT[@]}"
expect_in init_changed "adapters/20: lora.init_from: changed since the checkpoint .*step-00000003/manifest.json relied on it for task 20"
mv "$AD/20" "$WORK/aside-20"
resume_init init_gone 2 "${INIT[@]}"
expect_in init_gone "adapters/20: lora.init_from: gone since the checkpoint"
resume_init init_unset 2 "${T[@]}" "${LLAMA[@]}"
expect_in init_unset "take their values from lora.init_from '.*adapters/\{task\}' in the checkpoint, '' in this job"

expect_code 2 bad_word "$thetad" validate "$job" --set offload.enabled=true --set offload.host_groups=some
expect_in bad_word "offload.host_groups: must be one of all, scheduled; got 'some'"
finish
