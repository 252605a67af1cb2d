# Shared by the fault tests with the REAL thetad (sourced): a short CPU job with many steps and
# frequent checkpoints, helpers to find a rank's thetad process, the newest checkpoint, the final
# parameter hash, and a resume check against an uninterrupted run.
# Usage of a test: SCRIPT.sh [PATH/TO/thetad]  (default: $THETAD_BIN)
# shellcheck shell=bash disable=SC2034  # variables used by the scripts that source this file
# shellcheck source=tests/launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

THETAD=${1:-${THETAD_BIN:-}}
[[ -n $THETAD && -x $THETAD ]] || fail "usage: $0 PATH/TO/thetad (or set THETAD_BIN)"
THETAD=$(readlink -f "$THETAD")
MPIRUN=${THETAD_MPIRUN:-mpirun}  # with the library's MPIRUN_FLAGS
unset SLURM_JOB_ID CUDA_VISIBLE_DEVICES || true
COMM_TIMEOUT=20
# How the launcher spreads the job (a test may set more before its runs, e.g. --simulate-nodes).
LAUNCH_ARGS=(--nproc-per-node 2)

# fault_job FILE NAME [CKPT_DIR]: the job every fault test trains (tiny; CPU and the MPI backend
# unless FAULT_BACKEND says nccl).
fault_job() {
  cat >"$1" <<YAML
job: $2-$MARKER
seed: 7
steps: 100000
model: {kind: multitask_mlp, input_dim: 16, hidden: 32, trunk_layers: 2, head_layers: 1, tasks: 4}
data: {kind: synthetic, batch_per_rank: 8, schedule: round_robin}
comm: {backend: ${FAULT_BACKEND:-mpi}, timeout_s: $COMM_TIMEOUT}
optimizer: {kind: adamw, lr: 1.0e-3}
checkpoint: {dir: ${3:-$T/ckpt}, every_steps: 20, keep: 3}
log: {level: info, progress_every_s: 1}
YAML
}

# thetad_pids: the thetad processes of this test (not the wrappers: their executable is bash).
thetad_pids() {
  local pid
  for pid in $(marker_pids); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$THETAD" ]] && echo "$pid"
  done
  return 0
}

# rank_pid R: the pid of rank R's thetad.
rank_pid() {
  local pid r
  for pid in $(thetad_pids); do
    r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [[ $r == "$1" ]] && { echo "$pid"; return 0; }
  done
  return 1
}

# newest_step DIR: step of the newest complete checkpoint in DIR (manifest.json's "step", else
# the number in the directory's name); -1 if none.
newest_step() {
  python3 - "$1" <<'PY'
import json, os, re, sys
best = -1
d = sys.argv[1]
for name in (os.listdir(d) if os.path.isdir(d) else []):
    m = os.path.join(d, name, "manifest.json")
    if not os.path.isfile(m):
        continue
    step = None
    try:
        step = int(json.load(open(m)).get("step"))
    except Exception:
        nums = re.findall(r"\d+", name)
        step = int(nums[-1]) if nums else None
    if step is not None:
        best = max(best, step)
print(best)
PY
}

# final_hash LOGFILE: the hex of rank 0's "final params hash: <hex>" line.
final_hash() { sed -n -E 's/.*final params hash: ([0-9a-fA-F]+).*/\1/p' "$1" | tail -n 1; }

# start_fault_run JOB: the launcher in the background (LAUNCH_ARGS: 2 ranks); sets LPID. Waits until a
# checkpoint at step >= 40 exists.
start_fault_run() {
  "$LAUNCHER" --thetad "$THETAD" "${LAUNCH_ARGS[@]}" --log-dir "$T/logs-fault" "$1" \
    >"$T/fault.out" 2>"$T/fault.err" &
  LPID=$!
  local deadline=$((SECONDS + 180))
  until (($(newest_step "$T/ckpt") >= 40)); do
    kill -0 "$LPID" 2>/dev/null || { tail -n 30 "$T/fault.err" >&2; fail "the job ended before its second checkpoint"; }
    ((SECONDS < deadline)) || fail "no checkpoint at step >= 40 after 180 s"
    sleep 0.1
  done
  wait_for 10 rank_pid 1 >/dev/null
}

# wait_launcher LIMIT: waits for LPID; sets RC and ELAPSED (from now).
wait_launcher() { LERR=$T/fault.err wait_exit "$LPID" "$1"; }

# expect_lost LIMIT PATTERN WHAT: after a kill, the launcher ends within LIMIT seconds with exit 3
# (lost peer), its stderr matching PATTERN (it names WHAT was lost), and no process is left.
expect_lost() {
  wait_launcher "$1"
  ((RC == 3)) || { tail -n 30 "$T/fault.err" >&2; fail "want launcher exit 3 (lost peer) after $3 was killed, got $RC"; }
  assert_grep "$2" "$T/fault.err" "the launcher does not name $3"
  [[ -z $(thetad_pids) ]] || fail "thetad processes left: $(thetad_pids | paste -sd' ')"
  no_leftovers
  pass "kill -9 of $3: launcher exit $RC after ${ELAPSED}s naming it; nothing left"
}

# resume_run JOB: reruns the job to 40 steps past the newest checkpoint; it must resume (not
# restart) and succeed. Sets RESUMED_FROM and RESUMED_TO.
resume_run() {
  local job=$1 s total rc
  s=$(newest_step "$T/ckpt")
  ((s >= 20)) || fail "no checkpoint left after the fault"
  total=$((s + 40))
  rc=0
  "$LAUNCHER" --thetad "$THETAD" "${LAUNCH_ARGS[@]}" --log-dir "$T/logs-resume" "$job" \
    --set "steps=$total" --set "metrics.path=$T/metrics-resume.jsonl" >"$T/resume.out" 2>"$T/resume.err" || rc=$?
  ((rc == 0)) || { tail -n 30 "$T/resume.err" >&2; fail "resumed run: exit $rc"; }
  if [[ -s $T/metrics-resume.jsonl ]]; then
    local n; n=$(wc -l <"$T/metrics-resume.jsonl")
    ((n <= total - s + 1)) || fail "resumed run logged $n steps of $total: it did not resume from step $s"
  else
    assert_grep '[Rr]esum' "$T/logs-resume/rank-0.log" "resumed run does not say it resumed"
  fi
  RESUMED_FROM=$s RESUMED_TO=$total
}

# resume_and_compare JOB: resume_run, and the result equals a run that never failed.
resume_and_compare() {
  local job=$1 rc h_resume h_ref
  resume_run "$job"
  rc=0
  "$LAUNCHER" --thetad "$THETAD" "${LAUNCH_ARGS[@]}" --log-dir "$T/logs-ref" "$job" \
    --set "steps=$RESUMED_TO" --set "checkpoint.dir=$T/ckpt-ref" >"$T/ref.out" 2>"$T/ref.err" || rc=$?
  ((rc == 0)) || { tail -n 30 "$T/ref.err" >&2; fail "uninterrupted run: exit $rc"; }
  h_resume=$(final_hash "$T/logs-resume/rank-0.log")
  h_ref=$(final_hash "$T/logs-ref/rank-0.log")
  [[ -n $h_resume && -n $h_ref ]] || fail "no 'final params hash:' line on rank 0 (resume '$h_resume', reference '$h_ref')"
  [[ $h_resume == "$h_ref" ]] || fail "resumed from step $RESUMED_FROM to $RESUMED_TO: params hash $h_resume != uninterrupted $h_ref"
  pass "resumed from step $RESUMED_FROM to $RESUMED_TO; final params hash $h_resume equals an uninterrupted run's"
}
