#!/usr/bin/env bash
# 2 simulated nodes x 1 GPU over NCCL (ctest label gpu; skips cleanly without a GPU; CI has none).
# Each simulated node is a host to NCCL too (NCCL_HOSTID, comm/node_split.hpp): the two ranks
# talk over NCCL's network transport (sockets on loopback), as two machines would. With 2 GPUs
# each node has its own; with one GPU both nodes share it, which NCCL allows across hosts.
#  1. the split: every rank names its node, NCCL's host id and a NET transport; one host arena
#     per node;
#  2. offload with the device cache == offload off, bitwise (the same fused AdamW on the same
#     values); offload through the host (no cache: each node's owner runs the CPU AdamW) within
#     float tolerance, and each node's owner stepped the same groups (every used group once per
#     node per step);
#  3. resume of the 2-node checkpoint == an uninterrupted run, bitwise; with 2 GPUs also the
#     2-node run == one node x 2 GPUs, and the 2-node checkpoint resumed on one node;
#  4. the trunk streamed from each node's host with activations and θ[t] offloaded (on
#     several ranks) == all-resident within float tolerance;
#  5. a whole node killed: exit 3 naming it within comm.timeout_s, and a rerun resumes
#     (tests/launch/faults/node_kill.sh with FAULT_BACKEND=nccl).
#   gpu_simulated_nodes.sh THETAD
source "$(dirname "$0")/lib.sh"
thetad=$1
skip_without_gpu  # ctest: Skipped, not Passed
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
job=$HERE/jobs/small.yaml
common=(--set comm.backend=nccl --set model.hidden=256 --set model.input_dim=64 --set model.tasks=6
        --set data.batch_per_rank=64 --set steps=20 --set checkpoint.every_steps=10 --set log.level=info
        --set offload.device_slots=2 --set offload.prefetch=1)
# NCCL over loopback sockets between the simulated hosts (the GPU machine reaches nothing else).
nccl_env=(-x NCCL_NVLS_ENABLE=0 -x NCCL_SOCKET_IFNAME=lo)
# run NAME NODES [ARGS...]: 2 ranks (NODES simulated nodes; 0: one node, needs 2 GPUs), with
# extra_env's -x flags too.
extra_env=()
run() {
  local name=$1 nodes=$2; shift 2
  local env=("${nccl_env[@]}" "${extra_env[@]}")
  ((nodes == 0)) || env+=(-x "THETAD_SIMULATE_NODES=$nodes")
  expect_code 0 "$name" mpirun "${MPIRUN_FLAGS[@]}" "${env[@]}" -np 2 "$thetad" run "$job" \
    "${common[@]}" --set checkpoint.dir="$WORK/$name" "$@"
}

# 1. The split, NCCL's view of it, one arena per node.
extra_env=(-x NCCL_DEBUG=INFO)  # NCCL names the transport of each channel
run n2_off 2 --set offload.enabled=false
extra_env=()
for r in 0 1; do
  expect_in n2_off "rank $r of 2: node $r of 2 \(simulated\), node-local rank 0 of 1"
  expect_in n2_off "\[rank $r\].*NCCL host id '.*/simulated-node-$r'"
done
expect_in n2_off "via NET/"
if [ "$ngpu" -eq 1 ]; then  # both nodes on GPU 0: each sizes its auto budgets as half of it
  expect_in n2_off "\[rank 0\].*GPU .* is shared by 2 ranks of this host"
  run n2_cache_auto 2 --set offload.enabled=true --set offload.device_cache_mb=auto
  expect_in n2_cache_auto "\[rank 1\].*device cache \(sized after the first step\): 6 lines"
