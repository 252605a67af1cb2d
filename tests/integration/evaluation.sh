#!/usr/bin/env bash
# Held-out evaluation per task, token files checked at validate, loss masks and the monitoring
# fields, on the CPU build with a tiny llama (tests/integration/jobs/eval.yaml):
#  - validate reads the token files of the tasks the run uses: an id >= model.vocab in an eval
#    file is exit 2 naming the file and the position; a task the schedule never trains needs no
#    file, one it trains does;
#  - a 1-rank run evaluates every 4 steps: an eval record per evaluation with every task, a log
#    line, the table at the end; the data overfits (the eval loss rises after its lowest point)
#    and export.best: eval_loss exports each task's adapter of the checkpoint at its best step;
#  - evaluation changes nothing trained: the final hash equals the same run without eval;
#  - 1 and 2 ranks give the same eval losses bitwise (both resumed from that run's last
#    checkpoint with an update too small to change a bit, so that their parameters are equal);
#  - records carry time, tokens_per_s, grad_norm and grad_norm_task; the job is saved beside the
#    metrics, and a fresh run moves the earlier run's metrics aside;
#  - grad_norm_task is each task's gradient norm (one SGD step of lr 1 moves it that far);
#  - data.loss_mask: a task whose every target is masked gets no gradient and a loss of 0.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/eval.yaml
py=/usr/bin/python3
"$py" - "$WORK" <<'PY'
import numpy as np, os, sys
w = sys.argv[1]
for d in ("train", "eval", "masks"):
    os.makedirs(f"{w}/{d}")
p = 1.0 / (np.arange(24) + 1.0) ** 1.5
p /= p.sum()
for t in range(4):  # each task a skewed unigram of its own: 40 training tokens (memorized), 400 held out
    rng = np.random.default_rng(100 + t)
    perm = rng.permutation(24)
    perm[rng.choice(24, 40, p=p)].astype("<u2").tofile(f"{w}/train/task{t}.bin")
    perm[rng.choice(24, 400, p=p)].astype("<u2").tofile(f"{w}/eval/task{t}.bin")
    perm[rng.choice(24, 40, p=p)].astype("<u2").tofile(f"{w}/masks/task{t}.bin")
    np.full(40, 0 if t == 2 else 1, dtype=np.uint8).tofile(f"{w}/masks/task{t}.mask.bin")  # task 2: all masked
PY
files=(--set data.dir="$WORK/train" --set eval.dir="$WORK/eval")

# Validation reads the files of the tasks the run uses.
expect_code 0 validate "$thetad" validate "$job" "${files[@]}"
expect_in validate "token files: 8 checked"
cp -r "$WORK/eval" "$WORK/eval_bad"
"$py" -c "import numpy as np, sys; a = np.fromfile(sys.argv[1], '<u2'); a[123] = 24; a.tofile(sys.argv[1])" "$WORK/eval_bad/task1.bin"
expect_code 2 validate_big_id "$thetad" validate "$job" "${files[@]}" --set eval.dir="$WORK/eval_bad"
expect_in validate_big_id "eval_bad/task1.bin: token id 24 is outside \[0, model.vocab = 24\) at token 123"
cp -r "$WORK/train" "$WORK/train3" && rm "$WORK/train3/task3.bin"
expect_code 0 validate_unscheduled "$thetad" validate "$job" --set data.dir="$WORK/train3" --set eval.tasks=[0,1,2] \
  --set data.schedule=per_rank --set "data.per_rank=[[0,1,2]]"
expect_code 2 validate_scheduled "$thetad" validate "$job" --set data.dir="$WORK/train3" --set eval.tasks=[0,1,2]
expect_in validate_scheduled "train3/task3.bin: missing \(task 3's token ids"

# One rank, evaluated every 4 steps, checkpoints at each evaluation, the best adapters exported.
run_np eval1 1 "$job" "${files[@]}" --set checkpoint.every_steps=4 --set checkpoint.keep=20 \
  --set export.adapters_dir="$WORK/export/task{task}" --set export.best=eval_loss
