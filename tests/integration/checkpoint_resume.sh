#!/usr/bin/env bash
# Checkpoints: a run stopped at step 20 and resumed to 30 ends bitwise-identical to an
# uninterrupted 30-step run, also from files of many blocks; partial checkpoints are ignored;
# another world size resumes; Python's torch.load reads the files; `keep` prunes old ones.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
run() { mpirun "${MPIRUN_FLAGS[@]}" -np "$1" "$thetad" run "$job" "${@:2}"; }

expect_code 0 full run 2 --set checkpoint.dir="$WORK/full" --set checkpoint.every_steps=10 --no-resume
expect_code 0 first20 run 2 --set steps=20 --set checkpoint.dir="$WORK/resumed" --no-resume
expect_code 0 resume30 run 2 --set checkpoint.dir="$WORK/resumed"
expect_in resume30 "resumed from .*step-00000020 at step 20"
h_full=$(final_hash "$WORK/full.log"); h_res=$(final_hash "$WORK/resume30.log")
if [ -n "$h_full" ] && [ "$h_full" = "$h_res" ]; then pass "resumed run is bitwise identical ($h_full)"
else fail "resumed hash $h_res != uninterrupted $h_full"; fi

# keep: 3 by default; checkpoints at 10, 20, 30 of the full run
n=$(find "$WORK/full" -maxdepth 1 -name 'step-*' | wc -l)
[ "$n" -eq 3 ] && pass "keep=3 kept 3 checkpoints" || fail "expected 3 checkpoints, found $n"

# A checkpoint killed mid-write (still a .tmp dir) is ignored; a step-* directory without its
# manifest (damaged since: a write is renamed step-* only once complete) is refused, not skipped
# (tests/integration/checkpoint_trust.sh), and resumes past once moved away.
cp -r "$WORK/resumed/step-00000020" "$WORK/resumed/step-00000040"
rm "$WORK/resumed/step-00000040/manifest.json"
mkdir -p "$WORK/resumed/.tmp-step-00000050"
expect_code 2 damaged run 2 --set checkpoint.dir="$WORK/resumed" --set steps=35
expect_in damaged "step-00000040/manifest.json: missing: the newest checkpoint in .* is damaged"
mv "$WORK/resumed/step-00000040" "$WORK/step-00000040.damaged"
expect_code 0 partial run 2 --set checkpoint.dir="$WORK/resumed" --set steps=35
expect_in partial "resumed from .*step-00000030 at step 30"

# Another world size: groups are replicated, so 3 ranks resume a 2-rank checkpoint.
expect_code 0 world3 run 3 --set checkpoint.dir="$WORK/full" --set steps=40
expect_in world3 "resumed from .*step-00000030 at step 30"

# Python reads the files.
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  expect_code 0 torch_load /usr/bin/python3 -c "
import torch, json, sys
sys.path.insert(0, '$HERE')
from ckpt_groups import load
m = json.load(open('$WORK/full/step-00000030/manifest.json'))
d = torch.load('$WORK/full/step-00000030/' + m['files'][0]['file'])
assert m['step'] == 30 and m['world_size'] == 2 and m['groups'] == 5, m
assert sorted(d) == ['exp_avg', 'exp_avg_sq', 'groups', 'offsets', 'param', 'steps'], sorted(d)
g = load('$WORK/full/step-00000030')
assert sorted(g) == [0, 1, 2, 3, 4] and g[1]['steps'] > 0 and g[1]['exp_avg'].numel() == g[1]['param'].numel(), g[1]
print('keys', sorted(d)[:4])"
fi
# A fresh start (--no-resume) in a directory holding a newer run's checkpoints: those move to
# previous-<time>/ (kept, never pruned), the new run's own checkpoints survive keep-N pruning,
# and a later resume picks the new run's newest step, not the old run's.
expect_code 0 old6 run 2 --set steps=6 --set checkpoint.every_steps=2 --set checkpoint.keep=2 \
  --set checkpoint.dir="$WORK/rerun" --no-resume
