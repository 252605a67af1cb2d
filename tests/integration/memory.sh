#!/usr/bin/env bash
# a job whose model needs more host memory than this machine has is refused
# before anything is allocated (exit 2, fast, naming the key and the sizes) by `validate` and by
# `run` (one rank, and two under mpirun); an allocation that fails anyway (a process limit,
# ulimit -v) ends the run with exit 1 and one line, without LibTorch's C++ frames. A job whose
# lower bound of device memory exceeds what the device has free is refused the same way, before
# its model is built and before anything is written (the device's memory given by the test aid
# THETAD_TEST_DEVICE_MEMORY, which also makes CPU ranks check).
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
# 1000 heads of 4097 x 4096: 1.7e10 parameters, 250 GiB with gradients and Adam moments.
huge=(--set model.hidden=4096 --set model.output_dim=4096 --set model.tasks=1000)

expect_code 2 validate_huge "$thetad" validate "$job" "${huge[@]}"
expect_in validate_huge "small.yaml: model.tasks: the job needs at least [0-9.]+ GiB of host memory on this host \(counted for one rank\), which has [0-9.]+ [GMT]iB available \(MemAvailable in /proc/meminfo\): 1 rank\(s\) x [0-9.]+ GiB"
start=$SECONDS
expect_code 2 run_huge timeout 120 "$thetad" run "$job" --no-resume "${huge[@]}"
((SECONDS - start < 30)) && pass "run_huge: refused in $((SECONDS - start)) s" || fail "run_huge: $((SECONDS - start)) s"
expect_in run_huge "model.tasks: the job needs at least [0-9.]+ GiB of host memory on this node \(1 rank\(s\)\)"
expect_not_in run_huge "model multitask_mlp built"  # refused before the model was built
expect_code 2 run_huge_np2 timeout 120 mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume "${huge[@]}"
expect_in run_huge_np2 "on this node \(2 rank\(s\)\).*: 2 rank\(s\) x [0-9.]+ GiB"

# An allocation that fails anyway: a limit on the process's address space below what the model
# takes (the estimate, against the machine's memory, lets it through).
# 100 heads of 2049 x 2048 (1.7 GB of values; the machine has more) under a 1.5 GB limit.
expect_code 1 alloc_fail bash -c 'ulimit -v 1500000; exec "$0" run "$1" --no-resume --set steps=2 \
  --set model.hidden=2048 --set model.output_dim=2048 --set model.tasks=100' "$thetad" "$job"
expect_in alloc_fail "out of host memory: "
expect_not_in alloc_fail "frame #|Exception raised from"
[ "$(grep -c "out of host memory" "$WORK/alloc_fail.log")" -eq 1 ] && pass "alloc_fail: one line" \
  || fail "alloc_fail: $(cat "$WORK/alloc_fail.log")"

# Device memory. 1000 x 1000 trunk: ~1e6 shared parameters, 16 MB with gradients and Adam moments.
wide=(--set model.hidden=1000 --set steps=2)
expect_code 2 validate_device env THETAD_TEST_DEVICE_MEMORY=8/81920 "$thetad" validate "$job" "${wide[@]}"
expect_in validate_device "small.yaml: model.hidden: the job needs at least [0-9.]+ MiB of device memory per rank, but the device of THETAD_TEST_DEVICE_MEMORY has 8.00 MiB free of 80.00 GiB: Θ's values [0-9.]+ MiB"
expect_code 0 validate_device_fits env THETAD_TEST_DEVICE_MEMORY=81920/81920 "$thetad" validate "$job" "${wide[@]}"
expect_in validate_device_fits "device memory: the job needs at least [0-9.]+ MiB per rank \(counted for one rank\)"
for np in 1 2; do
  name=run_device_np$np
  start=$SECONDS
  expect_code 2 $name timeout 120 mpirun "${MPIRUN_FLAGS[@]}" -x THETAD_TEST_DEVICE_MEMORY=8/81920 -np $np \
    "$thetad" run "$job" --no-resume "${wide[@]}" --set checkpoint.dir="$WORK/$name.ckpt" \
    --set metrics.path="$WORK/$name.jsonl"
  ((SECONDS - start < 30)) && pass "$name: refused in $((SECONDS - start)) s" || fail "$name: $((SECONDS - start)) s"
  expect_in $name "model.hidden: the job needs at least [0-9.]+ MiB of device memory per rank, but the device of THETAD_TEST_DEVICE_MEMORY.* has 8.00 MiB free of 80.00 GiB: .*Θ's gradient buckets"
  expect_in $name "device memory: at least [0-9.]+ MiB per rank"  # the estimate's parts, logged on rank 0
  expect_not_in $name "model multitask_mlp built"
  [ ! -e "$WORK/$name.ckpt" ] && [ ! -e "$WORK/$name.jsonl" ] && pass "$name: nothing written" \
    || fail "$name: $(ls -d "$WORK/$name".* 2>&1)"
done
expect_in run_device_np2 "of rank [01]"
# Enough: the run goes on and trains.
expect_code 0 run_device_fits env THETAD_TEST_DEVICE_MEMORY=81920/81920 "$thetad" run "$job" --no-resume "${wide[@]}"
expect_in run_device_fits "final params hash"
finish
