#!/usr/bin/env bash
# model.base_quant: nf4 on the CPU build, against nf4_ref.py (QLoRA's 4-bit NormalFloat written
# from its definition, over llama_ref.py's Hugging Face formulas):
#  - thetad's step-0 logits over the nf4 base equal the reference's over the quantized base within
#    1e-5 relative, and its next-token loss is within 5% of the full-precision base's;
#  - two tasks' adapters train on the nf4 base on 2 ranks (the loss falls) and are exported as PEFT
#    directories that load on the full-precision base, as QLoRA's users serve them: the
#    reference's logits with them equal thetad's, over either base; the merged model is merged
#    into the full base;
#  - a run stopped and resumed ends bitwise as the uninterrupted one; the adapters in the host
#    store end bitwise as resident ones; joint and per-task passes alike; a drawn base (no
#    model.init_from) is held nowhere but in nf4, is not in the checkpoint, and resumes bitwise;
#  - the nf4 base streamed from host memory (offload.shared: stream) or sharded over the ranks
#    (model.base_shard: node) as nf4 codes ends bitwise as the resident nf4 base, from files at 2
#    ranks and drawn (untied, 5 layers) at 4;
#  - combinations that cannot work are exit 2 at validate, naming the keys.
#   llama_nf4.sh THETAD REFERENCE THETAD_LOGITS
source "$(dirname "$0")/lib.sh"
thetad=$1
logits_bin=$3
# shellcheck source=llama_lib.sh
source "$HERE/llama_lib.sh"
nf4=$HERE/nf4_ref.py
quant=(--set model.init_from="$base" --set model.base_quant=nf4)

# Step 0 (B = 0): the base alone.
logits nf4_logits 0 --set model.base_quant=nf4
expect_in nf4_logits "frozen base in nf4 \(model.base_quant\): [0-9]+ matrix values"
$py "$nf4" logits "$base" "$WORK/tokens.npy" "$WORK/ref_nf4.npy"
close "step-0 logits over the nf4 base == QLoRA's definition" nf4_logits ref_nf4
logits full_logits 0
$py "$nf4" loss "$WORK/nf4_logits.npy" "$WORK/full_logits.npy" "$WORK/tokens.npy" 0.05 > "$WORK/loss.log" 2>&1 \
  && pass "nf4 against the full base: $(cat "$WORK/loss.log")" || { fail "nf4 loss"; cat "$WORK/loss.log"; }

# Two tasks' adapters trained on the nf4 base, 2 ranks, exported; they load on the full base.
run_np train 2 "$job" "${quant[@]}" --set steps=40 --set export.adapters_dir="$WORK/adapters/{task}" \
  --set export.merged_dir="$WORK/merged/{task}" --set 'export.merged_tasks=[0]'
expect_in train "export.adapters_dir: 1 adapters written"
expect_in train "export.merged_dir: task 0's merged model \(.*\) written to $WORK/merged/0"
$py - "$WORK/train.jsonl" <<'PY' && pass "nf4 base: the loss falls" || fail "nf4 base: loss"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
print(f"loss {l[0]:.3f} -> {l[-1]:.3f}"); assert sum(l[-5:]) < 0.9 * sum(l[:5])
PY
exported full_tuned
# The merged model: task 0's adapter folded into the full base the job names, not its 4-bit copy.
$py "$ref" logits "$WORK/merged/0" "$WORK/tokens.npy" "$WORK/ref_merged0.npy"
close "task 0's merged model == the full base + its PEFT adapter" ref_merged0 ref_full_tuned0
logits nf4_tuned0 0 --set model.base_quant=nf4 --set lora.init_from="$WORK/adapters/{task}"
$py "$nf4" logits "$base" "$WORK/tokens.npy" "$WORK/ref_nf4_tuned0.npy" "$WORK/adapters/0"
close "task 0: the nf4 base + its PEFT adapter == the definition's" nf4_tuned0 ref_nf4_tuned0

# Resume, the host store, the passes: bitwise the same parameters.
run_np whole 2 "$job" "${quant[@]}" --set steps=6 --set checkpoint.every_steps=3
run_np first3 2 "$job" "${quant[@]}" --set steps=3
# shellcheck disable=SC2046
expect_code 0 resumed mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" "${quant[@]}" --set steps=6 \
  --set checkpoint.dir="$WORK/first3.ckpt" --set log.level=info
