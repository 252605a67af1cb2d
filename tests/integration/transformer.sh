#!/usr/bin/env bash
# The transformer with per-task LoRA adapters, on the CPU build:
#  - N ranks (1, 2, 3) equal the single-process reference bitwise, with the base trained and
#    frozen (model.train_shared: false); prune on == off bitwise;
#  - a frozen base puts no byte on the wire: bytes_allreduced + bytes_kept per step = exactly 4 x
#    the active adapters' parameters (on 2 ranks each adapter stays with its user: all kept), and
#    the base's parameters end as they began;
#  - offload on == off bitwise (adapters through 2 device slots), bf16 equals its reference;
#  - resume is bitwise (10 steps, then resumed to 20 = 20 straight);
#  - the loss falls (synthetic token walks; token files), and bad token files are exit 2 naming
#    the file before any step;
#  - model.arch: llama keeps the same promises (reference, frozen base, prune,
#    offload with the device cache, bf16, resume), a frozen base held in bf16 included.
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
job=$HERE/jobs/transformer.yaml
# Every run is queued first (queue_np, queue) and run by world size, one start each, the
# comparisons with the reference in one more (run_queue); the checks after.
job_np() { local name=$1 np=$2; shift 2; queue_np "$name" "$np" "$job" "$@"; }  # name np args...
# job_in NAME NP DIR ARGS...: a run with its checkpoints in $WORK/DIR (a resume continues there).
job_in() {
  local name=$1 np=$2 dir=$3; shift 3
  queue "$name" "$np" 0 "$job" "$@" --set checkpoint.dir="$WORK/$dir" --set metrics.path="$WORK/$dir.jsonl" \
    --set log.level=info
}
# Per task: 2 layers x rank 2 x ((16+16) q + (16+16) v + (16+32) up) = 448 parameters.
per_task=448
for np in 1 2 3; do
  for shared in true false; do
    name=np${np}_shared_$shared
    job_np "$name" "$np" --set model.train_shared=$shared
    queue_ref "$name-reference" 0 "$job" --world "$np" --set model.train_shared=$shared --compare "$WORK/$name.ckpt"
  done
done
job_np np2_shared_false_noprune 2 --set model.train_shared=false --set comm.prune=false
for off in false true; do
  job_np "offload_$off" 2 --set offload.enabled=$off --set offload.device_slots=2 --set offload.prefetch=1
done
job_np bf16 2 --set precision=bf16
queue_ref bf16-reference 0 "$job" --world 2 --set precision=bf16 --compare "$WORK/bf16.ckpt"
# Resume: 10 steps, then the same run continued to 20, equals 20 straight.
job_in resume_first 1 resume --set steps=10
job_in resume_second 1 resume

# model.arch: llama: RMSNorm, rotary positions, grouped-query attention (1 key/value
# head for 2), SwiGLU with an adapted gate, tied embeddings. The same promises on 2 ranks: equal to
# the reference with the base trained and frozen, frozen base = adapters' bytes only, prune on ==
# off, offload (device cache) on == off, bf16 equals its reference, resume bitwise.
llama=(--set model.arch=llama --set model.kv_heads=1 --set model.tie_embeddings=true --set lora.targets=[q,v,gate])
for shared in true false; do
  job_np llama_shared_$shared 2 "${llama[@]}" --set model.train_shared=$shared
  queue_ref "llama_shared_$shared-reference" 0 "$job" --world 2 "${llama[@]}" \
    --set model.train_shared=$shared --compare "$WORK/llama_shared_$shared.ckpt"
