#!/usr/bin/env bash
# a running job notices that its checkpoint.dir was removed (exit 1
# naming it, the directory not recreated without its lock); a second job on the same metrics.path
# is refused (exit 2 naming the holder) and the first one's records survive whole; a metrics file
# inside checkpoint.dir is refused before anything starts; a log.file that takes no line
# (/dev/full) ends the run with exit 1 naming it, as a metrics file that cannot be written does.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
long=(--no-resume --set steps=10000000 --set log.level=info)

# The checkpoint directory removed under a running job.
"$thetad" run "$job" "${long[@]}" --set checkpoint.dir="$WORK/ck" --set checkpoint.every_steps=20 \
  --set checkpoint.async=false > "$WORK/gone.log" 2>&1 &
pid=$!
wait_for 60 exists "$WORK/ck/step-*/manifest.json" || fail "no first checkpoint"
# (The job writes into it meanwhile: rm may find a directory refilled under it; again until gone.)
for _ in $(seq 1 100); do rm -rf "$WORK/ck" 2>/dev/null && break; sleep 0.05; done
code=0
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { fail "the job ran on without its checkpoint.dir"; kill -9 "$pid"; }
wait "$pid" || code=$?
[ "$code" -eq 1 ] && pass "checkpoint.dir removed: exit 1" || fail "checkpoint.dir removed: exit $code"
expect_in gone "checkpoint.dir $WORK/ck: (the directory|its .lock) is gone: it was removed or replaced while this job ran"
[ ! -e "$WORK/ck" ] && pass "checkpoint.dir not recreated" || fail "checkpoint.dir recreated: $(ls -a "$WORK/ck")"

# Two jobs on one metrics file: the second is refused, the first one's records stay whole.
"$thetad" run "$job" "${long[@]}" --set metrics.path="$WORK/m.jsonl" > "$WORK/first.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$WORK/m.jsonl" ] && break; sleep 0.1; done
expect_code 2 second "$thetad" run "$job" --no-resume --set steps=5 --set metrics.path="$WORK/m.jsonl"
expect_in second "m.jsonl: metrics.path is in use by another job \(pid $pid on "
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
[ "$code" -eq 4 ] && pass "first job: exit 4 after SIGTERM" || fail "first job: exit $code"
$py - "$WORK/m.jsonl" <<'PY' && pass "first job's records whole" || fail "first job's records"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps and steps == list(range(len(steps))), steps[:20]
PY

# A metrics file inside checkpoint.dir: refused before anything starts.
expect_code 2 inside "$thetad" run "$job" --no-resume --set checkpoint.dir="$WORK/c2" \
  --set metrics.path="$WORK/c2/metrics.jsonl"
expect_in inside "metrics.path: '$WORK/c2/metrics.jsonl' lies inside checkpoint.dir"
[ ! -e "$WORK/c2" ] && pass "nothing written" || fail "something written: $(ls -a "$WORK/c2")"

# A log that cannot be written: exit 1 at once naming the file, on stderr; as a metrics file.
expect_code 1 devfull_log "$thetad" run "$job" --no-resume --set steps=5 --set log.file=/dev/full
expect_in devfull_log "/dev/full: writing the log failed \(log.file\): No space left on device"
expect_code 1 devfull_metrics "$thetad" run "$job" --no-resume --set steps=5 --set metrics.path=/dev/full
expect_in devfull_metrics "/dev/full: writing metrics failed"
finish
