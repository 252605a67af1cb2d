#!/usr/bin/env bash
# One GPU: LoRA on a Llama shape with a frozen bf16 base, thetad (model.arch:
# llama, precision: bf16, model.train_shared: false: the base held in bf16 only) next to Hugging
# Face transformers + peft (bench/peer/peft_llama.py: LlamaForCausalLM in bf16, frozen, one peft
# adapter per task, fused AdamW, zero_grad(set_to_none=True)), same shapes, batch, sequence, tasks
# and steps. bench/gpu/plain.sh runs both (its shape llama_d2048_l16_t64_bf16: d 2048, 16 layers,
# 16 heads, 4 key/value heads, d_ff 5632, vocab 32000, seq 512, 64 tasks, 2 adapters of rank 16
# on q,k,v,o,gate,up,down per step, 140 steps: every task used 4 times, 20-step windows after 10)
# and prints the table: step ms (median of window means; the peer's CUDA-event times in
# summary.json), peak device memory (thetad's device_mem_peak_bytes = max of mem_step_peak_bytes;
# the peer's torch.cuda.max_memory_allocated) and the ratios thetad/peer. Goal: step <= 1.0x,
# peak <= 0.75x.
#
#   bash bench/gpu/llama_peft.sh /tmp/build      # environment: docs/gpu.md
#
# Needs python3 with torch, transformers and peft. Results: ${OUT:-/tmp/out}/llama_peft/plain/.
# LLAMA_SHAPES overrides the shapes (plain.sh's PLAIN_SHAPES syntax, e.g.
# "llama_d2048_l16_t64_bf16:tasks=256,steps=520"); every other PLAIN_* variable applies.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: bash bench/gpu/llama_peft.sh BUILD_DIR" >&2; exit 2; }
PY=${PLAIN_PYTHON:-python3}
if [ "${PLAIN_DEVICE:-cuda}" = cuda ] && ! "$PY" -c 'import transformers, peft' 2>/dev/null; then
  echo "bench/gpu/llama_peft.sh: $PY cannot import transformers and peft (the peer needs both)" >&2; exit 2
fi
OUT=${OUT:-/tmp/out}/llama_peft PLAIN_SHAPES=${LLAMA_SHAPES:-llama_d2048_l16_t64_bf16} \
  PLAIN_BUDGET_S=${PLAIN_BUDGET_S:-400} PLAIN_CAP_S=${PLAIN_CAP_S:-240} exec bash "$ROOT/bench/gpu/plain.sh" "$@"
