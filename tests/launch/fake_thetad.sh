#!/usr/bin/env bash
# A FAKE thetad for the launcher's tests: implements `validate` and `run` without training.
#   validate JOB [--set ...]: exit 2 if the job file contains "FAKE_INVALID", 127 if it contains
#     "FAKE_BROKEN" (thetad cannot start), else 0.
#   run JOB ...: logs a few lines (tagged and untagged), runs THETAD_FAKE_STEPS steps of
#     THETAD_FAKE_SLEEP seconds, exits THETAD_FAKE_EXIT_CODE on rank THETAD_FAKE_EXIT_RANK
#     (after THETAD_FAKE_EXIT_AFTER steps) and 0 elsewhere; on SIGTERM prints "got SIGTERM" and
#     exits 4 like thetad does after its checkpoint, which takes THETAD_FAKE_STOP_SLEEP seconds
#     (default 0; then it prints "checkpoint complete"). THETAD_FAKE_RAW: bytes one rank writes. It installs its SIGTERM handler only
#     after THETAD_FAKE_START_DELAY seconds (default 0), like thetad while LibTorch loads: a
#     SIGTERM before that kills it. Once its handler is set it reports so on the fd the launcher's
#     wrapper names in THETAD_READY_FD, as thetad does. Writes its pid to $THETAD_FAKE_STATE/pid-R and
#     the NCCL_SOCKET_IFNAME it was given to nccl_socket_ifname-R, and marks
#     $THETAD_FAKE_STATE/ran when run at all, its arguments one a line to args-R.
#     THETAD_FAKE_EDIT_JOB: rank 0 appends a line to the job file (an edit after the check).
# shellcheck disable=SC2317  # on_term runs from a trap
set -euo pipefail
cmd=${1:-}; shift || true
job=${1:-}
case $cmd in
  version) echo "thetad fake"; exit 0 ;;
  validate)
    if grep -q FAKE_BROKEN "$job"; then  # thetad itself cannot run (e.g. a missing library)
      echo "thetad: error while loading shared libraries: libfake.so: cannot open shared object file" >&2
      exit 127
    fi
    if grep -q FAKE_INVALID "$job"; then
      echo "$job:3:1: error: key 'model.kind': FAKE_INVALID is not a model" >&2
      exit 2
    fi
    echo "job: fake"
    exit 0 ;;
  run) ;;
  *) echo "fake thetad: unknown command '$cmd'" >&2; exit 1 ;;
esac

rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}
state=${THETAD_FAKE_STATE:?}
echo $$ >"$state/pid-$rank"
echo "${NCCL_SOCKET_IFNAME:-}" >"$state/nccl_socket_ifname-$rank"
touch "$state/ran"
printf '%s\n' "$@" >"$state/args-$rank"
# THETAD_FAKE_EDIT_JOB: rank 0 edits the job file once it runs (after the launcher's check).
if [[ -n ${THETAD_FAKE_EDIT_JOB:-} && $rank == 0 ]]; then echo "steps: 99" >>"$job"; fi
# say LEVEL TAG TEXT: one log line as thetad writes it. No $(...) while the TERM trap is set (bash
# 5.2 runs a trap that arrives while it expands one with a broken parser: see thetad-launch).
say() {
  local now=$EPOCHREALTIME frac
  frac=${now#*.}
  printf '[%(%Y-%m-%d %H:%M:%S)T.%s] [rank %s] [%s] %s: %s\n' "${now%.*}" "${frac:0:3}" "$rank" "$2" "$1" "$3" >&2
}
sleeper=""
on_term() {
  trap '' TERM  # thetad's handler only sets a flag: a second SIGTERM changes nothing
  say warning daemon "got SIGTERM, checkpointing"
  if [[ -n $sleeper ]]; then kill "$sleeper" 2>/dev/null || true; fi
  if [[ ${THETAD_FAKE_STOP_SLEEP:-0} != 0 ]]; then
    sleep "$THETAD_FAKE_STOP_SLEEP"
    say info daemon "checkpoint complete"
  fi
  exit 4
}
if [[ ${THETAD_FAKE_START_DELAY:-0} != 0 ]]; then sleep "$THETAD_FAKE_START_DELAY"; fi
trap on_term TERM
if [[ -n ${THETAD_READY_FD:-} ]]; then  # the stop handler is set: tell the wrapper, once
  printf 'ready\n' >&"$THETAD_READY_FD" || true
  exec {THETAD_READY_FD}>&-
  unset THETAD_READY_FD
fi

say info daemon "fake worker starts job $job"
say info daemon "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
echo "untagged line from fake rank $rank" >&2
# THETAD_FAKE_RAW: bytes (printf %b escapes) rank THETAD_FAKE_RAW_RANK (default 1) writes as is.
if [[ -n ${THETAD_FAKE_RAW:-} && $rank == "${THETAD_FAKE_RAW_RANK:-1}" ]]; then printf '%b' "$THETAD_FAKE_RAW" >&2; fi
steps=${THETAD_FAKE_STEPS:-3}
for ((s = 1; s <= steps; s++)); do
  if [[ $rank == "${THETAD_FAKE_EXIT_RANK:-none}" ]] && ((s > ${THETAD_FAKE_EXIT_AFTER:-0})); then
    say error comm "fake failure at step $s"
    exit "${THETAD_FAKE_EXIT_CODE:-1}"
  fi
  say info daemon "step $s"
  sleep "${THETAD_FAKE_SLEEP:-0.1}" &
  sleeper=$!
  wait "$sleeper" || true
  sleeper=""
done
say info daemon "done"
exit 0
