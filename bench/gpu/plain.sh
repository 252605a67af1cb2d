#!/usr/bin/env bash
# One GPU: thetad all-resident (or, offload=1, with its θ[t] host store;
# `mpirun -np 1 thetad run JOB`, the job YAML generated per shape) next to the plain PyTorch loop
# (bench/peer/plain_loop.py: eager, or compiled for a llama shape's compiled peer; fused AdamW,
# zero_grad(set_to_none=True)) on the same model, data and steps, for several shapes; then
# one table (bench/gpu/plain_table.py): step ms (median of 20-step window means after warm-up),
# peak device GiB (thetad's device_mem_peak_bytes, the peer's max_memory_allocated), ratios.
#
#   bash bench/gpu/plain.sh /tmp/build      # thetad built in /tmp/build; environment: docs/gpu.md
#
# Results: ${OUT:-/tmp/out}/plain/<shape>/{job.yaml,thetad/,peer/}, summary.md, summary.json (a llama
# shape's further peers in peer_<name>/, one table row per peer).
# Environment:
#   PLAIN_SHAPES="NAME NAME:key=value,key=value ..."  shapes to run (default: all built-in, in the
#       order below); NAME:k=v,... overrides keys of a built-in shape, or defines a new one from
#       the multitask reference (keys: see the SHAPES table below)
#   PLAIN_STEPS=N       steps of every shape (default: each shape's own)
#   PLAIN_BUDGET_S=330  runs that would start after this many seconds are skipped and listed
#   PLAIN_CAP_S=150     timeout of one run    PLAIN_PYTHON=python3    PLAIN_TIMING=cuda-events|host
#   PLAIN_DEVICE=cpu    run without a GPU (plumbing only: tiny shapes, no memory figures)
#   PLAIN_LLAMA_PEERS="peft compiled"  the llama shapes' peers, each run after the shape's one
#       thetad run (the first in peer/, the others in peer_<name>/); default: the shape's `peer`
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
BUILD=${1:-${BENCH_BUILD_DIR:-}}
[ -n "$BUILD" ] || { echo "usage: bash bench/gpu/plain.sh BUILD_DIR (thetad in BUILD_DIR/daemon/thetad)" >&2; exit 2; }
THETAD=$(cd "$BUILD" 2>/dev/null && pwd)/daemon/thetad
[ -x "$THETAD" ] || { echo "bench/gpu/plain.sh: $BUILD/daemon/thetad not built" >&2; exit 2; }
OUT=${OUT:-/tmp/out}/plain
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${PLAIN_PYTHON:-python3}
DEVICE=${PLAIN_DEVICE:-cuda}
if [ "$DEVICE" = cuda ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "bench/gpu/plain.sh: no GPU visible (PLAIN_DEVICE=cpu runs the plumbing on the CPU)" >&2; exit 2
fi
BUDGET=${PLAIN_BUDGET_S:-330} CAP=${PLAIN_CAP_S:-150} TIMING=${PLAIN_TIMING:-cuda-events}
[ "$DEVICE" = cpu ] && TIMING=host
START=$(date +%s)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
# shellcheck disable=SC2054  # commas inside --mca values
MPI=(mpirun -np 1 --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx -x NCCL_NVLS_ENABLE -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI+=(-x LD_LIBRARY_PATH)

# Built-in shapes. mlp: input = hidden = output width, trunk/head layers, tasks (one per step,
# round_robin), batch rows, init of the peer (exact: thetad's values, so the losses agree; fast:
# the same distribution drawn on the GPU, for the large ones). lora: the transformer of
# bench/jobs/lora-transformer.yaml (8 layers here), 2 adapters per step, frozen base. llama: the
# Llama architecture (model.arch: llama) against the peer the key `peer` names: peft, Hugging Face
# transformers + peft (bench/peer/peft_llama.py), or compiled, the same Llama written by hand with
# SDPA and torch.compile, the step's tasks in one base pass with batched adapter GEMMs
# (compiled_split: a pass per task) (bench/peer/compiled_llama.py: its step 0 compiles, within
# PLAIN_CAP_S); not in the default order (bench/gpu/llama_peft.sh runs them). Steps:
# every task is used at least 3 times; the first `warmup` steps are left out of the windows.
declare -A SHAPES=(
  [mlp_w1024_t24_fp32]="kind=mlp hidden=1024 trunk=8 head=2 tasks=24 batch=256 precision=fp32 init=exact steps=130"
  [mlp_w4096_t24_fp32]="kind=mlp hidden=4096 trunk=8 head=2 tasks=24 batch=256 precision=fp32 init=exact steps=130"
  [mlp_w4096_t24_bf16]="kind=mlp hidden=4096 trunk=8 head=2 tasks=24 batch=256 precision=bf16 init=exact steps=130"
  [mlp_w8192_t12_bf16]="kind=mlp hidden=8192 trunk=4 head=2 tasks=12 batch=256 precision=bf16 init=fast steps=110"
  [mlp_d1024_t1024_fp32]="kind=mlp hidden=1024 trunk=4 head=2 tasks=1024 batch=256 precision=fp32 init=fast steps=3090"
  [llama_d2048_l16_t64_bf16]="kind=llama layers=16 d_model=2048 heads=16 kv_heads=4 d_ff=5632 vocab=32000 seq_len=512 tasks=64 rank=16 batch=8 tpr=2 frozen=1 precision=bf16 targets=q,k,v,o,gate,up,down steps=140"
  [llama_d2048_l16_t64_bf16_offload]="kind=llama layers=16 d_model=2048 heads=16 kv_heads=4 d_ff=5632 vocab=32000 seq_len=512 tasks=64 rank=16 batch=8 tpr=2 frozen=1 precision=bf16 targets=q,k,v,o,gate,up,down steps=140 offload=1"
  [lora_t48_bf16]="kind=lora layers=8 d_model=2048 heads=16 d_ff=8192 vocab=32000 seq_len=512 tasks=48 rank=16 batch=8 tpr=2 frozen=1 precision=bf16 steps=110"
  [lora_t48_fp32]="kind=lora layers=8 d_model=2048 heads=16 d_ff=8192 vocab=32000 seq_len=512 tasks=48 rank=16 batch=8 tpr=2 frozen=1 precision=fp32 steps=110"
  [llama_1b_t8_s2048_bf16]="kind=llama layers=22 d_model=2048 heads=32 kv_heads=4 d_ff=5632 vocab=32000 seq_len=2048 tasks=64 rank=16 batch=8 tpr=8 frozen=1 precision=bf16 targets=q,k,v,o,gate,up,down steps=40 warmup=10 window=10"
  [lora_d1536_t48_bf16]="kind=lora layers=12 d_model=1536 heads=12 d_ff=6144 vocab=16000 seq_len=384 tasks=48 rank=8 batch=6 tpr=2 frozen=1 precision=bf16 targets=q,v steps=200 window=25"
  [lora_t48_fp32_act]="kind=lora layers=8 d_model=2048 heads=16 d_ff=8192 vocab=32000 seq_len=512 tasks=48 rank=16 batch=8 tpr=2 frozen=1 precision=fp32 steps=110 act=1"
)
ORDER="mlp_w1024_t24_fp32 mlp_w4096_t24_fp32 mlp_w4096_t24_bf16 mlp_w8192_t12_bf16 lora_t48_bf16 lora_t48_fp32 mlp_d1024_t1024_fp32"
DEFAULTS="kind=mlp hidden=4096 trunk=8 head=2 tasks=16 batch=256 precision=fp32 init=exact steps=130 warmup=10 window=20
          layers=8 d_model=2048 heads=16 kv_heads=0 d_ff=8192 vocab=32000 seq_len=512 rank=16 tpr=2 frozen=1
          targets=q,k,v,o offload=0 cache=auto act=0 overlap=true backward=auto peer=peft"
CPU_DIMS="hidden=32 trunk=2 tasks=3 steps=50 warmup=5 window=5 layers=1 d_model=32 heads=2 kv_heads=1 d_ff=64 vocab=64 seq_len=16 rank=4 batch=8 init=exact"
LLAMA_PEERS="peft compiled compiled_split"  # `peer`: plain_loop.py --model peft-llama, compiled-llama (fused, or split)

log() { printf '[plain %4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }
# spec KEY: the value of KEY in the current shape's SPEC (word-split on purpose: k=v words).
# shellcheck disable=SC2086
spec() { printf '%s\n' $SPEC | sed -n "s/^$1=//p" | tail -1; }
# resolve K=V...: one line of every key once, in first-seen order, the last value winning.
resolve() { printf '%s\n' "$@" | awk -F= '!($1 in v){o[++n]=$1} {v[$1]=substr($0, length($1) + 2)}
                                       END{for (i = 1; i <= n; i++) printf "%s=%s%s", o[i], v[o[i]], i < n ? " " : ""}'; }
# shellcheck disable=SC2086
KNOWN=" $(printf '%s\n' $DEFAULTS | sed 's/=.*//' | tr '\n' ' ') "

job_yaml() {  # the thetad job of the current shape on stdout
  local prec; prec=$(spec precision)
  echo "# bench/gpu/plain.sh shape $NAME: $SPEC"
  echo "job: plain-$NAME"
  echo "seed: 1234"
  echo "steps: $(spec steps)"
  echo "precision: $prec"
  if [ "$(spec kind)" = mlp ]; then
    local h; h=$(spec hidden)
    echo "model: {kind: multitask_mlp, input_dim: $h, hidden: $h, output_dim: $h, trunk_layers: $(spec trunk), head_layers: $(spec head), tasks: $(spec tasks)}"
    echo "data: {kind: synthetic, batch_per_rank: $(spec batch), schedule: round_robin, tasks_per_rank: 1, noise: 0.01}"
    echo "optimizer: {kind: adamw, lr: 1.0e-3, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.01, overlap: $(spec overlap)}"
  else
    local arch=""
    [ "$(spec kind)" = llama ] && arch="arch: llama, kv_heads: $(spec kv_heads), tie_embeddings: false, "
    echo "model: {kind: transformer, ${arch}layers: $(spec layers), d_model: $(spec d_model), heads: $(spec heads), d_ff: $(spec d_ff), vocab: $(spec vocab), seq_len: $(spec seq_len),"
    echo "        tasks: $(spec tasks), train_shared: $([ "$(spec frozen)" = 1 ] && echo false || echo true)}"
    echo "lora: {rank: $(spec rank), alpha: 32, targets: [$(spec targets)]}"
    echo "data: {kind: synthetic, batch_per_rank: $(spec batch), schedule: round_robin, tasks_per_rank: $(spec tpr), noise: 0.01}"
    echo "optimizer: {kind: adamw, lr: 1.0e-4, weight_decay: 0.0, overlap: $(spec overlap)}"
  fi
  echo "comm: {backend: auto, bucket_cap_mb: 25, prune: true, average: contributors, active: declared, timeout_s: 300}"
  # offload=1: the θ[t] (adapters, heads) in thetad's host store with a device cache of `cache` MB
  # (the configuration for many adapters); 0: all-resident.
  # act=1: offload.activations (the trunk layers', the transformer's feed-forward inputs).
  if [ "$(spec offload)" = 1 ]; then echo "offload: {enabled: true, device_cache_mb: $(spec cache), activations: $([ "$(spec act)" = 1 ] && echo true || echo false)}"
  else echo "offload: {enabled: false, activations: $([ "$(spec act)" = 1 ] && echo true || echo false)}"; fi
  echo "train: {backward: $(spec backward)}"  # backward=joint|per_task|auto (train.backward)
  echo "metrics: {path: \"$DIR/thetad/metrics.jsonl\"}"
  echo "log: {level: info, progress_every_s: 10}"
}

peer_args() {  # [LLAMA_PEER]: the peer's command-line options of the current shape
  local common=(--device "$DEVICE" --steps "$(spec steps)" --warmup "$(spec warmup)" --window "$(spec window)"
                --timing "$TIMING" --precision "$(spec precision)" --tasks "$(spec tasks)" --batch "$(spec batch)")
  if [ "$(spec kind)" = mlp ]; then
    local h; h=$(spec hidden)
    echo --model multitask "${common[@]}" --input-dim "$h" --hidden "$h" --output-dim "$h" \
         --trunk-layers "$(spec trunk)" --head-layers "$(spec head)" --init "$(spec init)" --seed 1234
  else
    local shape=(--layers "$(spec layers)" --d-model "$(spec d_model)" --heads "$(spec heads)" --d-ff "$(spec d_ff)"
                 --vocab "$(spec vocab)" --seq-len "$(spec seq_len)" --rank "$(spec rank)" --alpha 32
                 --targets "$(spec targets)" --tasks-per-rank "$(spec tpr)" --lr 1e-4 --seed 1234)
    if [ "$(spec kind)" = llama ]; then
      local peer=${1:-$(spec peer)} split=()
      # compiled_split: the compiled peer with a pass per task (--no-fuse-tasks), for comparison.
      [ "$peer" = compiled_split ] && peer=compiled split=(--no-fuse-tasks)
      echo --model "$peer-llama" "${common[@]}" "${shape[@]}" --kv-heads "$(spec kv_heads)" "${split[@]}"
    else
      echo --model lora "${common[@]}" "${shape[@]}" "$([ "$(spec frozen)" = 1 ] && echo --frozen-base)"
    fi
  fi
}

run_one() {  # LABEL LOGDIR command...: under timeout, in its own process group; "LABEL rc N (S s)"
  local label=$1 dir=$2 t0 rc; shift 2
  mkdir -p "$dir"
  if [ $(( $(date +%s) - START )) -ge "$BUDGET" ]; then
    log "SKIP $NAME $label: budget of ${BUDGET}s spent"; echo skipped > "$dir/status"; return
  fi
  printf '%q ' "$@" > "$dir/cmd.txt"; echo >> "$dir/cmd.txt"
  t0=$(date +%s)
  setsid timeout -k 10 "$CAP" "$@" > "$dir/log.txt" 2>&1 < /dev/null &
  local pid=$!
  wait "$pid"; rc=$?
  kill -KILL -- "-$pid" 2>/dev/null  # leftovers of the run's process group, if any
  echo "rc $rc" > "$dir/status"
  log "$NAME $label: rc $rc ($(( $(date +%s) - t0 )) s); $(tail -n 1 "$dir/log.txt" | cut -c1-140)"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (+local changes)')"
  echo "command: bash bench/gpu/plain.sh $BUILD  PLAIN_SHAPES='${PLAIN_SHAPES:-}' PLAIN_STEPS='${PLAIN_STEPS:-}' PLAIN_LLAMA_PEERS='${PLAIN_LLAMA_PEERS:-}' timing: $TIMING"
  [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import torch; print("torch", torch.__version__)' 2>&1
} > "$OUT/env.txt"
cat "$OUT/env.txt"
is_llama_peer() { case " $LLAMA_PEERS " in *" $1 "*) return 0 ;; esac; return 1; }
for p in ${PLAIN_LLAMA_PEERS:-}; do
  is_llama_peer "$p" || { echo "bench/gpu/plain.sh: PLAIN_LLAMA_PEERS: unknown peer '$p' (known: $LLAMA_PEERS)" >&2; exit 2; }
done
# shellcheck disable=SC2086
if [ -n "$(printf '%s\n' ${PLAIN_LLAMA_PEERS:-} | sort | uniq -d)" ]; then
  echo "bench/gpu/plain.sh: PLAIN_LLAMA_PEERS: '$PLAIN_LLAMA_PEERS' names a peer twice" >&2; exit 2
fi
NAMES=() SPECS=()
for entry in ${PLAIN_SHAPES:-$ORDER}; do  # every shape checked before anything runs
  name=${entry%%:*}
  over=""; [ "$entry" != "$name" ] && over=$(echo "${entry#*:}" | tr ',' ' ')
  if [ -z "${SHAPES[$name]:-}" ] && [ -z "$over" ]; then
    echo "bench/gpu/plain.sh: PLAIN_SHAPES: '$name' is not a built-in shape (${!SHAPES[*]}) and sets no key" >&2; exit 2
  fi
  for kv in $over; do
    case "$KNOWN" in *" ${kv%%=*} "*) ;; *) echo "bench/gpu/plain.sh: PLAIN_SHAPES: unknown key '${kv%%=*}' in '$entry' (known:$KNOWN)" >&2; exit 2 ;; esac
  done
  # A shape with overrides is its own row (and folder, and job name): NAME_key-value_...
  label=$name; [ -n "$over" ] && label="${name}_$(echo "$over" | tr ' =' '_-')"
  # shellcheck disable=SC2046,SC2086
  SPEC=$(resolve $DEFAULTS ${SHAPES[$name]:-} $over $([ "$DEVICE" = cpu ] && echo $CPU_DIMS) ${PLAIN_STEPS:+steps=$PLAIN_STEPS})
  is_llama_peer "$(spec peer)" || { echo "bench/gpu/plain.sh: PLAIN_SHAPES: '$entry': peer=$(spec peer) is not one of: $LLAMA_PEERS" >&2; exit 2; }
  # A llama shape's peers, in order (plain_table.py reads them): the first runs in peer/.
  # shellcheck disable=SC2086
  [ "$(spec kind)" = llama ] && SPEC="$SPEC peers=$(echo ${PLAIN_LLAMA_PEERS:-$(spec peer)} | tr ' ' ,)"
  NAMES+=("$label") SPECS+=("$SPEC")
done
for i in "${!NAMES[@]}"; do
  NAME=${NAMES[$i]} SPEC=${SPECS[$i]} DIR=$OUT/${NAMES[$i]}
  rm -rf "$DIR" && mkdir -p "$DIR"
  echo "$SPEC" > "$DIR/spec.txt"
  job_yaml > "$DIR/job.yaml"
  run_one thetad "$DIR/thetad" "${MPI[@]}" "$THETAD" run "$DIR/job.yaml" --no-resume
  peers=$(spec peers | tr , ' ') folder=peer
  for p in ${peers:-""}; do  # one peer (mlp, lora), or each of a llama shape's: peer/, peer_NAME/...
    [ "$folder" = peer ] || folder=peer_$p
    # shellcheck disable=SC2046
    run_one "$folder" "$DIR/$folder" "$PY" bench/peer/plain_loop.py $(peer_args "$p") --out "$DIR/$folder/result.json"
    folder=
  done
done
log "done; table:"
"$PY" bench/gpu/plain_table.py "$OUT" "${NAMES[@]}"
