#!/usr/bin/env bash
# offload.shared: stream (Θ streamed layer by layer from a host store of its own) vs resident:
# bitwise-identical parameters after 20 steps on 1, 2 and 4 ranks, with pruning on and off,
# gradient accumulation, an alternate schedule that freezes Θ in some steps, a frozen base, comm
# discover mode, bf16 autocast, and θ[t] offload on and off; the single-process reference agrees; Θ's device slots stay within the
# prefetch window (less than Θ); the lowest layers kept on the device (shared_device_layers) change
# nothing but where they are stepped; a checkpoint of one mode resumes in the other with the same
# continuation; bad input is exit 2 naming the key.
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
job=$HERE/jobs/small.yaml
# 6 trunk layers of 16->32 then 32->32 (+ bias): Θ = 544 + 5 x 1056 floats = 23296 bytes.
trunk=(--set model.trunk_layers=6 --set steps=20)
# Every run is queued first and run by world size, one start each (run_queue); the checks after.
# job_np NAME NP ARGS...: a run from scratch on NP ranks that must end 0.
job_np() { local name=$1 np=$2; shift 2; queue "$name" "$np" 0 "$job" --no-resume "${trunk[@]}" "$@"; }

# on_off NAME NP ARGS...: resident and streamed Θ, queued; their final hashes are compared after.
ON_OFF=()
on_off() {
  local name=$1 np=$2; shift 2
  job_np "${name}_resident" "$np" --set offload.shared=resident "$@"
  job_np "${name}_stream" "$np" --set offload.shared=stream --set metrics.path="$WORK/${name}_stream.jsonl" "$@"
  ON_OFF+=("$name")
}
for np in 1 2 4; do on_off "np$np" "$np"; done
on_off np2_prefetch3 2 --set offload.shared_prefetch_layers=3
on_off np4_prune_off 4 --set comm.prune=false --set comm.average=world
on_off np2_accumulate 2 --set accumulate_steps=2
on_off np4_accumulate 4 --set accumulate_steps=3 --set data.tasks_per_rank=2
on_off np2_alternate 2 --set data.schedule=alternate --set "data.alternate=[shared,tasks,task:2]"
on_off np2_frozen 2 --set model.train_shared=false
on_off np2_offload 2 --set offload.enabled=true --set offload.device_slots=2
on_off np4_offload_accumulate 4 --set offload.enabled=true --set offload.device_slots=4 --set accumulate_steps=2
on_off np2_discover 2 --set comm.active=discover
# bf16 autocast with two tasks per rank: each layer's bias gradients of its two uses are summed in
# bf16 as autocast's cached cast of the resident bias sums them.
on_off np2_bf16 2 --set precision=bf16 --set data.tasks_per_rank=2
# The layers (and θ[t]) sent to the device as bf16 (offload.h2d_dtype): the same bits, since the
# trunk layer's matmul and bias add read them through autocast's bf16 casts anyway.
job_np np2_bf16_copies 2 --set offload.shared=stream --set precision=bf16 --set data.tasks_per_rank=2 \
  --set offload.h2d_dtype=bf16 --set offload.enabled=true --set offload.device_slots=2
# The lowest layers on the device (the store's cache lines, the device AdamW), the rest streamed.
on_off np1_devlayers 1 --set offload.shared_device_layers=2
on_off np2_devlayers 2 --set offload.shared_device_layers=3
on_off np4_devlayers_accumulate 4 --set offload.shared_device_layers=1 --set accumulate_steps=2 --set data.tasks_per_rank=2
on_off np2_devlayers_alternate 2 --set offload.shared_device_layers=2 --set data.schedule=alternate \
  --set "data.alternate=[shared,tasks,task:2]"
on_off np2_devlayers_offload 2 --set offload.shared_device_layers=4 --set offload.enabled=true --set offload.device_slots=2
on_off np2_devlayers_prune_off 2 --set offload.shared_device_layers=2 --set comm.prune=false
# auto: what the device's free memory holds; the host device has none of its own, so none here
# (tests/integration/gpu_train.sh checks a GPU's count).
on_off np2_devlayers_auto 2 --set offload.shared_device_layers=auto
# The single-process reference (plain autograd, Θ on the device) agrees.
job_np ref_run 2 --set offload.shared=stream --set checkpoint.dir="$WORK/ref_ck" --set accumulate_steps=2
queue_ref ref_compare 0 "$job" --world 2 "${trunk[@]}" --set accumulate_steps=2 --compare "$WORK/ref_ck"
# Resume across modes: 10 steps in one mode, 10 more in the other == 20 in one.
for first in stream resident; do
  second=$([ $first = stream ] && echo resident || echo stream)
  job_np "resume_${first}_10" 2 --set offload.shared=$first --set steps=10 --set checkpoint.dir="$WORK/ck_$first"
  queue "resume_${first}_then_$second" 2 0 "$job" "${trunk[@]}" --set offload.shared=$second \
    --set checkpoint.dir="$WORK/ck_$first"
done
# Resume with device layers: their values and moments are read from the device into the
# checkpoint, and written back into the lines when a run resumes.
job_np resume_devlayers_10 2 --set offload.shared=stream --set offload.shared_device_layers=3 \
  --set steps=10 --set checkpoint.dir="$WORK/ck_devlayers"
queue resume_devlayers_then_devlayers 2 0 "$job" "${trunk[@]}" --set offload.shared=stream \
  --set offload.shared_device_layers=3 --set checkpoint.dir="$WORK/ck_devlayers"
