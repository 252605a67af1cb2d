#!/usr/bin/env bash
# Incremental checkpoints (issue 34 item 3): a checkpoint writes Θ and the task groups trained
# since the newest complete one and hard-links the files of the others; every directory stays
# complete (keep=2 prunes older ones without breaking newer ones) and resumes to bitwise the
# parameters of an uninterrupted run, on 1 rank (synchronous) and 2 ranks (asynchronous); a flipped
# byte in a shared file, or a shared file removed, is exit 2 naming the file and a group it holds,
# and nothing is deleted.
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
    assert m["format"] == "thetad-checkpoint-5", m["format"]
    out = {}
    for first, count, f in m["runs"]:
        for g in range(first, first + count):
            name = m["files"][f]["file"]
            t = torch.load(os.path.join(d, name))
            at = t["groups"].tolist().index(g)
            assert t["param"].numel() * 12 == m["files"][f]["bytes"]
            out[g] = (name, int(t["steps"][at]))
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
  expect_in ${name}_resumed "checkpoint step 12: wrote [0-9.]+ MB in [0-9]+ files, linked [0-9.]+ MB in [1-9][0-9]* files, [0-9.]+ s"
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
finish
