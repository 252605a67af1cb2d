#!/usr/bin/env bash
# Where the host's time goes in thetad's step on the GPU machine: runs the reference
# all-resident configuration (bench/jobs/reference.yaml) with a timeline under each variant and
# prints, per variant, the medians of the step's metrics, the host spans (bench/gpu/host_spans.py)
# and one step's spans in order. Needs a build (bench/gpu/run.sh makes one).
#
#   # in the environment of docs/gpu.md:
#   bash bench/gpu/host_gap.sh BUILD_DIR "default|" "no-overlap|--set optimizer.overlap=false" \
#        "fifo|NCCL_WORK_FIFO_BYTES=8388608"
#
# A variant is NAME|WORDS: WORDS are thetad arguments (--set ...) and NAME=VALUE environment
# settings for the ranks. Output under ${OUT:-/tmp/out}/host_gap/NAME/; the digest on stdout.
# Environment: GAP_STEPS=40 GAP_SKIP=10 GAP_NP=(GPUs visible) GAP_TRACE_STEP=25
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:?usage: host_gap.sh BUILD_DIR VARIANT...}
shift
THETAD="$BUILD/daemon/thetad"
[ -x "$THETAD" ] || { echo "host_gap.sh: no $THETAD" >&2; exit 2; }
OUT=${OUT:-/tmp/out}/host_gap
mkdir -p "$OUT"
STEPS=${GAP_STEPS:-40}
SKIP=${GAP_SKIP:-10}
TRACE=${GAP_TRACE_STEP:-25}
NP=${GAP_NP:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "${NP:-0}" -gt 0 ] || { echo "host_gap.sh: no GPU visible" >&2; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
MPI_FLAGS=(--oversubscribe --bind-to none --mca btl "self,vader,tcp" --mca btl_tcp_if_include lo
           --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx
           -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI_FLAGS+=(-x LD_LIBRARY_PATH)
PY=$(command -v python3 || echo /usr/bin/python3)

for variant in "$@"; do
  name=${variant%%|*}
  words=${variant#*|}
  dir="$OUT/$name"
  mkdir -p "$dir"
  args=() envs=()
  read -r -a ws <<< "$words"
  for ((i = 0; i < ${#ws[@]}; i++)); do
    w=${ws[$i]}
    if [ "$w" = --set ]; then args+=(--set "${ws[$((i + 1))]}"); i=$((i + 1))
    elif [[ $w == *=* ]]; then envs+=(-x "$w")
    else args+=("$w"); fi
  done
  timeout -k 10 150 mpirun "${MPI_FLAGS[@]}" "${envs[@]}" -np "$NP" "$THETAD" run "$ROOT/bench/jobs/reference.yaml" \
    --no-resume --set steps="$STEPS" --set comm.average=world --set log.progress_every_s=30 \
    --set metrics.path="$dir/metrics.jsonl" --set timeline.path="$dir/timeline-{rank}.json" "${args[@]}" \
    > "$dir/log.txt" 2>&1
  rc=$?
  echo "=== $name (rc $rc): $words"
  [ "$rc" -eq 0 ] || { tail -n 5 "$dir/log.txt"; continue; }
  "$PY" - "$dir/metrics.jsonl" "$SKIP" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("rank", 0) == 0][int(sys.argv[2]):]
keys = ["step_ms", "forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms", "count_exchange_ms"]
print("  metrics (rank 0, median): " + "  ".join(
    "%s %.3f" % (k, statistics.median(r.get(k, 0) for r in rows)) for k in keys))
PYEOF
  for r in $(seq 0 $((NP - 1))); do
    tl="$dir/timeline-$r.json"
    [ -f "$tl" ] || continue
    echo "  -- rank $r host spans"
    if [ "$r" -eq 0 ]; then "$PY" "$ROOT/bench/gpu/host_spans.py" "$tl" "$SKIP" --trace "$TRACE" | sed 's/^/  /'
    else "$PY" "$ROOT/bench/gpu/host_spans.py" "$tl" "$SKIP" | head -n 8 | sed 's/^/  /'; fi
  done
done
