#!/usr/bin/env bash
# bench/plot_metrics.py, the demo's last step: without matplotlib it says how to install it (exit
# 2, one line, no traceback); with it, bytes.png compares thetad's bytes with DDP's (allreduced +
# pruned, the ratio on stderr) and the loss lines are moving averages that skip NaN points.
#   plot_metrics.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the source tree
py=/usr/bin/python3
plot="$HERE/../../bench/plot_metrics.py"
[ -x "$py" ] || skip "no $py"

# 4 steps: 300 bytes sent and 100 pruned each (thetad sends 0.75x DDP's), two tasks' losses.
for s in 0 1 2 3; do
  echo "{\"step\":$s,\"rank\":0,\"loss\":1,\"task_loss\":[{\"task\":0,\"loss\":1},{\"task\":1,\"loss\":0.5}],\"step_ms\":2,\"bytes_allreduced\":300,\"bytes_pruned\":100}"
done > "$WORK/m.jsonl"
# Evaluation records (a kind of their own) after steps 2 and 4: drawn apart, never as steps.
echo '{"step":2,"kind":"eval","time":"t","eval_loss":{"0":2.5,"1":null},"eval_tokens":{"0":8,"1":0},"eval_ms":1}' >> "$WORK/m.jsonl"
echo '{"step":4,"kind":"eval","time":"t","eval_loss":{"0":2.25,"1":3},"eval_tokens":{"0":8,"1":8},"eval_ms":1}' >> "$WORK/m.jsonl"

# A matplotlib that cannot be imported, ahead of the real one on the path.
mkdir -p "$WORK/nompl/matplotlib"
echo 'raise ImportError("No module named matplotlib")' > "$WORK/nompl/matplotlib/__init__.py"
expect_code 2 no_matplotlib env PYTHONPATH="$WORK/nompl" "$py" "$plot" "$WORK/m.jsonl" -o "$WORK/none"
expect_in no_matplotlib "needs matplotlib.*apt-get install python3-matplotlib"
expect_not_in no_matplotlib "Traceback"
if [ -e "$WORK/none" ]; then fail "$WORK/none was created"; else pass "no output folder without matplotlib"; fi

if "$py" -c 'import matplotlib' 2>/dev/null; then
  expect_code 0 plots "$py" "$plot" "$WORK/m.jsonl" -o "$WORK/plots"
  expect_in plots "bytes.png: thetad sent 0.75x the bytes DDP would have sent"
  expect_in plots "eval_loss_per_task.png: 2 task\(s\) over 2 evaluation\(s\)"
  for png in loss_per_task step_time bytes eval_loss_per_task; do
    if [ -s "$WORK/plots/$png.png" ]; then pass "$png.png"; else fail "no $png.png"; fi
  done
  if out=$(cd "$HERE/../../bench" && "$py" -c '
import math, plot_metrics as p
nan = float("nan")
assert p.moving_average([1, 2, 3, 4, 5], 3) == [1.5, 2, 3, 4, 4.5], p.moving_average([1, 2, 3, 4, 5], 3)
got = p.moving_average([1, nan, 3], 3)
assert got == [1, 2, 3], got
assert math.isnan(p.moving_average([nan, nan], 1)[0])
print("moving average")' 2>&1); then pass "$out"; else fail "$out"; fi
else
  echo "matplotlib missing: the plots themselves not checked"
fi
finish
