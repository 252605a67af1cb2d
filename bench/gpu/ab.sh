#!/usr/bin/env bash
# Two builds of thetad side by side on a GPU machine (a restructuring must not change the
# speed or the numbers): builds tree A and tree B, then runs the reference configuration with
# each, alternating A, B, A, B, all-resident and offload, and reports the step time per window of
# steps (median of step_ms over each window, device-side phase times from the metrics) and
# whether the final parameter hashes agree.
#
#   bash bench/gpu/ab.sh OLD_SRC NEW_SRC     # from the repository root, environment: docs/gpu.md
#
# Environment: AB_STEPS=200 AB_WINDOW=50 AB_REPEATS=2 AB_MODES="resident offload"
#   AB_BUILD=.gpubuild (build folders AB_BUILD/a and AB_BUILD/b; kept while the machine is warm)
#   AB_SKIP_BUILD=1  OUT=/tmp/out
set -uo pipefail
A_SRC=$(cd "$1" && pwd) B_SRC=$(cd "$2" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/out}
STEPS=${AB_STEPS:-200} WINDOW=${AB_WINDOW:-50} REPEATS=${AB_REPEATS:-2}
MODES=${AB_MODES:-resident offload}
BUILD=${AB_BUILD:-$ROOT/.gpubuild}
mkdir -p "$OUT" "$BUILD"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
MPI_FLAGS=(--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
           --mca oob_tcp_if_include lo --mca pml ob1 --mca osc ^ucx
           -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI_FLAGS+=(-x LD_LIBRARY_PATH)
NP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0)
[ "$NP" -gt 0 ] || { echo "ab.sh: no GPU visible" >&2; exit 2; }
log() { printf '[ab %4ds] %s\n' "$SECONDS" "$*"; }

build() {  # build SRC DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DTHETAD_BUILD_TESTS=ON > "$2.configure.log" 2>&1 &&
    cmake --build "$2" -j 8 --target thetad > "$2.build.log" 2>&1
}
if [ "${AB_SKIP_BUILD:-0}" != 1 ]; then
  log "building A ($A_SRC) and B ($B_SRC)"
  build "$A_SRC" "$BUILD/a" & pa=$!
  build "$B_SRC" "$BUILD/b" & pb=$!
  wait $pa || { tail -20 "$BUILD/a.build.log"; exit 1; }
  wait $pb || { tail -20 "$BUILD/b.build.log"; exit 1; }
  log "built"
fi

job_of() { [ "$1" = offload ] && echo bench/jobs/reference-offload.yaml || echo bench/jobs/reference.yaml; }
for r in $(seq 1 "$REPEATS"); do
  for mode in $MODES; do
    for side in a b; do
      name="${mode}_${side}_${r}"
      src=$A_SRC; [ "$side" = b ] && src=$B_SRC
      mkdir -p "$OUT/$name"
      log "run $name"
      timeout -k 10 240 mpirun "${MPI_FLAGS[@]}" -np "$NP" "$BUILD/$side/daemon/thetad" run "$src/$(job_of "$mode")" \
        --no-resume --set steps="$STEPS" --set comm.average=world --set log.level=info \
        --set metrics.path="$OUT/$name/metrics.jsonl" > "$OUT/$name/log.txt" 2>&1 < /dev/null
      echo "rc=$?" >> "$OUT/$name/log.txt"
    done
  done
done

python3 - "$OUT" "$WINDOW" "$MODES" "$REPEATS" <<'PY' | tee "$OUT/ab.md"
import json, re, statistics, sys, pathlib
out, window, modes, repeats = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
def load(name):
    p = out / name / "metrics.jsonl"
    recs = [json.loads(l) for l in open(p)] if p.exists() else []
    log = (out / name / "log.txt").read_text(errors="replace") if (out / name / "log.txt").exists() else ""
    h = re.findall(r"final params hash: ([0-9a-f]+)", log)
    return recs, (h[-1] if h else "-"), re.findall(r"rc=(\d+)", log)[-1:] or ["?"]
print("| run | rc | windows of %d steps: median step_ms (first window is warm-up) | fwd | bwd | comm_wait | opt | peak MiB | hash |" % window)
print("|---|---|---|---|---|---|---|---|---|")
summary = {}
for mode in modes:
    for r in range(1, repeats + 1):
        for side in "ab":
            name = f"{mode}_{side}_{r}"
            recs, h, rc = load(name)
            wins = [statistics.median(x["step_ms"] for x in recs[i:i + window]) for i in range(0, len(recs), window)]
            steady = recs[window:] or recs
            med = lambda k: statistics.median(x[k] for x in steady) if steady else float("nan")
            summary.setdefault((mode, side), []).extend(x["step_ms"] for x in steady)
            peak = max((x["device_mem_peak_bytes"] for x in recs), default=0) / 2**20
            print(f"| {name} | {rc[0]} | {' / '.join('%.2f' % w for w in wins)} | {med('forward_ms'):.2f} | {med('backward_ms'):.2f} "
                  f"| {med('comm_wait_ms'):.2f} | {med('optimizer_ms'):.2f} | {peak:.0f} | {h} |")
print()
for mode in modes:
    a, b = summary.get((mode, "a"), []), summary.get((mode, "b"), [])
    if a and b:
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"- {mode}: A {ma:.2f} ms, B {mb:.2f} ms per step (median over the steady windows of all repeats): B/A = {mb / ma:.3f}")
PY
