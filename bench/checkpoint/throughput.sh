#!/usr/bin/env bash
# Checkpoint throughput and incremental checkpoints (not in CI).
# Usage: bench/checkpoint/throughput.sh THETAD [DIR]   (DIR: where checkpoints go, default a
# temporary directory on the disk under test; SCALE=k multiplies the shapes below)
# Prints, in one run on one disk:
#  1. a full checkpoint's bytes/s (its "checkpoint step N: wrote X MB ... Z s" line: snapshot,
#     files written and synced, manifest, rename) against `dd oflag=direct` of the same size;
#  2. what an incremental checkpoint wrote and linked (Θ + the groups trained since);
#  3. the stall of the final checkpoint of a 1,024-task multitask job that trained 60 groups
#     (the issue's GPU case is d = 1024, 32 GB; here d is scaled down to fit a CPU machine).
set -euo pipefail
thetad=$1
dir=${2:-$(mktemp -d)}
scale=${SCALE:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
job=$(cd "$(dirname "$0")/../.." && pwd)/tests/integration/jobs/small.yaml
mkdir -p "$dir"
trap 'rm -rf "$dir"/bench-*' EXIT
run() { local name=$1; shift; "$thetad" run "$job" --no-resume --set checkpoint.dir="$dir/bench-$name" \
          --set log.level=info --set comm.bucket_cap_mb=25 "$@" > "$dir/bench-$name.log" 2>&1; }
line() { grep -o "checkpoint step $2: wrote [0-9.]* MB in [0-9]* files, linked [0-9.]* MB in [0-9]* files, [0-9.]* s" "$dir/bench-$1.log"; }

# 1. Full checkpoint: a wide trunk (Θ of 4 x hidden^2 values), one step, its checkpoint written whole.
hidden=$((2048 * scale))
run full --set steps=1 --set model.input_dim=$hidden --set model.hidden=$hidden --set model.trunk_layers=4 \
  --set checkpoint.every_steps=1
l=$(line full 1)
mb=$(echo "$l" | awk '{print $5}'); secs=$(echo "$l" | awk '{print $(NF-1)}')
dd if=/dev/zero of="$dir/bench-dd" bs=16M count=$(( ${mb%.*} / 16 + 1 )) oflag=direct 2> "$dir/bench-dd.log"
dd_mbs=$(awk '/copied/ {print $(NF-1), $NF}' "$dir/bench-dd.log")
rm -f "$dir/bench-dd"
echo "full checkpoint: $l -> $(awk -v m="$mb" -v s="$secs" 'BEGIN {printf "%.0f", m / s}') MB/s; dd oflag=direct: $dd_mbs"
# Its two parts: the snapshot (the trainer's stall) and the files' writing, syncing and publishing.
echo "  of which $(grep -o 'snapshot [0-9.]* ms' "$dir/bench-full.log" | head -1), written $(grep -o 'in the background in [0-9.]* ms' "$dir/bench-full.log" | head -1 | sed 's/.* in //')"

# 2 and 3. 1,024 tasks of d = 256 * SCALE, one task per step: a full checkpoint at step 30, then
# the final one at step 60 (Θ + the 30 tasks trained since), overlapping the final hash.
d=$((256 * scale))
run tasks --set steps=60 --set model.tasks=1024 --set model.input_dim=$d --set model.hidden=$d \
  --set model.trunk_layers=2 --set model.head_layers=2 --set checkpoint.every_steps=30 --set checkpoint.keep=2
echo "1,024 tasks (d=$d), first checkpoint:  $(line tasks 30)"
echo "1,024 tasks (d=$d), final checkpoint:  $(line tasks 60)"
grep -o "final params hash computed while .*\|final checkpoint and hash: the trainer stalled [0-9.]* ms\|synchronous: the trainer stalled [0-9.]* ms" \
  "$dir/bench-tasks.log" | tail -2
