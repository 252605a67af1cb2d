#!/usr/bin/env bash
# Not in CI: the stop latency of the launcher, from SIGTERM to the launcher until it has exited
# 4 with every rank's exit 4 recorded, with fake ranks (fake_thetad.sh, no checkpoint time) under
# real mpirun; and, inside that, until the last rank recorded its exit 4 (the rest is mpirun's
# own teardown). Prints each run's seconds and the medians. Usage: stop_latency.sh [RUNS] [RANKS]
# (THETAD_LAUNCH picks another launcher, e.g. an older one, to compare).
set -euo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
runs=${1:-10} ranks=${2:-2}
export THETAD_FAKE_STATE=$T/state OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
job=$T/lat.yaml
printf 'job: lat-%s\nsteps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata: {kind: synthetic}\n' "$MARKER" >"$job"
times=() ranks_done=()
for ((i = 0; i < runs; i++)); do
  rm -rf "$THETAD_FAKE_STATE" "$T/logs"
  mkdir -p "$THETAD_FAKE_STATE"
  THETAD_FAKE_STEPS=100000 THETAD_FAKE_SLEEP=0.1 "$LAUNCHER" --thetad "$LAUNCH_TEST_DIR/fake_thetad.sh" \
    --nproc-per-node "$ranks" --log-dir "$T/logs" "$job" >"$T/out" 2>"$T/err" &
  pid=$!
  # every rank stepping (its stop handler set), then a moment of quiet
  wait_for 60 test -e "$T/logs/rank-$((ranks - 1)).log"
  for ((r = 0; r < ranks; r++)); do wait_for 60 grep -q 'step 2' "$T/logs/rank-$r.log"; done
  sleep 0.3
  t0=$EPOCHREALTIME
  kill -TERM "$pid"
  rc=0
  wait "$pid" || rc=$?
  t1=$EPOCHREALTIME
  ((rc == 4)) || { tail -n 5 "$T/err" >&2; fail "run $i: exit $rc"; }
  for ((r = 0; r < ranks; r++)); do
    [[ $(cut -d' ' -f1 "$T/logs/rank-$r.exit") == 4 ]] || fail "run $i: rank $r did not exit 4"
  done
  times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
  ranks_done+=("$(cat "$T"/logs/rank-*.exit | awk -v a="$t0" '$2 - a > m { m = $2 - a } END { printf "%.3f", m }')")
  echo "run $i: launcher exit 4 after ${times[-1]} s, last rank's exit 4 after ${ranks_done[-1]} s"
done
printf '%s\n' "${ranks_done[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "SIGTERM to every rank exited 4, %d ranks: median %.3f s, min %.3f s, max %.3f s (%d runs)\n", '"$ranks"', v[int((NR + 1) / 2)], v[1], v[NR], NR }'
printf '%s\n' "${times[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "SIGTERM to launcher exit 4, %d ranks: median %.3f s, min %.3f s, max %.3f s (%d runs)\n", '"$ranks"', v[int((NR + 1) / 2)], v[1], v[NR], NR }'
