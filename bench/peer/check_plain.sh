#!/usr/bin/env bash
# CPU check of the one-GPU peer (plain_loop.py), ~10 s: its --check (finite, falling
# losses on tiny shapes), the hand-written Llama of --model compiled-llama against the formula
# (check_compiled_llama.py; eager: torch.compile is for CUDA), then the same tiny runs as the DDP
# peers on one gloo rank: the losses must be bitwise equal (same init, data, schedule and loss
# functions, imported from them). PYTHON: one with torch (Debian's python3-torch: /usr/bin/python3).
#   bash bench/peer/check_plain.sh [PYTHON]
set -uo pipefail
PY=${1:-python3}
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
"$PY" "$DIR/plain_loop.py" --check || fail=1
"$PY" "$DIR/check_compiled_llama.py" || fail=1
MT=(--device cpu --input-dim 16 --hidden 32 --output-dim 8 --trunk-layers 2 --tasks 3 --batch 8 --steps 6 --warmup 1)
LO=(--device cpu --layers 1 --d-model 16 --heads 2 --d-ff 32 --vocab 32 --seq-len 8 --tasks 3 --tasks-per-rank 2 --batch 4 --steps 4 --warmup 1)
pair() {  # NAME DDP_SCRIPT PLAIN_MODEL ARGS...
  local name=$1 ddp=$2 model=$3; shift 3
  env -u RANK -u WORLD_SIZE "$PY" "$DIR/$ddp" --backend gloo --master-port $((29700 + RANDOM % 200)) "$@" \
      --out "$TMP/$name.ddp.json" > "$TMP/$name.ddp.log" 2>&1 || { echo "$name: DDP peer failed"; cat "$TMP/$name.ddp.log"; fail=1; return; }
  "$PY" "$DIR/plain_loop.py" --model "$model" --window 1 "$@" --out "$TMP/$name.plain.json" > "$TMP/$name.plain.log" 2>&1 ||
      { echo "$name: plain peer failed"; cat "$TMP/$name.plain.log"; fail=1; return; }
  "$PY" - "$name" "$TMP/$name.ddp.json" "$TMP/$name.plain.json" <<'PY' || fail=1
import json, sys
name, d, p = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
same = d["losses"] == p["losses"] and len(p["losses"]) > 1
print("%s: plain loop vs DDP peer on 1 rank, %d losses %s (first %.7f / %.7f)" % (
    name, len(p["losses"]), "bitwise equal" if same else "DIFFER", p["losses"][0], d["losses"][0]))
sys.exit(0 if same else 1)
PY
}
pair multitask_fp32 ddp_multitask.py multitask "${MT[@]}"
pair multitask_bf16 ddp_multitask.py multitask "${MT[@]}" --precision bf16
pair lora_frozen_bf16 ddp_lora_transformer.py lora "${LO[@]}" --frozen-base --precision bf16
pair lora_fp32 ddp_lora_transformer.py lora "${LO[@]}"
[ "$fail" = 0 ] && echo "check_plain: ok" || echo "check_plain: FAILED"
exit "$fail"
