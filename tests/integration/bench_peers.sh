#!/usr/bin/env bash
# The one-GPU benchmark's PyTorch peers on the CPU, tiny shapes (bench/peer/check_plain.sh):
# the plain loop's falling losses for each model (compiled-llama among them, eager here), the
# hand-written Llama of compiled-llama against the formula (logits, step 0's loss, falling
# losses), and the plain loop bitwise equal to the DDP peers on one gloo rank. Needs torch in
# /usr/bin/python3 (Debian's python3-torch, scripts/setup.sh); skipped without it.
#   bench_peers.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export PYTHONDONTWRITEBYTECODE=1 TMPDIR=$WORK  # nothing written into the source tree
py=/usr/bin/python3
[ -x "$py" ] && "$py" -c 'import torch' 2>/dev/null || skip "no torch in $py (python3-torch)"

expect_code 0 check_plain bash "$HERE/../../bench/peer/check_plain.sh" "$py"
for model in multitask lora compiled-llama; do
  expect_in check_plain "^plain_loop --check $model: ok"
done
for pass in "fused" "a pass per task"; do  # --fuse-tasks (the step's tasks in one base pass) and not
  expect_in check_plain "^compiled-llama logits \(float64, $pass\) vs the formula.*: ok$"
  expect_in check_plain "^compiled-llama logits \(bfloat16, $pass\) vs the formula.*: ok$"
done
expect_in check_plain "^compiled-llama --fuse-tasks: step 0 loss .*: ok$"
expect_in check_plain "^compiled-llama --no-fuse-tasks: step 0 loss .*: ok$"
expect_in check_plain "^check_plain: ok$"
finish
