#!/usr/bin/env bash
# The store's device cache (offload.device_cache_mb): groups cached on the device with their Adam
# state and updated there, evicted to the host (Belady over every rank's schedule) and updated by
# the owner's CPU AdamW there: bitwise the parameters of offload off, on 1, 2 and 4 ranks, with
# every group cached, with 2 lines for 6 groups (evictions and flushes happen), with gradient
# clipping, accumulation, two simulated nodes (one arena and one flushing owner per node), across
# a checkpoint taken with dirty cached groups and resumed, and after a kill -9 of every rank while
# a checkpoint is being written. Bad sizes are exit 2.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
# 6 groups of 33 floats: a line (params, m, v) is 396 bytes; 0.0008 MiB (838 bytes) holds 2 lines.
W=(--set model.tasks=6 --set data.schedule=weighted --set "data.weights=[1,2,3,1,2,3]" --set optimizer.clip_norm=0.5)
OFF=(--set offload.enabled=false)
ON=(--set offload.enabled=true --set offload.device_slots=2)
TWO=("${ON[@]}" --set offload.device_cache_mb=0.0008)
ALL=("${ON[@]}" --set offload.device_cache_mb=1)
# Every run is queued first and run by world size, one start each (run_queue); the checks after.
for np in 1 2 4; do
  queue_np off_np$np $np "$job" --set steps=30 "${W[@]}" "${OFF[@]}"
  queue_np all_np$np $np "$job" --set steps=30 "${W[@]}" "${ALL[@]}"
  queue_np two_np$np $np "$job" --set steps=30 "${W[@]}" "${TWO[@]}"
done
# offload.uncached_update: 4 lines for 6 groups, of which up to 2 are transit lines (as many as
# a step uses groups): a group the cache does not keep is streamed through one with its Adam
# state and updated on the device (device), or where the measured bandwidths favour it (auto),
# or updated by its owner's CPU AdamW (host). Each gives offload off's bits.
FOUR=("${ON[@]}" --set offload.device_cache_mb=0.0016)
for np in 1 2; do
  for mode in host device auto; do
    queue_np u${mode}_np$np $np "$job" --set steps=30 "${W[@]}" "${FOUR[@]}" --set offload.uncached_update=$mode
  done
done
# A checkpoint at step 20 with groups in transit lines, resumed to 30 with and without them.
queue_np ufirst20 2 "$job" --set steps=20 "${W[@]}" "${FOUR[@]}" --set offload.uncached_update=device
for mode in device host; do
  queue uresume30_$mode 2 0 "$job" --set steps=30 "${W[@]}" "${FOUR[@]}" --set offload.uncached_update=$mode \
    --set checkpoint.dir="$WORK/ufirst20.ckpt"
done
# The extreme classifier's slices are streamed in row chunks through the slots even where a slice
# is one shard: they stay out of the cache (and equal offload off).
XC=(--set model.kind=extreme_classifier --set model.classes=400 --set optimizer.lr=0.03 --set offload.shard_mb=0.1)
queue_np xc_off 2 "$job" --set steps=20 "${XC[@]}" "${OFF[@]}"
queue_np xc_cache 2 "$job" --set steps=20 "${XC[@]}" "${ALL[@]}"
queue_np acc_off 2 "$job" --set steps=20 --set accumulate_steps=2 "${W[@]}" "${OFF[@]}"
queue_np acc_two 2 "$job" --set steps=20 --set accumulate_steps=2 "${W[@]}" "${TWO[@]}"
# A checkpoint at step 20 with dirty cached groups, resumed to 30: the uninterrupted run's bits.
queue_np first20 2 "$job" --set steps=20 "${W[@]}" "${TWO[@]}"
queue resume30 2 0 "$job" --set steps=30 "${W[@]}" "${TWO[@]}" --set checkpoint.dir="$WORK/first20.ckpt"
# A budget that holds no line (396 bytes here) is exit 2 naming the key and the line's size (found by
# validation, before any rank starts: "at least", the largest group's).
queue small_budget 2 2 "$job" --no-resume --set steps=2 "${W[@]}" "${ON[@]}" --set offload.device_cache_mb=0.0001
run_queue
# Two simulated nodes of 2 ranks: each node's arena gets its flushes from its own owner.
queue nodes_off 4 0 "$job" --no-resume --set steps=30 "${W[@]}" "${OFF[@]}"
queue nodes_two 4 0 "$job" --no-resume --set steps=30 "${W[@]}" "${TWO[@]}"
run_queue -x THETAD_SIMULATE_NODES=2

