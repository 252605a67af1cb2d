#!/usr/bin/env bash
# every step that ran has its metrics record, also the one that went non-finite
# (train.on_nonfinite: stop, exit 1 naming it: its record has nonfinite: 1) and the one whose
# checkpoint failed (warn: the checkpoint of non-finite parameters is refused, exit 1).
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
run() { mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume "$@"; }
# records NAME STEP [any|after]: the metrics of NAME end at STEP, one record per step 0..STEP,
# and STEP's record has nonfinite: 1 (unless `any`); `after`: they end at STEP or one step later.
records() {
  $py - "$WORK/$1.jsonl" "$2" "${3:-}" <<'PY' && pass "$1: records 0..$2${3:+ ($3)}" || fail "$1: records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
last = int(sys.argv[2])
steps = [r["step"] for r in recs]
if sys.argv[3] == "after":
    assert steps == list(range(len(steps))) and last <= steps[-1] <= last + 1, (steps, last)
else:
    assert steps == list(range(last + 1)), steps
assert sys.argv[3] in ("any", "after") or recs[-1]["nonfinite"] == 1, recs[-1]
PY
}

expect_code 1 stop run --set steps=6 --set optimizer.lr=1e30 --set metrics.path="$WORK/stop.jsonl"
expect_in stop "non-finite training: the loss of step [1-5] is (nan|inf)"
step=$(grep -oE "the loss of step [0-9]+" "$WORK/stop.log" | head -1 | grep -oE "[0-9]+$")
records stop "$step"

# Stopped at its checkpoint (checked before it is written): the same.
expect_code 1 stop_ckpt run --set steps=6 --set optimizer.lr=1e30 --set metrics.path="$WORK/stop_ckpt.jsonl" \
  --set checkpoint.dir="$WORK/ck" --set checkpoint.every_steps=1
step=$(grep -oE "the loss of step [0-9]+" "$WORK/stop_ckpt.log" | head -1 | grep -oE "[0-9]+$")
records stop_ckpt "$step"

# warn: the checkpoint of the NaN parameters fails (exit 1); the steps up to it have records. A
# synchronous checkpoint is refused at its step (its last step is refused - 1); one written in
# the background (checkpoint.async, the default) when its write is agreed, a step later: the
# step that ran meanwhile has its record too.
expect_code 1 warn run --set steps=8 --set optimizer.lr=1e30 --set train.on_nonfinite=warn \
  --set checkpoint.dir="$WORK/warn" --set checkpoint.every_steps=1 --set metrics.path="$WORK/warn.jsonl"
refused=$(grep -oE "the checkpoint of step [0-9]+ is not written" "$WORK/warn.log" | head -1 | grep -oE "[0-9]+" | head -1)
records warn "$((refused - 1))" after
expect_code 1 warn_sync run --set steps=8 --set optimizer.lr=1e30 --set train.on_nonfinite=warn \
  --set checkpoint.dir="$WORK/warn_sync" --set checkpoint.every_steps=1 --set checkpoint.async=false \
  --set metrics.path="$WORK/warn_sync.jsonl"
refused=$(grep -oE "the checkpoint of step [0-9]+ is not written" "$WORK/warn_sync.log" | head -1 | grep -oE "[0-9]+" | head -1)
records warn_sync "$((refused - 1))" any
finish