expect_in resumed "resumed from .*step-00000003 at step 3"
same_hash "nf4: stopped at step 3 and resumed == uninterrupted" whole resumed
run_np store 2 "$job" "${quant[@]}" --set steps=6 --set offload.enabled=true --set offload.device_slots=2
same_hash "nf4: adapters in the host store == resident" whole store
run_np joint 2 "$job" "${quant[@]}" --set steps=6 --set train.backward=joint --set data.tasks_per_rank=2
run_np per_task 2 "$job" "${quant[@]}" --set steps=6 --set train.backward=per_task --set data.tasks_per_rank=2
same_hash "nf4: the joint pass == a pass per task" joint per_task

# The nf4 base's layers streamed from host memory, or sharded over the ranks and gathered, as nf4
# codes: the parameters of the resident nf4 base.
run_np nf4_stream 2 "$job" "${quant[@]}" --set steps=6 --set offload.shared=stream
expect_in nf4_stream "streamed base: [0-9]+ layers in .* MiB of host memory shared by 2 local ranks"
same_hash "nf4: streamed from host memory == resident" whole nf4_stream
run_np nf4_shard 2 "$job" "${quant[@]}" --set steps=6 --set model.base_shard=node
expect_in nf4_shard "sharded base: [0-9]+ layers, 1/2 of each on each of 2 local ranks"
same_hash "nf4: sharded over 2 ranks == resident" whole nf4_shard

# A drawn base (no model.init_from): its matrices drawn as they are quantized and held nowhere
# else; no checkpoint holds Θ (the seed draws it again), and a resumed run ends bitwise.
tfm=$HERE/jobs/transformer.yaml
drawn=(--set model.arch=llama --set model.kv_heads=1 --set model.train_shared=false --set model.base_quant=nf4
       --set "lora.targets=[q,k,v,o,gate,up,down]" --set steps=6)
run_np drawn_whole 2 "$tfm" "${drawn[@]}" --set checkpoint.every_steps=3
expect_in drawn_whole "frozen base in nf4 .*drawn from the seed as quantized, held nowhere else"
drawn_resumes "a drawn nf4 base" drawn_whole "$tfm" "${drawn[@]}"
# Of 5 layers through 3 slots, untied (the output layer quantized where it is, the layers where
# they are streamed or sharded from).
untied=(--set model.layers=5 --set model.tie_embeddings=false)
run_np drawn_untied 4 "$tfm" "${drawn[@]}" "${untied[@]}"
run_np drawn_untied_stream 4 "$tfm" "${drawn[@]}" "${untied[@]}" --set offload.shared=stream
same_hash "a drawn nf4 base, untied, 4 ranks: streamed == resident" drawn_untied drawn_untied_stream
# The load's line counts the embedding and norms alike and the streamed layers as in host memory,
# not among the embeddings.
resident_bytes() { grep -oE "[0-9.e+-]+ MB of embeddings and norms" "$WORK/$1.log" | head -1; }
expect_in drawn_untied_stream "the layers' [0-9]+ matrix values in host memory, brought in a layer at a time"
if [ "$(resident_bytes drawn_untied_stream)" = "$(resident_bytes drawn_untied)" ] && [ -n "$(resident_bytes drawn_untied)" ]; then
  pass "a drawn nf4 base streamed: the embedding and norms logged as resident ($(resident_bytes drawn_untied))"
else
  fail "a drawn nf4 base streamed logs other resident bytes: '$(resident_bytes drawn_untied_stream)' vs '$(resident_bytes drawn_untied)'"
fi
run_np drawn_untied_shard 4 "$tfm" "${drawn[@]}" "${untied[@]}" --set model.base_shard=node
same_hash "a drawn nf4 base, untied, 4 ranks: sharded == resident" drawn_untied drawn_untied_shard

# What cannot work: exit 2 at validate, naming the keys.
expect_code 2 trained_base "$thetad" validate "$job" "${quant[@]}" --set model.train_shared=true
expect_in trained_base "model.base_quant: nf4 holds a frozen base, but model.train_shared is true"
expect_code 2 mlp_base "$thetad" validate "$HERE/jobs/small.yaml" --set model.base_quant=nf4
expect_in mlp_base "model.base_quant: nf4 quantizes the transformer's frozen base; model.kind is multitask_mlp"
expect_code 2 bad_word "$thetad" validate "$job" "${quant[@]}" --set model.base_quant=nf8
expect_in bad_word "model.base_quant.*nf8"
finish
