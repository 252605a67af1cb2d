#!/usr/bin/env bash
# Several nodes on one host (THETAD_SIMULATE_NODES, comm/node_split.hpp): 2 nodes x 2 ranks and
# 3 nodes x 1 rank. Offload on == off bitwise == the single-process reference; one host arena
# per node; each offloaded group stepped once per node per step it was used (every node's owner
# steps add up to a one-node run's); the launcher's per-node logs; resume of a 2-node run on 1
# node and the reverse; bad node counts exit 2. (A whole node killed: tests/launch/faults/node_kill.sh.)
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
job=$HERE/jobs/small.yaml
launcher=$(cd "$HERE/../.." && pwd)/launch/thetad-launch
off_args=(--set steps=20 --set model.tasks=6 --set offload.device_slots=2 --set offload.prefetch=1
          --set checkpoint.every_steps=10)
ref_args=(--set steps=20 --set model.tasks=6)  # the single-process reference: no offload, no checkpoints
# run NAME NODES NP OFFLOAD [ARGS...]: queues a run with NODES simulated nodes (0: none),
# checkpoints in $WORK/NAME; run_nodes NODES runs the queue (NODES for every run of it).
run() {
  local name=$1 nodes=$2 np=$3 offload=$4; shift 4
  queue "$name" "$np" 0 "$job" "${off_args[@]}" --set offload.enabled="$offload" --set checkpoint.dir="$WORK/$name" "$@"
}
run_nodes() { if (($1 == 0)); then run_queue; else run_queue -x "THETAD_SIMULATE_NODES=$1"; fi; }
same_hash() {  # NAME_A NAME_B WHAT
  local a b
  a=$(final_hash "$WORK/$1.log"); b=$(final_hash "$WORK/$2.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$3 ($a)"; else fail "$3: $1 $a != $2 $b"; fi
}
# split_ok NAME NODES NP: every rank logged its simulated node; NODES arenas, one per node.
split_ok() {
  local name=$1 nodes=$2 np=$3 per=$(($3 / $2)) r bad=0
  for ((r = 0; r < np; r++)); do
    grep -qE "rank $r of $np: node $((r / per)) of $nodes \(simulated\), node-local rank $((r % per)) of $per" \
      "$WORK/$name.log" || { bad=1; fail "$name: rank $r is not node $((r / per)), local rank $((r % per))"; }
  done
  ((bad)) || pass "$name: ranks split into $nodes simulated nodes of $per"
  local arenas
  arenas=$(grep -cE "host arena: .* shared by $per local ranks.*node-local rank 0\)" "$WORK/$name.log" || true)
  if [ "$arenas" -eq "$nodes" ]; then pass "$name: $arenas host arenas, one per node"
  else fail "$name: $arenas host arenas for $nodes nodes"; fi
}
# steps_per_node NAME NODES NP ONE_NODE_TOTAL: each node's owners stepped every used group once.
steps_per_node() {
  local name=$1 nodes=$2 per=$(($3 / $2)) want=$4 k ranks got bad=0
  for ((k = 0; k < nodes; k++)); do
    ranks=(); for ((r = k * per; r < (k + 1) * per; r++)); do ranks+=("$r"); done
    got=$(owner_steps "$WORK/$name.log" "${ranks[@]}")
    [ "$got" -eq "$want" ] || { bad=1; fail "$name: node $k's owners ran $got group steps, a one-node run $want"; }
  done
  ((bad)) || pass "$name: each of $nodes nodes ran the $want group steps of a one-node run"
}

# Every mpirun run is queued, and run by world size and node count, one start each (run_nodes).
# 2 nodes x 2 ranks and 3 nodes x 1 rank. The offload-on run of 2 x 2 goes through the launcher
# (its per-node logs).
run one_np4 0 4 true
run one_np3 0 3 true
# Resume across node counts (offload on), checked below: 2 nodes' step-20 checkpoint on 1 node,
# and 1 node's on 2 nodes, both to step 30, equal an uninterrupted 30-step run.
run full30 0 4 true --set steps=30
run_nodes 0
run n2x2_off 2 4 false
run resume_1to2 2 4 true --set steps=30 --set checkpoint.dir="$WORK/one_np4"
run_nodes 2
run n3x1_off 3 3 false
run n3x1_on 3 3 true
run_nodes 3
expect_code 0 n2x2_on "$launcher" --thetad "$thetad" --simulate-nodes 2 --nproc-per-node 2 \
  --log-dir "$WORK/n2x2_logs" "$job" "${off_args[@]}" --set offload.enabled=true \
  --set checkpoint.dir="$WORK/n2x2_on"
# (The references compare step 20, before a resume continues n2x2_on's checkpoints to step 30.)
queue_ref n2x2_reference 0 "$job" --world 4 "${ref_args[@]}" --compare "$WORK/n2x2_on"
queue_ref n3x1_reference 0 "$job" --world 3 "${ref_args[@]}" --compare "$WORK/n3x1_on"
run_queue
run resume_2to1 0 4 true --set steps=30 --set checkpoint.dir="$WORK/n2x2_on"
run_nodes 0

same_hash n2x2_off n2x2_on "2 nodes x 2: offload on == off bitwise"
same_hash one_np4 n2x2_on "2 nodes x 2 == 1 node x 4 bitwise"
split_ok n2x2_on 2 4
one=$(owner_steps "$WORK/one_np4.log")
if [ "$one" -gt 0 ]; then pass "one node x 4: $one owner group steps"; else fail "one node x 4: no owner steps logged"; fi
steps_per_node n2x2_on 2 4 "$one"
for k in 0 1; do
  f=$WORK/n2x2_logs/node-$k.log
  if [ -f "$f" ] && [ "$(grep -oE '^\[[^]]*\] \[rank [0-9]+\]' "$f" | sed -E 's/.*rank ([0-9]+).*/\1/' | sort -u | paste -sd,)" = "$((2 * k)),$((2 * k + 1))" ]; then
    pass "launcher: node-$k.log holds ranks $((2 * k)) and $((2 * k + 1))"
  else fail "launcher: node-$k.log missing or with other ranks"; fi
done
same_hash n3x1_off n3x1_on "3 nodes x 1: offload on == off bitwise"
split_ok n3x1_on 3 3
steps_per_node n3x1_on 3 3 "$(owner_steps "$WORK/one_np3.log")"
expect_in resume_2to1 "resumed from .*step-00000020 at step 20"
expect_in resume_1to2 "resumed from .*step-00000020 at step 20"
same_hash full30 resume_2to1 "2-node checkpoint resumed on 1 node == uninterrupted"
same_hash full30 resume_1to2 "1-node checkpoint resumed on 2 nodes == uninterrupted"

# Bad node counts start nothing: exit 2, saying why (thetad itself, and the launcher first).
expect_code 2 bad_thetad mpirun "${MPIRUN_FLAGS[@]}" -x THETAD_SIMULATE_NODES=3 -np 4 "$thetad" run "$job" --no-resume
expect_in bad_thetad "THETAD_SIMULATE_NODES='3': .*divides"
expect_code 2 bad_launcher "$launcher" --thetad "$thetad" --simulate-nodes 0 --nproc-per-node 2 "$job"
expect_in bad_launcher "--simulate-nodes must be a whole number from 1 to"
expect_code 2 bad_launcher_env env THETAD_SIMULATE_NODES=5 "$launcher" --thetad "$thetad" --nproc-per-node 2 \
  --log-dir "$WORK/bad_logs" "$job"
expect_in bad_launcher_env "THETAD_SIMULATE_NODES='5'"
finish
