#!/usr/bin/env bash
# model.base_shard: node on a transformer's frozen base, on the CPU build (each rank of the node
# holds 1/N of every layer, every layer gathered from the N shards into
# offload.shared_prefetch_layers + 2 slots before its use, forward and backward): bitwise the
# parameters of the unsharded base, at 2 and 4 ranks, for
#  - a base read from Hugging Face files (llama_ref.py's tiny Llama): the default, joint and
#    per-task passes, bf16, the adapters in the host store; its merged export and PEFT adapters
#    the unsharded run's, byte for byte;
#  - a drawn base of more layers than slots, tied and untied, fp32 and bf16, and a run stopped and
#    resumed (a drawn sharded base is not in its checkpoints: the seed draws it again);
#  - combinations that cannot work are exit 2 at validate, naming the keys.
#   llama_sharded.sh THETAD REFERENCE THETAD_LOGITS
source "$(dirname "$0")/lib.sh"
thetad=$1
logits_bin=$3
# shellcheck source=llama_lib.sh
source "$HERE/llama_lib.sh"
file=(--set model.init_from="$base" --set steps=6)
shard=(--set model.base_shard=node)

# A base from files: every variant against its unsharded twin.
twin_exports "a base from files, 2 ranks: sharded == unsharded" res shd "${shard[@]}"
expect_in shd "sharded base: [0-9]+ layers, 1/2 of each on each of 2 local ranks"
for v in "4|per_task|--set train.backward=per_task" "4|joint|--set train.backward=joint" "2|bf16|--set precision=bf16" \
         "2|store|--set offload.enabled=true --set offload.device_slots=2"; do
  np=${v%%|*}; rest=${v#*|}; name=${rest%%|*}
  # shellcheck disable=SC2086  # the variant's words are split on purpose
  run_np "res_$name" "$np" "$job" "${file[@]}" ${rest#*|}
  # shellcheck disable=SC2086
  run_np "shd_$name" "$np" "$job" "${file[@]}" "${shard[@]}" ${rest#*|}
  same_hash "a base from files, $np ranks, $name: sharded == unsharded" "res_$name" "shd_$name"
done
expect_in shd_joint "sharded base: [0-9]+ layers, 1/4 of each on each of 4 local ranks"

# A drawn base of 5 layers through 3 slots: each pass gathers layers again.
tfm=$HERE/jobs/transformer.yaml
drawn=(--set model.arch=llama --set model.kv_heads=1 --set model.train_shared=false --set model.layers=5
       --set "lora.targets=[q,k,v,o,gate,up,down]" --set steps=6)
for v in "2|fp32|--set model.tie_embeddings=false" "4|fp32|--set model.tie_embeddings=false" \
         "4|tied|--set model.tie_embeddings=true" "2|bf16|--set precision=bf16 --set model.tie_embeddings=false"; do
  np=${v%%|*}; rest=${v#*|}; name=${rest%%|*}_np$np
  # shellcheck disable=SC2086
  run_np "drawn_res_$name" "$np" "$tfm" "${drawn[@]}" ${rest#*|}
  # shellcheck disable=SC2086
  run_np "drawn_shd_$name" "$np" "$tfm" "${drawn[@]}" "${shard[@]}" ${rest#*|}
  same_hash "a drawn base, $np ranks, ${rest%%|*}: sharded == unsharded" "drawn_res_$name" "drawn_shd_$name"
done
expect_in drawn_shd_fp32_np4 "sharded base: [0-9]+ layer gathers .*, 1 not prefetched"
drawn_resumes "a drawn sharded base" drawn_shd_fp32_np2 "$tfm" "${drawn[@]}" "${shard[@]}" --set model.tie_embeddings=false

# What cannot work: exit 2 at validate, naming the keys.
expect_code 2 trained "$thetad" validate "$job" "${shard[@]}" --set model.train_shared=true
expect_in trained "model.base_shard: node shards the transformer's frozen base over the node's ranks, but model.train_shared is true"
expect_code 2 stream "$thetad" validate "$job" "${shard[@]}" --set offload.shared=stream
expect_in stream "model.base_shard: .*with offload.shared: stream .*choose one"
finish
