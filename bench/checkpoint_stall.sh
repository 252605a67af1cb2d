#!/usr/bin/env bash
# The trainer's stall per checkpoint, checkpoint.async true vs false (docs/BENCHMARKS.md).
# Usage: bench/checkpoint_stall.sh THETAD JOB.yaml NP STEPS EVERY [--set ...]
# Prints, per mode: the stall of each checkpoint but the last (synchronous in both modes: the
# run's end), their mean, the part of it at the checkpointing step (async; the rest is the
# per-step polls and agreements), the background write+publish times, and the median step_ms.
# On a GPU machine (bench/gpu/checkpoint.sh): NCCL's multicast stays off and LD_LIBRARY_PATH
# reaches the ranks; STALL_LOGS=DIR keeps the logs and metrics there (else a temporary directory).
# STALL_MODES="true": the asynchronous mode only (default "false true": both).
set -euo pipefail
thetad=$1 job=$2 np=$3 steps=$4 every=$5; shift 5
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
mpi_env=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && mpi_env+=(-x LD_LIBRARY_PATH)
if [ -n "${STALL_LOGS:-}" ]; then
  work=$STALL_LOGS; mkdir -p "$work"; ckpt=$(mktemp -d); trap 'rm -rf "$ckpt"' EXIT
else
  work=$(mktemp -d); ckpt=$work; trap 'rm -rf "$work"' EXIT
fi
for mode in ${STALL_MODES:-false true}; do
  mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx "${mpi_env[@]}" -np "$np" "$thetad" run "$job" --no-resume \
    --set steps="$steps" --set checkpoint.every_steps="$every" --set checkpoint.keep=2 \
    --set checkpoint.async=$mode --set checkpoint.dir="$ckpt/ckpt-$mode" --set metrics.path="$work/m-$mode.jsonl" \
    --set log.level=info "$@" > "$work/$mode.log" 2>&1
  stalls=$(grep -o 'the trainer stalled [0-9.]*' "$work/$mode.log" | awk '{print $4}' | head -n -1 | tr '\n' ' ')
  at_step=$(grep -o '[0-9.]* ms of them at step' "$work/$mode.log" | awk '{print $1}' | tr '\n' ' ' || true)
  writes=$(grep -o 'in the background in [0-9.]*' "$work/$mode.log" | awk '{print $5}' | tr '\n' ' ' || true)
  step_med=$(python3 -c "
import json,statistics
print(round(statistics.median(json.loads(l)['step_ms'] for l in open('$work/m-$mode.jsonl')),2))")
  mean=$(echo "$stalls" | awk '{s=0; for(i=1;i<=NF;i++) s+=$i; if (NF) printf "%.1f", s/NF}')
  staged=$(grep -o '([0-9.]* MB staged on the tensors. device, [0-9.]* MB copied on the host)' "$work/$mode.log" | head -1 || true)
  snaps=$(grep -o 'barrier [0-9.]* ms, snapshot [0-9.]* ms' "$work/$mode.log" | awk '{print $5}' | tr '\n' ' ' || true)
  warm=$(grep -o 'checkpoint warm-up after step [0-9]*: [0-9.]* ms' "$work/$mode.log" | head -1 || true)
  echo "async=$mode stall_ms: [$stalls] mean $mean; of which at the checkpointing step: [$at_step] (snapshots [$snaps]); background write_ms: [$writes]; median step_ms $step_med ${staged:+snapshot $staged}${warm:+; $warm}"
done
