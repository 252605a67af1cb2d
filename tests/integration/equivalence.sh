#!/usr/bin/env bash
# The gold test: W real ranks under mpirun must end with the parameters of the single-process
# reference (thetad_reference), for every combination of prune on/off x average contributors/
# world x declared/discover x six schedules (incl. gradient accumulation and frozen groups); prune
# on and off must be bitwise identical (so only prune on's run is compared with the reference); with
# prune on, bytes_allreduced per step must be exactly 4 x (|Θ| + Σ|θ[t]| of active tasks); from 3
# ranks on, single-contributor buckets must have gone as broadcasts.
# With W = 1 the engine adopts autograd's gradients (no buckets, no reduction): the same bits are
# asked of it, over the six schedules with average contributors and declared groups (the other
# keys change nothing in a world of one).
#   equivalence.sh THETAD REFERENCE W
set -euo pipefail
thetad=$1 reference=$2 world=$3
averages="contributors world" actives="declared discover"
if [ "$world" -eq 1 ]; then averages=contributors actives=declared; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
here=$(cd "$(dirname "$0")" && pwd)
job=$here/jobs/equiv.yaml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun_flags=(--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
              --mca oob_tcp_if_include lo --mca pml ob1)

per_rank="[[0]"; for ((r = 1; r < world; r++)); do per_rank+=",[0,$((r % 4))]"; done; per_rank+="]"
declare -A schedules=(
  [one_task_per_rank]="--set data.schedule=round_robin"
  [several_tasks_per_rank]="--set data.schedule=round_robin --set data.tasks_per_rank=2"
  [task_shared_by_ranks]="--set data.schedule=per_rank --set data.per_rank=$per_rank"
  [task_unused]="--set data.schedule=weighted --set data.weights=[1,1,1,1,0]"
  [accumulate_2]="--set data.schedule=round_robin --set accumulate_steps=2"
  [alternate_frozen]="--set data.schedule=alternate --set data.alternate=[shared,tasks,task:2]"
)
fails=0 runs=0
for sched in one_task_per_rank several_tasks_per_rank task_shared_by_ranks task_unused accumulate_2 alternate_frozen; do
  for average in $averages; do
    for active in $actives; do
      declare -A hash=()
      for prune in true false; do
        name="$sched-$average-$active-prune_$prune"
        dir=$work/$name
        # shellcheck disable=SC2206
        sets=(${schedules[$sched]} --set comm.average=$average --set comm.active=$active
              --set comm.prune=$prune --set checkpoint.dir=$dir/ckpt --set metrics.path=$dir/metrics.jsonl
              --set log.level=info)
        runs=$((runs + 1))
        if ! mpirun "${mpirun_flags[@]}" -np "$world" "$thetad" run "$job" "${sets[@]}" --no-resume \
             > "$dir.log" 2>&1; then
          echo "FAIL $name: thetad run failed"; tail -20 "$dir.log"; fails=$((fails + 1)); continue
        fi
        hash[$prune]=$(grep -o 'final params hash: [0-9a-f]*' "$dir.log" | awk '{print $4}')
        # prune off is held to prune on's bits below (its final hash), and prune on to the
        # reference here: a second reference run would add nothing but time.
        if [ "$prune" = false ]; then echo "ok   $name: ran (its hash is compared with prune on's)"; continue; fi
        if ! out=$("$reference" "$job" --world "$world" "${sets[@]}" --compare "$dir/ckpt" 2>&1); then
          echo "FAIL $name: $out"; fails=$((fails + 1)); continue
        fi
        echo "ok   $name: $out"
      done
      if [ "${hash[true]:-x}" != "${hash[false]:-y}" ]; then
        echo "FAIL $sched-$average-$active: prune on/off not bitwise identical (${hash[true]:-} vs ${hash[false]:-})"
        fails=$((fails + 1))
      fi
      unset hash
    done
  done
done
# Bytes: with the fixed per_rank schedule the active tasks are known: task 0 (every rank: reduced)
# and tasks 1..min(3,W-1), one rank each: kept by it (comm.sole_user: keep), nothing sent.
theta_shared=$(( (12 * 16 + 16) + (16 * 16 + 16) ))
theta_task=$(( (16 * 16 + 16) + (16 * 1 + 1) ))
alone=0; for ((r = 1; r < world && r < 4; r++)); do alone=$((alone + 1)); done
expect="$(( 4 * (theta_shared + theta_task) )) $(( 4 * alone * theta_task ))"
got=$(/usr/bin/python3 -c '
import json,sys
vals={(json.loads(l)["bytes_allreduced"], json.loads(l)["bytes_kept"]) for l in open(sys.argv[1])}
print(" ".join("%d %d" % v for v in sorted(vals)))' "$work/task_shared_by_ranks-contributors-declared-prune_true/metrics.jsonl")
if [ "$got" != "$expect" ]; then
  echo "FAIL bytes_allreduced and bytes_kept per step: got $got, expected exactly $expect"; fails=$((fails + 1))
else
  echo "ok   bytes_allreduced, bytes_kept per step = $got = 4 x (|Θ| + |θ[0]|), 4 x $alone x |θ[t]|"
fi
# From 3 ranks on, the buckets of a task one rank trained go as a broadcast from that rank (the
# parameters were checked above); with 2 ranks, never.
bc=$(/usr/bin/python3 -c '
import json,sys
print(sum(json.loads(l)["buckets_broadcast"] for l in open(sys.argv[1])))' "$work/one_task_per_rank-${averages##* }-declared-prune_true/metrics.jsonl")
if { [ "$world" -ge 3 ] && [ "$bc" -gt 0 ]; } || { [ "$world" -lt 3 ] && [ "$bc" -eq 0 ]; }; then
  echo "ok   buckets sent as broadcasts: $bc (W=$world)"
else
  echo "FAIL buckets sent as broadcasts: $bc (W=$world)"; fails=$((fails + 1))
fi
# A world of one took the adopted path (the engine says so at start-up), the others never.
adopted=$(grep -c "gradients adopted from autograd" "$work/one_task_per_rank-${averages##* }-declared-prune_true.log" || true)
if { [ "$world" -eq 1 ] && [ "$adopted" -gt 0 ]; } || { [ "$world" -gt 1 ] && [ "$adopted" -eq 0 ]; }; then
  echo "ok   adopted gradients: $adopted log lines (W=$world)"
else
  echo "FAIL adopted gradients: $adopted log lines (W=$world)"; fails=$((fails + 1))
fi
echo "equivalence (W=$world): $runs runs, $fails failures"
[ "$fails" -eq 0 ]
