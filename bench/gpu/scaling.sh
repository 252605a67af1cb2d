#!/usr/bin/env bash
# Weak scaling on one host: a job on 1, 2, 4, ... GPUs with the work per rank fixed, thetad and
# (optionally) the PyTorch DDP peer, in one command so that every ratio is taken within one
# call. Prints the windows of steps (bench/gpu/steady.sh) and one table of the last window's
# medians: step, backward, comm_wait, bytes (reduced or broadcast gradients, state moved between
# ranks, gradients kept by their one trainer: comm.sole_user), the bandwidth the engine's
# allreduces achieved (busbw, to set beside bench/comm/bench_comm_bw), and step(N)/step(1),
# thetad/DDP. SCALING_VARIANTS="broadcast||--set comm.sole_user=broadcast" adds the run that sends
# every gradient, on the same build.
#
#   bash bench/gpu/scaling.sh BUILD_DIR [JOB.yaml]
#
# Environment:
#   SCALING_NP="1 2 4"        rank counts (each at most the GPUs visible)
#   SCALING_PRECISIONS="fp32 bf16"
#   SCALING_STEPS=300 SCALING_WINDOW=100   steps per run, steps per window (the last one is the table's)
#   SCALING_VARIANTS="name|ENV=V ENV2=V|--set k=v ..."  extra runs at the largest count, ';'-separated
#                              (an environment for mpirun's ranks and thetad arguments)
#   SCALING_DDP=1             also bench/peer/ddp_multitask.py at each count (reference job's model)
#   SCALING_CAP_S=150         timeout of one run
# Results under ${OUT:-/tmp/out}/scaling/; docs/gpu.md says how to build on a CUDA machine.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:?usage: scaling.sh BUILD_DIR [JOB.yaml]}
JOB=${2:-$ROOT/bench/jobs/reference.yaml}
THETAD="$BUILD/daemon/thetad"
[ -x "$THETAD" ] || { echo "scaling.sh: no $THETAD" >&2; exit 2; }
OUT=${OUT:-/tmp/out}/scaling
mkdir -p "$OUT"
STEPS=${SCALING_STEPS:-300} WINDOW=${SCALING_WINDOW:-100} CAP=${SCALING_CAP_S:-150}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
# shellcheck disable=SC2054  # commas inside --mca values
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca pml ob1 --mca osc ^ucx
     -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI+=(-x LD_LIBRARY_PATH)
RUNS=()

# run NAME NP ENV THETAD_ARGS...: one thetad run, its metrics in $OUT/NAME.
run() {
  local name=$1 np=$2 env=$3; shift 3
  local envx=() kv
  for kv in $env; do export "${kv?}"; envx+=(-x "${kv%%=*}"); done
  mkdir -p "$OUT/$name"
  timeout -k 10 "$CAP" "${MPI[@]}" "${envx[@]}" -np "$np" "$THETAD" run "$JOB" --no-resume --set steps="$STEPS" \
    --set log.progress_every_s=60 --set metrics.path="$OUT/$name/metrics.jsonl" "$@" > "$OUT/$name/log.txt" 2>&1
  echo "$name: exit $? $(grep -o 'final params hash: [0-9a-f]*' "$OUT/$name/log.txt" | tail -1)"
  for kv in $env; do unset "${kv%%=*}"; done
  RUNS+=("$name")
}

ddp() {  # NAME NP PRECISION: the DDP peer of the reference job's model
  local name=$1 np=$2 prec=$3
  mkdir -p "$OUT/$name"
  timeout -k 10 "$CAP" "${MPI[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29600 + np)) -np "$np" \
    python3 "$ROOT/bench/peer/ddp_multitask.py" --device cuda --backend nccl --tasks 16 --batch 256 \
    --steps "$STEPS" --warmup $((STEPS - WINDOW)) --init fast --average-world --precision "$prec" \
    --out "$OUT/$name/result.json" > "$OUT/$name/log.txt" 2>&1
  echo "$name: exit $?"
}

for prec in ${SCALING_PRECISIONS:-fp32 bf16}; do
  grad=fp32; [ "$prec" = bf16 ] && grad=bf16
  for np in ${SCALING_NP:-1 2 4}; do
    [ "$np" -le "$NGPU" ] || { echo "skip np $np: $NGPU GPUs"; continue; }
    run "${prec}_np$np" "$np" "" --set precision="$prec" --set comm.grad_dtype="$grad"
    [ "${SCALING_DDP:-0}" = 1 ] && ddp "ddp_${prec}_np$np" "$np" "$prec"
  done
  top=$(for n in ${SCALING_NP:-1 2 4}; do [ "$n" -le "$NGPU" ] && echo "$n"; done | sort -n | tail -1)
  IFS=';' read -r -a variants <<< "${SCALING_VARIANTS:-}"
  for v in "${variants[@]}"; do
    [ -n "$v" ] || continue
    IFS='|' read -r vname venv vargs <<< "$v"
    # shellcheck disable=SC2086  # thetad arguments are words
    run "${prec}_np${top}_$vname" "$top" "$venv" --set precision="$prec" --set comm.grad_dtype="$grad" $vargs
  done
done

python3 - "$OUT" "$WINDOW" "${RUNS[@]}" <<'PY'
import json, os, re, statistics, sys
out, window, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rows(name):
    p = os.path.join(out, name, "metrics.jsonl")
    rs = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    return sorted((r for r in rs if r.get("rank", 0) == 0), key=lambda r: r["step"])
def med(rs, k): return statistics.median((r.get(k) or 0) for r in rs) if rs else float("nan")
def ddp(name):
    p = os.path.join(out, "ddp_" + name, "result.json")
    try: return json.load(open(p)).get("step_ms_median")
    except Exception: return None
print("| run | windows (step ms) | step ms | backward | comm_wait | comm_wait % | MB/step | state MB/step | kept MB/step "
      "| allreduce busbw GB/s | step(N)/step(1) | DDP ms | thetad/DDP |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
base = {}
for n in names:
    rs = rows(n)
    if not rs: print(f"| {n} | no metrics |"); continue
    wins = [rs[i:i + window] for i in range(0, len(rs), window)]
    last = wins[-1]
    prec, np_ = re.match(r"(\w+?)_np(\d+)", n).groups()
    step = med(last, "step_ms")
    if np_ == "1" and n == f"{prec}_np1": base[prec] = step
    d = ddp(n) if n == f"{prec}_np{np_}" else None
    series = ", ".join("%.2f" % med(w, "step_ms") for w in wins)
    print(f"| {n} | {series} | {step:.2f} | {med(last, 'backward_ms'):.2f} | "
          f"{med(last, 'comm_wait_ms'):.2f} | {100 * med(last, 'comm_wait_ms') / step:.1f} | "
          f"{med(last, 'bytes_allreduced') / 1e6:.0f} | {sum((r.get('bytes_state_moved') or 0) for r in last) / len(last) / 1e6:.1f} | "
          f"{med(last, 'bytes_kept') / 1e6:.0f} | {med(last, 'allreduce_busbw_gbs'):.1f} | "
          f"{step / base[prec] if prec in base else float('nan'):.3f} | "
          f"{'' if d is None else f'{d:.2f}'} | {'' if d is None else f'{step / d:.3f}'} |")
PY
