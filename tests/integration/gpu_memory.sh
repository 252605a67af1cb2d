#!/usr/bin/env bash
# GPU (ctest label gpu; skips cleanly without a GPU): a job far too big for one GPU is refused
# before its model is built: exit 2 within seconds, naming the key and the
# sizes against the GPU's free and total memory, nothing written.
#   gpu_memory.sh THETAD
source "$(dirname "$0")/lib.sh"
thetad=$1  # (the CMake test passes the reference too; it is not used here)
skip_without_gpu  # ctest: Skipped, not Passed
job=$HERE/jobs/small.yaml
# 3000 heads of 4097 x 4096 resident on the device: 5.0e10 parameters, 188 GiB of values alone.
huge=(--set comm.backend=nccl --set model.hidden=4096 --set model.output_dim=4096 --set model.tasks=3000
      --set steps=2 --set checkpoint.dir="$WORK/ckpt" --set metrics.path="$WORK/metrics.jsonl")
start=$SECONDS
expect_code 2 gpu_huge timeout 300 mpirun "${MPIRUN_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 -np 1 "$thetad" run "$job" \
  --no-resume "${huge[@]}"
((SECONDS - start < 60)) && pass "gpu_huge: refused in $((SECONDS - start)) s" || fail "gpu_huge: $((SECONDS - start)) s"
expect_in gpu_huge "model.tasks: the job needs at least [0-9.]+ GiB of device memory per rank, but cuda:[0-9]+ has [0-9.]+ GiB free of [0-9.]+ GiB: .*the task groups' values \(model.tasks = 3000\) [0-9.]+ GiB"
expect_in gpu_huge "device memory: at least [0-9.]+ GiB per rank"
expect_not_in gpu_huge "model multitask_mlp built"
[ ! -e "$WORK/ckpt" ] && [ ! -e "$WORK/metrics.jsonl" ] && pass "gpu_huge: nothing written" || fail "gpu_huge: written"
# validate needs no device: it says the estimate (a CUDA build) and checks nothing against it.
expect_code 0 gpu_validate "$thetad" validate "$job" "${huge[@]}"
expect_in gpu_validate "thetad: device memory: the job needs at least [0-9.]+ GiB per rank \(counted for one rank\)"
finish
