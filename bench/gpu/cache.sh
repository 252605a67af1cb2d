#!/usr/bin/env bash
# On the visible GPUs: the host store as a device cache (offload.device_cache_mb), in steady
# state, side by side in one call: the reference configuration (T = 16) all-resident, offloaded
# without a cache (every step swaps and steps θ[t] on the host), with the cache sized
# automatically (every group fits), and with a cache of 4 lines; then tiny tasks (d = 1024) at
# T = 256 and T = 1024 for 1000 steps, all-resident vs offload with the cache; and the PyTorch
# DDP peer at T = 16 for peak memory. Builds thetad first.
#
#   bash bench/gpu/cache.sh      # OUT=... (default /tmp/out); environment: docs/gpu.md
#
# Environment: CACHE_STEPS=400 (reference), CACHE_REF="resident ..." (a subset of the reference
#   variants), CACHE_TINY_STEPS=1000, CACHE_TINY_T="256 1024", CACHE_TINY_NOCACHE=1 (also offload
#   without the cache at those T), CACHE_DDP=1 (the DDP peer), BENCH_BUILD_DIR=/tmp/build,
#   CACHE_SKIP_BUILD=1.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/out}
BUILD=${BENCH_BUILD_DIR:-/tmp/build}
mkdir -p "$OUT"
if [ "${CACHE_SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTHETAD_BUILD_TESTS=ON > "$OUT/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j 16 --target thetad ${CACHE_EXTRA_TARGETS:-} > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
NP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# A line is one head (2 x 4096 x 4096 + biases, fp32) with its Adam m and v: 403 MB.
LINE_MB=385
export STEADY_CAP_S=${STEADY_CAP_S:-150}
REF_VARIANTS=("resident|--set offload.enabled=false" "offload_nocache|--set offload.device_cache_mb=0"
              "offload_cache_auto|--set offload.device_cache_mb=auto"
              "offload_cache_4|--set offload.device_cache_mb=$((4 * LINE_MB))")
# CACHE_REF="resident offload_cache_auto": only those variants
if [ -n "${CACHE_REF:-}" ]; then
  keep=(); for v in "${REF_VARIANTS[@]}"; do case " $CACHE_REF " in *" ${v%%|*} "*) keep+=("$v") ;; esac; done
  REF_VARIANTS=("${keep[@]}")
fi
STEADY_STEPS=${CACHE_STEPS:-400} STEADY_WINDOW=100 bash bench/gpu/steady.sh "$BUILD" bench/jobs/reference-offload.yaml \
  "${REF_VARIANTS[@]}" 2>&1 | tee "$OUT/reference.txt"
grep -h "device cache:" "$OUT"/steady/offload_cache_*/log.txt | sed 's/.*\] //' | sort | uniq -c | head -8
TINY=(--set model.input_dim=1024 --set model.hidden=1024 --set model.output_dim=1024)
for T in ${CACHE_TINY_T:-256 1024}; do
  OUT=$OUT/tiny_T$T STEADY_STEPS=${CACHE_TINY_STEPS:-1000} STEADY_WINDOW=250 bash bench/gpu/steady.sh "$BUILD" \
    bench/jobs/reference-offload.yaml "resident_T$T|--set offload.enabled=false --set model.tasks=$T ${TINY[*]}" \
    "offload_cache_T$T|--set model.tasks=$T ${TINY[*]}" \
    ${CACHE_TINY_NOCACHE:+"offload_nocache_T$T|--set offload.device_cache_mb=0 --set model.tasks=$T ${TINY[*]}"} \
    2>&1 | tee "$OUT/tiny_T$T.txt"
done
[ "${CACHE_DDP:-1}" = 1 ] || exit 0
PY=/opt/torch/.venv/bin/python3; [ -x "$PY" ] || PY=python3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
timeout 120 mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx -x NCCL_NVLS_ENABLE -x PATH -x LD_LIBRARY_PATH \
  -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29622 -np "$NP" "$PY" bench/peer/ddp_multitask.py --device cuda \
  --backend nccl --input-dim 4096 --hidden 4096 --output-dim 4096 --trunk-layers 8 --head-layers 2 --tasks 16 \
  --batch 256 --steps 60 --warmup 10 --lr 1e-3 --seed 1234 --init fast --average-world --precision fp32 \
  --compress-hook none --max-seconds 100 --out "$OUT/ddp_T16.json" > "$OUT/ddp_T16.log" 2>&1
"$PY" - "$OUT/ddp_T16.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("DDP T=16: step %.2f ms (median after warm-up), peak %.2f GiB" % (d.get("step_ms_median") or d.get("step_ms") or 0,
      (d.get("peak_mem_bytes") or d.get("max_memory_allocated") or 0) / 2**30))
PY
