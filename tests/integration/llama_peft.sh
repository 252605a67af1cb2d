#!/usr/bin/env bash
# A real base in, real adapters out, on the CPU build, against llama_ref.py (Hugging Face's Llama
# and PEFT's LoRA formulas in plain torch; the GPU test gpu_llama_peft.sh checks the same against
# transformers and peft themselves; hf_families.sh the other families):
#  - a Hugging Face directory (config.json, two safetensors shards with BF16, F16 and F32 tensors,
#    the index) is read: thetad's step-0 logits equal the reference's within 1e-5 relative;
#  - the dimensions come from config.json; a job key that disagrees is exit 2 naming both values;
#  - two tasks' adapters train on a frozen base, are exported as PEFT directories (names, shapes,
#    adapter_config.json), and the reference with those adapters gives thetad's logits; read back
#    by lora.init_from they continue training; export.at_checkpoints rewrites only what changed;
#  - flat uint16 token files train; every bad input is exit 2 naming the file and the tensor, a
#    base or adapter file shortened while mapped included.
#   llama_peft.sh THETAD REFERENCE THETAD_LOGITS
source "$(dirname "$0")/lib.sh"
thetad=$1
logits_bin=$3
# shellcheck source=llama_lib.sh
source "$HERE/llama_lib.sh"

# Step 0: the base's logits (no adapter has moved yet: B = 0).
logits base_logits 0
$py "$ref" logits "$base" "$WORK/tokens.npy" "$WORK/ref_base.npy"
close "step-0 logits == the Hugging Face formulas" base_logits ref_base
expect_code 0 validate_dims "$thetad" validate "$job" --set model.init_from="$base"
expect_code 2 dims_mismatch "$thetad" validate "$job" --set model.init_from="$base" --set model.d_model=64
expect_in dims_mismatch "model.d_model: is 64 but .*config.json has hidden_size = 32"

# Two tasks' adapters on the frozen base, 2 ranks, exported at the end.
run_np train 2 "$job" --set model.init_from="$base" --set export.adapters_dir="$WORK/adapters/{task}"
expect_in train "export.adapters_dir: 1 adapters written"
# Two ranks of one host, not bound to cores: the base is read on each rank's share of the CPUs
# (cpu_share: the online CPUs over the ranks, where the rank may run on all of them).
online=$(getconf _NPROCESSORS_ONLN) mine=$(nproc)
share=$((mine >= online ? online / 2 : mine))
expect_in train "model.init_from: [0-9]+ parameters from .*, $((share > 0 ? share : 1)) threads;"
exported tuned
$py - "$WORK/tuned0.npy" "$WORK/base_logits.npy" <<'PY' && pass "the adapters moved the logits" || fail "adapters did nothing"
import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert np.abs(a - b).max() > 1e-3, np.abs(a - b).max()
PY

# Continue from the exported adapters, exporting at every checkpoint: a step of task 0 only
# (round robin on one rank: steps alternate 0, 1) rewrites adapter 0 alone.
cp -r "$WORK/adapters" "$WORK/again"
run_np again 1 "$job" --set model.init_from="$base" --set lora.init_from="$WORK/adapters/{task}" \
  --set export.adapters_dir="$WORK/again/{task}" --set export.at_checkpoints=true --set checkpoint.every_steps=1 --set steps=3
expect_in again "lora.init_from: adapters of 2 of 2 tasks"
# The base is read on the rank's CPUs, not on LibTorch's intra-op threads (1 with Debian's LibTorch).
expect_in again "model.init_from: [0-9]+ parameters from .*, $(nproc) threads;"
n=$(grep -o 'export.adapters_dir: [0-9]* adapters written' "$WORK/again.log" | awk '{print $2}' | tr '\n' ' ')
[ "$n" = "1 1 1 " ] && pass "at_checkpoints: one adapter rewritten per step ($n)" || fail "at_checkpoints wrote: '$n'"
# Exporting into a directory that holds something else: refused before any step.
mkdir -p "$WORK/busy/1" && echo keep > "$WORK/busy/1/notes.txt"
expect_code 2 export_busy "$thetad" run "$job" --no-resume --set model.init_from="$base" \
  --set export.adapters_dir="$WORK/busy/{task}" --set checkpoint.dir="$WORK/busy.ckpt"
expect_in export_busy "busy/1: export.adapters_dir: holds 'notes.txt'"
[ "$(cat "$WORK/busy/1/notes.txt")" = keep ] && pass "export_busy: nothing overwritten" || fail "export_busy overwrote"
# An adapter of another rank: exit 2 naming the file and both values.
expect_code 2 lora_rank "$logits_bin" "$job" --set model.init_from="$base" --set lora.init_from="$WORK/adapters/{task}" \
  --set lora.rank=2 --tokens "$WORK/tokens.npy" --task 0 --out "$WORK/x.npy"
expect_in lora_rank "adapters/0/adapter_config.json: lora.init_from: r = 4 but lora.rank is 2"
# thetad validate refuses what run refuses: that rank, a FIFO for adapter_config.json (it does not
# block), the merged model written into its base, and an export into the adapters it continues from.
expect_code 2 validate_lora_rank "$thetad" validate "$job" --set model.init_from="$base" \
  --set lora.init_from="$WORK/adapters/{task}" --set lora.rank=2
expect_in validate_lora_rank "adapters/0/adapter_config.json: lora.init_from: r = 4 but lora.rank is 2"
mkdir -p "$WORK/fifo_adapter/0" && mkfifo "$WORK/fifo_adapter/0/adapter_config.json"
expect_code 2 validate_lora_fifo timeout 20 "$thetad" validate "$job" --set model.init_from="$base" \
  --set lora.init_from="$WORK/fifo_adapter/{task}"
