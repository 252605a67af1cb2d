#!/usr/bin/env bash
# Offload on vs off: bitwise-identical parameters after 20 steps on 1, 2 and 4 ranks, with fewer
# device slots than tasks (evictions happen) and 1-step prefetch; swaps show in the metrics.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
for np in 1 2 4; do
  for off in false true; do
    expect_code 0 "np${np}_offload_$off" mpirun "${MPIRUN_FLAGS[@]}" -np "$np" "$thetad" run "$job" \
      --no-resume --set steps=20 --set model.tasks=6 --set offload.enabled=$off --set offload.device_slots=2 \
      --set offload.prefetch=1 --set metrics.path="$WORK/np${np}_$off.jsonl"
  done
  a=$(final_hash "$WORK/np${np}_offload_false.log"); b=$(final_hash "$WORK/np${np}_offload_true.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "np=$np: offload on == off bitwise ($a)"
  else fail "np=$np: offload on $b != off $a"; fi
  /usr/bin/python3 - "$WORK/np${np}_true.jsonl" <<'PY' && pass "np=$np: swaps and host arena in metrics" || fail "np=$np: metrics lack swaps"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["swap_misses"] for r in recs) > 0 and sum(r["h2d_bytes"] for r in recs) > 0, "no swaps"
assert all(r["host_pinned_bytes"] > 0 for r in recs), "no arena"
PY
done
expect_in np4_offload_true "host store: 6 task groups, 2 device slots"
# Bad settings exit 2 with a clear message: slots < 1, an arena larger than the host limit.
expect_code 2 zero_slots mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume \
  --set offload.enabled=true --set offload.device_slots=0
expect_in zero_slots "offload.device_slots"
expect_code 2 host_limit mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume \
  --set offload.enabled=true --set offload.host_limit_mb=0.001
expect_in host_limit "offload"
finish
