#!/usr/bin/env bash
# Where the time of a thetad step goes on the GPU: Nsight Systems around rank 0 of a short run
# at the reference configuration, reduced to per-kernel and per-copy summaries (CSV) and a
# short text digest. The .nsys-rep itself stays on the machine unless PROFILE_KEEP_REP=1.
#
#   bash bench/gpu/profile.sh [JOB.yaml] [--set k=v ...]      # environment: docs/gpu.md
#
# Environment: BENCH_BUILD_DIR (thetad is $BENCH_BUILD_DIR/daemon/thetad; default /tmp/build),
# OUT (default /tmp/out; results in $OUT/profile), PROFILE_STEPS=30, BENCH_NP (default: GPUs).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/out}
DIR="$OUT/profile"
mkdir -p "$DIR"
THETAD=${BENCH_BUILD_DIR:-/tmp/build}/daemon/thetad
JOB=${1:-$ROOT/bench/jobs/reference.yaml}
[ $# -gt 0 ] && shift
if ! command -v nsys >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /opt/nvidia/nsight-systems/*/bin /usr/local/cuda/nsight-systems*/bin; do
    [ -x "$d/nsys" ] && PATH="$d:$PATH" && break
  done
fi
if ! command -v nsys >/dev/null 2>&1; then
  echo "profile.sh: nsys not found; skipping the profile" | tee "$DIR/summary.txt"
  exit 0
fi
[ -x "$THETAD" ] || { echo "profile.sh: $THETAD not built" >&2; exit 2; }
NP=${BENCH_NP:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
MPI_FLAGS=${BENCH_MPI_FLAGS:---oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx}
# shellcheck disable=SC2086,SC2016
timeout -k 10 240 mpirun $MPI_FLAGS -x NCCL_NVLS_ENABLE -x PATH ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} -np "$NP" \
  bash -c 'if [ "${OMPI_COMM_WORLD_RANK:-0}" = 0 ]; then
             exec nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true \
               -o "$0/rank0" "$@"
           else exec "$@"; fi' "$DIR" \
  "$THETAD" run "$JOB" --no-resume --set steps="${PROFILE_STEPS:-30}" --set log.progress_every_s=60 \
  --set metrics.path="$DIR/metrics.jsonl" "$@" > "$DIR/run.log" 2>&1
echo "profile run: rc $?" | tee "$DIR/summary.txt"
REP="$DIR/rank0.nsys-rep"
[ -f "$REP" ] || { tail -20 "$DIR/run.log"; exit 1; }
nsys stats --force-export=true --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum \
  --format csv --output "$DIR/stats" "$REP" > "$DIR/stats.log" 2>&1
# The digest: the kernels and copies that take the most GPU time over the whole run.
for f in "$DIR"/stats_cuda_gpu_kern_sum.csv "$DIR"/stats_cuda_gpu_mem_time_sum.csv "$DIR"/stats_cuda_api_sum.csv; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f") (top 15)" >> "$DIR/summary.txt"
  head -16 "$f" | cut -c1-220 >> "$DIR/summary.txt"
done
[ "${PROFILE_KEEP_REP:-0}" = 1 ] || rm -f "$REP" "$DIR"/rank0.sqlite
cat "$DIR/summary.txt"
