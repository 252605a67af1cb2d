#!/usr/bin/env bash
# On a GPU machine: the trunk Θ streamed from the host (offload.shared: stream)
# against all-resident and against PyTorch FSDP2 with CPU offload (bench/peer/fsdp2_offload.py);
# activation offload against FSDP2 with save_on_cpu; and a trunk too large for the device, which
# all-resident cannot hold and the streamed trunk trains. Needs a build (bench/gpu/run.sh makes one).
#
#   bash bench/gpu/stream.sh /tmp/build      # environment: docs/gpu.md
#
# Output under ${OUT:-/tmp/out}/stream/; a table on stdout (median step_ms over the steps after
# STREAM_WARMUP=5). STREAM_BUDGET_S=480 bounds the whole script (later points get what is left);
# STREAM_POINTS="speed act size" picks the sections; STREAM_STEPS=30 the speed runs' steps; STREAM_DEVICE_LAYERS="2 4" the
# offload.shared_device_layers points of the speed section; STREAM_BIG_LAYERS=84 the size trunk,
# STREAM_BIG_DEVICE_LAYERS=40 the device layers of point size_dev; points threads and heavy (below)
# are not in the default points either.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:?usage: stream.sh BUILD_DIR}
THETAD=$BUILD/daemon/thetad
[ -x "$THETAD" ] || { echo "stream.sh: no $THETAD" >&2; exit 2; }
OUT=${OUT:-/tmp/out}/stream
mkdir -p "$OUT"
START=$(date +%s) BUDGET=${STREAM_BUDGET_S:-480} WARM=${STREAM_WARMUP:-5}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx -x NCCL_NVLS_ENABLE -x PATH -np 1)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI+=(-x LD_LIBRARY_PATH)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
cap() { local l; l=$(left); echo $(( l - 5 < $1 ? l - 5 : $1 )); }
thetad() {  # NAME CAP JOB ARGS...
  local name=$1 c; c=$(cap "$2"); shift 2
  [ "$c" -gt 10 ] || { echo "$name: skipped (budget)"; return; }
  mkdir -p "$OUT/$name"
  timeout "$c" "${MPI[@]}" "$THETAD" run "$@" --no-resume --set metrics.path="$OUT/$name/metrics.jsonl" \
      > "$OUT/$name/log.txt" 2>&1
  echo "$name: exit $? $(grep -o 'final params hash: [0-9a-f]*' "$OUT/$name/log.txt" | tail -1)$(grep -m1 -io 'out of memory[^.]*' "$OUT/$name/log.txt" | head -c 120)"
}
fsdp() {  # NAME CAP ARGS...   (STREAM_FSDP=0: the peers are skipped)
  local name=$1 c; c=$(cap "$2"); shift 2
  [ "${STREAM_FSDP:-1}" = 1 ] || { echo "$name: skipped (STREAM_FSDP=0)"; return; }
  [ "$c" -gt 10 ] || { echo "$name: skipped (budget)"; return; }
  mkdir -p "$OUT/$name"
  timeout "$c" "${MPI[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29600 + RANDOM % 300)) python3 \
      "$ROOT/bench/peer/fsdp2_offload.py" --warmup "$WARM" --out "$OUT/$name/result.json" "$@" > "$OUT/$name/log.txt" 2>&1
  echo "$name: exit $? $(tail -1 "$OUT/$name/log.txt" | head -c 300)"
}
POINTS=" ${STREAM_POINTS:-speed act size} "
point() { [[ $POINTS == *" $1 "* ]]; }
# The reference trunk (8 layers of 4096) with one head, batch 1024: all-resident, streamed, FSDP2.
REF=(bench/jobs/reference.yaml --set model.tasks=1 --set data.batch_per_rank=1024 --set steps="${STREAM_STEPS:-30}")
if point speed; then
  thetad ref_resident 90 "${REF[@]}"
  thetad ref_stream_k1 120 "${REF[@]}" --set offload.shared=stream
  thetad ref_stream_k3 120 "${REF[@]}" --set offload.shared=stream --set offload.shared_prefetch_layers=3
  # The lowest layers kept on the device with their Adam state, the rest streamed.
  for n in ${STREAM_DEVICE_LAYERS:-2 4}; do
    thetad "ref_stream_dev$n" 120 "${REF[@]}" --set offload.shared=stream --set offload.shared_device_layers="$n"
  done
  thetad ref_resident_again 90 "${REF[@]}"  # the machine's drift over the section
  fsdp fsdp2_cpu_offload 120 --batch 1024 --steps 10 --offload cpu
  fsdp fsdp2_device 60 --batch 1024 --steps 20 --offload none
