# The launcher tests' runs with a FAKE thetad (fake_thetad.sh) under real mpirun (sourced by
# launcher_fake.sh and security.sh): the fake's state dir, job files that carry the test's
# marker, the launcher in the foreground or the background, and an mpirun that records its start.
# shellcheck shell=bash disable=SC2034  # FAKE, RC, LPID, LERR: used by the scripts that source this file
# shellcheck source=tests/launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FAKE=$LAUNCH_TEST_DIR/fake_thetad.sh
export THETAD_FAKE_STATE=$T/state
mkdir -p "$THETAD_FAKE_STATE"
unset SLURM_JOB_ID CUDA_VISIBLE_DEVICES THETAD_MPIRUN_ARGS THETAD_MPIRUN_BIND || true

# A job file whose path carries the marker (for pgrep) and whose `job:` names it; thetad's loader
# accepts it (the launcher checks it in-process) unless the model line given breaks it.
make_job() {  # make_job NAME [model line]
  local f=$T/$1.yaml model='model: {kind: multitask_mlp, tasks: 2}'
  printf 'job: %s-%s\nsteps: 10\n%s\ndata: {kind: synthetic}\n' "$1" "$MARKER" "${2:-$model}" >"$f"
  echo "$f"
}

# run_launcher OUT_PREFIX ARGS...: runs the launcher in the foreground (60 s limit); sets RC.
run_launcher() {
  local out=$1; shift
  RC=0
  timeout -k 5 60 "$LAUNCHER" --thetad "$FAKE" "$@" >"$out.out" 2>"$out.err" || RC=$?
}

# start_launcher OUT_PREFIX ARGS...: in the background; sets LPID.
start_launcher() {
  local out=$1; shift
  "$LAUNCHER" --thetad "$FAKE" "$@" >"$out.out" 2>"$out.err" &
  LPID=$! LERR=$out.err
}

# mpirun_shim: $T/mpirun-shim runs mpirun (THETAD_MPIRUN's, else PATH's) after touching
# $T/mpirun-started, so that a test can tell that nothing was started.
mpirun_shim() {
  cat >"$T/mpirun-shim" <<SHIM
#!/usr/bin/env bash
touch "$T/mpirun-started"
exec ${THETAD_MPIRUN:-mpirun} "\$@"
SHIM
  chmod +x "$T/mpirun-shim"
}
