#!/usr/bin/env bash
# The trainer's stall per checkpoint, checkpoint.async true vs false (docs/BENCHMARKS.md).
# Usage: bench/checkpoint_stall.sh THETAD JOB.yaml NP STEPS EVERY [--set ...]
# Prints, per mode: the stall of each checkpoint but the last (synchronous in both modes: the
# run's end), their mean, the part of it at the checkpointing step (async; the rest is the
# per-step polls and agreements), the background write+publish times, and the median step_ms.
set -euo pipefail
thetad=$1 job=$2 np=$3 steps=$4 every=$5; shift 5
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for mode in false true; do
  mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo --mca pml ob1 -np "$np" "$thetad" run "$job" --no-resume \
    --set steps="$steps" --set checkpoint.every_steps="$every" --set checkpoint.keep=2 \
    --set checkpoint.async=$mode --set checkpoint.dir="$work/ckpt-$mode" --set metrics.path="$work/m-$mode.jsonl" \
    --set log.level=info "$@" > "$work/$mode.log" 2>&1
  stalls=$(grep -o 'the trainer stalled [0-9.]*' "$work/$mode.log" | awk '{print $4}' | head -n -1 | tr '\n' ' ')
  at_step=$(grep -o '[0-9.]* ms of them at step' "$work/$mode.log" | awk '{print $1}' | tr '\n' ' ' || true)
  writes=$(grep -o 'in the background in [0-9.]*' "$work/$mode.log" | awk '{print $5}' | tr '\n' ' ' || true)
  step_med=$(python3 -c "
import json,statistics
print(round(statistics.median(json.loads(l)['step_ms'] for l in open('$work/m-$mode.jsonl')),2))")
  mean=$(echo "$stalls" | awk '{s=0; for(i=1;i<=NF;i++) s+=$i; if (NF) printf "%.1f", s/NF}')
  echo "async=$mode stall_ms: [$stalls] mean $mean; of which at the checkpointing step: [$at_step]; background write_ms: [$writes]; median step_ms $step_med"
done
