#!/usr/bin/env bash
# Accounting and outputs: step_ms covers each step whole (its
# checkpoint and the last step included) and the phases are disjoint parts of it; a resumed run
# does not record replayed steps twice; per-rank outputs without {rank} and outputs on one path
# are refused before any step; a checkpoint past `steps` is exit 2, one at `steps` is "nothing
# to do"; a job file without end is refused at once; `version` says whether NCCL is usable.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
run() { mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" "$@"; }

# step_ms: every step, checkpoint steps and the last one included, holds its phases.
expect_code 0 timed run --set steps=6 --set checkpoint.dir="$WORK/timed" --set checkpoint.every_steps=2 \
  --set metrics.path="$WORK/timed.jsonl" --no-resume
$py - "$WORK/timed.jsonl" <<'PY' && pass "step_ms >= the sum of the phases on every step" || fail "step_ms vs phases"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in recs] == list(range(6)), [r["step"] for r in recs]
for r in recs:
    phases = r["forward_ms"] + r["backward_ms"] + r["comm_wait_ms"] + r["optimizer_ms"]
    assert r["step_ms"] > 0 and r["step_ms"] >= phases, (r["step"], r["step_ms"], phases)
PY

# A crash after the checkpoint of step 4 (its final checkpoint never written): the resumed run
# replays steps 4 and 5, and the metrics hold each step once.
rm -rf "$WORK/timed/step-00000006"
expect_code 0 replay run --set steps=8 --set checkpoint.dir="$WORK/timed" --set checkpoint.every_steps=2 \
  --set metrics.path="$WORK/timed.jsonl"
expect_in replay "resumed from .*step-00000004 at step 4"
steps=$($py -c "import json,sys; print(' '.join(str(json.loads(l)['step']) for l in open(sys.argv[1])))" "$WORK/timed.jsonl")
[ "$steps" = "0 1 2 3 4 5 6 7" ] && pass "metrics after the resume: each step once" || fail "metrics steps: $steps"

# A checkpoint past steps: exit 2 naming both; at steps: nothing to do, exit 0.
expect_code 2 past run --set steps=5 --set checkpoint.dir="$WORK/timed"
expect_in past "step-00000008: the newest checkpoint is of step 8, past steps: 5 of this job"
expect_code 0 complete run --set steps=8 --set checkpoint.dir="$WORK/timed"
expect_in complete "already complete: resumed at step 8 = steps; nothing to do"

# Outputs: timeline without {rank} on 2 ranks, metrics and log on one path: exit 2, no step.
expect_code 2 timeline_rank run --set timeline.path="$WORK/trace.json" --set metrics.path="$WORK/tl.jsonl" --no-resume
expect_in timeline_rank "small.yaml: timeline.path: '.*trace.json' has no \\{rank\\} but the world has 2 ranks"
[ ! -e "$WORK/tl.jsonl" ] && [ ! -e "$WORK/trace.json" ] && pass "timeline_rank: nothing written" || fail "timeline_rank: wrote output"
expect_code 2 same_path "$thetad" validate "$job" --set metrics.path="$WORK/x" --set log.file="$WORK/x"
expect_in same_path "--set log.file: is the same path as metrics.path"
# checkpoint.dir is one directory for every rank: {rank} in it is exit 2 before anything is made.
expect_code 2 ckpt_rank "$thetad" run "$job" --set checkpoint.dir="$WORK/ck_{rank}" --no-resume
expect_in ckpt_rank "--set checkpoint.dir: \\{rank\\} cannot be used here: a checkpoint is one directory"
[ ! -e "$WORK/ck_0" ] && [ ! -e "$WORK/ck_{rank}" ] && pass "ckpt_rank: no directory made" || fail "ckpt_rank: made a directory"

# A job file without end, and binary junk: exit 2 at once, nothing raw echoed.
expect_code 2 dev_zero timeout 20 "$thetad" validate /dev/zero
expect_in dev_zero "/dev/zero: cannot read job file: not a regular file \(a character device\)"
head -c 3000 /bin/ls > "$WORK/junk.yaml"
expect_code 2 junk "$thetad" validate "$WORK/junk.yaml"
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$WORK/junk.log"; then fail "junk: control characters echoed"
else pass "junk: no control characters in the error"; fi

# Keys without effect: a warning naming file:line:key, exit 0.
expect_code 0 irrelevant "$thetad" validate "$job" --set data.weights='[1, 2, 3, 4]'
expect_in irrelevant "warning: --set data.weights: ignored: data.schedule is round_robin"

# version: what the build can use.
expect_code 0 version "$thetad" version
expect_in version "^backends: mpi \\(CPU tensors\\), nccl "
finish
