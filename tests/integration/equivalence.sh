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
# With W = 8 the ranks form 2 simulated nodes of 4 (THETAD_SIMULATE_NODES, comm/node_split.hpp),
# as two hosts would: nothing may assume 4 ranks or fewer, nor one node. There each schedule also
# runs with the host store (offload on, one host arena per node shared by its 4 ranks), bitwise
# equal to offload off.
# All runs of the test are the jobs of one `thetad run-jobs` (one process start per rank for the
# lot), and all comparisons the cases of one `thetad_reference --cases`.
#   equivalence.sh THETAD REFERENCE W
source "$(dirname "$0")/lib.sh"
thetad=$1 reference=$2 world=$3
averages="contributors world" actives="declared discover"
if [ "$world" -eq 1 ]; then averages=contributors actives=declared; fi
nodes=0
if [ "$world" -eq 8 ]; then nodes=2; fi
job=$HERE/jobs/equiv.yaml

# Rank r > 0 trains task 0 and task 1 + (r - 1) % 3: tasks 1..3 are each shared from 5 ranks on.
per_rank="[[0]"; for ((r = 1; r < world; r++)); do per_rank+=",[0,$((1 + (r - 1) % 3))]"; done; per_rank+="]"
schedule_names="one_task_per_rank several_tasks_per_rank task_shared_by_ranks task_unused accumulate_2 alternate_frozen"
declare -A schedules=(
  [one_task_per_rank]="--set data.schedule=round_robin"
  [several_tasks_per_rank]="--set data.schedule=round_robin --set data.tasks_per_rank=2"
  [task_shared_by_ranks]="--set data.schedule=per_rank --set data.per_rank=$per_rank"
  [task_unused]="--set data.schedule=weighted --set data.weights=[1,1,1,1,0]"
  [accumulate_2]="--set data.schedule=round_robin --set accumulate_steps=2"
  [alternate_frozen]="--set data.schedule=alternate --set data.alternate=[shared,tasks,task:2]"
)
# The host store with fewer device slots than tasks (evictions), but for the schedule that holds
# every task until its optimizer step.
offload_sets() {
  local slots=2
  [ "$1" != alternate_frozen ] || slots=5
  echo "--set offload.enabled=true --set offload.device_slots=$slots --set offload.prefetch=1"
}

# A run is "SCHED AVERAGE ACTIVE PRUNE [offload]"; its name, and its overrides (files under
# $WORK/NAME) for thetad and the reference alike.
name_of() { local n="$1-$2-$3-prune_$4"; [ -z "${5:-}" ] || n+="-offload"; echo "$n"; }
sets_of() {
  local dir
  dir=$WORK/$(name_of "$@")
  echo "${schedules[$1]} --set comm.average=$2 --set comm.active=$3 --set comm.prune=$4" \
       "--set checkpoint.dir=$dir/ckpt --set metrics.path=$dir/metrics.jsonl --set log.level=info" \
       "$([ -z "${5:-}" ] || offload_sets "$1")"
}
runs=()
for sched in $schedule_names; do
  for average in $averages; do
    for active in $actives; do
      for prune in true false; do runs+=("$sched $average $active $prune"); done
    done
  done
  ((nodes == 0)) || runs+=("$sched contributors declared true offload")
done

# Every run, in order, in one list; a run's output goes to $WORK/NAME.log.
: > "$WORK/runs.list"
for run in "${runs[@]}"; do
  # shellcheck disable=SC2086
  echo "$WORK/$(name_of $run).log $job --no-resume $(sets_of $run)" >> "$WORK/runs.list"
done
env=()
((nodes == 0)) || env=(-x "THETAD_SIMULATE_NODES=$nodes")
start=$SECONDS
rc=0
mpirun "${MPIRUN_FLAGS[@]}" "${env[@]}" -np "$world" "$thetad" run-jobs "$WORK/runs.list" > "$WORK/runs.out" 2>&1 || rc=$?
echo "${#runs[@]} runs on $world ranks in one start: $((SECONDS - start)) s (exit $rc)"
((rc == 0)) || { echo "---- mpirun's output:"; tail -20 "$WORK/runs.out"; }

# The runs that ended with a hash; the prune-on runs without offload, each compared with the
# reference (all in one start). Prune off is held to prune on's bits, and offload on to offload
# off's, below: a reference run of theirs would add nothing but time.
declare -A hash=()
: > "$WORK/reference.list"
for run in "${runs[@]}"; do
  # shellcheck disable=SC2086
  name=$(name_of $run)
  hash[$name]=$(final_hash "$WORK/$name.log" 2>/dev/null || true)
  if [ -z "${hash[$name]}" ]; then
    fail "$name: thetad run failed"; tail -20 "$WORK/$name.log" 2>/dev/null || echo "(not run: the list ended before it)"
    continue
  fi
  case $name in
    # shellcheck disable=SC2086
    *-prune_true) echo "$name $job --world $world $(sets_of $run) --compare $WORK/$name/ckpt" >> "$WORK/reference.list" ;;
    *) pass "$name: ran (its hash is compared below)" ;;
  esac
