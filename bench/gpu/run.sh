#!/usr/bin/env bash
# One command for a GPU machine: build thetad, run the GPU tests, the engine
# bandwidth benchmark, thetad (all-resident and offload) and the PyTorch DDP peer at the
# reference configuration and over a sweep of T, on all visible GPUs; then one table.
#
#   bash bench/gpu/run.sh          # from the repository root, environment: docs/gpu.md
#
# Everything (logs, metrics, JSON, summary.md) goes under ${OUT:-/tmp/out}. Environment:
#   BENCH_BUDGET_S=420     wall-clock budget from the start, build included; every command's
#                          timeout is clamped to what is left, and points that would get less
#                          than BENCH_MIN_POINT_S=30 s are skipped and listed
#   BENCH_SWEEP_T="16 64 256"  task counts of the sweep (thetad offload and DDP; 16 = reference)
#   BENCH_DDP_EXTRA_T=384  DDP-only points run when DDP did not run out of memory at the largest
#                          sweep point ("" = none)
#   BENCH_STEPS=60 BENCH_WARMUP=10   steps per run / steps left out of the medians
#   BENCH_FLOOR_STEPS=40   steps of the host-floor measurement of the offload step (store_h2d)
#   BENCH_CAP_BIG_S=240    timeout of a sweep point of thetad (offload set-up grows with T)
#   BENCH_DDP_SWEEP=0      DDP only at the reference T (its sweep does not depend on thetad)
#   BENCH_TF32=1           also the reference all-resident with TF32 matmuls, thetad and DDP (GPUs)
#   BENCH_BF16=1           also the reference in bf16: thetad resident and offload with
#                          bf16 gradients on the wire; DDP with autocast, with and without its
#                          bf16_compress_hook
#   BENCH_DRY_RUN=1        tiny model; on CPU (MPI for thetad, gloo for DDP, 2 ranks) when no GPU
#   BENCH_BUILD_DIR=/tmp/build  BENCH_SKIP_BUILD=1  BENCH_FULL_BUILD=1 (all targets, not just
#                          thetad, bench_engine_bw and the gpu-labelled tests)  BENCH_JOBS=16
#   BENCH_NP=N             ranks (default: GPUs visible; 2 on CPU)
#   BENCH_PYTHON=python3   the python with torch for DDP (default: the first of python3,
#                          /usr/bin/python3 that imports torch)
#   BENCH_MPI_FLAGS="..."  mpirun flags (default: loopback TCP + shared memory, --bind-to none)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
BUDGET=${BENCH_BUDGET_S:-420}
MIN_POINT=${BENCH_MIN_POINT_S:-30}
DRY=${BENCH_DRY_RUN:-0}
BUILD=${BENCH_BUILD_DIR:-/tmp/build}
JOBS=${BENCH_JOBS:-16}
STEPS=${BENCH_STEPS:-60}
WARMUP=${BENCH_WARMUP:-10}
SWEEP=${BENCH_SWEEP_T:-16 64 256}
RUNS="$OUT/runs.jsonl"
: > "$RUNS"

# NVLink multicast stays off in every environment, launchers' included (docs/gpu.md).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
MPI_FLAGS=${BENCH_MPI_FLAGS:---oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx}
MPI_ENV=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI_ENV+=(-x LD_LIBRARY_PATH)

