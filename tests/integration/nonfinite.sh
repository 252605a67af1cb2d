#!/usr/bin/env bash
# Non-finite training: a loss that becomes NaN or Inf on any rank stops the
# job on every rank (train.on_nonfinite: stop, exit 1, naming the step and what is non-finite),
# or skips the step everywhere (skip_step: counted in the metrics), or is logged (warn). A
# checkpoint of non-finite parameters is never written (the previous one stays the newest), and
# a checkpoint holding NaN is refused at resume (exit 2 naming the file).
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
run() { mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume "$@"; }
newest() { ls -d "$1"/step-* 2>/dev/null | sort | tail -1 | xargs -r basename; }

# optimizer.lr: 1e30: step 0 is finite, its update is not; the next loss stops the job.
expect_code 1 lr_stop run --set steps=6 --set optimizer.lr=1e30 --set checkpoint.dir="$WORK/lr" \
  --set checkpoint.every_steps=1
expect_in lr_stop "non-finite training: the loss of step [1-5] is (nan|inf) on rank [01]"
expect_in lr_stop "train.on_nonfinite: stop"
if grep -q "final params hash" "$WORK/lr_stop.log"; then fail "lr_stop: ran to the end"; else pass "lr_stop: stopped"; fi

# data.noise: 1e308: the targets overflow at step 0.
expect_code 1 noise_stop run --set steps=6 --set data.noise=1e308
expect_in noise_stop "non-finite training: the loss of step 0 is (nan|inf)"

# warn: training goes on; the parameters become NaN and their checkpoint is refused (exit 1);
# the newest checkpoint on disk stays the last finite one.
expect_code 1 warn_ckpt run --set steps=8 --set optimizer.lr=1e30 --set train.on_nonfinite=warn \
  --set checkpoint.dir="$WORK/warn" --set checkpoint.every_steps=1 --set checkpoint.keep=1 \
  --set metrics.path="$WORK/warn.jsonl"
expect_in warn_ckpt "non-finite loss at step [0-9]+: .*training goes on \\(train.on_nonfinite: warn\\)"
expect_in warn_ckpt "non-finite parameters after step ([0-9]+): parameter '.*' of group [0-9]+ holds NaN or Inf; the checkpoint of step \\1 is not written"
last=$(newest "$WORK/warn")
refused=$(grep -oE "the checkpoint of step [0-9]+ is not written" "$WORK/warn_ckpt.log" | head -1 | grep -oE "[0-9]+")
if [ -n "$last" ] && [ "$((10#${last#step-}))" -lt "${refused:-0}" ]; then pass "warn_ckpt: newest checkpoint $last is older than the refused step $refused"
else fail "warn_ckpt: newest checkpoint '$last', refused step '$refused'"; fi
ls "$WORK/warn" | grep -q '^\.tmp-step' && fail "warn_ckpt: a .tmp-step directory was left" || pass "warn_ckpt: no .tmp-step left"
# The same with the snapshot staged (as on a GPU; the test aid stages host tensors): staged
# parameters are checked as flat runs, and a failing run still names its non-finite parameter.
expect_code 1 warn_staged env THETAD_TEST_CHECKPOINT_STAGE_HOST=1 mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run \
  "$job" --no-resume --set steps=8 --set optimizer.lr=1e30 --set train.on_nonfinite=warn \
  --set checkpoint.dir="$WORK/warn_staged" --set checkpoint.every_steps=1 --set checkpoint.keep=1
expect_in warn_staged "non-finite parameters after step ([0-9]+): parameter '.*' of group [0-9]+ holds NaN or Inf; the checkpoint of step \\1 is not written"

# Inf in one task's npy targets: only the steps that train it are non-finite, on one rank at a
# time; skip_step skips them on both ranks, the others train, and every checkpoint is finite.
if $py -c 'import numpy' 2>/dev/null; then
  $py - "$WORK/data" <<'PY'
import numpy as np, sys, os
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
for t in range(4):
    x = rng.standard_normal((50, 16)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((16, 1)).astype(np.float32)).astype(np.float32)
    if t == 2: y[:] = np.inf
    np.save(f"{d}/task{t}_x.npy", x); np.save(f"{d}/task{t}_y.npy", y)
PY
  npy=(--set data.kind=npy --set data.dir="$WORK/data" --set steps=8)
  expect_code 1 npy_stop run "${npy[@]}"
  # (stop reads the loss one step late: the next update may have spoilt the parameters by then)
expect_in npy_stop "non-finite training: the loss of step [0-9]+ is (inf|nan) on rank [01]; (the parameters are finite|when it was read .* holds NaN or Inf \\(look at the inputs and targets)"
  for offload in false true; do
    name=npy_skip_$offload
    expect_code 0 $name run "${npy[@]}" --set train.on_nonfinite=skip_step --set offload.enabled=$offload \
      --set checkpoint.dir="$WORK/$name" --set metrics.path="$WORK/$name.jsonl"
    expect_in $name "non-finite loss at step [0-9]+.*the step is skipped on every rank"
    $py - "$WORK/$name.jsonl" <<'PY' && pass "$name: metrics count the skipped steps" || fail "$name: metrics"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
skipped = [r["step"] for r in recs if r["skipped"] == 1]
assert len(recs) == 8 and 0 < len(skipped) < 8, (len(recs), skipped)
assert all(r["nonfinite"] == 1 for r in recs if r["skipped"] == 1)
PY
    [ "$(newest "$WORK/$name")" = step-00000008 ] && pass "$name: final checkpoint written" || fail "$name: no final checkpoint"
  done
else
  echo "numpy missing: npy cases skipped"
fi

# A checkpoint holding NaN (written by hand, checksum matching): refused at resume, exit 2.
expect_code 0 good run --set steps=2 --set checkpoint.dir="$WORK/nan"
$py - "$WORK/nan/step-00000002" <<'PY'
import torch, sys, os
os.chdir(sys.argv[1])
g = 'shard-00001.pt'  # the task groups' file (Θ has shard-00000.pt to itself): group 1 first
d = torch.load(g)
d['param'][int(d['offsets'][0])] = float('nan')
torch.save(d, g)
PY
$py "$HERE/rechecksum.py" "$WORK/nan/step-00000002"
expect_code 2 resume_nan mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set steps=3 --set checkpoint.dir="$WORK/nan"
expect_in resume_nan "shard-00001.pt: group 1: parameters hold NaN or Inf"
finish
