#!/usr/bin/env bash
# tools/metrics_bridge.py on the CPU with a fake writer (no TensorBoard or W&B needed): records
# become the scalars at their steps (train, per task, eval), a partial last line waits for its
# newline, a file replaced under its name (a resumed run) or truncated and regrown in place is
# read again without sending a record twice, lines that are not thetad records are skipped with a
# warning, rank 0 only by default; without the packages the CLI is exit 2 with the pip
# command. Where TensorBoard is importable, --once writes event files (skipped otherwise).
#   metrics_bridge.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
py=/usr/bin/python3
tools="$HERE/../../tools"
[ -x "$py" ] || skip "no $py"

if out=$(cd "$tools" && "$py" - "$WORK/m.jsonl" <<'PY' 2>&1
import json, os, sys
import metrics_bridge as mb
path = sys.argv[1]
class Fake:
    def __init__(self): self.points = []
    def write(self, step, pairs): self.points += [(step, t, v) for t, v in pairs]
fake = Fake()
bridge, follow = mb.Bridge([fake], all_ranks=False), mb.Follower(path)
def pump(): return mb.run(bridge, follow, once=True, poll_s=0, idle_exit_s=None)  # one look at the file
train = lambda s, r=0: json.dumps({"step": s, "rank": r, "kind": "train", "time": "t", "loss": 2.0 - s,
    "task_loss": [{"task": 3, "loss": 1.5}], "lr": 0.1, "grad_norm": None, "grad_norm_task": [{"task": 3, "norm": 0.5}],
    "tokens_per_s": 100.0, "bytes_allreduced": 64})
assert pump() == 0  # no file yet
with open(path, "w") as f:
    f.write(train(0) + "\n" + train(0, r=1) + "\n" + train(1)[:20])  # rank 1 skipped; a partial line
assert pump() == 1, fake.points
got = {t: v for s, t, v in fake.points if s == 0}
assert got == {"train/loss": 2.0, "task_loss/3": 1.5, "train/lr": 0.1, "grad_norm_task/3": 0.5,
               "train/tokens_per_s": 100.0, "system/bytes_allreduced": 64.0}, got
with open(path, "a") as f:
    f.write(train(1)[20:] + "\n" + json.dumps({"step": 2, "kind": "eval", "eval_loss": {"3": 1.25, "4": None}}) + "\n")
assert pump() == 2
assert (2, "eval/loss/3", 1.25) in fake.points and (2, "eval/loss_mean", 1.25) in fake.points, fake.points
assert not any(t == "eval/loss/4" for _, t, _ in fake.points)  # null: not a point
# A resumed run rewrites the file (a new inode) with the records before its step, then appends.
with open(path + ".new", "w") as f:
    f.write(train(0) + "\n" + train(1) + "\n" + train(2) + "\n")
os.replace(path + ".new", path)
before = len(fake.points)
assert pump() == 1  # step 2's train record only: 0 and 1 were sent
assert all(s == 2 for s, _, _ in fake.points[before:])
print("scalars, partial lines, rank 0, eval records, a replaced file without repeats")
PY
); then pass "$out"; else fail "$out"; fi

# Truncated in place and written again past the old offset between two looks (the same inode,
# a larger size): told by the first bytes, read again from the start, every new record sent once.
if out=$(cd "$tools" && "$py" - "$WORK/t.jsonl" <<'PY' 2>&1
import collections, json, sys
import metrics_bridge as mb
path = sys.argv[1]
class Fake:
    def __init__(self): self.steps = []
    def write(self, step, pairs): self.steps.append(step)
fake = Fake()
bridge, follow = mb.Bridge([fake], all_ranks=False), mb.Follower(path)
def pump(): return mb.run(bridge, follow, once=True, poll_s=0, idle_exit_s=None)
rec = lambda s, t: json.dumps({"step": s, "rank": 0, "kind": "train", "time": t, "loss": 1.0})
with open(path, "w") as f:
    f.write("".join(rec(s, "old") + "\n" for s in range(5)))
assert pump() == 5
with open(path, "r+") as f:  # in place: the inode stays
    f.truncate(0)
    f.write("".join(rec(s, "new") + "\n" for s in [0, 1] + list(range(10, 40))))
assert pump() == 30, fake.steps
count = collections.Counter(fake.steps)
assert sorted(count) == [0, 1, 2, 3, 4] + list(range(10, 40)) and set(count.values()) == {1}, count
print("a file truncated and regrown in place: read again, each record once")
PY
); then pass "$out"; else fail "$out"; fi