expect_in eval1 "eval after step 40: mean [0-9.]+ over 4 task\(s\) \| t0="
expect_in eval1 "best eval loss per task \(4 task\(s\)\), exported at its step"
cp "$WORK/eval1.jsonl" "$WORK/eval1.kept.jsonl"
if out=$("$py" - "$WORK" <<'PY' 2>&1
import json, os, struct, sys
w = sys.argv[1]
recs = [json.loads(l) for l in open(f"{w}/eval1.jsonl")]
evals = [r for r in recs if r.get("kind") == "eval"]
train = [r for r in recs if r.get("kind") == "train"]
assert [r["step"] for r in evals] == list(range(4, 41, 4)), [r["step"] for r in evals]
assert [r["step"] for r in train] == list(range(40))
# Each evaluation follows the step record of its last step.
order = [(r["kind"], r["step"]) for r in recs]
assert all(order[order.index(("eval", s)) - 1] == ("train", s - 1) for s in range(4, 41, 4)), order
for r in evals:
    assert sorted(r["eval_loss"]) == ["0", "1", "2", "3"] and all(v == 8 * 16 for v in r["eval_tokens"].values()), r
r = train[-1]
assert r["time"].endswith("Z") and r["time"][10] == "T", r["time"]
assert r["tokens_per_s"] > 0 and r["samples_per_s"] > 0 and abs(r["tokens_per_s"] - 8 * r["samples_per_s"]) < 1e-6 * r["tokens_per_s"]
norms = {e["task"]: e["norm"] for e in r["grad_norm_task"]}
assert sorted(norms) == [0, 1, 2, 3] and all(n > 0 for n in norms.values()), r["grad_norm_task"]
# The base is frozen: the global norm is the tasks' together.
assert abs(r["grad_norm"] ** 2 - sum(n * n for n in norms.values())) < 1e-6 * r["grad_norm"] ** 2, r["grad_norm"]
best = {}
for t in "0123":
    curve = [(e["eval_loss"][t], e["step"]) for e in evals]
    best[t] = min(curve)[1]
print("best steps", best)
over = [t for t in best if best[t] < 40 and evals[-1]["eval_loss"][t] > min(evals, key=lambda e: e["eval_loss"][t])["eval_loss"][t]]
assert over, "no task overfits: the eval loss is lowest at the last step for every task"
json.dump(best, open(f"{w}/best.json", "w"))
job = open(f"{w}/eval1.jsonl.job.yaml").read()
assert "eval:" in job and f'dir: "{w}/eval"' in job and "best: eval_loss" in job, job
print(f"eval records, order, rates, norms; overfitting tasks {over}")
PY
); then pass "$out"; else fail "$out"; fi

