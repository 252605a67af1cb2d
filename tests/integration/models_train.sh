#!/usr/bin/env bash
# Each model trains on 1 and 2 ranks and its loss falls on synthetic data (mean of the last 5
# steps below 0.7 x the first 5); metrics carry every field of docs/architecture.md; the timeline parses.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
check_metrics() {  # name file [max last/first loss ratio]
  if /usr/bin/python3 - "$2" "${3:-0.7}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ratio = float(sys.argv[2])
need = ["step", "loss", "task_loss", "step_ms", "forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms",
        "bytes_allreduced", "bytes_pruned", "buckets_launched", "buckets_pruned", "h2d_bytes", "d2h_bytes",
        "swap_hits", "swap_misses", "device_mem_peak_bytes", "host_pinned_bytes"]
missing = [k for k in need if k not in recs[0]]
assert not missing, f"missing fields {missing}"
first = sum(r["loss"] for r in recs[:5]) / 5
last = sum(r["loss"] for r in recs[-5:]) / 5
print(f"loss {first:.4f} -> {last:.4f}")
assert last < ratio * first, "loss did not fall"
PY
  then pass "$1: metrics complete, loss falls"; else fail "$1: metrics"; fi
}
# train NAME NP ARGS...: an 80-step run, queued (its metrics are checked after the runs).
TRAINED=()
train() {
  local name=$1 np=$2; shift 2
  queue "$name" "$np" 0 "$job" --no-resume --set steps=80 --set metrics.path="$WORK/$name.jsonl" \
    --set timeline.path="$WORK/$name-{rank}.trace.json" "$@"
  TRAINED+=("$name ${RATIO:-0.7}")
}
for np in 1 2; do
  train "mlp_np$np" $np
  train "adapter_np$np" $np --set model.kind=multitask_adapter --set model.adapter_rank=4
done
# The extreme classifier: 400 classes in 4 slices (θ[t]) swapped by the store, sampled softmax
# with 20 negatives; also checked against the single-process reference.
xc=(--set model.kind=extreme_classifier --set model.classes=400 --set model.negatives_per_step=20
    --set optimizer.lr=0.03 --set offload.enabled=true --set offload.device_slots=2 --set steps=160)
for np in 1 2; do RATIO=0.9 train "extreme_np$np" $np "${xc[@]}" --set checkpoint.dir="$WORK/xc$np"; done
reference=$2
queue_ref extreme_reference 0 "$job" --world 2 "${xc[@]}" --compare "$WORK/xc2"
torch=""
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  torch=yes
  /usr/bin/python3 "$HERE/../../docs/examples/export_torchscript.py" "$WORK/model.pt" --input-dim 16 --tasks 4
  train "torchscript_np2" 2 --set model.kind=torchscript --set model.trust_code=true --set model.path="$WORK/model.pt" \
    --set 'model.shared=["trunk.*"]' --set 'model.task=heads.{t}.*'
  # The documented example job, as written (only its outputs and model file moved here).
  queue torchscript_example 2 0 "$HERE/../../docs/examples/torchscript.yaml" --no-resume --set steps=80 \
    --set model.path="$WORK/model.pt" --set checkpoint.dir="$WORK/ts-example-ck" --set metrics.path="$WORK/ts-example.jsonl"
  # model.task as a list: a head's weight and bias named by two patterns are the same groups as
  # one pattern for both (bitwise the same run); a parameter two groups' patterns match is exit 2
  # naming both patterns.
  ts=(--set model.kind=torchscript --set model.trust_code=true --set model.path="$WORK/model.pt" --set 'model.shared=["trunk.*"]' --set steps=20)
  queue_np ts_one_pattern 2 "$job" "${ts[@]}" --set 'model.task=heads.{t}.*'
fi
run_queue
for entry in "${TRAINED[@]}"; do
  read -r name ratio <<<"$entry"
  check_metrics "$name" "$WORK/$name.jsonl" "$ratio"
done
/usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$WORK/mlp_np2-1.trace.json" \
  && pass "timeline parses as JSON" || fail "timeline is not JSON"
if [ -n "$torch" ]; then
  check_metrics torchscript_example "$WORK/ts-example.jsonl"
  # (The patterns below hold blanks: runs of their own.)
  run_np ts_two_patterns 2 "$job" "${ts[@]}" --set 'model.task=["heads.{t}.weight", "heads.{t}.bias"]'
  same_hash "model.task as a list of two patterns = one pattern" ts_one_pattern ts_two_patterns
  expect_code 2 ts_overlap mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume "${ts[@]}" \
    --set 'model.shared=["trunk.*", "heads.0.*"]' --set 'model.task=["heads.{t}.weight", "heads.{t}.bias"]' \
    --set checkpoint.dir="$WORK/ts-overlap-ck"
  expect_in ts_overlap "parameter 'heads.0.weight' is matched by 2 groups' patterns: model.shared 'heads.0.\\*', model.task 'heads.\\{t\\}.weight' \\(task 0\\)"
  # A model that breaks the contract (no task argument; a tuple returned): exit 2 on every rank
  # before any step, naming the file and the expected form.
  # (TorchScript reads the classes' source: a file, not standard input.)
  cat > "$WORK/bad_models.py" <<'PY'
import sys, torch
from torch import nn
from typing import Tuple
class OneArg(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(16, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 1) for _ in range(4)])
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads[0](self.trunk(x))
class Pair(OneArg):
    def forward(self, x: torch.Tensor, task: int) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return h, h
torch.jit.script(OneArg()).save(sys.argv[1] + "/onearg.pt")
torch.jit.script(Pair()).save(sys.argv[1] + "/pair.pt")
PY
  /usr/bin/python3 "$WORK/bad_models.py" "$WORK"
  for bad in onearg pair; do
    expect_code 2 "torchscript_$bad" mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --no-resume \
      --set model.kind=torchscript --set model.trust_code=true --set model.path="$WORK/$bad.pt" --set 'model.shared=["trunk.*"]' \
      --set 'model.task=heads.{t}.*' --set checkpoint.dir="$WORK/$bad-ck"
    expect_in "torchscript_$bad" "$bad.pt: model.path: the model's forward is .*thetad calls forward\\(self, x: Tensor, task: int\\) -> Tensor"
  done
else
  echo "python3-torch missing: TorchScript part skipped"
fi
finish
