#!/usr/bin/env bash
# The README's first command: installs what the demo needs (Debian 12), builds thetad and its
# launcher, trains the demo job (config/examples/demo.yaml: 8 tasks on a shared trunk, 2 ranks on
# the CPU) through the launcher, and draws its curves. The terminal gets a few lines; the install
# and build logs go to build/setup-*.log, the ranks' logs to runs/demo/logs. Safe to run again:
# it installs nothing new, rebuilds only what changed, and trains the demo afresh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$SECONDS
"$root/scripts/setup.sh" --demo

job=config/examples/demo.yaml
run=runs/demo
# The demo's own outputs, so that each run starts from step 0 (--no-resume would move the old
# checkpoints to ckpt/previous-<time>/ and keep them).
rm -rf "$run/ckpt" "$run/plots" "$run/logs"
echo "demo: training 8 tasks on 2 CPU ranks, 300 steps (every rank's lines: $run/logs/launcher.log)"
t0=$SECONDS
# The ranks' lines go to the logs; the terminal shows rank 0's progress lines as they come.
rc=0
"$root/launch/thetad-launch" --nproc-per-node 2 "$job" --no-resume 2>&1 |
  grep --line-buffered -E '\] info: step [0-9]+/[0-9]+ \|' | sed -u 's/.*info: /  /' || rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "demo: the run failed (exit $rc); the last lines of $run/logs/launcher.log:" >&2
  tail -n 20 "$run/logs/launcher.log" >&2 || true
  exit "$rc"
fi
echo "demo: trained in $((SECONDS - t0)) s"

plots="not drawn"
if out=$(/usr/bin/python3 bench/plot_metrics.py "$run/metrics.jsonl" -o "$run/plots" 2>&1); then
  plots="$run/plots/ (loss_per_task.png, step_time.png, bytes.png)"
  sed -n 's/^plot_metrics: bytes.png: /demo: /p' <<<"$out"
else
  echo "$out" | tail -n 3 >&2
fi

checkpoints=""
for d in "$run"/ckpt/step-*; do [ -d "$d" ] && checkpoints+="${checkpoints:+ }${d##*/}"; done
echo "demo: done in $((SECONDS - start)) s. Where everything went:"
echo "  metrics      $run/metrics.jsonl (one JSON line per step)"
echo "  plots        $plots"
echo "  checkpoints  $run/ckpt/ (${checkpoints:-none})"
echo "  exports      none: this job exports nothing (export.adapters_dir, for transformer jobs)"
echo "  logs         $run/logs/ (launcher.log: every rank's lines; rank-0.log, rank-1.log)"
echo "  next         the README's \"Using it\": train on with --set steps=400 (resumes at step 300)"
