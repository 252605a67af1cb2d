#!/usr/bin/env bash
# Issue 34's "checkpointing the LoRA job every 50 steps costs <= 2% of its throughput" (one GPU,
# not in CI): bench/jobs/lora-transformer.yaml for 300 steps with a checkpoint every 50 steps and
# with none, the sum of step_ms over steps 20..298 of each (the last step's final checkpoint left
# out) and each checkpoint's "wrote ... linked ..." line. Run from the source root:
#   OUT=/tmp/out bash bench/checkpoint/every_steps.sh BUILD/daemon/thetad
# STEPS=N (300) and FROM=S (20): the run's steps and the first step summed; a steady state
# leaves out the first checkpoint, which writes the random frozen base once (STEPS=500 FROM=150:
# the base's write ends before step 150; a base from model.init_from is never written).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$1; d=${OUT:-/tmp/out}/ckcost; mkdir -p $d
STEPS=${STEPS:-300} FROM=${FROM:-20}
for every in 0 50; do
  mpirun -np 1 --bind-to none $T run bench/jobs/lora-transformer.yaml --no-resume --set steps=$STEPS \
    --set checkpoint.every_steps=$every --set checkpoint.dir=/tmp/ckcost-$every --set metrics.path=$d/m$every.jsonl \
    > $d/log$every.txt 2>&1 || { echo "every $every failed"; tail -3 $d/log$every.txt; }
  python3 - $d/m$every.jsonl $every $FROM $((STEPS - 2)) <<'PY'
import json,sys
r=[json.loads(l) for l in open(sys.argv[1])]
lo,hi=int(sys.argv[3]),int(sys.argv[4])
s=sum(x['step_ms'] for x in r if lo<=x['step']<=hi)
print('every_steps', sys.argv[2], 'steps %d..%d: %.2f s' % (lo,hi,s/1e3), 'median step %.1f ms' % sorted(x['step_ms'] for x in r)[len(r)//2])
PY
  grep -o "checkpoint step [0-9]*: wrote.*" $d/log$every.txt | cut -c1-200 | head -8
  rm -rf /tmp/ckcost-$every
done