fi
# Activations: 8 layers of 4096 over 8192 rows (saved tensors 256 MiB a layer).
if point act; then
  thetad act_off 60 bench/jobs/activation_offload.yaml --set offload.activations=false
  thetad act_on 60 bench/jobs/activation_offload.yaml --set offload.activations=true
  ACT=(--input-dim 1024 --hidden 4096 --trunk-layers 8 --head-layers 1 --output-dim 1 --batch 8192 --steps 20 --offload none)
  fsdp fsdp2_act_device 60 "${ACT[@]}" --activations device
  fsdp fsdp2_act_save_on_cpu 60 "${ACT[@]}" --activations save_on_cpu
fi
# A trunk the device cannot hold all-resident: 84 layers of 8192 (5.6 B parameters; with
# gradients and AdamW moments 90 GB, more than an H100's 80 GB; 76 layers still fit, at 98%).
BIG=(bench/jobs/reference.yaml --set model.tasks=1 --set model.input_dim=8192 --set model.hidden=8192
     --set model.trunk_layers="${STREAM_BIG_LAYERS:-84}" --set model.head_layers=1 --set model.output_dim=8 --set data.batch_per_rank=256 --set steps=6)
if point size; then
  thetad big_resident 120 "${BIG[@]}"
  thetad big_stream 400 "${BIG[@]}" --set offload.shared=stream
fi
# The same with its lowest STREAM_BIG_DEVICE_LAYERS layers on the device (point size_dev).
if point size_dev; then
  thetad big_stream_dev 400 "${BIG[@]}" --set offload.shared=stream \
    --set offload.shared_device_layers="${STREAM_BIG_DEVICE_LAYERS:-40}"
fi
# The size trunk's CPU AdamW rate against its thread count (point threads): if the optimizer's
# threads contended for cores with the threads that feed the GPU, fewer would be faster per byte.
# STREAM_THREAD_LAYERS=40 layers of 8192, offload.cpu_threads in STREAM_THREADS="15 12 8", 10 steps.
if point threads; then
  for th in ${STREAM_THREADS:-15 12 8}; do
    thetad "big${STREAM_THREAD_LAYERS:-40}_stream_t$th" 200 "${BIG[@]}" --set model.trunk_layers="${STREAM_THREAD_LAYERS:-40}" \
      --set steps=10 --set offload.shared=stream --set offload.cpu_threads="$th"
  done
