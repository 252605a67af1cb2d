#!/usr/bin/env bash
# The README's demo job (config/examples/demo.yaml) shows what thetad is for: each step leaves
# task heads unused, and their gradients are not sent. A few steps of it on 2 ranks, as the demo
# runs it: every record of rank 0 has bytes_pruned > 0 and buckets_pruned > 0, and thetad sends
# the share of DDP's bytes (allreduced + pruned) that the job's comment promises.
#   demo_prunes.sh THETAD
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck disable=SC2034 # run_np (lib.sh) runs it
thetad=$1
py=/usr/bin/python3
job="$HERE/../../config/examples/demo.yaml"

run_np demo 2 "$job" --set steps=6 --set checkpoint.every_steps=0 --set log.progress_every_s=0
[ -s "$WORK/demo.jsonl" ] || die "no metrics written"

# Rank 0's records: every step prunes; 4 of the 8 heads are used each step, and the heads'
# gradients make up most of DDP's bytes (the job sizes them so): thetad sends 0.33-0.67x them.
if out=$($py - "$WORK/demo.jsonl" 2>&1 <<'PY'
import json, sys
records = [r for r in map(json.loads, open(sys.argv[1])) if r["rank"] == 0]
assert len(records) == 6, f"{len(records)} records of rank 0, expected 6"
bad = [(r["step"], r["bytes_pruned"], r["buckets_pruned"]) for r in records
       if r["bytes_pruned"] <= 0 or r["buckets_pruned"] <= 0]
assert not bad, f"steps without pruning (step, bytes_pruned, buckets_pruned): {bad}"
sent = sum(r["bytes_allreduced"] for r in records)
ddp = sum(r["bytes_allreduced"] + r["bytes_pruned"] + r["bytes_kept"] for r in records)
assert 0.05 < sent / ddp < 0.67, f"thetad sends {sent / ddp:.3f}x DDP's bytes, expected 0.05-0.67"
print(f"every step prunes; thetad sends {sent / ddp:.3f}x DDP's bytes")
PY
); then pass "$out"; else fail "$out"; fi
finish
