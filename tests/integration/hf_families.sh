#!/usr/bin/env bash
# The bases people fine-tune, on the CPU build, against llama_ref.py (each family's Hugging Face
# formulas in plain torch; gpu_llama_peft.sh checks the same against transformers and peft). Per
# family a tiny base written by the reference (llama3: rope_scaling llama3, tied embeddings;
# mistral: heads wider together than hidden_size; qwen2: biases on q, k, v, tied, its merged model
# cut into several safetensors files; qwen3: q/k head norms, head_dim 16, transformers 5's
# rope_parameters), one short training run that exports task 0's adapter and merged model (in
# fp32, fp16 or bf16), and one thetad_logits start for the base (task 1, no adapter) and task 0
# with its exported adapter. The reference then checks (one line each): thetad's step-0 logits
# equal its own within 1e-5; the PEFT directory; base + adapter == thetad's logits; the merged
# model's files, weights (W + alpha / r B A) and logits. Then the finished Qwen2 job run again
# merges its newest checkpoint anew (one file where there were shards); a merged directory that
# holds something else and a Qwen2 base without a bias are exit 2 before any step, naming the file.
#   hf_families.sh THETAD REFERENCE THETAD_LOGITS
source "$(dirname "$0")/lib.sh"
thetad=$1
logits_bin=$3
py=/usr/bin/python3
ref=$HERE/llama_ref.py
job=$HERE/jobs/llama.yaml

# family export.dtype safetensors-word extra-sets...
family() {
  local fam=$1 dtype=$2 word=$3; shift 3
  local d=$WORK/$fam
  mkdir -p "$d"
  $py "$ref" base "$d/base" "$d/tokens.npy" "$fam" || { fail "$fam: llama_ref.py base"; return; }
  run_np "${fam}_train" 1 "$job" --set model.init_from="$d/base" --set steps=6 --set export.dtype="$dtype" \
    --set export.adapters_dir="$d/adapters/{task}" --set export.merged_dir="$d/merged/{task}" \
    --set 'export.merged_tasks=[0]' "$@"
  expect_in "${fam}_train" "export.merged_dir: task 0's merged model \(.*\) written to $d/merged/0"
  # Task 0 with its exported adapter; task 1 has no directory: the base (B = 0).
  mkdir -p "$d/only" && cp -r "$d/adapters/0" "$d/only/0"
  expect_code 0 "${fam}_logits" "$logits_bin" "$job" --set model.init_from="$d/base" \
    --set lora.init_from="$d/only/{task}" --tokens "$d/tokens.npy" \
    --task 1 --out "$d/thetad_base.npy" --task 0 --out "$d/thetad_tuned.npy"
  $py "$ref" verify "$d" "$word" > "$d/verify.log" 2>&1 || { fail "$fam: llama_ref.py verify"; cat "$d/verify.log"; }
  while IFS= read -r line; do
    case $line in
      "ok   "*) pass "$fam: ${line#ok   }" ;;
      "FAIL "*) fail "$fam: ${line#FAIL }" ;;
    esac
  done < "$d/verify.log"
}

family llama3 fp32 F32
family mistral fp16 F16
family qwen2 fp32 F32 --set export.max_shard_mb=0.01
[ -e "$WORK/qwen2/merged/0/model.safetensors.index.json" ] && [ ! -e "$WORK/qwen2/merged/0/model.safetensors" ] \
  && pass "qwen2: the merged model in $(ls "$WORK/qwen2/merged/0" | grep -c 'model-.*-of-.*safetensors') files and an index" \
  || fail "qwen2: export.max_shard_mb did not shard the merged model: $(ls "$WORK/qwen2/merged/0")"
family qwen3 bf16 BF16

# The finished qwen2 job run again: found complete at start, it exports from its newest checkpoint
# again, now in one file; the shards of the first export are removed, the weights are the same.
cp -r "$WORK/qwen2/merged/0" "$WORK/qwen2_sharded"
expect_code 0 qwen2_again mpirun "${MPIRUN_FLAGS[@]}" -np 1 "$thetad" run "$job" --set checkpoint.dir="$WORK/qwen2_train.ckpt" \
  --set model.init_from="$WORK/qwen2/base" --set steps=6 --set export.merged_dir="$WORK/qwen2/merged/{task}" \
  --set 'export.merged_tasks=[0]' --set log.level=info
expect_in qwen2_again "already complete"
[ "$(ls "$WORK/qwen2/merged/0" | tr '\n' ' ')" = "config.json generation_config.json model.safetensors " ] \
  && pass "qwen2: merged again in one file, the earlier shards and index removed" || fail "qwen2 again: $(ls "$WORK/qwen2/merged/0")"
$py - "$WORK/qwen2_sharded" "$WORK/qwen2/merged/0" <<PY && pass "qwen2: the same merged weights" || fail "qwen2: merged weights differ"
import sys; sys.path.insert(0, "$HERE"); import llama_ref as r
a, b = r.read_dir(sys.argv[1]), r.read_dir(sys.argv[2])
assert sorted(a) == sorted(b) and all(a[k].equal(b[k]) for k in a)
PY
# A merged directory that holds something else: refused before any step, nothing overwritten.
mkdir -p "$WORK/busy/0" && echo keep > "$WORK/busy/0/notes.txt"
expect_code 2 merged_busy "$thetad" run "$job" --no-resume --set model.init_from="$WORK/qwen2/base" \
  --set export.merged_dir="$WORK/busy/{task}" --set 'export.merged_tasks=[0]' --set checkpoint.dir="$WORK/busy.ckpt"
expect_in merged_busy "busy/0: export.merged_dir: holds 'notes.txt', which is not a merged model's file; refusing to write task 0's merged model there"
[ "$(ls "$WORK/busy/0")" = notes.txt ] && [ "$(cat "$WORK/busy/0/notes.txt")" = keep ] && [ ! -e "$WORK/busy.ckpt/step-1" ] \
  && pass "merged_busy: nothing written" || fail "merged_busy wrote: $(ls -R "$WORK/busy" "$WORK/busy.ckpt" 2>&1)"

# A Qwen2 base without one of its biases: exit 2 before any step, naming the file and the tensor.
$py "$ref" drop "$WORK/qwen2/base" "$WORK/nobias" model.layers.1.self_attn.k_proj.bias
expect_code 2 qwen2_no_bias "$logits_bin" "$job" --set model.init_from="$WORK/nobias" --tokens "$WORK/qwen2/tokens.npy" \
  --task 0 --out "$WORK/x.npy"
expect_in qwen2_no_bias "nobias: model.init_from: tensor 'model.layers.1.self_attn.k_proj.bias' is missing"
finish
