#!/usr/bin/env bash
# The goal "checkpointing the LoRA job every 50 steps costs <= 2% of its throughput" (one GPU,
# not in CI): bench/jobs/lora-transformer.yaml for STEPS steps with a checkpoint every EVERY steps
# and with none, PAIRS times alternately (none, every, none, ...), then per run:
#  - the sum of step_ms over steps FROM..STEPS-2 (the last step's final checkpoint left out):
#    between runs, which a host whose speed drifts over minutes blurs (by 5-40% on the GPU hosts measured);
#  - within the run, each checkpoint's window (the step that takes it and the next EVERY/2 - 1)
#    against the window after it (EVERY/2 steps without a write): the cost of one checkpoint, and as a share
#    of 50 steps the cost of a checkpoint every 50 steps. Drift over seconds cancels; the run
#    without checkpoints shows what the same windows differ by on their own (its control).
#    EVERY=100 (the default) leaves each write 50 steps to finish in its window.
# and each checkpoint's "wrote ... linked ..." line. Run from the source root:
#   OUT=/tmp/out bash bench/checkpoint/every_steps.sh BUILD/daemon/thetad
# STEPS=N (460), FROM=S (60), EVERY=E (100), PAIRS=P (1), JOB=YAML (the LoRA job), SET="key=value ..." (each
# passed as --set, e.g. SET=precision=bf16). THETAD_TEST_CHECKPOINT_BACKGROUND_THREADS=N in the
# environment: the background write's threads (default half the rank's). INIT_FROM=DIR: the frozen base from a
# Hugging Face Llama directory (bench/gpu/write_llama_safetensors.py --layers 16 --heads 16
# --kv-heads 16 --ff 8192 writes one of the job's sizes): what a user fine-tuning a base does, and
# then the base is never written (the manifest records its path and fingerprint). Without it the
# random base is written once, by the first checkpoint (FROM past that write's window leaves it
# out).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$1; d=${OUT:-/tmp/out}/ckcost; mkdir -p $d
STEPS=${STEPS:-460} FROM=${FROM:-60} EVERY=${EVERY:-100} PAIRS=${PAIRS:-1} JOB=${JOB:-bench/jobs/lora-transformer.yaml}
INIT=(); [ -n "${INIT_FROM:-}" ] && INIT=(--set model.init_from="$INIT_FROM")
for kv in ${SET:-}; do INIT+=(--set "$kv"); done
for pair in $(seq 1 "$PAIRS"); do
  for every in 0 $EVERY; do
    tag=$every-$pair
    mpirun -np 1 --bind-to none $T run "$JOB" --no-resume --set steps=$STEPS "${INIT[@]}" \
      --set checkpoint.every_steps=$every --set checkpoint.dir=/tmp/ckcost-$every --set metrics.path=$d/m$tag.jsonl \
      > $d/log$tag.txt 2>&1 || { echo "every $every (pair $pair) failed"; tail -3 $d/log$tag.txt; }
    python3 - $d/m$tag.jsonl $every $FROM $((STEPS - 2)) $pair $EVERY <<'PY'
import json, sys
r = {x['step']: x['step_ms'] for x in map(json.loads, open(sys.argv[1]))}
every, lo, hi, pair, period = (int(a) for a in sys.argv[2:])
total = sum(ms for s, ms in r.items() if lo <= s <= hi)
steps = sorted(r.values())
print('pair %d every_steps %d: steps %d..%d %.2f s, median step %.1f ms' % (pair, every, lo, hi, total / 1e3, steps[len(steps) // 2]))
half = period // 2
win = lambda a: sum(r.get(s, 0.0) for s in range(a, a + half))
starts = [c for c in range(period, hi - period + 2, period) if c >= lo]
if starts:
    # Checkpoint c is taken at the end of the step recorded as c - 1 (records count from 0): its
    # stall is in that record.
    extra = [win(c - 1) - win(c - 1 + half) for c in starts]
    step = sum(win(c - 1 + half) for c in starts) / (half * len(starts))
    label = 'checkpoint' if every else 'no checkpoint (control)'
    print('  within the run, %s windows at %s: +%s ms against the next %d steps; mean %.1f ms = %.2f%% of 50 steps'
          % (label, starts, ', +'.join('%.0f' % e for e in extra), half, sum(extra) / len(extra),
             100 * sum(extra) / len(extra) / (50 * step)))
    # Where in the window it goes: each of its first 5 steps, averaged over the checkpoints,
    # against the mean step of the windows after them.
    first = [sum(r.get(c - 1 + k, 0.0) for c in starts) / len(starts) - step for k in range(5)]
    print('  the first 5 steps of those windows against that mean step (%.1f ms): %s ms'
          % (step, ', '.join('%+.1f' % x for x in first)))
PY
    grep -o "checkpoint step [0-9]*: wrote.*" $d/log$tag.txt | cut -c1-200 | head -8
    grep -o "asynchronous: the trainer stalled [^;]*" $d/log$tag.txt | head -8
    rm -rf /tmp/ckcost-$every
  done
done
