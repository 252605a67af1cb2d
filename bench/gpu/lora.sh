#!/usr/bin/env bash
# On all visible GPUs: thetad's transformer with per-task LoRA adapters on a
# frozen base (bench/jobs/lora-transformer.yaml; θ[t] resident, then offloaded to the host store)
# next to the PyTorch DDP peer (bench/peer/ddp_lora_transformer.py, --frozen-base, same sizes),
# then a table of median step time over the steps after the warm-up, peak device memory and
# bytes reduced per step. Run after bench/gpu/run.sh has built thetad (same BENCH_BUILD_DIR):
#
#   bash bench/gpu/lora.sh      # OUT=... (default /tmp/out/lora); environment: docs/gpu.md
#
# Environment: LORA_T=64 LORA_STEPS=60 LORA_WARMUP=10 LORA_CAP_S=150 (per run), LORA_SET="..."
# (extra --set for thetad, e.g. "model.layers=4" for a smaller base; the peer gets the same sizes),
# LORA_TRAIN_BASE=1 (the base trained too: model.train_shared true, the peer without --frozen-base).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/out}/lora
mkdir -p "$OUT"
BUILD=${BENCH_BUILD_DIR:-/tmp/build}
THETAD=$BUILD/daemon/thetad
JOB=bench/jobs/lora-transformer.yaml
T=${LORA_T:-64} STEPS=${LORA_STEPS:-60} WARMUP=${LORA_WARMUP:-10} CAP=${LORA_CAP_S:-150}
NP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0)
[ "$NP" -gt 0 ] || { echo "bench/gpu/lora.sh: no GPU visible" >&2; exit 2; }
[ -x "$THETAD" ] || { echo "bench/gpu/lora.sh: $THETAD not built (run bench/gpu/run.sh first)" >&2; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx -x NCCL_NVLS_ENABLE -x PATH -np "$NP")
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI+=(-x LD_LIBRARY_PATH)
SETS=(--set steps="$STEPS" --set model.tasks="$T")
FROZEN=(--frozen-base)
if [ "${LORA_TRAIN_BASE:-0}" = 1 ]; then SETS+=(--set model.train_shared=true); FROZEN=(); fi
for kv in ${LORA_SET:-}; do SETS+=(--set "$kv"); done
# The sizes the peer gets: the job's, after LORA_SET.
size() { local v; v=$(printf '%s\n' ${LORA_SET:-} | sed -n "s/^model\.$1=//p" | tail -1); echo "${v:-$2}"; }
L=$(size layers 16) D=$(size d_model 2048) H=$(size heads 16) F=$(size d_ff 8192) V=$(size vocab 32000) S=$(size seq_len 512)

run_thetad() {  # NAME OFFLOAD
  mkdir -p "$OUT/$1"
  timeout "$CAP" "${MPI[@]}" "$THETAD" run "$JOB" --no-resume "${SETS[@]}" --set offload.enabled="$2" \
      --set metrics.path="$OUT/$1/metrics.jsonl" > "$OUT/$1/log.txt" 2>&1
  echo "$1 exit $?"
}
run_thetad thetad_resident false
run_thetad thetad_offload true
mkdir -p "$OUT/ddp"
timeout "$CAP" "${MPI[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29561 python3 bench/peer/ddp_lora_transformer.py \
    --device cuda --backend nccl --layers "$L" --d-model "$D" --heads "$H" --d-ff "$F" --vocab "$V" --seq-len "$S" \
    --tasks "$T" --rank 16 --alpha 32 --targets q,k,v,o "${FROZEN[@]}" --tasks-per-rank 2 --batch 8 \
    --steps "$STEPS" --warmup "$WARMUP" --precision bf16 --lr 1e-4 --out "$OUT/ddp/result.json" > "$OUT/ddp/log.txt" 2>&1
echo "ddp exit $?"
python3 - "$OUT" "$WARMUP" <<'PY'
import json, os, statistics, sys
out, warm = sys.argv[1], int(sys.argv[2])
def thetad(name):
    p = os.path.join(out, name, "metrics.jsonl")
    rows = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    rows = [r for r in rows if r.get("rank", 0) == 0 and r.get("step", 0) >= warm]
    if not rows: return None
    med = lambda k: statistics.median(r.get(k) or 0 for r in rows)
    return {"step_ms": med("step_ms"), "peak": max(r.get("device_mem_peak_bytes") or 0 for r in rows),
            "bytes": med("bytes_allreduced"), "h2d": med("h2d_bytes"), "loss": rows[-1].get("loss"), "steps": len(rows)}
res = {n: thetad(n) for n in ("thetad_resident", "thetad_offload")}
p = os.path.join(out, "ddp", "result.json")
d = json.load(open(p)) if os.path.exists(p) else None
res["ddp"] = d and {"step_ms": d.get("step_ms_median"), "peak": d.get("peak_mem_bytes"), "bytes": d.get("bytes_allreduced_per_step"),
                    "loss": (d.get("losses") or [None])[-1], "error": d.get("error")}
json.dump(res, open(os.path.join(out, "summary.json"), "w"), indent=1)
ddp_ms = res["ddp"] and res["ddp"].get("step_ms")
print("| run | step ms (median after warm-up) | × DDP | peak device GiB | MB reduced/step | last loss |")
print("|---|---|---|---|---|---|")
for n, r in res.items():
    if not r: print(f"| {n} | failed | | | | |"); continue
    ratio = f"{r['step_ms'] / ddp_ms:.2f}" if ddp_ms and r.get("step_ms") else ""
    f = lambda v, s: f"{v / s:.2f}" if isinstance(v, (int, float)) else "?"
    print(f"| {n} | {f(r.get('step_ms'), 1)} | {ratio} | {f(r.get('peak'), 2**30)} | {f(r.get('bytes'), 1e6)} | {r.get('loss')} |")
PY
