#!/usr/bin/env bash
# offload.shared: stream on a transformer's frozen base, on the CPU build (its layers in host
# memory shared by the node's ranks, brought into offload.shared_prefetch_layers + 2 slots layer
# by layer, forward and backward): bitwise the parameters of the resident base, for
#  - a base read from Hugging Face files (llama_ref.py's tiny Llama) on 2 ranks, joint and per-task
#    passes, bf16, the adapters in the host store; its merged export the resident run's, byte for
#    byte, and its PEFT adapters the resident run's;
#  - a drawn base of more layers than slots (layers copied in again each pass), tied and untied,
#    fp32 and bf16, and a run stopped and resumed;
#  - passes of 2 of 4 tasks (train.tasks_per_pass): the resident joint pass's parameters with half
#    the layer copies of a pass per task;
#  - combinations that cannot work are exit 2 at validate, naming the keys.
#   llama_streamed.sh THETAD REFERENCE THETAD_LOGITS
source "$(dirname "$0")/lib.sh"
thetad=$1
logits_bin=$3
# shellcheck source=llama_lib.sh
source "$HERE/llama_lib.sh"
file=(--set model.init_from="$base" --set steps=6)
stream=(--set offload.shared=stream)

# A base from files: every variant against its resident twin.
twin_exports "a base from files, 2 ranks: streamed == resident" res str "${stream[@]}"
expect_in str "streamed base: [0-9]+ layers in .* MiB of host memory shared by 2 local ranks"
for v in "per_task|--set train.backward=per_task" "joint|--set train.backward=joint" "bf16|--set precision=bf16" \
         "store|--set offload.enabled=true --set offload.device_slots=2"; do
  name=${v%%|*}
  # shellcheck disable=SC2086  # the variant's words are split on purpose
  run_np "res_$name" 2 "$job" "${file[@]}" ${v#*|}
  # shellcheck disable=SC2086
  run_np "str_$name" 2 "$job" "${file[@]}" "${stream[@]}" ${v#*|}
  same_hash "a base from files, $name: streamed == resident" "res_$name" "str_$name"
done

# A drawn base of 5 layers through 3 slots: each pass copies layers in again.
tfm=$HERE/jobs/transformer.yaml
drawn=(--set model.arch=llama --set model.kv_heads=1 --set model.train_shared=false --set model.layers=5
       --set "lora.targets=[q,k,v,o,gate,up,down]" --set steps=6)
for v in "fp32|--set model.tie_embeddings=false" "tied|--set model.tie_embeddings=true" \
         "bf16|--set precision=bf16 --set model.tie_embeddings=false"; do
  name=${v%%|*}
  # shellcheck disable=SC2086
  run_np "drawn_res_$name" 2 "$tfm" "${drawn[@]}" ${v#*|}
  # shellcheck disable=SC2086
  run_np "drawn_str_$name" 2 "$tfm" "${drawn[@]}" "${stream[@]}" ${v#*|} --set checkpoint.every_steps=3
  same_hash "a drawn base, $name: streamed == resident" "drawn_res_$name" "drawn_str_$name"
done
expect_in drawn_str_fp32 "streamed base: [0-9]+ layer copies .*, 1 not prefetched"
four=(--set data.tasks_per_rank=4 --set model.tie_embeddings=false)
run_np drawn_res_four 2 "$tfm" "${drawn[@]}" "${four[@]}" --set train.backward=joint
run_np drawn_str_pairs 2 "$tfm" "${drawn[@]}" "${four[@]}" "${stream[@]}" --set train.backward=per_task --set train.tasks_per_pass=2
run_np drawn_str_single 2 "$tfm" "${drawn[@]}" "${four[@]}" "${stream[@]}" --set train.backward=per_task
same_hash "a drawn base, passes of 2 of 4 tasks: streamed == resident joint" drawn_res_four drawn_str_pairs
copies() { grep -oE "streamed base: [0-9]+ layer copies" "$WORK/$1.log" | head -1 | grep -oE "[0-9]+"; }
pairs=$(copies drawn_str_pairs) single=$(copies drawn_str_single)
if [ -n "$pairs" ] && [ -n "$single" ] && [ "$pairs" -lt "$single" ] && [ $((2 * pairs)) -le $((single + 30)) ]; then
  pass "passes of 2 tasks: $pairs layer copies, a pass per task $single"
else
  fail "layer copies: passes of 2 tasks '$pairs', a pass per task '$single'"
fi
drawn_resumes "a drawn streamed base" drawn_str_fp32 "$tfm" "${drawn[@]}" "${stream[@]}" --set model.tie_embeddings=false

# What cannot work: exit 2 at validate, naming the keys.
expect_code 2 trained "$thetad" validate "$job" "${stream[@]}" --set model.train_shared=true
expect_in trained "offload.shared: stream of a transformer streams its frozen base, but model.train_shared is true"
expect_code 2 split "$thetad" validate "$job" "${stream[@]}" --set offload.shared_device_layers=1
expect_in split "offload.shared_device_layers: is the streamed MLP trunk's"
finish