expect_code 0 fresh3 run 2 --set steps=3 --set checkpoint.every_steps=1 --set checkpoint.keep=2 \
  --set checkpoint.dir="$WORK/rerun" --no-resume
expect_in fresh3 "checkpoints already in .* were moved to .*previous-"
now=$(cd "$WORK/rerun" && ls -d step-* 2>/dev/null | tr '\n' ' ')
old=$(cd "$WORK/rerun" && ls -d previous-*/step-* 2>/dev/null | sed 's|.*/||' | tr '\n' ' ')
[ "$now" = "step-00000002 step-00000003 " ] && pass "the fresh run's last 2 checkpoints are kept ($now)" \
  || fail "fresh run's checkpoints: '$now' (want step-00000002 step-00000003)"
[ "$old" = "step-00000004 step-00000006 " ] && pass "the old run's checkpoints were set aside ($old)" \
  || fail "old run's checkpoints: '$old'"
expect_code 0 resume_fresh run 2 --set steps=5 --set checkpoint.dir="$WORK/rerun"
expect_in resume_fresh "resumed from .*step-00000003 at step 3"
# Checkpoint files are synced to disk before the rename publishes them.
if command -v strace >/dev/null 2>&1; then
  expect_code 0 synced strace -f -qq -e trace=fsync -o "$WORK/fsync.trace" "$thetad" run "$job" --no-resume \
    --set steps=2 --set checkpoint.dir="$WORK/synced"
  n=$(grep -c 'fsync(' "$WORK/fsync.trace" || true)
  [ "$n" -ge 3 ] && pass "checkpoint files and directories fsynced ($n calls)" || fail "only $n fsync calls"
fi

# A file of several 4 MiB blocks (Θ of 1024 x 2048 + 2048^2 values: 50 MB), written by several
# threads at once, its tensors of 8 and 16 MiB copied into the snapshot by several threads: a run
# resumed from it ends bitwise-identical, and torch.load reads the same values.
big=(--set model.input_dim=1024 --set model.hidden=2048 --set comm.bucket_cap_mb=25 --set checkpoint.every_steps=2)
expect_code 0 big4 run 1 --set steps=4 --set checkpoint.dir="$WORK/big4" "${big[@]}" --no-resume
expect_code 0 big2 run 1 --set steps=2 --set checkpoint.dir="$WORK/big2" "${big[@]}" --no-resume
expect_code 0 big2to4 run 1 --set steps=4 --set checkpoint.dir="$WORK/big2" "${big[@]}"
h_big=$(final_hash "$WORK/big4.log"); h_big_res=$(final_hash "$WORK/big2to4.log")
[ -n "$h_big" ] && [ "$h_big" = "$h_big_res" ] && pass "multi-block files resume bitwise ($h_big)" || fail "multi-block: $h_big_res != $h_big"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  expect_code 0 big_torch_load /usr/bin/python3 -c "
import sys, torch
sys.path.insert(0, '$HERE')
from ckpt_groups import load
a, b = load('$WORK/big4/step-00000004'), load('$WORK/big2/step-00000004')
assert a[0]['param'].numel() > 1 << 20 and sorted(a) == sorted(b), (a[0]['param'].numel(), sorted(a), sorted(b))
keys = ('param', 'exp_avg', 'exp_avg_sq')
assert all(torch.equal(a[g][k], b[g][k]) for g in a for k in keys), [g for g in a if not all(torch.equal(a[g][k], b[g][k]) for k in keys)]"
fi

# A checkpoint of another model is refused with exit 2, naming the key that differs.
expect_code 2 other_model run 2 --set checkpoint.dir="$WORK/full" --set model.hidden=48
expect_in other_model "layout: model.hidden is 32 in the checkpoint, 48 in this job"
finish