done
job_np llama_noprune 2 "${llama[@]}" --set model.train_shared=false --set comm.prune=false
job_np llama_offload 2 "${llama[@]}" --set offload.enabled=true --set offload.device_slots=2 --set offload.device_cache_mb=0.01
job_np llama_bf16 2 "${llama[@]}" --set precision=bf16
queue_ref llama_bf16-reference 0 "$job" --world 2 "${llama[@]}" --set precision=bf16 --compare "$WORK/llama_bf16.ckpt"
# A frozen base under bf16 is held in bf16 only: equal to the reference (whose model
# holds it so too; test_frozen_bf16 checks it against a float32-held base bitwise), its checkpoint
# holds the base widened, and a resume from it is bitwise (the restored base rounded back).
frozen_bf16=("${llama[@]}" --set precision=bf16 --set model.train_shared=false)
job_np llama_bf16_frozen 2 "${frozen_bf16[@]}"
queue_ref llama_bf16_frozen-reference 0 "$job" --world 2 "${frozen_bf16[@]}" --compare "$WORK/llama_bf16_frozen.ckpt"
job_in llama_bf16_frozen_first 1 llama_bf16_frozen_r "${frozen_bf16[@]}" --set steps=10
job_in llama_bf16_frozen_resumed 1 llama_bf16_frozen_r "${frozen_bf16[@]}"
job_np llama_bf16_frozen_np1 1 "${frozen_bf16[@]}"
# 10 steps on 1 rank resumed on 2 (the 1-rank runs go first: their world size is queued first).
job_in llama_resume_first 1 llama_resume "${llama[@]}" --set steps=10
job_in llama_resume_second 2 llama_resume "${llama[@]}"
job_np llama_np1 1 "${llama[@]}"
job_in llama_np1_resume_check 1 llama_np1r "${llama[@]}" --set steps=10
job_in llama_np1_resumed 1 llama_np1r "${llama[@]}"
job_np llama_train 1 "${llama[@]}" --set steps=150

# The loss falls: synthetic walks (1 rank, 150 steps) and the same walks from token files; bad
# token files are exit 2 naming the file, before any step.
job_np synthetic_train 1 --set steps=150
mkdir -p "$WORK/tokens" "$WORK/bad"
/usr/bin/python3 - "$WORK/tokens" "$WORK/bad" <<'PY'
import numpy as np, sys
good, bad = sys.argv[1:]
for t in range(4):  # task t: a walk of stride 2t+1 through 24 ids, 5000 tokens
    np.save(f"{good}/task{t}.npy", ((np.arange(5000) * (2 * t + 1) + 3 * t) % 24).astype(np.int32 if t % 2 else np.int64))
np.save(f"{bad}/float.npy", np.zeros(100, dtype=np.float32))
np.save(f"{bad}/big_id.npy", np.full(100, 24, dtype=np.int64))
np.save(f"{bad}/short.npy", np.zeros(8, dtype=np.uint16))
PY
job_np tokens_train 2 --set steps=150 --set data.kind=tokens --set data.dir="$WORK/tokens"
for bad in float big_id short; do
  mkdir -p "$WORK/bad_$bad" && cp -r "$WORK/tokens" "$WORK/bad_$bad/bad_dir" && cp "$WORK/bad/$bad.npy" "$WORK/bad_$bad/bad_dir/task2.npy"
  queue "bad_$bad" 1 2 "$job" --no-resume --set data.kind=tokens --set data.dir="$WORK/bad_$bad/bad_dir" \
    --set checkpoint.dir="$WORK/bad_$bad.ckpt"
done
# The TorchScript path with a real transformer: the Python model of docs/examples/
# export_transformer.py, scripted, trains under thetad on the token files with the same loss
# curve as the built-in transformer started from its weights (model.init_from: its state dict).
tokens=(--set steps=60 --set lora.targets=[q,v] --set data.kind=tokens --set data.dir="$WORK/tokens")
/usr/bin/python3 "$HERE/../../docs/examples/export_transformer.py" "$WORK/tfm.pt" --state-dict "$WORK/tfm-init.pt" \
  > "$WORK/export.log" 2>&1 || fail "export_transformer.py: $(tail -3 "$WORK/export.log")"
job_np builtin_from_state_dict 1 "${tokens[@]}" --set model.init_from="$WORK/tfm-init.pt"
# Initial weights that do not fit: exit 2 naming the file and the key, before any step.
/usr/bin/python3 - "$WORK/tfm-init.pt" "$WORK" <<'PY'
import sys, torch
sd = torch.load(sys.argv[1]); out = sys.argv[2]
torch.save({k: v for k, v in sd.items() if k != "lm_head.weight"}, f"{out}/missing.pt")
torch.save(dict(sd, **{"blocks.9.attn.q.weight": torch.zeros(2, 2)}), f"{out}/unexpected.pt")
torch.save(dict(sd, **{"embed.weight": torch.zeros(25, 16)}), f"{out}/shape.pt")
PY
for bad in missing unexpected shape; do
  queue "init_$bad" 1 2 "$job" --no-resume --set model.init_from="$WORK/$bad.pt" \
    --set lora.targets=[q,v] --set checkpoint.dir="$WORK/init_$bad.ckpt"
