#!/usr/bin/env bash
# SIGTERM to one rank mid-run: all ranks agree, finish the step, write a complete checkpoint
# and exit 4; mpirun exits 4. A second run resumes from it.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set steps=100000 --set job=sigterm-$$ \
  --set checkpoint.dir="$WORK/ckpt" --set metrics.path="$WORK/metrics.jsonl" --no-resume \
  > "$WORK/run.log" 2>&1 &
mpirun_pid=$!
for _ in $(seq 1 300); do
  [ -s "$WORK/metrics.jsonl" ] && [ "$(wc -l < "$WORK/metrics.jsonl")" -ge 5 ] && break
  sleep 0.1
done
victim=$(pgrep -f "thetad run .*sigterm-$$" | tail -1)
kill -TERM "$victim"
code=0
wait "$mpirun_pid" || code=$?
[ "$code" -eq 4 ] && pass "exit 4 after SIGTERM" || { fail "exit $code after SIGTERM"; tail -20 "$WORK/run.log"; }
ck=$(find "$WORK/ckpt" -maxdepth 2 -name manifest.json | head -1)
[ -n "$ck" ] && pass "complete checkpoint $(dirname "$ck")" || fail "no complete checkpoint"
grep -q "stop requested" "$WORK/run.log" && pass "ranks agreed to stop" || fail "no stop line"
[ -z "$(pgrep -f "thetad run .*sigterm-$$")" ] && pass "no process left" || fail "processes left"
finish
