#!/usr/bin/env bash
# Offload on vs off: bitwise-identical parameters after 20 steps on 1, 2 and 4 ranks, with fewer
# device slots than tasks (evictions happen) and 1-step prefetch; swaps show in the metrics.
# The same for the extreme classifier with row shards (offload.shard_mb), whose slices are
# streamed shard by shard with fewer device slots than shards; the sharded model also matches
# the unsharded one within float tolerance and the single-process reference.
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
job=$HERE/jobs/small.yaml
# on_off NP NAME ARGS...: queues the job with offload off and on on NP ranks (each run's
# log $WORK/NAME_offload_{false,true}.log, metrics $WORK/NAME_{false,true}.jsonl); on_off_check
# NAME, after the runs: the same final hash, and swaps in the offload run's metrics.
on_off() {
  local np=$1 name=$2; shift 2
  for off in false true; do
    queue "${name}_offload_$off" "$np" 0 "$job" --no-resume --set steps=20 --set offload.enabled=$off \
      --set offload.device_slots=2 --set offload.prefetch=1 --set metrics.path="$WORK/${name}_$off.jsonl" "$@"
  done
  CHECKS+=("$name")
}
on_off_check() {
  local name=$1 a b
  a=$(final_hash "$WORK/${name}_offload_false.log"); b=$(final_hash "$WORK/${name}_offload_true.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$name: offload on == off bitwise ($a)"
  else fail "$name: offload on $b != off $a"; fi
  /usr/bin/python3 - "$WORK/${name}_true.jsonl" <<'PY' && pass "$name: swaps and host arena in metrics" || fail "$name: metrics lack swaps"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["swap_misses"] for r in recs) > 0 and sum(r["h2d_bytes"] for r in recs) > 0, "no swaps"
assert all(r["host_pinned_bytes"] > 0 for r in recs), "no arena"
PY
}
CHECKS=()
# Extreme classifier, 400 classes in 4 slices of 100 rows of 33 floats (hidden 32 + bias):
# shard_mb 0.004 (4194 bytes) makes shards of 31 rows, 4 per slice, streamed through 2 slots.
xc=(--set model.kind=extreme_classifier --set model.classes=400 --set optimizer.lr=0.03
    --set offload.shard_mb=0.004)
# Every run of a world size in one start (run_queue); the checks after.
for np in 1 2 4; do
  on_off "$np" "np$np" --set model.tasks=6
  on_off "$np" "xc_np$np" "${xc[@]}" --set checkpoint.dir="$WORK/xc_ck_np$np"
done
# DDP's semantics (prune off, average world): every bucket is reduced, groups nobody used
# included; those are not stepped (their copies to the host are discarded), as with offload off.
on_off 2 np2_prune_off --set model.tasks=6 --set comm.prune=false --set comm.average=world
on_off 2 xc_accumulate_np2 "${xc[@]}" --set accumulate_steps=2
# Sampled softmax over the shards (the label classes plus 20 sampled ones per step): offload on
# == off bitwise, and the single-process reference agrees.
xcn=("${xc[@]}" --set model.negatives_per_step=20)
on_off 2 xc_negatives_np2 "${xcn[@]}" --set checkpoint.dir="$WORK/xcn_ck_np2"
# Sampled softmax over small shards (3 rows, 34 per slice; 16 labels and 2 negatives per step):
# most shards get no class in a step. They are marked absent, so the shards after them launch
# during backward instead of at finish_backward, and the engine holds at most 2 shards' gradients
# (3 rows of 33 floats each) at once. With accumulate_steps 2, the shards of the first
# micro-step's task are handed over before the last backward. Offload on == off bitwise.
xcs=(--set model.kind=extreme_classifier --set model.classes=400 --set optimizer.lr=0.03
     --set offload.shard_mb=0.0004 --set model.negatives_per_step=2)
on_off 2 xc_sparse_np2 "${xcs[@]}"
on_off 2 xc_sparse_accumulate_np2 "${xcs[@]}" --set accumulate_steps=2
# Gradient clipping of offloaded groups: the owner clips by the norm of the reduced gradient on
# the host (it never is whole on the device with shards); the reference clips on the tensors.
# clip_norm 0.05 clips most steps; same parameters within 1e-5.
queue xc_clip 2 0 "$job" --no-resume --set steps=20 "${xc[@]}" --set optimizer.clip_norm=0.05 \
  --set offload.enabled=true --set offload.device_slots=2 --set checkpoint.dir="$WORK/xc_ck_clip"