# The exported adapter of each task is its checkpoint's at its best step (not the last one's).
if out=$(cd "$HERE" && "$py" - "$WORK" <<'PY' 2>&1
import json, struct, sys
import numpy as np
import ckpt_groups
w = sys.argv[1]
best = json.load(open(f"{w}/best.json"))
def safetensors_values(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    vals = [np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4")
            for k, v in head.items() if k != "__metadata__"]
    return np.sort(np.concatenate(vals))
last = ckpt_groups.load(f"{w}/eval1.ckpt/step-00000040")
differs = 0
for t, step in best.items():
    g = int(t) + 1
    at_best = np.sort(ckpt_groups.load(f"{w}/eval1.ckpt/step-{step:08d}")[g]["param"].numpy())
    got = safetensors_values(f"{w}/export/task{t}/adapter_model.safetensors")
    assert np.array_equal(got, at_best), f"task {t}: the export is not step {step}'s adapter"
    differs += not np.array_equal(got, np.sort(last[g]["param"].numpy()))
assert differs, "every export is the last adapter"
print(f"each export is its task's adapter at its best step; {differs} differ from the last")
PY
); then pass "$out"; else fail "$out"; fi

# The best adapters outlive the run (best-eval/ in the checkpoint directory): the finished job run
# again (to add an export: nothing trains, nothing is evaluated) and a resume from step 20 export
# the same best adapters as the run itself, not the last ones or the best since the resume.
cp -r "$WORK/eval1.ckpt" "$WORK/again.ckpt" && cp -r "$WORK/eval1.ckpt" "$WORK/mid.ckpt"
rm -rf "$WORK"/mid.ckpt/step-000000{24,28,32,36,40}
for run in again mid; do
  expect_code 0 "best_$run" mpirun "${MPIRUN_FLAGS[@]}" -np 1 "$thetad" run "$job" "${files[@]}" \
    --set checkpoint.dir="$WORK/$run.ckpt" --set checkpoint.every_steps=4 --set checkpoint.keep=20 \
    --set metrics.path="$WORK/best_$run.jsonl" --set export.best=eval_loss --set export.adapters_dir="$WORK/export_$run/task{task}"
  for t in 0 1 2 3; do
    cmp -s "$WORK/export/task$t/adapter_model.safetensors" "$WORK/export_$run/task$t/adapter_model.safetensors" \
      || fail "best_$run: task $t's exported adapter is not the run's best"
  done
  pass "best_$run: every task's export is the first run's best adapter"
done
expect_in best_mid "export.best: the best adapters of [0-9]+ task\(s\) found by earlier runs \(up to step 20\) taken up"

# Evaluation changes nothing trained; a fresh run on the same metrics path moves the old file aside.
run_np noeval 1 "$job" "${files[@]}" --set eval.dir= --set metrics.path="$WORK/eval1.jsonl"
same_hash "evaluation changes no parameter: the final hash equals the run without eval" eval1 noeval
aside=$(ls "$WORK"/eval1.previous-*.jsonl 2>/dev/null | head -1)
if [ -n "$aside" ] && cmp -s "$aside" "$WORK/eval1.kept.jsonl" && [ -s "$aside.job.yaml" ]; then
  pass "the earlier run's metrics moved aside whole: $(basename "$aside")"; else fail "no earlier metrics aside ($aside)"; fi
expect_in noeval "the earlier run's metrics .*eval1.jsonl were moved to .*eval1.previous-"

# 1 and 2 ranks: the same parameters (the last checkpoint, one more step whose update is below
# every parameter's last bit), the same eval losses bitwise, and the same as the first run's at 40.
for np in 1 2; do
  cp -r "$WORK/eval1.ckpt" "$WORK/resume$np.ckpt"
  expect_code 0 "resume$np" mpirun "${MPIRUN_FLAGS[@]}" -np "$np" "$thetad" run "$job" "${files[@]}" \
    --set steps=41 --set optimizer.lr=1e-30 --set checkpoint.dir="$WORK/resume$np.ckpt" \
    --set metrics.path="$WORK/resume$np.jsonl" --set log.level=info
done
same_hash "1 and 2 ranks end with the same parameters" resume1 resume2
if out=$("$py" - "$WORK" <<'PY' 2>&1
import json, sys
w = sys.argv[1]
def eval_at(path, step):
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "eval" and r["step"] == step:
            return json.dumps(r["eval_loss"], sort_keys=True), r["eval_tokens"]
    raise AssertionError(f"{path}: no eval at {step}")
one, two, first = eval_at(f"{w}/resume1.jsonl", 41), eval_at(f"{w}/resume2.jsonl", 41), eval_at(f"{w}/eval1.kept.jsonl", 40)
assert one == two, (one, two)
assert one[0] == first[0], (one, first)
print("eval losses bitwise equal on 1 and 2 ranks:", one[0])
PY
); then pass "$out"; else fail "$out"; fi

# comm.sole_user: keep (the default) on 2 ranks, each task trained by one rank only, and that rank
# not t mod 2, the one that evaluates and exports the task: every evaluation's losses, the best
# adapters exported and rank 0's gradient norms are those of sending every gradient (broadcast);
# read from the stale replicas, the losses stayed the initial ones and the norms of the tasks
# trained on rank 1 were 0.
for mode in keep broadcast; do
  run_np "sole_$mode" 2 "$job" "${files[@]}" --set data.schedule=per_rank --set "data.per_rank=[[1,3],[0,2]]" \
    --set steps=16 --set comm.sole_user=$mode --set export.best=eval_loss \
    --set export.adapters_dir="$WORK/sole_$mode/task{task}"
done
expect_in sole_keep "resident groups follow the replica rule"
if out=$("$py" - "$WORK" <<'PY' 2>&1
import json, sys
w = sys.argv[1]
def records(name):
    recs = [json.loads(l) for l in open(f"{w}/{name}.jsonl")]
    return [r for r in recs if r.get("kind") == "eval"], [r for r in recs if r.get("kind") == "train"]
(ek, tk), (eb, tb) = records("sole_keep"), records("sole_broadcast")
assert sum(r["buckets_kept"] for r in tk) > 0, "nothing was kept"
assert [r["eval_loss"] for r in ek] == [r["eval_loss"] for r in eb], (ek, eb)
first, last = ek[0]["eval_loss"], ek[-1]["eval_loss"]
assert all(first[t] != last[t] for t in first), ("an eval loss never moved", first, last)
for a, b in zip(tk, tb):
    na = {e["task"]: e["norm"] for e in a["grad_norm_task"]}
    nb = {e["task"]: e["norm"] for e in b["grad_norm_task"]}
    assert sorted(na) == sorted(nb) == [0, 1, 2, 3], (a["step"], na, nb)
    for t in nb:
        assert abs(na[t] - nb[t]) <= 1e-6 * nb[t], (a["step"], t, na[t], nb[t])
    assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-6 * b["grad_norm"], (a["step"], a["grad_norm"], b["grad_norm"])
print("keep == broadcast: eval losses bitwise at", [r["step"] for r in ek], "; grad norms of every task")
PY
); then pass "$out"; else fail "$out"; fi
for t in 0 1 2 3; do
  if cmp -s "$WORK/sole_keep/task$t/adapter_model.safetensors" "$WORK/sole_broadcast/task$t/adapter_model.safetensors"; then
    pass "task $t: the best adapter exported under keep is broadcast's"
  else fail "task $t: the best adapters differ between keep and broadcast"; fi
done

# Adapters in the host store (offload.enabled, only the scheduled tasks held): each evaluated
# task's adapter is lent to the forward by the store, a task never trained evaluated at its
# initial values; the same eval losses bitwise and the same best adapters as resident ones.
for home in resident store; do
  extra=()
  [ "$home" = store ] && extra=(--set offload.enabled=true --set offload.host_groups=scheduled)
  run_np "home_$home" 2 "$job" "${files[@]}" --set data.schedule=per_rank --set "data.per_rank=[[0,1],[2]]" \
    --set steps=16 --set export.best=eval_loss --set export.adapters_dir="$WORK/home_$home/task{task}" "${extra[@]}"
done
if out=$("$py" - "$WORK" <<'PY' 2>&1
import json, sys
w = sys.argv[1]
def evals(name):
    return [(r["step"], r["eval_loss"]) for r in map(json.loads, open(f"{w}/{name}.jsonl")) if r.get("kind") == "eval"]
res, sto = evals("home_resident"), evals("home_store")
assert len(res) == 4 and res == sto, (res, sto)
assert res[0][1]["3"] == res[-1][1]["3"] and res[0][1]["0"] != res[-1][1]["0"], res
print("host store == resident: eval losses bitwise at", [s for s, _ in res], "(task 3 untrained, unchanged)")
PY
); then pass "$out"; else fail "$out"; fi
for t in 0 1 2; do
  if cmp -s "$WORK/home_resident/task$t/adapter_model.safetensors" "$WORK/home_store/task$t/adapter_model.safetensors"; then
    pass "task $t: the best adapter exported from the host store is the resident run's"
  else fail "task $t: the best adapters differ between the host store and resident"; fi
done

# data.loss_mask, and the gradient norms' values: one plain SGD step of lr 1 from adapters whose B
# is zero moves only B, by minus its gradient (A's gradient is B-times-something: zero), so each
# task's grad_norm_task is the norm of its B after the step. Task 2's targets are all masked: loss
# 0, gradient 0, its B stays zero.
run_np masked 1 "$job" --set data.dir="$WORK/masks" --set data.loss_mask=true --set eval.dir= --set steps=1 \
  --set optimizer.kind=sgd --set optimizer.lr=1
if out=$(cd "$HERE" && "$py" - "$WORK" <<'PY' 2>&1
import json, sys
import numpy as np
import ckpt_groups
w = sys.argv[1]
(r,) = [json.loads(l) for l in open(f"{w}/masked.jsonl")]
loss = {e["task"]: e["loss"] for e in r["task_loss"]}
norm = {e["task"]: e["norm"] for e in r["grad_norm_task"]}
assert loss[2] == 0 and all(loss[t] > 0 for t in (0, 1, 3)), loss
g = ckpt_groups.load(f"{w}/masked.ckpt/step-00000001")
# Each task's parameters per layer and target (q, v, gate, up, down): A [4, in] then B [out, 4].
shapes = [((4, 16), (16, 4)), ((4, 16), (8, 4)), ((4, 16), (32, 4)), ((4, 16), (32, 4)), ((4, 32), (16, 4))]
for t in range(4):
    flat, at, b = g[t + 1]["param"].numpy(), 0, []
    for layer in range(2):
        for a_shape, b_shape in shapes:
            at += a_shape[0] * a_shape[1]
            b.append(flat[at:at + b_shape[0] * b_shape[1]])
            at += b_shape[0] * b_shape[1]
    assert at == flat.size, (at, flat.size)
    b_norm = float(np.linalg.norm(np.concatenate(b).astype(np.float64)))
    assert abs(b_norm - norm[t]) <= 1e-5 * max(norm[t], 1e-30), (t, b_norm, norm[t])
assert norm[2] == 0 and all(norm[t] > 0 for t in (0, 1, 3)), norm
print("grad_norm_task = each task's step (SGD, lr 1); a fully masked task: loss 0, gradient 0:", norm)
PY
); then pass "$out"; else fail "$out"; fi
# A pass of one row with masked targets: the mask leaves the inputs alone (it wrote -1 into the
# input tokens through a view: "index out of range").
run_np masked_one_row 1 "$job" --set data.dir="$WORK/masks" --set data.loss_mask=true --set eval.dir="$WORK/masks" \
  --set steps=2 --set eval.every_steps=1 --set eval.rows=2 --set data.batch_per_rank=1 --set data.schedule=per_rank \
  --set "data.per_rank=[[1]]"
finish
