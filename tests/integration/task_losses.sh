#!/usr/bin/env bash
# rank 0's metrics record and progress line hold the per-task loss of every
# rank's tasks, not only rank 0's. 2 ranks, round robin (each step rank 0 and rank 1 train
# different tasks), with metrics.all_ranks: rank 0's record of each step must hold every task of
# both ranks' own records, with the very values each rank computed; with accumulate_steps 2 a
# task trained in both micro-steps appears once. The demo's plot script draws every task.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3

expect_code 0 two_ranks mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume --set steps=6 \
  --set metrics.path="$WORK/m-{rank}.jsonl" --set metrics.all_ranks=true --set data.tasks_per_rank=2 \
  --set log.progress_every_s=0
$py - "$WORK/m-0.jsonl" "$WORK/m-1.jsonl" <<'PY' && pass "rank 0's records hold both ranks' task losses" \
  || fail "rank 0's task losses"
import json, sys
r0 = [json.loads(l) for l in open(sys.argv[1])]
r1 = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in r0] == list(range(6)) == [r["step"] for r in r1]
seen = set()
for a, b in zip(r0, r1):
    mine = {t["task"]: t["loss"] for t in b["task_loss"]}
    got = {t["task"]: t["loss"] for t in a["task_loss"]}
    assert len(mine) == 2 and set(mine) <= set(got), (a["step"], got, mine)
    assert len(got) == 4, (a["step"], got)  # 2 tasks per rank, 4 tasks: all of them each step
    for t, l in mine.items():
        assert got[t] == l, (a["step"], t, got[t], l)  # rank 1's own value, exactly
    seen |= set(got)
assert seen == {0, 1, 2, 3}, seen
PY
# The progress line (rank 0) names tasks of both ranks.
grep -E "step 6/6 .*loss [0-9.]+ t0=[0-9.e+-]+ t1=[0-9.e+-]+ t2=[0-9.e+-]+ t3=[0-9.e+-]+ \|" "$WORK/two_ranks.log" >/dev/null \
  && pass "progress line: every rank's tasks" || fail "progress line: $(grep 'step 6/6' "$WORK/two_ranks.log")"

# Two micro-steps that train the same tasks: one loss per task in rank 0's record.
expect_code 0 accumulate mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume --set steps=3 \
  --set metrics.path="$WORK/acc.jsonl" --set accumulate_steps=2 --set data.schedule=all
$py - "$WORK/acc.jsonl" <<'PY' && pass "accumulate_steps 2, schedule all: one loss per task" || fail "merged losses"
import json, math, sys
for r in map(json.loads, open(sys.argv[1])):
    tasks = [t["task"] for t in r["task_loss"]]
    assert tasks == [0, 1, 2, 3], tasks
    assert all(math.isfinite(t["loss"]) for t in r["task_loss"]), r["task_loss"]
PY

# The plot: a line per task, all 4 (needs matplotlib; skipped without).
if $py -c 'import matplotlib' 2>/dev/null; then
  out=$($py "$HERE/../../bench/plot_metrics.py" "$WORK/m-0.jsonl" -o "$WORK/plots" 2>&1) \
    && grep -q "loss_per_task.png: 4 task(s), 0..3" <<<"$out" && pass "plot: every task" || fail "plot: $out"
fi
finish