# The unsharded model (weight and bias apart, one matmul per slice), compared below.
queue xc_unsharded 2 0 "$job" --no-resume --set steps=20 "${xc[@]}" --set offload.shard_mb=0 \
  --set offload.enabled=true --set offload.device_slots=2 --set checkpoint.dir="$WORK/xc_ck_unsharded"
# Bad settings exit 2 with a clear message: slots < 1, an arena larger than the host limit, row
# shards on a model that does not compute over them, one slot for two-at-a-time shards.
queue zero_slots 2 2 "$job" --no-resume --set offload.enabled=true --set offload.device_slots=0
queue host_limit 2 2 "$job" --no-resume --set offload.enabled=true --set offload.host_limit_mb=0.001
queue shard_mlp 2 2 "$job" --no-resume --set offload.enabled=true --set offload.shard_mb=1
run_queue
# (Refused once the store is planned, after start-up: the ranks abort the job with exit 2.)
expect_code 2 shard_one_slot mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume \
  "${xc[@]}" --set offload.enabled=true --set offload.device_slots=1

for name in "${CHECKS[@]}"; do on_off_check "$name"; done
expect_in np4_offload_true "host store: 6 task groups, 2 device slots"
expect_in xc_np2_offload_true "4 groups in 16 units, 2 device slots"
# Each shard's gradient is reduced and copied to the host on its own: the engine never holds
# more than two shards' gradients (4092 bytes each) of a 13200-byte slice at once.
for np in 2 4; do
  /usr/bin/python3 - "$WORK/xc_np${np}_true.jsonl" <<'PY' && pass "xc_np$np: shard gradients streamed (at most 2 shards held)" \
    || fail "xc_np$np: shard gradients not streamed"
import json, sys
peak = max(json.loads(l)["grad_stream_peak_bytes"] for l in open(sys.argv[1]))
assert 0 < peak <= 2 * 31 * 33 * 4, "grad_stream_peak_bytes %d" % peak
PY
done
expect_code 0 xcn_reference "$reference" "$job" --world 2 --set steps=20 "${xcn[@]}" --compare "$WORK/xcn_ck_np2"
expect_in xc_sparse_np2_offload_true "4 groups in 136 units"
/usr/bin/python3 - "$WORK/xc_sparse_np2_true.jsonl" <<'PY' && pass "xc_sparse_np2: empty shards hold nothing up (at most 2 shards held)" \
  || fail "xc_sparse_np2: shard gradients piled up behind empty shards"
import json, sys
peak = max(json.loads(l)["grad_stream_peak_bytes"] for l in open(sys.argv[1]))
assert 0 < peak <= 2 * 3 * 33 * 4, "grad_stream_peak_bytes %d" % peak
PY
expect_code 0 xc_clip_reference "$reference" "$job" --world 2 --set steps=20 "${xc[@]}" \
  --set optimizer.clip_norm=0.05 --compare "$WORK/xc_ck_clip" --tol 1e-5
expect_code 1 xc_clip_differs "$reference" "$job" --world 2 --set steps=20 "${xc[@]}" \
  --set optimizer.clip_norm=0 --compare "$WORK/xc_ck_clip" --tol 1e-5
# Sharded vs the single-process reference (same chunks, plain autograd), and vs the unsharded
# model within float tolerance.
expect_code 0 xc_reference "$reference" "$job" --world 2 --set steps=20 "${xc[@]}" --compare "$WORK/xc_ck_np2"
HERE=$HERE /usr/bin/python3 - "$WORK/xc_ck_np2/step-00000020" "$WORK/xc_ck_unsharded/step-00000020" <<'PY' \
  && pass "sharded == unsharded within 1e-4" || fail "sharded differs from unsharded"
import os, sys, torch
sys.path.insert(0, os.environ["HERE"])
from ckpt_groups import load
sharded, plain = (load(d) for d in sys.argv[1:3])
assert len(sharded) == 5, sorted(sharded)
worst = 0.0
for g in range(5):
    a, b = sharded[g]["param"], plain[g]["param"]
    if g > 0:  # slice of 100 rows: sharded [rows x (hidden+1)] (bias as last column), plain weight then bias
        rows = 100
        hidden = b.numel() // rows - 1
        b = torch.cat([b[: rows * hidden].view(rows, hidden), b[rows * hidden:].unsqueeze(1)], 1).reshape(-1)
    worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
print(f"max relative difference {worst:.3g}")
assert worst < 1e-4
PY
expect_in zero_slots "offload.device_slots"
expect_in host_limit "offload"
expect_in shard_mlp "offload.shard_mb: .*extreme_classifier"
expect_in shard_one_slot "offload.device_slots: .*at least 2 device slots"
finish
