#!/usr/bin/env bash
# deploy/slurm/thetad.sbatch on a real (one-node) Slurm cluster: Debian's slurmctld, slurmd and
# munge, installed when missing and started in this test's temporary directory (cluster.sh).
# A small CPU job (2 ranks) is submitted with sbatch, twice. Each time the test checks that its
# ranks were started by srun (--mpi=pmix, thetad-launch's choice inside an allocation), then
# preempts it mid-run:
#   signal:  `scancel --signal=TERM --batch` (what `--signal=B:TERM@120` sends before the time
#            limit): the ranks checkpoint and exit 4 and the script runs `scontrol requeue`;
#   requeue: `scontrol requeue JOBID` from outside: Slurm sends SIGTERM to every process of
#            the job (KillWait before SIGKILL); the ranks checkpoint and exit 4.
# Slurm starts the job again, it resumes from that checkpoint and finishes with the final
# parameter hash of an uninterrupted run.
# Exit 77 (ctest SKIP_RETURN_CODE) when Slurm cannot be had or started here.
# Usage: sbatch_requeue.sh PATH/TO/thetad
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
THETAD=$(readlink -f "${1:?usage: $0 PATH/TO/thetad}")
# Each step needs the one before: the first failure ends the test.
TEST_FAIL_FAST=1
# shellcheck source=tests/lib/test_lib.sh
source "$HERE/../lib/test_lib.sh"
# shellcheck source=tests/slurm/cluster.sh
source "$HERE/cluster.sh"

