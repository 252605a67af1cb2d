#!/usr/bin/env bash
# Steady state of thetad's step: runs each variant of a job for many steps and
# prints, per window of steps, the median step time and the phases that explain it (device-side
# forward/backward, comm_wait, CPU AdamW and the store's acquire wait), so that a run is judged
# by its last windows, not by one median of a short run. Needs a build (bench/gpu/run.sh makes one).
#
#   # in the environment of docs/gpu.md:
#   STEADY_STEPS=400 STEADY_WINDOW=50 bash bench/gpu/steady.sh BUILD_DIR bench/jobs/reference-offload.yaml \
#        "resident|--set offload.enabled=false" "offload|" "offload_T64|--set model.tasks=64"
#
# A variant is NAME|WORDS (thetad arguments). Output under ${OUT:-/tmp/out}/steady/NAME/; the
# table on stdout. Environment: STEADY_NP (GPUs visible), STEADY_CAP_S=120 per run.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:?usage: steady.sh BUILD_DIR JOB VARIANT...}
JOB=${2:?usage: steady.sh BUILD_DIR JOB VARIANT...}
shift 2
THETAD="$BUILD/daemon/thetad"
[ -x "$THETAD" ] || { echo "steady.sh: no $THETAD" >&2; exit 2; }
OUT=${OUT:-/tmp/out}/steady
STEPS=${STEADY_STEPS:-400} WINDOW=${STEADY_WINDOW:-50} CAP=${STEADY_CAP_S:-120}
NP=${STEADY_NP:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "${NP:-0}" -gt 0 ] || { echo "steady.sh: no GPU visible" >&2; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx -x NCCL_NVLS_ENABLE -x PATH -np "$NP")
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI+=(-x LD_LIBRARY_PATH)
for variant in "$@"; do
  name=${variant%%|*}; words=${variant#*|}
  mkdir -p "$OUT/$name"
  # shellcheck disable=SC2086  # WORDS are split on purpose
  timeout "$CAP" "${MPI[@]}" "$THETAD" run "$JOB" --no-resume --set steps="$STEPS" \
      --set metrics.path="$OUT/$name/metrics.jsonl" $words > "$OUT/$name/log.txt" 2>&1
  echo "$name: exit $? ($(grep -o 'final params hash: [0-9a-f]*' "$OUT/$name/log.txt" | tail -1))"
done
python3 - "$OUT" "$WINDOW" "$@" <<'PY'
import json, os, statistics, sys
out, window = sys.argv[1], int(sys.argv[2])
med = lambda rows, k: statistics.median((r.get(k) or 0) for r in rows)
print(f"| run | window (steps) | step ms | forward | backward | comm_wait | cpu_adam | acquire_wait | peak GiB |")
print("|---|---|---|---|---|---|---|---|---|")
for variant in sys.argv[3:]:
    name = variant.split("|")[0]
    p = os.path.join(out, name, "metrics.jsonl")
    rows = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    rows = sorted((r for r in rows if r.get("rank", 0) == 0), key=lambda r: r["step"])
    for i in range(0, len(rows), window):
        w = rows[i:i + window]
        print(f"| {name} | {w[0]['step']}-{w[-1]['step']} | {med(w, 'step_ms'):.2f} | {med(w, 'forward_ms'):.2f} | "
              f"{med(w, 'backward_ms'):.2f} | {med(w, 'comm_wait_ms'):.2f} | {med(w, 'cpu_adam_ms'):.2f} | "
              f"{med(w, 'acquire_wait_ms'):.2f} | {max((r.get('device_mem_peak_bytes') or 0) for r in w) / 2**30:.2f} |")
PY
