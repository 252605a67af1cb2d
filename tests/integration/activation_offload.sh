#!/usr/bin/env bash
# offload.activations on vs off: bitwise the same final parameters after 20 steps on 1, 2 and 4
# ranks, with prune, accumulation, an alternate schedule with frozen groups, several tasks per
# rank (a layer used twice in one backward), θ[t] offload, bf16, the extreme classifier's
# encoder and the transformer's feed-forward activations (gpt2 and llama, frozen base); the
# single-process reference agrees. The metrics show the saved tensors held on the
# device staying within two layers' worth and the pinned pool not growing after the first step.
# Models it does not cover and bad values exit 2.
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
job=$HERE/jobs/small.yaml
base=(--set steps=20 --set model.trunk_layers=3 --set comm.prune=true)
# on_off NAME NP ARGS...: activations off and on, queued; on_off_check NAME after the runs: the
# same final hash, metrics checked.
on_off() {
  local name=$1 np=$2; shift 2
  for act in false true; do
    queue_np "${name}_act_$act" "$np" "$job" "${base[@]}" --set offload.activations=$act "$@"
  done
  CHECKS+=("$name")
}
on_off_check() {
  local name=$1
  same_hash "$name: activations on == off bitwise" "${name}_act_false" "${name}_act_true"
  /usr/bin/python3 - "$WORK/${name}_act_true.jsonl" "$WORK/${name}_act_false.jsonl" <<'PY' \
    && pass "$name: within 2 layers on the device, pool warm after step 0" || fail "$name: metrics"
import json, sys
on = [json.loads(l) for l in open(sys.argv[1])]
off = [json.loads(l) for l in open(sys.argv[2])]
used = [r for r in on if r["act_offload_bytes"] > 0]
assert used, "no activation copies at all"
for r in used:
    assert 0 < r["act_device_peak_bytes"] <= 2 * r["act_layer_bytes"], \
        "step %d: %d bytes held, one layer is %d" % (r["step"], r["act_device_peak_bytes"], r["act_layer_bytes"])
allocs = [r["act_pool_allocations"] for r in on]
assert allocs[0] > 0 and all(a == allocs[0] for a in allocs), "pool allocations per step %s" % allocs
assert all(r["act_offload_bytes"] == 0 and r["act_pool_allocations"] == 0 for r in off), "off moved activations"
print("peak %d bytes, one layer %d, %d pinned buffers" % (max(r["act_device_peak_bytes"] for r in used),
      max(r["act_layer_bytes"] for r in used), allocs[0]))
PY
}
# reference NAME NP ARGS...: the single-process reference ends with the parameters of run NAME.
reference() {
  local name=$1 np=$2; shift 2
  queue_ref "${name}_reference" 0 "$job" --world "$np" "${base[@]}" "$@" --compare "$WORK/${name}_act_true.ckpt"
}
# Every run is queued, and run by world size, one start each (run_queue); the checks after.
CHECKS=()
for np in 1 2 4; do on_off "np$np" "$np"; done
# The copies show on the timeline's d2h and h2d lanes (checked below).
queue_np timeline 1 "$job" "${base[@]}" --set steps=3 --set offload.activations=true --set timeline.path="$WORK/trace.json"
reference np4 4
on_off prune_off_np2 2 --set comm.prune=false --set comm.average=world
on_off accumulate_np2 2 --set accumulate_steps=2
alternate=(--set data.schedule=alternate --set "data.alternate=[shared,tasks,task:2]")
on_off alternate_np2 2 "${alternate[@]}"
reference alternate_np2 2 "${alternate[@]}"
on_off two_tasks_np4 4 --set data.tasks_per_rank=2
reference two_tasks_np4 4 --set data.tasks_per_rank=2
on_off store_np2 2 --set offload.enabled=true --set offload.device_slots=2
on_off bf16_np2 2 --set precision=bf16 --set data.tasks_per_rank=2
xc=(--set model.kind=extreme_classifier --set model.classes=400 --set optimizer.lr=0.03)
on_off xc_np2 2 "${xc[@]}"

# The transformer: its feed-forward activations' inputs (gpt2's gelu, llama's SwiGLU) go to the
# host, its LoRA adapters and a frozen base's (fused) loss around them.
tfm_on_off() {
  local name=$1 np=$2; shift 2
  local job=$HERE/jobs/transformer.yaml
  local -a base=(--set steps=8)
  on_off "$name" "$np" "$@"
}
tfm_on_off tfm_np2 2
tfm_on_off tfm_llama_frozen_bf16_np1 1 --set model.arch=llama --set model.kv_heads=1 --set model.train_shared=false \
  --set precision=bf16 --set data.tasks_per_rank=2

# Bad input: models whose activations it cannot move (the key in the file: its line is named),
# a value that is not a bool.
bad_job=$WORK/act.yaml
{ cat "$job"; echo "offload: {activations: true}"; } > "$bad_job"
line=$(grep -n '^offload:' "$bad_job" | cut -d: -f1)
queue bad_run 2 2 "$bad_job" --no-resume --set model.kind=multitask_adapter
run_queue

for name in "${CHECKS[@]}"; do on_off_check "$name"; done
/usr/bin/python3 - "$WORK/trace.json" <<'PY' && pass "timeline: activation copies on the d2h and h2d lanes" || fail "timeline: no activation copies"
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
lanes = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
got = {lanes.get(e.get("tid")) for e in ev if e.get("name", "").startswith("activations of layer")}
assert got == {"d2h", "h2d"}, got
PY
for kind in multitask_adapter; do
  expect_code 2 "bad_$kind" "$thetad" validate "$bad_job" --set model.kind=$kind
  expect_in "bad_$kind" "act.yaml:$line:[0-9]+: .*offload.activations: .*'$kind' keeps its activations on the device"
done
expect_in bad_run "offload.activations: .*multitask_adapter"
expect_code 2 bad_value "$thetad" validate "$job" --set offload.activations=sometimes
expect_in bad_value "offload.activations"
finish
