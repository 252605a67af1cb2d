#!/usr/bin/env bash
# Asynchronous checkpoints (checkpoint.async): the files and the final parameters equal the
# synchronous ones (offload off and on); a kill -9 while a background write is in flight leaves
# the previous checkpoint the newest complete one, and resuming from it is bitwise; a full disk
# during a background write is a clear exit 1 with nothing published and the previous checkpoint
# intact; SIGTERM during a background write still ends with exit 4 and a complete checkpoint.
# Slow and failing writes come from the writer's test aids THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS
# and THETAD_TEST_CHECKPOINT_ENOSPC_RANK (docs/configuration.md, checkpoint).
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
run() { mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" "$@"; }

# The runs that need no signal, no test aid and no run before them, queued: one start
# (run_queue); the uninterrupted runs the resumes below are held to, and step 10 before a full disk.
for off in false true; do
  for mode in true false; do
    queue "eq_${off}_$mode" 2 0 "$job" --no-resume --set steps=12 --set checkpoint.every_steps=3 \
      --set checkpoint.keep=10 --set checkpoint.async=$mode --set offload.enabled=$off \
      --set checkpoint.dir="$WORK/eq_${off}_$mode"
  done
done
queue uninterrupted 2 0 "$job" --no-resume --set checkpoint.every_steps=5 --set checkpoint.dir="$WORK/uninterrupted"
queue before_full 2 0 "$job" --no-resume --set steps=10 --set checkpoint.every_steps=5 --set checkpoint.dir="$WORK/full"
run_queue

# 1. async == sync: the same final hash and byte-identical checkpoint files, offload off and on.
for off in false true; do
  same_hash "offload $off: async == sync final parameters" "eq_${off}_true" "eq_${off}_false"
  n=$(find "$WORK/eq_${off}_true" -name 'shard-*.pt' | wc -l)
  if [ "$n" -ge 4 ] && diff -r "$WORK/eq_${off}_true" "$WORK/eq_${off}_false" -x .lock > "$WORK/diff_$off.txt"; then
    pass "offload $off: async and sync checkpoints are the same files ($n shards, manifests included)"
  else fail "offload $off: checkpoint files differ ($n shards)"; head "$WORK/diff_$off.txt"; fi
  expect_in "eq_${off}_true" "checkpoint written: .*step-00000003 \(asynchronous: the trainer stalled"
  expect_in "eq_${off}_false" "checkpoint written: .*step-00000003 \(synchronous: the trainer stalled"
done

# 2. kill -9 of every rank while the write of step 10 is in flight: step 5 stays the newest
# complete checkpoint, and a resume from it ends with the uninterrupted hash.
THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS=3000 run --no-resume --set job=kill-$$ --set checkpoint.every_steps=5 \
  --set checkpoint.dir="$WORK/kill" > "$WORK/kill.log" 2>&1 &
mpirun_pid=$!
if wait_for 60 exists "$WORK/kill/step-00000005/manifest.json" && wait_for 60 exists "$WORK/kill/.tmp-step-00000010"; then
  # shellcheck disable=SC2046
  kill -9 $(ranks_of "kill-$$")
  wait "$mpirun_pid" || true
  [ "$(newest "$WORK/kill")" = step-00000005 ] && [ ! -e "$WORK/kill/step-00000010" ] \
    && pass "kill -9 mid-write: step-00000005 is the newest complete checkpoint" \
    || fail "kill -9 mid-write: newest is '$(newest "$WORK/kill")'"
else
  fail "kill -9: no write of step 10 in flight seen"; kill -9 $(ranks_of "kill-$$") 2>/dev/null; wait "$mpirun_pid" || true
  tail -5 "$WORK/kill.log"
fi
# (Its resume is queued below.)

# 3. A full disk on rank 1 during the background write of step 15 (checkpoints 5 and 10 were
# written before): exit 1 naming the checkpoint and the error, nothing of step 15 left, step 10
# intact (a resume from it ends with the uninterrupted hash).
sum10=$(cat "$WORK/full/step-00000010/manifest.json" | md5sum)
expect_code 1 disk_full env THETAD_TEST_CHECKPOINT_ENOSPC_RANK=1 \
  mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set checkpoint.every_steps=5 --set checkpoint.dir="$WORK/full"
expect_in disk_full "checkpoint at step 15 failed: checkpoint: short write to .*No space left on device \(the newest complete checkpoint in .* is unchanged\)"
expect_in disk_full "checkpoint at step 15 failed on another rank; .*\.tmp-step-00000015 removed"
[ "$(newest "$WORK/full")" = step-00000010 ] && [ -z "$(ls -A "$WORK/full" | grep -v -e '^step-0000000[5]$' -e '^step-00000010$' -e '^\.lock$')" ] \
  && [ "$(md5sum < "$WORK/full/step-00000010/manifest.json")" = "$sum10" ] \
  && pass "disk full: nothing of step 15 published or left, step-00000010 intact" \
  || fail "disk full: checkpoint dir holds $(ls -A "$WORK/full" | tr '\n' ' ')"
# (Its resume is queued below.)

# 4. SIGTERM to one rank while a background write is in flight: exit 4 after the in-flight
# checkpoint and a final one are published; resuming from it ends with the uninterrupted hash.
THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS=1500 run --no-resume --set job=term-$$ --set checkpoint.every_steps=5 \
  --set checkpoint.dir="$WORK/term" > "$WORK/term.log" 2>&1 &
mpirun_pid=$!
if wait_for 60 exists "$WORK/term/.tmp-step-00000005"; then kill -TERM "$(ranks_of "term-$$" | tail -1)"; fi
code=0
wait "$mpirun_pid" || code=$?
[ "$code" -eq 4 ] && pass "SIGTERM mid-write: exit 4" || { fail "SIGTERM mid-write: exit $code"; tail -20 "$WORK/term.log"; }
grep -q "checkpoint written: .*step-00000005 (asynchronous" "$WORK/term.log" \
  && pass "SIGTERM mid-write: the in-flight checkpoint was published first" || fail "SIGTERM: step 5 not published"
last=$(newest "$WORK/term")
[ -n "$last" ] && [ "$last" != step-00000005 ] && ! compgen -G "$WORK/term/.tmp-*" >/dev/null \
  && pass "SIGTERM mid-write: the stop's checkpoint $last is complete" || fail "SIGTERM: newest '$last'"
# The three resumes, queued: one start.
queue kill_resume 2 0 "$job" --set checkpoint.dir="$WORK/kill"
queue full_resume 2 0 "$job" --set checkpoint.every_steps=5 --set checkpoint.dir="$WORK/full"
queue term_resume 2 0 "$job" --set checkpoint.dir="$WORK/term"
run_queue
expect_in kill_resume "resumed from .*step-00000005 at step 5"
same_hash "resume after kill -9 mid-write == uninterrupted" kill_resume uninterrupted
expect_in full_resume "resumed from .*step-00000010 at step 10"
same_hash "resume after a full disk == uninterrupted" full_resume uninterrupted
expect_in term_resume "resumed from .*$last"
same_hash "resume after SIGTERM mid-write == uninterrupted" term_resume uninterrupted
# 5. Staging (ShardValues): the snapshot clones the tensors (on a GPU on their device; here, with
# the test aid THETAD_TEST_CHECKPOINT_STAGE_HOST, on the host) and the writer thread copies the
# clones out; the files are byte-identical to the synchronous ones of 1., so a resume is bitwise.
expect_code 0 staged env THETAD_TEST_CHECKPOINT_STAGE_HOST=1 mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" \
  --no-resume --set steps=12 --set checkpoint.every_steps=3 --set checkpoint.keep=10 --set checkpoint.async=true \
  --set offload.enabled=false --set checkpoint.dir="$WORK/staged"
expect_in staged "checkpoint of step 3: .*snapshot [0-9.]+ ms \(0*[.0]*[1-9][0-9.]* MB staged on the tensors' device, 0\.000 MB copied on the host\)"
expect_in eq_false_true "checkpoint of step 3: .*snapshot [0-9.]+ ms \(0\.000 MB staged on the tensors' device, 0*[.0]*[1-9][0-9.]* MB copied on the host\)"
same_hash "staged async == sync final parameters" staged eq_false_false
diff -r "$WORK/staged" "$WORK/eq_false_false" -x .lock > "$WORK/diff_staged.txt" \
  && pass "staged checkpoints are the same files as the synchronous ones" \
  || { fail "staged checkpoint files differ"; head "$WORK/diff_staged.txt"; }
[ -z "$(ranks_of "term-$$")$(ranks_of "kill-$$")" ] && pass "no process left" || fail "processes left"
finish