log() { printf '[bench %4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# The timeout a point with this cap gets now: the cap, or what is left of the budget less 5 s.
clamp() { local rem; rem=$(left); echo $(( rem - 5 < $1 ? rem - 5 : $1 )); }

# ---- machine ------------------------------------------------------------------------------
NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$NGPU" -gt 0 ]; then
  NGPU=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
fi
if [ "$NGPU" -gt 0 ]; then
  DEVICE=cuda; DDP_BACKEND=nccl; NP=${BENCH_NP:-$NGPU}
else
  if [ "$DRY" != 1 ]; then
    echo "bench/gpu/run.sh: no GPU visible (nvidia-smi -L); for a CPU dry run set BENCH_DRY_RUN=1" >&2
    exit 2
  fi
  DEVICE=cpu; DDP_BACKEND=gloo; NP=${BENCH_NP:-2}
fi
PY=${BENCH_PYTHON:-}
if [ -z "$PY" ]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then PY=$(command -v "$p"); break; fi
  done
fi
SUMPY=$(command -v python3 || echo /usr/bin/python3)

# Model sizes: the job files' (the reference configuration) or, dry run, tiny ones.
if [ "$DRY" = 1 ]; then
  D_IN=64; D_H=64; D_OUT=32; TRUNK=2; HEAD=2; BATCH=32; REF_T=16
  STEPS=${BENCH_STEPS:-30}; WARMUP=${BENCH_WARMUP:-5}
  DIMS=(--set model.input_dim=$D_IN --set model.hidden=$D_H --set model.output_dim=$D_OUT
        --set model.trunk_layers=$TRUNK --set model.head_layers=$HEAD --set data.batch_per_rank=$BATCH)
  CAP=60; CAP_BIG=90; ENGINE_ARGS=(--total-mb 64 --iters 5 --warmup 2)
else
  D_IN=4096; D_H=4096; D_OUT=4096; TRUNK=8; HEAD=2; BATCH=256; REF_T=16
  DIMS=()
  CAP=150; CAP_BIG=${BENCH_CAP_BIG_S:-240}; ENGINE_ARGS=()
fi
SEED=1234

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (+local changes)')"
  echo "command: bash bench/gpu/run.sh (environment: docs/gpu.md)"
  echo "ranks: $NP  device: $DEVICE  dry_run: $DRY  budget_s: $BUDGET  steps: $STEPS  warmup: $WARMUP  sweep_T: $SWEEP"
  echo "cpus: $(nproc)  mem: $(free -g 2>/dev/null | awk '/Mem:/{print $2 " GiB"}')"
  [ "$NGPU" -gt 0 ] && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  [ "$NGPU" -gt 1 ] && nvidia-smi topo -m 2>/dev/null | head -n $((NGPU + 2))
  [ -n "$PY" ] && "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")' 2>/dev/null
  echo "mpirun: $(mpirun --version 2>/dev/null | head -1)"
} > "$OUT/env.txt" 2>&1
log "$(grep -E '^(ranks|commit)' "$OUT/env.txt" | tr '\n' ' ')"
[ -n "$PY" ] || log "WARNING: no python3 with torch found: the DDP peer cannot run"

# record NAME KIND STATUS RC WALL TIMEOUT EXTRA_JSON  -> one line of $OUT/runs.jsonl
record() {
  printf '{"name": "%s", "kind": "%s", "status": "%s", "rc": %s, "wall_s": %s, "timeout_s": %s, "dir": "%s"%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$1" "${7:+, $7}" >> "$RUNS"
}

# point NAME KIND CAP_S EXTRA_JSON -- command...
# Runs the command in its own process group under `timeout` (clamped to the budget), with its
# output in $OUT/NAME/log.txt and, on GPUs, a memory sampler in $OUT/NAME/smi.csv.
point() {
  local name=$1 kind=$2 cap=$3 extra=$4; shift 5
  local dir="$OUT/$name" rem t rc status t0 wall smi_pid=""
  mkdir -p "$dir"
  rem=$(left)
  t=$(clamp "$cap")
  if [ "$t" -lt "$MIN_POINT" ]; then
    log "SKIP $name: ${rem}s of the budget left"
    record "$name" "$kind" skipped null 0 0 "$extra"
    SKIPPED+=("$name")
    return 0
  fi
  printf '%q ' "$@" > "$dir/cmd.txt"; echo >> "$dir/cmd.txt"
  log "RUN  $name (timeout ${t}s): $*"
  if [ "$NGPU" -gt 0 ]; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 > "$dir/smi.csv" 2>/dev/null &
    smi_pid=$!
  fi
  t0=$(date +%s.%N)
  setsid timeout -k 10 "$t" "$@" > "$dir/log.txt" 2>&1 < /dev/null &
  local pid=$!
  wait "$pid"; rc=$?
  kill -KILL -- "-$pid" 2>/dev/null  # leftovers of this point's process group, if any
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [ -n "$smi_pid" ]; then kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; fi
  case $rc in
    0) status=ok ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  log "     $name: $status (rc $rc, ${wall}s); last line: $(tail -n 1 "$dir/log.txt" | cut -c1-160)"
  record "$name" "$kind" "$status" "$rc" "$wall" "$t" "$extra"
  return 0
}
SKIPPED=()