for np in 1 2 4; do
  same_hash "np$np: every group cached == offload off" off_np$np all_np$np
  same_hash "np$np: 2 lines for 6 groups == offload off" off_np$np two_np$np
done
expect_in all_np2 "device cache: 6 lines of"
expect_in all_np2 "device cache: 6 loads, 0 flushes by this rank, [0-9]+ group steps on the device"
expect_in two_np2 "device cache: 2 lines of"
# Evicted groups went back to the host (some rank flushed) and later came back.
if grep -qE "device cache: [0-9]+ loads, [1-9][0-9]* flushes" "$WORK/two_np2.log"; then
  pass "two_np2: evicted groups flushed to the host"; else fail "two_np2: no flush"; fi
for np in 1 2; do
  for mode in host device auto; do same_hash "np$np: uncached_update $mode == offload off" off_np$np u${mode}_np$np; done
done
expect_in udevice_np2 "device cache: 2 of its lines are transit lines \\(offload.uncached_update: device\\)"
expect_in udevice_np1 "device cache: 1 of its lines are transit lines"
expect_in udevice_np2 "group steps on the device \\([1-9][0-9]* of them streamed through transit lines\\)"
expect_in uhost_np2 "group steps on the device \\(0 of them streamed"
expect_in uauto_np2 "offload.uncached_update: auto\\), measured at step [0-9]+ on groups of 33 parameters: PCIe"
if python3 - "$WORK/udevice_np2.jsonl" <<'PY'; then pass "udevice_np2: streamed_steps in the metrics"; else fail "udevice_np2: streamed_steps"; fi
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["streamed_steps"] for r in rows) > 0 and all(r["streamed_steps"] <= r["device_steps"] for r in rows)
PY
for mode in device host; do
  same_hash "checkpoint with streamed groups, resumed with $mode: == uninterrupted offload off" off_np2 uresume30_$mode
done
same_hash "extreme classifier, one shard per slice, cache on == offload off" xc_off xc_cache
same_hash "accumulate_steps 2: 2 lines == offload off" acc_off acc_two
same_hash "2 simulated nodes x 2 ranks: 2 lines == offload off" nodes_off nodes_two
expect_in resume30 "resumed from .*step-00000020 at step 20"
same_hash "checkpoint with cached groups, resumed: == uninterrupted offload off" off_np2 resume30
expect_in small_budget "offload.device_cache_mb: 0.0001 MiB holds no task group: one line .* is (at least )?396 bytes"

# kill -9 of every rank while the checkpoint of step 10 is being written (slowed by the writer's
# test aid), with dirty groups in the cache: step 5 stays the newest complete checkpoint, and the
# run resumed from it ends with the uninterrupted run's bits.
THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS=3000 mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume \
  --set job=cachekill-$$ --set steps=30 "${W[@]}" "${TWO[@]}" --set checkpoint.every_steps=5 \
  --set checkpoint.dir="$WORK/kill" > "$WORK/kill.log" 2>&1 &
mpirun_pid=$!
if wait_for 60 exists "$WORK/kill/step-00000005/manifest.json" && wait_for 60 exists "$WORK/kill/.tmp-step-00000010"; then
  # shellcheck disable=SC2046  # one pid per word
  kill -9 $(ranks_of "cachekill-$$")
  wait "$mpirun_pid" || true
  [ "$(newest "$WORK/kill")" = step-00000005 ] && pass "kill -9 with cached groups: step 5 is the newest checkpoint" \
    || fail "kill -9 with cached groups: newest is '$(newest "$WORK/kill")'"
else
  fail "kill -9: no write of step 10 in flight seen"
  # shellcheck disable=SC2046  # one pid per word
  kill -9 $(ranks_of "cachekill-$$") 2>/dev/null; wait "$mpirun_pid" || true
fi
expect_code 0 kill_resume mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set steps=30 "${W[@]}" "${TWO[@]}" \
  --set checkpoint.dir="$WORK/kill"
expect_in kill_resume "resumed from .*step-00000005 at step 5"
same_hash "kill -9 with cached groups, resumed: == uninterrupted offload off" off_np2 kill_resume

for bad in abc -1 "1e99"; do
  expect_code 2 "bad_$bad" "$thetad" validate "$job" --set offload.enabled=true --set "offload.device_cache_mb=$bad"
  expect_in "bad_$bad" "offload.device_cache_mb.*expected auto or a size in MiB"
done
finish
