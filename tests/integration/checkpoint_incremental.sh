#!/usr/bin/env bash
# Incremental checkpoints: a checkpoint writes Θ and the task groups trained
# since the newest complete one and hard-links the files of the others; every directory stays
# complete (keep=2 prunes older ones without breaking newer ones) and resumes to bitwise the
# parameters of an uninterrupted run, on 1 rank (synchronous) and 2 ranks (asynchronous); a flipped
# byte in a shared file, or a shared file removed, is exit 2 naming the file and a group it holds,
# and nothing is deleted. A manifest that maps a group to the stale copy an older shared file
# still holds is refused (its own checksum; behind a recomputed one, the group's step count). A
# shared file damaged while the job runs is never linked into the next checkpoint: that one is
# written again with the file's groups anew, and resumes. A checkpoint of step 10^8 (a 9-digit
# directory name) resumes and is pruned like any other.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
# 8 tasks, round_robin: W tasks per step, a checkpoint every 2 steps changes 2W of them.
run() { local np=$1; shift; mpirun "${MPIRUN_FLAGS[@]}" -np "$np" "$thetad" run "$job" --set model.tasks=8 \
          --set checkpoint.every_steps=2 --set checkpoint.keep=2 --set log.level=info "$@"; }

for mode in "1 false" "2 true"; do
  set -- $mode; np=$1 async=$2; name=np${np}
  expect_code 0 ${name}_plain run "$np" --set steps=12 --no-resume --set checkpoint.dir="$WORK/${name}_plain"
  expect_code 0 ${name}_first run "$np" --set steps=6 --no-resume --set checkpoint.async=$async \
    --set checkpoint.dir="$WORK/$name"
  # The files each checkpoint wrote hold exactly Θ and the groups whose step counts changed since
  # the checkpoint before; the others are hard links to that checkpoint's files.
  ls "$WORK/$name" > "$WORK/$name.dirs"
  [ "$(grep -c '^step-' "$WORK/$name.dirs")" = 2 ] && pass "$name: keep=2 left 2 checkpoints" || fail "$name: $(cat "$WORK/$name.dirs")"
  expect_code 0 ${name}_resumed run "$np" --set steps=12 --set checkpoint.async=$async --set checkpoint.dir="$WORK/$name"
  expect_in ${name}_resumed "resumed from .*step-00000006 at step 6"
  same_hash "$name: checkpointed incrementally, pruned and resumed == uninterrupted" ${name}_plain ${name}_resumed
  $py - "$WORK/$name/step-00000010" "$WORK/$name/step-00000012" "$np" <<'PY' \
    && pass "$name: each checkpoint wrote Θ + the changed groups only, linked the rest" || fail "$name: files written"
import json, os, sys, torch
step10, step12, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
def groups(d):
    """group -> (file, steps) of a checkpoint; every file checked against its manifest's bytes"""
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["format"] == "thetad-checkpoint-6", m["format"]
    out = {}
    for first, count, f, steps in m["runs"]:
        for g in range(first, first + count):
            name = m["files"][f]["file"]
            t = torch.load(os.path.join(d, name))
            at = t["groups"].tolist().index(g)
            assert t["param"].numel() * 12 == m["files"][f]["bytes"]
            assert int(t["steps"][at]) == steps, (g, steps)  # the run's step count is the file's
            out[g] = (name, steps)
    return out
a, b = groups(step10), groups(step12)
changed = {g for g in b if b[g][1] != a[g][1]}
assert 0 in changed and len(changed) == 1 + 2 * np, changed  # Θ and 2 steps x W tasks
new = {g for g in b if not (b[g][0] in {v[0] for v in a.values()} and
       os.stat(os.path.join(step12, b[g][0])).st_ino == os.stat(os.path.join(step10, b[g][0])).st_ino)}
assert new == changed, (new, changed)
for g in set(b) - new:  # shared: the same inode, a hard link
    assert os.stat(os.path.join(step12, b[g][0])).st_nlink >= 2
PY
  # The log says what each checkpoint wrote and linked.
  expect_in ${name}_resumed "checkpoint step 12: wrote [0-9.]+ MB in [0-9]+ files, linked [0-9.]+ MB in [1-9][0-9]* files \\(verified in [0-9.]+ s\\), [0-9.]+ s"