T=$WORK
# After a failure: the jobs' outputs and the ranks' own logs (the launcher's --log-dir under the
# job's chdir), their last words. Then the cluster goes.
# shellcheck disable=SC2317  # run by the library's exit (at_exit)
last_words() {
  ((FAILS > 0)) || return 0
  for f in "$T"/out-*.txt; do [[ -e $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done
  for f in "$T"/runs/*/logs/rank-*.log "$T"/runs/*/logs/rank-*.exit; do
    [[ -e $f ]] && { echo "--- $f"; grep -v '\] info: step ' "$f" | tail -n 8; }
  done
  return 0
}
at_exit last_words
at_exit slurm_stop
t0=$SECONDS

slurm_install || skip "$SLURM_WHY"
slurm_start "$T/slurm" || skip "Slurm cannot start here: $SLURM_WHY"
pass "one-node Slurm cluster up in $((SECONDS - t0)) s ($(sinfo -h -o '%D node(s), %c CPUs'))"

# The script as users submit it; only what this machine lacks is overridden on the command line
# (one node, 2 CPU ranks, no GPUs). It finds thetad-launch and thetad through the environment.
export THETAD_LAUNCH=$ROOT/launch/thetad-launch THETAD_BIN=$THETAD
unset CUDA_VISIBLE_DEVICES || true

# write_job NAME: a small CPU job, long enough (several seconds) that a preemption lands mid-run.
write_job() {
  cat >"$T/$1.yaml" <<YAML
job: $1
seed: 11
steps: 3000
model: {kind: multitask_mlp, input_dim: 16, hidden: 32, trunk_layers: 2, head_layers: 1, tasks: 4}
data: {kind: synthetic, batch_per_rank: 8, schedule: round_robin}
comm: {backend: mpi, timeout_s: 30}
optimizer: {kind: adamw, lr: 1.0e-3}
checkpoint: {dir: $T/$1-ckpt, every_steps: 20, keep: 2}
log: {level: info}
YAML
}
# newest_step NAME: the newest complete checkpoint's step, -1 if none.
newest_step() {
  local d s=-1
  for d in "$T/$1-ckpt"/step-*; do [[ -f $d/manifest.json ]] && s=$((10#${d##*step-})); done
  echo "$s"
}
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
final_hash() { sed -n -E 's/.*final params hash: ([0-9a-fA-F]+).*/\1/p' "$1" | tail -n 1; }

# The same job never interrupted (mpirun, the same 2 ranks): the hash every cycle must reach.
write_job reference
rc=0
"$ROOT/launch/thetad-launch" --launcher mpirun --nproc-per-node 2 --log-dir "$T/ref-logs" \
  "$T/reference.yaml" --set job=slurm >"$T/ref.out" 2>&1 || rc=$?
((rc == 0)) || { tail -n 20 "$T/ref.out"; fail "uninterrupted run: exit $rc"; }
WANT=$(final_hash "$T/ref.out")
[[ -n $WANT ]] || fail "the uninterrupted run printed no final params hash"

# cycle MODE: submit, check srun started the ranks, preempt (MODE signal or requeue), and follow
# the job through exit 4, requeue, resume and completion to the uninterrupted run's hash.
cycle() {
  local mode=$1 jobid out state deadline at ck procids="" pid env_of restarts got
  write_job "$mode"
  jobid=$(sbatch --parsable --chdir="$T" --output="$T/out-%j.txt" --nodes=1 --ntasks-per-node=2 \
    --ntasks=2 --cpus-per-task=1 --gpus-per-task=0 --time=00:10:00 \
    "$ROOT/deploy/slurm/thetad.sbatch" "$T/$mode.yaml" --set job=slurm) || fail "sbatch refused the script"
  out=$T/out-$jobid.txt

  # Running with a checkpoint behind it (step >= 40), ranks started by srun.
  deadline=$((SECONDS + 90))
  until (($(newest_step "$mode") >= 40)); do
    state=$(job_field "$jobid" JobState)
    [[ $state == PENDING || $state == RUNNING ]] || fail "$mode: job $jobid is $state before its second checkpoint"
    ((SECONDS < deadline)) || fail "$mode: no checkpoint at step >= 40 after 90 s (job $state)"
    sleep 0.2
  done
  for pid in $(pgrep -f -- "$THETAD run $T/$mode.yaml" || true); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$THETAD" ]] || continue  # not the wrappers
    env_of=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
    grep -qx "SLURM_JOB_ID=$jobid" <<<"$env_of" || continue
    grep -q '^SLURM_STEP_ID=[0-9]' <<<"$env_of" || continue  # a task of an srun step, not the batch shell
    procids+=" $(sed -n 's/^SLURM_PROCID=//p' <<<"$env_of")"
  done
  [[ $(tr ' ' '\n' <<<"$procids" | sort -u | grep -c .) == 2 ]] ||
    fail "$mode: want 2 thetad ranks in an srun step of job $jobid, found SLURM_PROCID '$procids'"
  grep -q 'via srun' "$out" || fail "$mode: thetad-launch did not start the ranks with srun"
  pass "$mode: sbatch job $jobid, 2 ranks started by srun --mpi=pmix (SLURM_PROCID$procids)"

  at=$(newest_step "$mode")
  if [[ $mode == signal ]]; then
    scancel --signal=TERM --batch "$jobid"
  else
    scontrol requeue "$jobid"
  fi
  deadline=$((SECONDS + 90))
  until grep -q 'thetad.sbatch: exit 4' "$out" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "$mode: no exit 4 within 90 s of the preemption"
    sleep 0.2
  done
  ck=$(newest_step "$mode")
  ((ck > at)) || fail "$mode: no checkpoint written on preemption (newest step $ck, $at before it)"
  grep -q 'requeueing job' "$out" || fail "$mode: the script did not ask for the requeue"
  pass "$mode: preempted at step $ck: checkpointed, exit 4, requeued ($((SECONDS - t0)) s in)"

  # Slurm holds a requeued job back (BeginTime, about two minutes); a test need not wait that long.
  for _ in $(seq 50); do
    [[ $(job_field "$jobid" JobState) == PENDING ]] && break
    sleep 0.2
  done
  # ...but it must not start before the node has torn down the first run's step: a restart whose
  # step launched while the old slurmstepd was still ending failed to launch its tasks ("aborted
  # before step completely launched"), seen once in CI.
  for _ in $(seq 150); do
    pgrep -f "slurmstepd: \[$jobid\." >/dev/null 2>&1 || break
    sleep 0.2
  done
  sleep 1
  scontrol update "JobId=$jobid" StartTime=now >/dev/null 2>&1 || true
  deadline=$((SECONDS + 200))
  while :; do
    state=$(job_field "$jobid" JobState)
    [[ $state == COMPLETED ]] && break
    [[ $state =~ ^(PENDING|RUNNING|REQUEUED|CONFIGURING|COMPLETING|REQUEUE_HOLD|REQUEUE_FED)$ ]] ||
      fail "$mode: job $jobid ended $state ($(job_field "$jobid" ExitCode))"
    ((SECONDS < deadline)) || fail "$mode: job $jobid still $state 200 s after its requeue"
    sleep 0.5
  done
  restarts=$(job_field "$jobid" Restarts)
  ((restarts >= 1)) || fail "$mode: job $jobid completed without a restart (Restarts=$restarts)"
  grep -q "restart $restarts" "$out" || fail "$mode: the output shows no restart $restarts"
  grep -qE "resumed from .*step-0*$ck at step $ck" "$out" || fail "$mode: the requeued run did not resume from step $ck"
  got=$(final_hash "$out")
  [[ $got == "$WANT" ]] || fail "$mode: preempted and requeued run ended with hash '$got', an uninterrupted one with $WANT"
  pass "$mode: requeued (Restarts=$restarts), resumed from step $ck, completed with the uninterrupted run's hash $WANT ($((SECONDS - t0)) s in)"
}

cycle signal
cycle requeue
echo "slurm test took $((SECONDS - t0)) s"
finish