# ---- build ----------------------------------------------------------------------------------
THETAD="$BUILD/daemon/thetad"
ENGINE_BW="$BUILD/bench/comm/bench_engine_bw"
STORE_H2D="$BUILD/bench/offload/bench_store_h2d"
build() {  # build TIMEOUT_S
  local bt=$1
  mkdir -p "$OUT/build"
  timeout -k 10 "$bt" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTHETAD_BUILD_TESTS=ON \
        > "$OUT/build/configure.log" 2>&1 || return 1
  local targets="all"
  if [ "${BENCH_FULL_BUILD:-0}" != 1 ]; then
    # thetad, the benchmark and the executables of the gpu-labelled tests (their target names).
    local known gpu_exes t
    known=$(cmake --build "$BUILD" --target help 2>/dev/null | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p; s/^\([^ :]*\): phony$/\1/p')
    gpu_exes=$(ctest --test-dir "$BUILD" -L gpu -N --show-only=json-v1 2>/dev/null | "$SUMPY" -c '
import json, os, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
for t in d.get("tests", []):
    for a in t.get("command", []) or []:
        print(os.path.basename(a))')
    targets="thetad bench_engine_bw bench_store_h2d"
    for t in $gpu_exes; do
      if echo "$known" | grep -qx -- "$t" && ! echo " $targets " | grep -q " $t "; then targets="$targets $t"; fi
    done
  fi
  echo "$targets" > "$OUT/build/targets.txt"
  local rem; rem=$(left)
  # shellcheck disable=SC2046
  timeout -k 10 "$(( rem > 60 ? rem - 30 : 30 ))" cmake --build "$BUILD" -j "$JOBS" \
        $( [ "$targets" = all ] || printf -- '--target %s ' $targets ) > "$OUT/build/build.log" 2>&1
}
if [ "${BENCH_SKIP_BUILD:-0}" = 1 ]; then
  log "build skipped (BENCH_SKIP_BUILD=1), using $BUILD"
  record build build skipped null 0 0
else
  log "build into $BUILD (-j $JOBS)"
  t0=$(date +%s)
  if build 300; then
    record build build ok 0 $(( $(date +%s) - t0 )) 0 "\"targets\": \"$(cat "$OUT/build/targets.txt")\""
    log "build ok: $(cat "$OUT/build/targets.txt")"
  else
    record build build failed 1 $(( $(date +%s) - t0 )) 0
    log "BUILD FAILED; last lines:"
    tail -n 30 "$OUT/build/configure.log" "$OUT/build/build.log" 2>/dev/null
  fi
fi

# ---- GPU tests ---------------------------------------------------------------------------------
if [ "$NGPU" -gt 0 ] && [ -x "$THETAD" ]; then
  point ctest_gpu ctest 240 "" -- ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 120
  grep -E 'tests passed|tests failed' "$OUT/ctest_gpu/log.txt" | tail -1 | sed 's/^/           /'
else
  record ctest_gpu ctest skipped null 0 0 '"reason": "no GPU or no build"'
fi

# ---- engine bandwidth ----------------------------------------------------------------------------
if [ -x "$ENGINE_BW" ]; then
  point engine_bw engine_bw 90 "" -- mpirun $MPI_FLAGS "${MPI_ENV[@]}" -np "$NP" "$ENGINE_BW" \
        "${ENGINE_ARGS[@]}" --json "$OUT/engine_bw/result.json"
  grep -E '^(engine|raw|comm|RESULT|bench_engine_bw: SKIP)' "$OUT/engine_bw/log.txt" | sed 's/^/           /'
else
  record engine_bw engine_bw skipped null 0 0 '"reason": "not built"'
fi

# ---- the store's host->device bandwidth ---------------------------------------------------
if [ -x "$STORE_H2D" ] && [ "$NGPU" -gt 0 ]; then
  # --floor-*: the host's floor of the reference offload step (its heads are 128 MiB, T = 16).
  point store_h2d store_h2d 150 "" -- mpirun $MPI_FLAGS "${MPI_ENV[@]}" -np "$NP" "$STORE_H2D" \
        --floor-steps "${BENCH_FLOOR_STEPS:-40}" --floor-groups "$REF_T" --group-mb 128 \
        --json "$OUT/store_h2d/result.json"
  grep -E '^(rank|RESULT)' "$OUT/store_h2d/log.txt" | sed 's/^/           /'
else
  record store_h2d store_h2d skipped null 0 0 '"reason": "no GPU or not built"'
fi

# ---- thetad and DDP --------------------------------------------------------------------------
# thetad_point NAME JOB T MODE PEER AVERAGE CAP [PRECISION [GRAD_DTYPE]]
thetad_point() {
  local name=$1 job=$2 T=$3 mode=$4 peer=$5 avg=$6 cap=$7 prec=${8:-fp32} grad=${9:-fp32}
  local meta="\"T\": $T, \"mode\": \"$mode\", \"peer\": \"$peer\", \"average\": \"$avg\", \"precision\": \"$prec\", \"grad_dtype\": \"$grad\", \"warmup\": $WARMUP, \"steps\": $STEPS, \"np\": $NP, \"device\": \"$DEVICE\", \"dims\": [$D_IN, $D_H, $D_OUT, $TRUNK, $HEAD, $BATCH]"
  if [ ! -x "$THETAD" ]; then record "$name" thetad skipped null 0 0 "$meta, \"reason\": \"not built\""; return; fi
  point "$name" thetad "$cap" "$meta" -- mpirun $MPI_FLAGS "${MPI_ENV[@]}" -np "$NP" "$THETAD" run "$job" --no-resume \
        --set steps="$STEPS" --set model.tasks="$T" --set comm.average="$avg" --set precision="$prec" \
        --set comm.grad_dtype="$grad" --set metrics.path="$OUT/$name/metrics.jsonl" --set log.progress_every_s=5 "${DIMS[@]}"
}
# ddp_point NAME T INIT STEPS CAP [PRECISION [COMPRESS_HOOK]]
PORT=29511
ddp_point() {
  local name=$1 T=$2 init=$3 steps=$4 cap=$5 prec=${6:-fp32} hook=${7:-none}
  local meta="\"T\": $T, \"init\": \"$init\", \"average\": \"world\", \"precision\": \"$prec\", \"compress_hook\": \"$hook\", \"warmup\": $WARMUP, \"steps\": $steps, \"np\": $NP, \"device\": \"$DEVICE\", \"dims\": [$D_IN, $D_H, $D_OUT, $TRUNK, $HEAD, $BATCH]"
  PORT=$((PORT + 1))
  if [ -z "$PY" ]; then record "$name" ddp skipped null 0 0 "$meta, \"reason\": \"no python with torch\""; return; fi
  local t; t=$(clamp "$cap")
  point "$name" ddp "$cap" "$meta" -- mpirun $MPI_FLAGS "${MPI_ENV[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$PORT \
        -np "$NP" "$PY" "$ROOT/bench/peer/ddp_multitask.py" --device "$DEVICE" --backend "$DDP_BACKEND" \
        --input-dim $D_IN --hidden $D_H --output-dim $D_OUT --trunk-layers $TRUNK --head-layers $HEAD \
        --tasks "$T" --batch $BATCH --steps "$steps" --warmup "$WARMUP" --lr 1e-3 --seed $SEED \
        --init "$init" --average-world --precision "$prec" --compress-hook "$hook" --max-seconds $(( t > 40 ? t - 20 : t / 2 )) --out "$OUT/$name/result.json"
}

# The reference (both thetad runs with average: world, DDP's semantics, so that the loss curves
# must agree; the divisor costs nothing), then the sweep.
thetad_point thetad_T${REF_T}_resident bench/jobs/reference.yaml $REF_T resident ddp_T${REF_T} world $CAP
ddp_point ddp_T${REF_T} $REF_T exact "$STEPS" $CAP
thetad_point thetad_T${REF_T}_offload bench/jobs/reference-offload.yaml $REF_T offload ddp_T${REF_T} world $CAP
# TF32 matmuls (precision: tf32; DDP: torch.backends.cuda.matmul.allow_tf32), same comparison.
if [ "${BENCH_TF32:-1}" = 1 ] && [ "$DEVICE" = cuda ]; then
  thetad_point thetad_T${REF_T}_resident_tf32 bench/jobs/reference.yaml $REF_T resident ddp_T${REF_T}_tf32 world $CAP tf32
  ddp_point ddp_T${REF_T}_tf32 $REF_T exact "$STEPS" $CAP tf32
fi
# bf16 (precision: bf16, comm.grad_dtype: bf16; DDP: autocast, plain and with its compress hook).
if [ "${BENCH_BF16:-1}" = 1 ] && [ "$DEVICE" = cuda ]; then
  thetad_point thetad_T${REF_T}_resident_bf16 bench/jobs/reference.yaml $REF_T resident ddp_T${REF_T}_bf16 world $CAP bf16 bf16
  thetad_point thetad_T${REF_T}_offload_bf16 bench/jobs/reference-offload.yaml $REF_T offload ddp_T${REF_T}_bf16 world $CAP bf16 bf16
  ddp_point ddp_T${REF_T}_bf16 $REF_T exact "$STEPS" $CAP bf16
  ddp_point ddp_T${REF_T}_bf16_compress $REF_T exact "$STEPS" $CAP bf16 bf16
fi
# The sweep: the DDP points first (cheap: device-side init, seconds of steps), then thetad's,
# largest T first (T = 256 is the slowest to set up).
for T in $(for x in $SWEEP; do echo "$x"; done | sort -n -u); do
  [ "$T" = "$REF_T" ] && continue
  [ "${BENCH_DDP_SWEEP:-1}" = 0 ] && continue
  # DDP's Adam state grows as heads get their first gradient: run until every head had one.
  ddp_steps=$(( (T + NP - 1) / NP + WARMUP + 5 )); [ "$ddp_steps" -lt "$STEPS" ] && ddp_steps=$STEPS
  ddp_point ddp_T$T "$T" fast "$ddp_steps" $CAP
done
# If DDP survived the largest sweep point, look further for where it runs out of device memory
# (DDP only; BENCH_DDP_EXTRA_T="" turns it off).
last_T=$(for T in $SWEEP; do echo "$T"; done | sort -n | tail -1)
if [ "${BENCH_DDP_SWEEP:-1}" != 0 ] && [ -n "$last_T" ] && [ -n "${BENCH_DDP_EXTRA_T-384}" ] && [ -f "$OUT/ddp_T$last_T/result.json" ] && \
   ! grep -qs '"oom": true' "$OUT/ddp_T$last_T"/result.json*; then
  for T in ${BENCH_DDP_EXTRA_T-384}; do
    ddp_steps=$(( (T + NP - 1) / NP + WARMUP + 5 )); [ "$ddp_steps" -lt "$STEPS" ] && ddp_steps=$STEPS
    ddp_point ddp_T$T "$T" fast "$ddp_steps" $CAP
  done
fi

for T in $(for x in $SWEEP; do echo "$x"; done | sort -n -r -u); do
  [ "$T" = "$REF_T" ] && continue
  thetad_point thetad_T${T}_offload bench/jobs/reference-offload.yaml "$T" offload ddp_T$T world $CAP_BIG
done

# ---- summary ------------------------------------------------------------------------------------
[ ${#SKIPPED[@]} -gt 0 ] && log "skipped for the budget: ${SKIPPED[*]}"
log "done in $(( $(date +%s) - START ))s; results in $OUT"
"$SUMPY" "$ROOT/bench/gpu/summarize.py" "$OUT"