# Bad input: exit 2 naming the key (and the sizes); checked below.
queue bad_arena 1 2 "$job" --no-resume "${trunk[@]}" --set offload.shared=stream --set offload.host_limit_mb=0.01
run_queue

for name in "${ON_OFF[@]}"; do same_hash "$name: streamed Θ == resident Θ bitwise" "${name}_resident" "${name}_stream"; done
same_hash "np2_bf16: bf16 copies of streamed Θ and θ[t] == resident Θ bitwise" np2_bf16_resident np2_bf16_copies
expect_in np2_stream "Θ streamed: 6 trunk layers, 3 device slots"
expect_in np2_devlayers_stream "3 layers kept on the device \(38016 bytes\)"
expect_in np2_devlayers_auto_stream "0 layers kept on the device \(0 bytes\)"

# Θ's device memory is the window's slots: (prefetch + 2) slots of the largest layer (1056 floats,
# 4224 bytes), less than Θ itself; its copies show in the metrics.
for name in np2 np2_prefetch3; do
  /usr/bin/python3 - "$WORK/${name}_stream.jsonl" "$name" <<'PY' && pass "$name: Θ device bytes within the window" \
    || fail "$name: Θ device bytes not within the window"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
k = 3 if sys.argv[2].endswith("prefetch3") else 1
slots = {r["theta_device_slot_bytes"] for r in recs}
assert slots == {(k + 2) * 4224}, slots
assert (k + 2) * 4224 < 23296 or k == 3, "window not smaller than Θ"
assert all(r["theta_h2d_bytes"] > 0 for r in recs), "no Θ copies"
assert sum(r["theta_d2h_bytes"] for r in recs) > 0, "no Θ gradients to the host"
PY
done

# With 3 of 6 layers on the device: 3 lines of 3 x 1056 floats more device memory, each of those
# layers stepped on the device every step, and their gradients no longer copied to the host.
/usr/bin/python3 - "$WORK/np2_stream.jsonl" "$WORK/np2_devlayers_stream.jsonl" <<'PY' && pass "np2_devlayers: device layers' bytes, steps and traffic" \
  || fail "np2_devlayers: device layers' bytes, steps or traffic wrong"
import json, sys
base, dev = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert {r["theta_device_slot_bytes"] for r in dev} == {3 * 4224 + 3 * 3 * 4224}, {r["theta_device_slot_bytes"] for r in dev}
assert all(r["theta_device_steps"] == 3 for r in dev), [r["theta_device_steps"] for r in dev]
assert all(r["theta_device_steps"] == 0 for r in base)
d2h = lambda rs: sum(r["theta_d2h_bytes"] for r in rs)
h2d = lambda rs: sum(r["theta_h2d_bytes"] for r in rs)
assert 0 < d2h(dev) < d2h(base), (d2h(dev), d2h(base))
assert 0 < h2d(dev) < h2d(base), (h2d(dev), h2d(base))
PY

for first in stream resident; do
  second=$([ $first = stream ] && echo resident || echo stream)
  expect_in "resume_${first}_then_$second" "resumed from .*step-00000010 at step 10"
  same_hash "resume: $first then $second == 20 steps" np2_resident "resume_${first}_then_$second"
done
same_hash "resume: device layers, 10 + 10 steps == 20" np2_resident resume_devlayers_then_devlayers

# Bad input: exit 2 naming the key (and the sizes).
expect_code 2 bad_kind "$thetad" validate "$job" --set offload.shared=stream --set model.kind=multitask_adapter
expect_in bad_kind "offload.shared: stream is for model.kind multitask_mlp"
expect_code 2 bad_no_layers "$thetad" validate "$job" --set offload.shared=stream --set model.trunk_layers=0
expect_in bad_no_layers "offload.shared: stream needs trunk layers to stream; model.trunk_layers is 0"
expect_code 2 bad_window "$thetad" validate "$job" --set offload.shared=stream --set offload.shared_prefetch_layers=2
expect_in bad_window "offload.shared_prefetch_layers: prefetches 2 layers ahead, but the trunk has 2 layers"
expect_code 2 bad_devlayers "$thetad" validate "$job" "${trunk[@]}" --set offload.shared=stream \
  --set offload.shared_device_layers=6
expect_in bad_devlayers "offload.shared_device_layers: keeps 6 trunk layers on the device, but the trunk has 6 layers"
expect_code 2 bad_devlayers_neg "$thetad" validate "$job" --set offload.shared=stream --set offload.shared_device_layers=-1
expect_in bad_devlayers_neg "offload.shared_device_layers: must be >= 0, got -1"
expect_code 2 bad_devlayers_word "$thetad" validate "$job" --set offload.shared=stream --set offload.shared_device_layers=most
expect_in bad_devlayers_word "offload.shared_device_layers: expected auto or a whole number of layers, got \"most\""
expect_code 2 bad_clip "$thetad" validate "$job" --set offload.shared=stream --set optimizer.clip_norm=1
expect_in bad_clip "optimizer.clip_norm is 1"
expect_code 2 bad_word "$thetad" validate "$job" --set offload.shared=streamed
expect_in bad_word "offload.shared: must be one of"
expect_in bad_arena "offload.shared: stream: Θ's host store \(6 trunk layers, 23296 bytes of parameters\)"
finish