fi
# A cache of a fixed size holds every group from the first step. (With `auto` it is sized after
# the first step, whose groups the host's CPU AdamW updates: equal within tolerance, not bitwise.)
cache=(--set offload.enabled=true --set offload.device_cache_mb=64)
run n2_cache 2 "${cache[@]}"
arenas=$(grep -cE "host arena: .* shared by 1 local ranks.*node-local rank 0\)" "$WORK/n2_cache.log" || true)
if [ "$arenas" -eq 2 ]; then pass "2 host arenas, one per node"; else fail "$arenas host arenas for 2 nodes"; fi

# 2. Offload on == off; the host path on each node's owner.
same_hash "2 nodes x 1 GPU: offload (device cache) == offload off bitwise" n2_off n2_cache
run n2_host 2 --set offload.enabled=true --set offload.device_cache_mb=0
s0=$(owner_steps "$WORK/n2_host.log" 0); s1=$(owner_steps "$WORK/n2_host.log" 1)
if [ "$s0" -gt 0 ] && [ "$s0" -eq "$s1" ]; then pass "each node's owner ran $s0 group steps"
else fail "owner group steps: node 0 $s0, node 1 $s1"; fi
py=$(command -v python3 || echo /usr/bin/python3)
if out=$("$py" "$HERE/compare_checkpoints.py" "$WORK/n2_off" "$WORK/n2_host" 2>&1); then
  pass "offload through the host vs offload off: $out"; else fail "offload through the host: $out"; fi

# 3. Resume, bitwise; and against one node where there are 2 GPUs.
run n2_full30 2 "${cache[@]}" --set steps=30
run n2_resume30 2 "${cache[@]}" --set steps=30 --set checkpoint.dir="$WORK/n2_cache"
expect_in n2_resume30 "resumed from .*step-00000020 at step 20"
same_hash "2 nodes: resumed at step 20 == uninterrupted" n2_full30 n2_resume30
run n2_off_full30 2 --set offload.enabled=false --set steps=30
run n2_off_resume30 2 --set offload.enabled=false --set steps=30 --set checkpoint.dir="$WORK/n2_off"
same_hash "2 nodes, offload off: resumed at step 20 == uninterrupted" n2_off_full30 n2_off_resume30
if [ "$ngpu" -ge 2 ]; then
  run one_off 0 --set offload.enabled=false
  same_hash "2 nodes x 1 GPU == 1 node x 2 GPUs bitwise" one_off n2_off
  run one_resume30 0 "${cache[@]}" --set steps=30 --set checkpoint.dir="$WORK/n2_cache"
  expect_in one_resume30 "resumed from .*step-00000020 at step 20"
  same_hash "2-node checkpoint resumed on 1 node == uninterrupted" n2_full30 one_resume30
else
  echo "note: one GPU: both simulated nodes share it; the one-node comparisons need 2 GPUs"
fi

# 4. Both nodes stream the trunk from their host (2 of 5 layers kept on the device), offload
#    their activations and θ[t]: the same parameters as all-resident within float tolerance.
tr=(--set model.trunk_layers=5)
run n2_trunk_resident 2 "${tr[@]}" --set offload.enabled=false
run n2_trunk_stream 2 "${tr[@]}" --set offload.shared=stream --set offload.shared_device_layers=2 \
  --set offload.activations=true --set offload.enabled=true
expect_in n2_trunk_stream "2 layers kept on the device"
if out=$("$py" "$HERE/compare_checkpoints.py" "$WORK/n2_trunk_resident" "$WORK/n2_trunk_stream" 2>&1); then
  pass "2 nodes: streamed trunk, activations and θ[t] offloaded vs all-resident: $out"
else fail "2 nodes: streamed trunk vs all-resident: $out"; fi

# 5. A whole node killed.
if out=$(FAULT_BACKEND=nccl NCCL_SOCKET_IFNAME=lo bash "$HERE/../launch/faults/node_kill.sh" "$thetad" 2>&1); then
  pass "node kill over NCCL: $(echo "$out" | grep '^ok' | paste -sd';')"
else fail "node kill over NCCL: $(echo "$out" | tail -5)"; fi
finish