fi
# Point split: the optimizer split between the host's CPU AdamW and the device's, on
# trunks of several widths and depths (STREAM_SPLIT_SHAPES="6144x12 4096x24 8192x8", WIDTHxLAYERS,
# batch 1024, activations offloaded), every layer streamed: no split (today's), the balanced split
# (auto), every layer split, the device layers of shared_device_layers: auto alone and with the
# split, all-resident, and FSDP2 with CPU offload on the first shape (STREAM_SPLIT_RUNS="none auto"
# makes those runs only; STREAM_SPLIT_BATCH=1024 the rows per step).
if point split; then
  first=1
  runs=" ${STREAM_SPLIT_RUNS:-resident none auto all devauto devauto_auto fsdp} "  # a subset: the runs to make
  run() { [[ "$runs" == *" $1 "* ]]; }
  for shape in ${STREAM_SPLIT_SHAPES:-6144x12 4096x24 8192x8}; do
    w=${shape%x*} n=${shape#*x}
    S=("${REF[@]}" --set model.input_dim="$w" --set model.hidden="$w" --set model.trunk_layers="$n"
       --set offload.activations=true --set steps="${STREAM_SPLIT_STEPS:-40}"
       --set data.batch_per_rank="${STREAM_SPLIT_BATCH:-1024}")
    run resident && thetad "split_${shape}_resident" 90 "${S[@]}"
    run none && thetad "split_${shape}_none" 120 "${S[@]}" --set offload.shared=stream --set offload.shared_split_layers=0
    run auto && thetad "split_${shape}_auto" 120 "${S[@]}" --set offload.shared=stream --set offload.shared_split_layers=auto
    run all && thetad "split_${shape}_all" 120 "${S[@]}" --set offload.shared=stream --set offload.shared_split_layers="$n"
    run devauto && thetad "split_${shape}_devauto" 120 "${S[@]}" --set offload.shared=stream \
      --set offload.shared_device_layers=auto --set offload.shared_split_layers=0
    run devauto_auto && thetad "split_${shape}_devauto_auto" 120 "${S[@]}" --set offload.shared=stream \
      --set offload.shared_device_layers=auto
    if [ "$first" = 1 ] && run fsdp; then
      fsdp "split_${shape}_fsdp2_cpu_offload" 150 --input-dim "$w" --hidden "$w" --trunk-layers "$n" --batch 1024 \
        --steps 8 --offload cpu --activations save_on_cpu
    fi
    first=0
  done
fi
# The host-bandwidth bound of the reference trunk's streamed step tested where it predicts the
# opposite (point heavy): at batch 4096 compute (about 4x batch 1024's) exceeds the streamed
# step's host bound, so the streamed step should equal the all-resident one.
if point heavy; then
  thetad heavy_resident 90 "${REF[@]}" --set data.batch_per_rank=4096
  thetad heavy_stream_k1 120 "${REF[@]}" --set data.batch_per_rank=4096 --set offload.shared=stream
fi
python3 - "$OUT" "$WARM" <<'PY'
import json, os, statistics, sys
out, warm = sys.argv[1], int(sys.argv[2])
print("| run | steps | step ms (median after warm-up) | peak device GiB | Θ H2D GB/step | Θ D2H GB/step | Θ slots GiB | Θ CPU AdamW ms | act device peak GiB |")
print("|---|---|---|---|---|---|---|---|---|")
for name in sorted(os.listdir(out)):
    d = os.path.join(out, name)
    m, r = os.path.join(d, "metrics.jsonl"), os.path.join(d, "result.json")
    if os.path.exists(m):
        rows = [json.loads(l) for l in open(m)]
        t = [x for x in rows if x["step"] >= min(warm, max(0, len(rows) - 2))] or rows
        med = lambda k: statistics.median((x.get(k) or 0) for x in t)
        print(f"| {name} | {len(rows)} | {med('step_ms'):.1f} | {max((x.get('device_mem_peak_bytes') or 0) for x in rows) / 2**30:.2f} | "
              f"{med('theta_h2d_bytes') / 1e9:.2f} | {med('theta_d2h_bytes') / 1e9:.2f} | {med('theta_device_slot_bytes') / 2**30:.2f} | "
              f"{med('theta_cpu_adam_ms'):.1f} | {med('act_device_peak_bytes') / 2**30:.2f} |")
    elif os.path.exists(r):
        j = json.load(open(r))
        sm = j.get("step_ms_median")
        print(f"| {name} (FSDP2) | {j.get('steps_done')} | {sm if sm is None else round(sm, 1)} | "
              f"{(j.get('peak_mem_bytes') or 0) / 2**30:.2f} | | | | | {'ERROR ' + str(j.get('error'))[:80] if j.get('error') else ''} |")
    else:
        print(f"| {name} | failed: {open(os.path.join(d, 'log.txt')).read()[-200:]!r} | | | | | | | |")
PY
