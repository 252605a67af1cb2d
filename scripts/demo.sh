#!/usr/bin/env bash
# The README's first command: set up, build, and run the demo job (a small multi-task training
# job on 2 ranks on the CPU) through the launcher. Safe to run again: it starts fresh each time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
export THETAD_BIN="$root/build/daemon/thetad"
rm -rf "$root/runs/demo/ckpt"  # the demo's own checkpoints (--no-resume would set them aside)
"$root/launch/thetad-launch" --nproc-per-node 2 config/examples/demo.yaml --no-resume
echo "demo: metrics in runs/demo/metrics.jsonl, checkpoints in runs/demo/ckpt, logs in runs/demo/logs"
# The curves: loss_per_task.png (each task's loss falling: every task of both ranks, rank 0's records
# gather them), step_time.png, bytes.png.
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 bench/plot_metrics.py runs/demo/metrics.jsonl -o runs/demo/plots
  echo "demo: plots in $root/runs/demo/plots (loss_per_task.png, step_time.png, bytes.png)"
else
  echo "demo: no plots (python3-matplotlib missing: apt-get install python3-matplotlib, then" \
       "/usr/bin/python3 bench/plot_metrics.py runs/demo/metrics.jsonl -o runs/demo/plots)"
fi
