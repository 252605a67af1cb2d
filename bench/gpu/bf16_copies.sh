#!/usr/bin/env bash
# On the visible GPUs: offloaded θ[t] sent to the device as bf16
# (offload.h2d_dtype) against fp32 copies, in a bf16 job. Two measurements, same call:
#  1. the host floor of the offload step (bench_store_h2d --floor-steps: the store's whole
#     per-step work with no model compute), fp32 copies then bf16 copies;
#  2. the reference offload job in bf16 (bench/jobs/reference-offload.yaml), steady state per
#     window of steps (bench/gpu/steady.sh): all-resident, offload without the device cache with
#     fp32 and with bf16 copies (the path the copies take), offload with the cache (auto).
# Needs a build (bench/gpu/run.sh makes one, or cmake into BUILD_DIR):
#
#   bash bench/gpu/bf16_copies.sh /tmp/build     # OUT=... (default /tmp/out); environment: docs/gpu.md
#
# Environment: BF16_STEPS=300 BF16_WINDOW=50 (steady windows), BF16_FLOOR_STEPS=40.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:?usage: bf16_copies.sh BUILD_DIR}
OUT=${OUT:-/tmp/out}
NP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "${NP:-0}" -gt 0 ] || { echo "bf16_copies.sh: no GPU visible" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
mkdir -p "$OUT/floor"
for copies in fp32 bf16; do
  flag=(); [ "$copies" = bf16 ] && flag=(--bf16-copies)
  mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
      --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx -np "$NP" \
      "$BUILD/bench/offload/bench_store_h2d" --groups 8 --group-mb 128 --floor-steps "${BF16_FLOOR_STEPS:-40}" \
      --floor-groups 16 "${flag[@]}" > "$OUT/floor/$copies.txt" 2>&1
  echo "floor $copies: exit $? $(grep 'RESULT host floor' "$OUT/floor/$copies.txt")"
done
STEADY_STEPS=${BF16_STEPS:-300} STEADY_WINDOW=${BF16_WINDOW:-50} OUT=$OUT \
  bash "$ROOT/bench/gpu/steady.sh" "$BUILD" "$ROOT/bench/jobs/reference-offload.yaml" \
  "resident_bf16|--set precision=bf16 --set offload.enabled=false" \
  "nocache_fp32_copies|--set precision=bf16 --set offload.device_cache_mb=0 --set offload.h2d_dtype=fp32" \
  "nocache_bf16_copies|--set precision=bf16 --set offload.device_cache_mb=0 --set offload.h2d_dtype=bf16" \
  "cache_bf16|--set precision=bf16"
# H2D bytes per step of the two no-cache runs (exactly half with bf16 copies).
python3 - "$OUT/steady" <<'PY'
import json, os, statistics, sys
for name in ("nocache_fp32_copies", "nocache_bf16_copies"):
    p = os.path.join(sys.argv[1], name, "metrics.jsonl")
    rows = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    rows = [r for r in rows if r.get("rank", 0) == 0 and r["step"] >= 10]
    if rows:
        print(f"{name}: h2d MB/step median {statistics.median(r['h2d_bytes'] for r in rows) / 1e6:.1f}, "
              f"d2h MB/step {statistics.median(r['d2h_bytes'] for r in rows) / 1e6:.1f}")
PY
