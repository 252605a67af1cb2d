#!/usr/bin/env bash
# On the visible GPUs: the trainer's stall per checkpoint, synchronous vs
# asynchronous (the snapshot staged on the device, ShardValues in daemon/state/checkpoint.hpp),
# at the reference model (bench/jobs/reference.yaml) on all visible GPUs, fp32 and bf16: a
# checkpoint every CKPT_EVERY=20 of CKPT_STEPS=100 steps (bench/checkpoint_stall.sh). Goal: the
# async stall at the checkpointing step <= one median step.
#
#   bash bench/gpu/checkpoint.sh      # from the repository root, environment: docs/gpu.md
#
# Builds thetad in ${CKPT_BUILD_DIR:-/tmp/build} (CKPT_SKIP_BUILD=1: use it as it is). Logs and
# metrics go into ${OUT:-/tmp/out}/checkpoint.tar; the table is the last thing printed.
# CKPT_BUDGET_S=240 bounds the whole script; CKPT_PRECISIONS="fp32 bf16"; CKPT_MODES="false true"
# (checkpoint.async values: STALL_MODES of bench/checkpoint_stall.sh).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD=${CKPT_BUILD_DIR:-/tmp/build}
START=$(date +%s) BUDGET=${CKPT_BUDGET_S:-240}
STEPS=${CKPT_STEPS:-100} EVERY=${CKPT_EVERY:-20}
NP=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$NP" -ge 1 ] || NP=2
LOGS=$(mktemp -d)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

if [ "${CKPT_SKIP_BUILD:-0}" != 1 ]; then
  { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" --target thetad -j 16; } \
    > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; echo "checkpoint.sh: build failed"; exit 1; }
fi
THETAD=$BUILD/daemon/thetad
echo "[ckpt $(( $(date +%s) - START ))s] built; $NP ranks"

TABLE=$LOGS/table.txt
: > "$TABLE"
for prec in ${CKPT_PRECISIONS:-fp32 bf16}; do
  t=$(left)
  [ "$t" -gt 30 ] || { echo "$prec: skipped (budget)" | tee -a "$TABLE"; continue; }
  timeout "$(( t - 5 ))" env STALL_LOGS="$LOGS/$prec" STALL_MODES="${CKPT_MODES:-false true}" bash bench/checkpoint_stall.sh "$THETAD" bench/jobs/reference.yaml \
    "$NP" "$STEPS" "$EVERY" --set precision="$prec" > "$LOGS/$prec.txt" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { echo "$prec: exit $rc"; tail -20 "$LOGS/$prec.txt"; }
  sed "s/^/$prec /" "$LOGS/$prec.txt" | grep ' async=' >> "$TABLE"
  echo "[ckpt $(( $(date +%s) - START ))s] $prec done"
done
tar -C "$LOGS" -cf "$OUT/checkpoint.tar" . && rm -rf "$LOGS/"{fp32,bf16}
echo "== stall per checkpoint (ms; async: the part at the checkpointing step is the target, <= median step_ms)"
cat "$TABLE"