done
if [ -s "$WORK/reference.list" ]; then
  start=$SECONDS
  "$reference" --cases "$WORK/reference.list" > "$WORK/reference.out" 2>&1 || true
  echo "$(wc -l < "$WORK/reference.list") reference comparisons in one start: $((SECONDS - start)) s"
  while read -r name _; do
    verdict=$(grep "^$name " "$WORK/reference.out" || true)
    case $verdict in
      "$name ok: "*) pass "${verdict/ ok: /: }" ;;
      "$name FAIL: "*) fail "${verdict/ FAIL: /: }" ;;
      *) fail "$name: no verdict from the reference"; tail -5 "$WORK/reference.out" ;;
    esac
  done < "$WORK/reference.list"
fi
# same_bits WHAT A B: runs A and B ended with bitwise the same parameters.
same_bits() {
  if [ -n "${hash[$2]}" ] && [ "${hash[$2]}" = "${hash[$3]:-}" ]; then pass "$1 (${hash[$2]})"
  else fail "$1: not bitwise identical (${hash[$2]} vs ${hash[$3]:-})"; fi
}
for run in "${runs[@]}"; do
  # shellcheck disable=SC2086
  name=$(name_of $run)
  case $name in
    *-prune_true) same_bits "${name%-prune_true}: prune on/off" "$name" "${name%_true}_false" ;;
    *-offload) same_bits "${name%-offload}: offload on/off" "${name%-offload}" "$name" ;;
  esac
done

# Bytes: with the fixed per_rank schedule the active tasks are known: task 0 (every rank: reduced)
# and task 1 + (r - 1) mod 3 on rank r >= 1. A task one rank alone trains is kept by it
# (comm.sole_user: keep), nothing sent; one that several ranks train (from 5 ranks on) is reduced.
theta_shared=$(( (12 * 16 + 16) + (16 * 16 + 16) ))
theta_task=$(( (16 * 16 + 16) + (16 * 1 + 1) ))
readers=(0 0 0 0); for ((r = 1; r < world; r++)); do readers[1 + (r - 1) % 3]=$((readers[1 + (r - 1) % 3] + 1)); done
alone=0 shared=0
for t in 1 2 3; do
  if [ "${readers[t]}" -eq 1 ]; then alone=$((alone + 1)); elif [ "${readers[t]}" -gt 1 ]; then shared=$((shared + 1)); fi
done
expect="$(( 4 * (theta_shared + (1 + shared) * theta_task) )) $(( 4 * alone * theta_task ))"
got=$(/usr/bin/python3 -c '
import json,sys
vals={(json.loads(l)["bytes_allreduced"], json.loads(l)["bytes_kept"]) for l in open(sys.argv[1])}
print(" ".join("%d %d" % v for v in sorted(vals)))' "$WORK/task_shared_by_ranks-contributors-declared-prune_true/metrics.jsonl" || true)
if [ "$got" != "$expect" ]; then
  fail "bytes_allreduced and bytes_kept per step: got $got, expected exactly $expect"
else
  pass "bytes_allreduced, bytes_kept per step = $got = 4 x (|Θ| + (1 + $shared) x |θ[t]|), 4 x $alone x |θ[t]|"
fi
# From 3 ranks on, the buckets of a task one rank trained go as a broadcast from that rank (the
# parameters were checked above); with 2 ranks, never.
bc=$(/usr/bin/python3 -c '
import json,sys
print(sum(json.loads(l)["buckets_broadcast"] for l in open(sys.argv[1])))' "$WORK/one_task_per_rank-${averages##* }-declared-prune_true/metrics.jsonl" || echo -1)
if { [ "$world" -ge 3 ] && [ "$bc" -gt 0 ]; } || { [ "$world" -lt 3 ] && [ "$bc" -eq 0 ]; }; then
  pass "buckets sent as broadcasts: $bc (W=$world)"
else
  fail "buckets sent as broadcasts: $bc (W=$world)"
fi
# A world of one took the adopted path (the engine says so at start-up), the others never.
adopted=$(grep -c "gradients adopted from autograd" "$WORK/one_task_per_rank-${averages##* }-declared-prune_true.log" || true)
if { [ "$world" -eq 1 ] && [ "$adopted" -gt 0 ]; } || { [ "$world" -gt 1 ] && [ "$adopted" -eq 0 ]; }; then
  pass "adopted gradients: $adopted log lines (W=$world)"
else
  fail "adopted gradients: $adopted log lines (W=$world)"
fi
# Simulated nodes: every rank is in its node, and each node has its own host arena.
if ((nodes > 0)); then
  per=$((world / nodes)) bad=0 log=$WORK/one_task_per_rank-contributors-declared-prune_true-offload.log
  for ((r = 0; r < world; r++)); do
    grep -qE "rank $r of $world: node $((r / per)) of $nodes \(simulated\), node-local rank $((r % per)) of $per" \
      "$log" || bad=1
  done
  if ((bad == 0)); then pass "$world ranks split into $nodes simulated nodes of $per"
  else fail "ranks not split into $nodes simulated nodes of $per"; fi
  arenas=$(grep -cE "host arena: .* shared by $per local ranks.*node-local rank 0\)" "$log" || true)
  if [ "$arenas" -eq "$nodes" ]; then pass "$arenas host arenas, one per node"
  else fail "$arenas host arenas for $nodes nodes"; fi
fi
echo "equivalence (W=$world): ${#runs[@]} runs"
finish