expect_in validate_lora_fifo "fifo_adapter/0/adapter_config.json: lora.init_from: .*not a regular file"
cp -r "$base" "$WORK/base_copy"
sum_before=$(cat "$WORK/base_copy"/*.safetensors | md5sum)
for cmd in validate run; do
  expect_code 2 "merged_into_base_$cmd" "$thetad" $cmd "$job" --no-resume --set model.init_from="$WORK/base_copy" \
    --set export.merged_dir="$WORK/base_copy/" --set "export.merged_tasks=[0]" --set checkpoint.dir="$WORK/mib.ckpt"
  expect_in "merged_into_base_$cmd" "base_copy/: export.merged_dir is model.init_from"
done
[ "$(cat "$WORK/base_copy"/*.safetensors | md5sum)" = "$sum_before" ] && pass "merged_into_base: the base is untouched" \
  || fail "merged_into_base: the base changed"
expect_code 2 export_into_init "$thetad" validate "$job" --set model.init_from="$base" \
  --set lora.init_from="$WORK/adapters/{task}" --set export.adapters_dir="$WORK/adapters/{task}"
expect_in export_into_init "adapters/0: export.adapters_dir \(task 0\) is lora.init_from \(task 0\)"

# Flat uint16 token files (one per task), read window by window; a file that is not whole ids: exit 2.
mkdir -p "$WORK/bin"
$py - "$WORK/bin" <<'PY'
import numpy as np, sys
for t in range(2):
    (np.arange(3000) * (2 * t + 1) % 40).astype("<u2").tofile(f"{sys.argv[1]}/task{t}.bin")
PY
run_np bin_train 1 "$job" --set model.init_from="$base" --set steps=60 --set data.kind=tokens \
  --set data.dir="$WORK/bin" --set data.token_dtype=uint16
$py - "$WORK/bin_train.jsonl" <<'PY' && pass "uint16 token files: the loss falls" || fail "bin_train: loss"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
print(f"loss {l[0]:.3f} -> {l[-1]:.3f}"); assert sum(l[-5:]) < 0.8 * sum(l[:5])
PY
printf 'abc' >> "$WORK/bin/task1.bin"
expect_code 2 bin_odd "$thetad" run "$job" --no-resume --set model.init_from="$base" --set data.kind=tokens \
  --set data.dir="$WORK/bin" --set data.token_dtype=uint16 --set checkpoint.dir="$WORK/bin_odd.ckpt"
expect_in bin_odd "bin/task1.bin: 6003 bytes, not a whole number of uint16 token ids"

# Bad bases: exit 2 before any step, naming the file and the tensor.
$py "$ref" bad "$base" "$WORK/bad"
for b in truncated oversized overlap dtype shape intdtype missing index extra; do
  want=2; [ $b = extra ] && want=0
  expect_code $want "bad_$b" "$logits_bin" "$job" --set model.init_from="$WORK/bad/$b" --tokens "$WORK/tokens.npy" \
    --task 0 --out "$WORK/bad_$b.npy"
done
first=model-00001-of-00002.safetensors
expect_in bad_truncated "bad/truncated/$first: .*data_offsets .* out of range"
expect_in bad_oversized "bad/oversized/$first: safetensors header of 1099511627776 bytes is above"
expect_in bad_overlap "bad/overlap/$first: safetensors tensors '.*' and '.*' overlap"
expect_in bad_dtype "bad/dtype/$first: safetensors tensor 'model.layers.0.self_attn.q_proj.weight': unknown dtype 'Q8'"
expect_in bad_shape "bad/shape/$first: model.init_from: tensor 'model.layers.0.self_attn.k_proj.weight' has shape \[32, 16\]"
expect_in bad_intdtype "tensor 'model.layers.0.mlp.down_proj.weight' is I16, not F32, BF16 or F16"
expect_in bad_missing "bad/missing: model.init_from: tensor 'model.layers.0.mlp.gate_proj.weight' is missing"
expect_in bad_index "tensor 'model.norm.weight', listed there by model.safetensors.index.json, is not in the file"
expect_in bad_extra "1 tensors name no parameter of the model and are ignored: model.layers.0.self_attn.rotary_emb.inv_freq"

# A base shard and an adapter file cut short by another process while the job has them mapped
# (the test aid truncates each to its header once mapped, before a tensor is copied): exit 2 naming
# the file and a tensor before any step, where the copy out of the map died of SIGBUS.
cp -r "$base" "$WORK/shrunk" && cp -r "$WORK/adapters" "$WORK/shrunk_adapters"
THETAD_TEST_TRUNCATE_MAPPED=model-00002-of-00002.safetensors expect_code 2 shrunk_base "$thetad" run "$job" --no-resume \
  --set model.init_from="$WORK/shrunk" --set checkpoint.dir="$WORK/shrunk.ckpt" --set metrics.path="$WORK/shrunk.jsonl"
expect_in shrunk_base "shrunk/model-00002-of-00002.safetensors: tensor '.*': cannot be read: the file is now [0-9]* bytes"
THETAD_TEST_TRUNCATE_MAPPED=adapter_model.safetensors expect_code 2 shrunk_adapter "$thetad" run "$job" --no-resume \
  --set model.init_from="$base" --set lora.init_from="$WORK/shrunk_adapters/{task}" \
  --set checkpoint.dir="$WORK/shrunk.ckpt" --set metrics.path="$WORK/shrunk.jsonl"
expect_in shrunk_adapter "shrunk_adapters/0/adapter_model.safetensors: tensor '.*': cannot be read"
[ ! -e "$WORK/shrunk.jsonl" ] && pass "shrunk: no step taken" || fail "shrunk: a step ran"
finish