done
expect_in np1_first "checkpoint step 4: wrote .* linked 0.0 MB in 1 files"
# A file 3/4 of whose groups changed is rewritten with the rest (compaction): step 8 of 1 rank.
expect_in np1_resumed "checkpoint step 8: .*\\(1 mostly stale files rewritten\\)"

# Damage to a shared file: the flipped byte is caught in every checkpoint that shares it (exit 2
# naming the file and a group); nothing is deleted.
damage() {
  local name=$1 pattern=$2 code=$3
  rm -rf "$WORK/$name"; cp -a "$WORK/np1" "$WORK/$name"; rm -f "$WORK/$name/.lock"
  (cd "$WORK/$name/step-00000012" && eval "$code")
  local before; before=$(cd "$WORK/$name" && find . -path './step-*' | sort | md5sum)
  expect_code 2 "$name" run 1 --set steps=14 --set checkpoint.dir="$WORK/$name"
  expect_in "$name" "$pattern"
  [ "$(cd "$WORK/$name" && find . -path './step-*' | sort | md5sum)" = "$before" ] && pass "$name: nothing deleted" || fail "$name: files changed"
}
# The newest checkpoint's file that the one before shares (link count 2).
sfile=
for f in "$WORK"/np1/step-00000012/shard-*.pt; do
  if [ "$(stat -c %h "$f")" -ge 2 ]; then sfile=$(basename "$f"); break; fi
done
[ -n "$sfile" ] || fail "no shared file in step-00000012"
damage flipped_shared "step-00000012/$sfile: checksum [0-9a-f]{16} where manifest.json says .*; it holds group [0-9]+" \
  "$py -c \"import sys; b=bytearray(open('$sfile','rb').read()); b[len(b)//2]^=0x41; open('$sfile','r+b').write(b)\""
[ "$(md5sum < "$WORK/flipped_shared/step-00000010/$sfile")" = "$(md5sum < "$WORK/flipped_shared/step-00000012/$sfile")" ] \
  && pass "the flipped file is the older checkpoint's too (one inode)" || fail "flipped_shared: not one file"
damage removed_shared "step-00000012/$sfile: missing .*; it holds group [0-9]+" "rm $sfile"

# The manifest maps a group to the stale copy a shared file still holds of it (the run of a
# group written anew at step 12 pointed at the older file that also holds it): refused by the
# manifest's checksum, and behind a recomputed checksum by the group's step count.
restale() {
  $py - "$1" <<'PY'
import json, os, sys, torch
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
held = {f["file"]: torch.load(os.path.join(sys.argv[1], f["file"]))["groups"].tolist() for f in m["files"]}
per = [[g, r[2], r[3]] for r in m["runs"] for g in range(r[0], r[0] + r[1])]
for g, f, steps in per:
    stale = [i for i, e in enumerate(m["files"]) if i != f and f >= 0 and g in held[e["file"]]]
    if stale:
        per[g][1] = stale[0]
        break
else:
    sys.exit("no group with a stale copy")
m["runs"] = [[g, 1, f, steps] for g, f, steps in per]
text = json.dumps(m, indent=2)  # the old checksum stays: the manifest no longer matches it
open(os.path.join(sys.argv[1], "manifest.json"), "w").write(text)
PY
}
damage stale_copy "step-00000012/manifest.json: checksum: the manifest's text hashes to" "restale ."
damage stale_copy_sealed "step-00000012/shard-[0-9]+.pt: group [0-9]+: step count [0-9]+ in the file, [0-9]+ in manifest.json's runs" \
  "restale . && $py $HERE/rechecksum.py ."