# Lines of JSON that are not thetad records: each skipped with one warning naming the file and
# line, and the bridge goes on to the records after them.
if out=$(cd "$tools" && "$py" - "$WORK/f.jsonl" <<'PY' 2>&1
import contextlib, io, json, sys
import metrics_bridge as mb
path = sys.argv[1]
class Fake:
    def __init__(self): self.points = []
    def write(self, step, pairs): self.points += [(step, t, v) for t, v in pairs]
fake = Fake()
bridge, follow = mb.Bridge([fake], all_ranks=False), mb.Follower(path)
open(path, "w").close()
foreign = [b"[]", b'"x"', b"42", b"{}", b'{"step": "a"}', b'{"step": true}', b"[" * 100000 + b"]" * 100000,
           b'{"step": 1, "task_loss": [{"loss": 1}]}', b'{"step": 2, "kind": "eval", "eval_loss": [1]}',
           b'{"step": 3, "rank": [0]}', b'{"step": 4, "kind": "other"}', b"not json", b"\xff\xfe"]
for n, line in enumerate(foreign, 1):
    with open(path, "ab") as f:
        f.write(line + b"\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        got = mb.run(bridge, follow, once=True, poll_s=0, idle_exit_s=None)
    warnings = err.getvalue().splitlines()
    assert got == 0 and len(warnings) == 1 and f"{path}:{n}: skipping" in warnings[0], (line[:40], got, warnings)
with open(path, "a") as f:  # thetad's records after them; a number no float holds is no point
    f.write(json.dumps({"step": 5, "loss": 0.5}) + "\n" + '{"step": 6, "loss": 1%s}\n' % ("0" * 400))
assert mb.run(bridge, follow, once=True, poll_s=0, idle_exit_s=None) == 2
assert fake.points == [(5, "train/loss", 0.5)], fake.points
print(f"{len(foreign)} foreign lines skipped with a warning each, the records after them sent")
PY
); then pass "$out"; else fail "$out"; fi

# The CLI: no writer named, no package, a missing file with --once.
echo '{"step":0,"rank":0,"loss":1}' > "$WORK/one.jsonl"
mkdir -p "$WORK/nopkg/torch" "$WORK/nopkg/tensorboardX" "$WORK/nopkg/wandb"
for m in torch tensorboardX wandb; do echo 'raise ImportError("no")' > "$WORK/nopkg/$m/__init__.py"; done
expect_code 2 bridge_nowriter "$py" "$tools/metrics_bridge.py" "$WORK/one.jsonl" --once
expect_in bridge_nowriter "nothing to write to"
expect_code 2 bridge_notb env PYTHONPATH="$WORK/nopkg" "$py" "$tools/metrics_bridge.py" "$WORK/one.jsonl" --once --tensorboard "$WORK/tb"
expect_in bridge_notb "pip install tensorboard"
expect_code 2 bridge_nowandb env PYTHONPATH="$WORK/nopkg" "$py" "$tools/metrics_bridge.py" "$WORK/one.jsonl" --once --wandb p
expect_in bridge_nowandb "pip install wandb"
expect_not_in bridge_nowandb "Traceback"
expect_code 2 bridge_nofile "$py" "$tools/metrics_bridge.py" "$WORK/none.jsonl" --once --tensorboard "$WORK/tb"
if "$py" -c 'from torch.utils.tensorboard import SummaryWriter' 2>/dev/null || "$py" -c 'import tensorboardX' 2>/dev/null; then
  expect_code 0 bridge_tb "$py" "$tools/metrics_bridge.py" "$WORK/one.jsonl" --once --tensorboard "$WORK/tb"
  if ls "$WORK"/tb/events.out.tfevents.* >/dev/null 2>&1; then pass "event files"; else fail "no event files"; fi
else
  echo "SKIP: no TensorBoard writer installed: event files are not exercised"
fi
finish