done
run_queue
# (Its shared patterns hold blanks: a run of its own.)
run_np torchscript_transformer 1 "$job" "${tokens[@]}" --set model.kind=torchscript --set model.trust_code=true --set model.path="$WORK/tfm.pt" \
  --set 'model.shared=["embed.*", "pos.*", "blocks.*", "ln_f.*", "lm_head.*"]' --set 'model.task=lora.{t}.*'

for np in 1 2 3; do
  # Round robin with 4 tasks: each step's ranks train min(np, 4) distinct adapters; on 2 ranks each
  # adapter has one user for good, who keeps its gradient (sent: nothing).
  /usr/bin/python3 - "$WORK/np${np}_shared_false.jsonl" $((4 * per_task * np)) "$np" <<'PY' \
    && pass "np$np frozen base: bytes per step = 4 x the active adapters ($((4 * per_task * np)))" \
    || fail "np$np frozen base: bytes per step"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
got = {r["bytes_allreduced"] + r["bytes_kept"] for r in recs}
if sys.argv[3] == "2": assert {r["bytes_allreduced"] for r in recs} == {0}, "kept adapters were sent"
assert got == {int(sys.argv[2])}, got
PY
done
same_hash "frozen base: prune on == off bitwise" np2_shared_false np2_shared_false_noprune
# (The frozen base ends as it began: the reference never steps a group no rank trained, and
# thetad equals it bitwise above.)
same_hash "offload on == off bitwise" offload_false offload_true
expect_in resume_second "resumed from .*step-00000010"
same_hash "resume at step 10 == 20 straight, bitwise" resume_second np1_shared_true
# Per task: 2 layers x rank 2 x ((16+16) q + (16+8) v + (16+32) gate) = 416 parameters.
/usr/bin/python3 - "$WORK/llama_shared_false.jsonl" $((4 * 416 * 2)) <<'PY' \
  && pass "llama frozen base: bytes per step = 4 x the active adapters" || fail "llama frozen base: bytes per step"
import json, sys
got = {json.loads(l)["bytes_allreduced"] + json.loads(l)["bytes_kept"] for l in open(sys.argv[1])}
assert got == {int(sys.argv[2])}, got
PY
same_hash "llama frozen base: prune on == off bitwise" llama_shared_false llama_noprune
same_hash "llama: offload (device cache) on == off bitwise" llama_shared_true llama_offload
expect_in llama_bf16_frozen "frozen base held in bf16 .*: [0-9.]+ MB in bf16"
expect_in llama_bf16_frozen_resumed "resumed from .*step-00000010"
same_hash "llama frozen bf16 base: resume at step 10 == 20 straight, bitwise" llama_bf16_frozen_resumed llama_bf16_frozen_np1
expect_in llama_resume_second "resumed from .*step-00000010"
same_hash "llama: resume at step 10 == 20 straight, bitwise" llama_np1_resumed llama_np1

falls() {  # name
  /usr/bin/python3 - "$WORK/$1.jsonl" <<'PY' && pass "$1: loss falls" || fail "$1: loss did not fall"
import json, sys
recs = [json.loads(l)["loss"] for l in open(sys.argv[1])]
first, last = sum(recs[:5]) / 5, sum(recs[-5:]) / 5
print(f"loss {first:.3f} -> {last:.3f}")
assert last < 0.5 * first
PY
}
falls synthetic_train
falls llama_train
falls tokens_train
for bad in float big_id short; do expect_in "bad_$bad" "bad_dir/task2.npy"; done
expect_in builtin_from_state_dict "model.init_from: [0-9]+ parameters from"
/usr/bin/python3 - "$WORK/builtin_from_state_dict.jsonl" "$WORK/torchscript_transformer.jsonl" <<'PY' \
  && pass "TorchScript transformer == built-in from its state dict: same loss curve" || fail "loss curves differ"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
worst = max(abs(x - y) / x for x, y in zip(a, b))
print(f"60 steps, loss {a[0]:.4f} -> {a[-1]:.4f}; largest relative difference {worst:.2e}")
assert len(a) == len(b) == 60 and worst < 1e-5 and a[-1] < 0.7 * a[0]
PY
expect_in init_missing "missing.pt: model.init_from: shared parameter 'lm_head.weight' is missing"
expect_in init_unexpected "unexpected.pt: model.init_from: key 'blocks.9.attn.q.weight' is not a parameter"
expect_in init_shape "shape.pt: model.init_from: key 'embed.weight' has shape \[25, 16\]"
expect_in bad_float "int64, int32 or uint16, found float32"
expect_in bad_big_id "token id 24 is outside \[0, model.vocab = 24\)"
expect_in bad_short "fewer than one window"
finish
