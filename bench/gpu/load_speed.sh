#!/usr/bin/env bash
# The start and the end of a run, timed: (1) loading a 1 B-parameter Hugging Face Llama base
# (model.init_from: config.json + model.safetensors, bf16, written once by
# bench/gpu/write_llama_safetensors.py) against `cat > /dev/null` of the same bytes in the same
# run, both from the page cache (the file is read once before): thetad's own log line
# "model.init_from: N parameters from DIR (X GB read in S s: G GB/s, T threads; thread-seconds:
# finiteness a, conversion b, copy to the device c)", with the frozen base held in bf16
# (precision: bf16: no conversion) and in float32 (precision: fp32: BF16 widened).
# Goal: >= 1 GB/s. (2) 10,000 PEFT adapters exported (export.adapters_dir; a tiny transformer,
# 100 adapters trained per step, each once): thetad's line "export.adapters_dir: N adapters
# written in S s". Goal: <= 60 s. On a GPU or on the CPU alike (the model lives where thetad runs).
#
#   bash bench/gpu/load_speed.sh BUILD_DIR            # thetad in BUILD_DIR/daemon/thetad
#
# Environment: OUT (results under $OUT/load_speed, default /tmp/out), LOAD_SHAPE (the writer's
# options; default TinyLlama's 1.1 B: --hidden 2048 --layers 22 --heads 32 --kv-heads 4 --ff 5632
# --vocab 32000), LOAD_MODEL_DIR (where the base is written, once: default $OUT/load_speed/model),
# EXPORT_TASKS (10000; 0 skips the export), LOAD_PYTHON (python3; the standard library suffices).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: bash bench/gpu/load_speed.sh BUILD_DIR" >&2; exit 2; }
THETAD=$(cd "$1" 2>/dev/null && pwd)/daemon/thetad
[ -x "$THETAD" ] || { echo "bench/gpu/load_speed.sh: $1/daemon/thetad not built" >&2; exit 2; }
OUT=${OUT:-/tmp/out}/load_speed
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${LOAD_PYTHON:-python3}
SHAPE=${LOAD_SHAPE:---hidden 2048 --layers 22 --heads 32 --kv-heads 4 --ff 5632 --vocab 32000}
MODEL=${LOAD_MODEL_DIR:-$OUT/model}
TASKS=${EXPORT_TASKS:-10000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
now() { date +%s.%N; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.3f GB in %.3f s: %.2f GB/s", b / 1e9, s, b / 1e9 / s }'; }

# shellcheck disable=SC2086  # the writer's options, word-split on purpose
if [ ! -f "$MODEL/model.safetensors" ] || [ "$(cat "$MODEL/shape.txt" 2>/dev/null)" != "$SHAPE" ]; then
  "$PY" "$ROOT/bench/gpu/write_llama_safetensors.py" "$MODEL" $SHAPE || exit 1
  echo "$SHAPE" > "$MODEL/shape.txt"
fi
FILE=$MODEL/model.safetensors
BYTES=$(stat -c %s "$FILE")
cat "$FILE" > /dev/null  # into the page cache
best=""
for _ in 1 2 3; do
  t0=$(now); cat "$FILE" > /dev/null; t1=$(now)
  s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  if [ -z "$best" ] || awk -v s="$s" -v b="$best" 'BEGIN { exit !(s < b) }'; then best=$s; fi
done
echo "cat > /dev/null (best of 3): $(rate "$BYTES" "$best")" | tee "$OUT/summary.txt"
# The host's rate of writing the same bytes into fresh memory (first touch): the floor of any
# load into new host memory (the CPU build's parameters; a GPU load writes device memory instead).
"$PY" - "$BYTES" <<'PY' | tee -a "$OUT/summary.txt"
import ctypes, mmap, sys, time
n = int(sys.argv[1])
fresh = mmap.mmap(-1, n)  # anonymous pages, not yet touched
t = time.perf_counter()
ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(fresh)), 1, n)
s = time.perf_counter() - t
print("fresh host memory, first touch: %.3f GB in %.3f s: %.2f GB/s" % (n / 1e9, s, n / 1e9 / s))
PY

load_job() {  # PRECISION: a one-step job on the base (the frozen base; one tiny adapter)
  cat <<YAML
job: load-speed
seed: 1
steps: 1
precision: $1
model: {kind: transformer, init_from: "$MODEL", seq_len: 8, tasks: 2, train_shared: false}
lora: {rank: 2, alpha: 4, targets: [q]}
data: {kind: synthetic, batch_per_rank: 1, schedule: round_robin}
log: {level: info}
YAML
}
for prec in bf16 fp32; do
  load_job "$prec" > "$OUT/load_$prec.yaml"
  "$THETAD" run "$OUT/load_$prec.yaml" --no-resume > "$OUT/load_$prec.log" 2>&1
  rc=$?
  line=$(grep -o 'model.init_from: [0-9]* parameters from .*)' "$OUT/load_$prec.log" | tail -1)
  echo "thetad load, precision $prec (rc $rc): ${line:-no load line, see $OUT/load_$prec.log}" | tee -a "$OUT/summary.txt"
  grep -o 'frozen base held in bf16.*' "$OUT/load_$prec.log" | tee -a "$OUT/summary.txt"
done

if [ "$TASKS" -gt 0 ]; then
  rm -rf "$OUT/adapters"
  cat > "$OUT/export.yaml" <<YAML
job: export-speed
seed: 1
steps: $(( (TASKS + 99) / 100 ))
model: {kind: transformer, arch: llama, layers: 1, d_model: 16, heads: 2, d_ff: 32, vocab: 32, seq_len: 8, tasks: $TASKS, train_shared: false}
lora: {rank: 2, alpha: 4, targets: [q, v]}
data: {kind: synthetic, batch_per_rank: 100, schedule: round_robin, tasks_per_rank: 100}
export: {adapters_dir: "$OUT/adapters/{task}"}
log: {level: info}
YAML
  "$THETAD" run "$OUT/export.yaml" --no-resume > "$OUT/export.log" 2>&1
  rc=$?
  line=$(grep -o 'export.adapters_dir: [0-9]* adapters written in .*' "$OUT/export.log" | tail -1)
  echo "thetad export of $TASKS adapters (rc $rc): ${line:-no export line, see $OUT/export.log}; $(find "$OUT/adapters" -name adapter_model.safetensors | wc -l) adapter files" | tee -a "$OUT/summary.txt"
fi