# A shared file damaged while the job runs (here while step 14's files are written, slowed by the
# test aid): step 14 is not published with it, but written again at once with its groups anew;
# the run ends with exit 0, and its newest checkpoint resumes to the same parameters. The file:
# step 12's of group 1 (untrained in steps 12 and 13: step 14 shares it), linked from step 10.
sfile=$($py -c "import json, sys; m = json.load(open(sys.argv[1])); r = [r for r in m['runs'] if r[0] <= 1 < r[0] + r[1]][0]
print(m['files'][r[2]]['file'])" "$WORK/np1/step-00000012/manifest.json")
expect_code 0 plain16 run 1 --set steps=16 --no-resume --set checkpoint.dir="$WORK/plain16"
# damaged_while_writing NAME ASYNC: a copy of np1's checkpoints resumed to step 16 (its writes
# slowed), the shared file $sfile of step 12 damaged while step 14 is being written; exit 0.
damaged_while_writing() {
  local name=$1 async=$2 healer code
  rm -rf "$WORK/$name"; cp -a "$WORK/np1" "$WORK/$name"; rm -f "$WORK/$name/.lock"
  THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS=1500 run 1 --set steps=16 --set checkpoint.async="$async" \
    --set checkpoint.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 &
  healer=$!
  if wait_for 60 exists "$WORK/$name/.tmp-step-00000014"; then
    $py -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[len(b)//2]^=0x41; open(sys.argv[1],'r+b').write(b)" \
      "$WORK/$name/step-00000012/$sfile"
  else fail "$name: no write of step 14 began"; fi
  code=0; wait $healer || code=$?
  [ "$code" = 0 ] && pass "$name: exit 0" || { fail "$name: exit $code"; tail -15 "$WORK/$name.log"; }
}
damaged_while_writing heal false
expect_in heal "checkpoint of step 14 not published: .*step-00000012/$sfile no longer matches its checksum .*hold it by hard link: step-00000010 step-00000012"
same_hash "heal: the run that met the damage == uninterrupted" plain16 heal
[ -f "$WORK/heal/step-00000014/manifest.json" ] && [ ! -e "$WORK/heal/step-00000014/$sfile" ] \
  && pass "heal: step 14 published without the damaged file" || fail "heal: step 14: $(ls "$WORK/heal/step-00000014")"
# The same with a checkpoint in the background: step 14 is dropped, training goes on, and the
# next checkpoint (the run's last, 16) writes the damaged file's groups anew.
damaged_while_writing heal_bg true
expect_in heal_bg "checkpoint of step 14 not published: .*step-00000012/$sfile no longer matches its checksum"
same_hash "heal_bg: the run that met the damage == uninterrupted" plain16 heal_bg
[ ! -e "$WORK/heal_bg/step-00000014" ] && [ -f "$WORK/heal_bg/step-00000016/manifest.json" ] && \
  [ ! -e "$WORK/heal_bg/step-00000016/$sfile" ] && pass "heal_bg: step 14 dropped, step 16 without the damaged file" \
  || fail "heal_bg: $(ls "$WORK/heal_bg")"
expect_code 0 heal_resumed run 1 --set steps=18 --set checkpoint.dir="$WORK/heal"
expect_in heal_resumed "resumed from .*step-00000016 at step 16"
expect_code 0 plain18 run 1 --set steps=18 --no-resume --set checkpoint.dir="$WORK/plain18"
same_hash "heal: resumed from the checkpoints written after the damage == uninterrupted" plain18 heal_resumed

# Step 10^8: a 9-digit directory name. The newest checkpoint made of step 100000000 resumes,
# later checkpoints are pruned by keep like any other, and the next run resumes from them.
mkdir -p "$WORK/big" && cp -a "$WORK/np1/step-00000012" "$WORK/big/step-100000000"
$py - "$WORK/big/step-100000000/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["step"] = 100000000
json.dump(m, open(sys.argv[1], "w"))
PY
$py "$HERE/rechecksum.py" "$WORK/big/step-100000000"
expect_code 0 big timeout 120 mpirun "${MPIRUN_FLAGS[@]}" -np 1 "$thetad" run "$job" --set model.tasks=8 \
  --set steps=100000002 --set checkpoint.every_steps=1 --set checkpoint.keep=1 --set checkpoint.dir="$WORK/big"
expect_in big "resumed from .*step-100000000 at step 100000000"
[ "$(cd "$WORK/big" && ls -d step-*)" = "step-100000002" ] && pass "big: keep=1 left step-100000002 only" \
  || fail "big: $(ls "$WORK/big")"
expect_code 0 big_again timeout 120 "$thetad" run "$job" --set model.tasks=8 --set steps=100000003 \
  --set checkpoint.every_steps=1 --set checkpoint.dir="$WORK/big"
expect_in big_again "resumed from .*step-100000002 at step 100000002"
finish
