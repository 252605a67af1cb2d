#!/usr/bin/env bash
# offload.shared_split_layers: the lowest streamed trunk layers updated on the device
# within the step through the store's update lines (values and Adam moments in and back out),
# the others by the host's CPU AdamW. Every split gives the bits of resident Θ (which equal
# all-host streaming, tests/integration/streamed_trunk.sh): on 1, 2 and 4 ranks, beside device
# layers, with gradient accumulation, an alternate schedule, θ[t] offload, bf16 and a resume; the
# split layers' steps and copies show in the metrics; bad input is exit 2 naming the key.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
# 6 trunk layers of 16->32 then 32->32 (+ bias): the largest layer 1056 floats (4224 bytes).
trunk=(--set model.trunk_layers=6 --set steps=20)
# Every run is queued first and run by world size, one start each (run_queue); the checks after.
# job_np NAME NP ARGS...: a run from scratch on NP ranks that must end 0.
job_np() { local name=$1 np=$2; shift 2; queue "$name" "$np" 0 "$job" --no-resume "${trunk[@]}" "$@"; }

# split NAME NP SPLIT ARGS...: resident Θ and Θ streamed with SPLIT layers updated on the device,
# queued; they end with the same final hash (checked after).
SPLITS=()
split() {
  local name=$1 np=$2 layers=$3; shift 3
  job_np "${name}_resident" "$np" --set offload.shared=resident "$@"
  job_np "${name}_split" "$np" --set offload.shared=stream --set offload.shared_split_layers="$layers" \
    --set metrics.path="$WORK/${name}_split.jsonl" "$@"
  SPLITS+=("$name $layers")
}
split np1 1 2
split np2_all 2 6
split np4 4 3
split np2_devlayers 2 2 --set offload.shared_device_layers=2
split np2_accumulate 2 3 --set accumulate_steps=2 --set data.tasks_per_rank=2
split np2_alternate 2 3 --set data.schedule=alternate --set "data.alternate=[shared,tasks,task:2]"
split np2_offload 2 4 --set offload.enabled=true --set offload.device_slots=2
split np2_bf16 2 3 --set precision=bf16 --set data.tasks_per_rank=2
split np2_prefetch2 2 5 --set offload.shared_prefetch_layers=2
# auto on the CPU: none (no PCIe to balance); a count asks for the lines anywhere.
job_np auto_cpu 1 --set offload.shared=stream --set offload.shared_split_layers=auto
# The split's layers are stepped on the device every step (theta_device_steps), their gradients no
# longer cross to the host (less D2H than with no split), and the update lines are in Θ's device
# bytes: 3 lines (prefetch 1 + 2) of 3 x 4224 bytes beside the 3 slots.
job_np np2_none 2 --set offload.shared=stream --set offload.shared_split_layers=0 \
  --set metrics.path="$WORK/np2_none.jsonl" --set model.train_shared=true
# Resume: 10 steps with a split, 10 more with another split == 20 resident steps.
job_np resume_10 2 --set offload.shared=stream --set offload.shared_split_layers=3 --set steps=10 \
  --set checkpoint.dir="$WORK/ck_split"
queue resume_then 2 0 "$job" "${trunk[@]}" --set offload.shared=stream --set offload.shared_split_layers=5 \
  --set checkpoint.dir="$WORK/ck_split"
job_np resume_resident 2 --set offload.shared=resident
run_queue

for entry in "${SPLITS[@]}"; do
  read -r name layers <<<"$entry"
  same_hash "$name: $layers split layers == resident Θ bitwise" "${name}_resident" "${name}_split"
done
expect_in np2_devlayers_split "2 layers kept on the device .*; 2 streamed layers updated on the device"
expect_in auto_cpu "0 streamed layers updated on the device \(offload.shared_split_layers: auto, 0 bytes"
/usr/bin/python3 - "$WORK/np2_none.jsonl" "$WORK/np4_split.jsonl" "$WORK/np2_all_split.jsonl" <<'PY' \
  && pass "split: device steps, traffic and device bytes" || fail "split: device steps, traffic or device bytes wrong"
import json, sys
none, three, six = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert all(r["theta_device_steps"] == 3 for r in three), [r["theta_device_steps"] for r in three]
assert all(r["theta_device_steps"] == 6 for r in six), [r["theta_device_steps"] for r in six]
assert all(r["theta_device_steps"] == 0 for r in none)
assert {r["theta_device_slot_bytes"] for r in six} == {3 * 4224 + 3 * 3 * 4224}, {r["theta_device_slot_bytes"] for r in six}
# rank 0 of 2 owns half the layers: with every layer split it copies lines out, never gradients.
assert sum(r["theta_d2h_bytes"] for r in six) > 0
PY
expect_in resume_then "resumed from .*step-00000010 at step 10"
same_hash "resume: split 3 then split 5 == 20 resident steps" resume_resident resume_then

# Bad input: exit 2 naming the key and the sizes.
expect_code 2 bad_split_count "$thetad" validate "$job" "${trunk[@]}" --set offload.shared=stream \
  --set offload.shared_device_layers=2 --set offload.shared_split_layers=5
expect_in bad_split_count "offload.shared_split_layers: updates 5 streamed layers on the device, but the trunk has 6 layers .* of which 2 stay on the device .*: at most 4"
expect_code 2 bad_split_word "$thetad" validate "$job" --set offload.shared=stream --set offload.shared_split_layers=half
expect_in bad_split_word "offload.shared_split_layers: expected auto or a whole number of layers, got \"half\""
expect_code 2 bad_split_neg "$thetad" validate "$job" --set offload.shared=stream --set offload.shared_split_layers=-2
expect_in bad_split_neg "offload.shared_split_layers: must be >= 0, got -2"
finish
