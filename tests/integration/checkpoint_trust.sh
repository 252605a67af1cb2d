#!/usr/bin/env bash
# a damaged newest checkpoint (its manifest gone) is never skipped for an
# older one: resume exits 2 naming it, and nothing is removed; `keep` never prunes a step-*
# directory that is not a complete checkpoint (a warning names it). Values a hand-edited shard
# carries past a recomputed checksum are checked at load: moments finite, second moments >= 0,
# step counts within 0..the checkpoint's step (exit 2 naming the file, the group and the key);
# every tensor within the record of its storage.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
run() { "$thetad" run "$job" --set checkpoint.every_steps=2 "$@"; }

# The newest checkpoint's manifest removed: refused, not skipped; both checkpoints stay.
expect_code 0 base run --no-resume --set steps=6 --set checkpoint.keep=2 --set checkpoint.dir="$WORK/a"
# (an asynchronous checkpoint is never said complete after a step past the end.)
late=$(grep -oE "complete after step [0-9]+" "$WORK/base.log" | awk '$4 > 6' | head -1)
[ -z "$late" ] && pass "no checkpoint complete after a step past steps" || fail "log says: $late"
rm "$WORK/a/step-00000006/manifest.json"
expect_code 2 newest_damaged run --set steps=8 --set checkpoint.keep=2 --set checkpoint.dir="$WORK/a"
expect_in newest_damaged "step-00000006/manifest.json: missing: the newest checkpoint in .* is damaged"
expect_in newest_damaged "move .*step-00000006 out of"
if grep -q "resumed from" "$WORK/newest_damaged.log"; then fail "resumed past the damaged checkpoint"; fi
[ -d "$WORK/a/step-00000006" ] && [ -f "$WORK/a/step-00000004/manifest.json" ] && [ -n "$(ls "$WORK"/a/step-00000006/shard-*.pt)" ] \
  && pass "both checkpoints kept" || fail "a checkpoint went: $(ls "$WORK/a")"

# Moved away as the message says: the run resumes from the one before.
mv "$WORK/a/step-00000006" "$WORK/aside-6"
expect_code 0 after_move run --set steps=8 --set checkpoint.keep=2 --set checkpoint.dir="$WORK/a"
expect_in after_move "resumed from .*step-00000004 at step 4"

# An older damaged checkpoint: keep=1 prunes complete ones only and names the damaged one.
expect_code 0 base_b run --no-resume --set steps=4 --set checkpoint.keep=3 --set checkpoint.dir="$WORK/b"
rm "$WORK/b/step-00000002/manifest.json"
expect_code 0 prune_damaged run --set steps=8 --set checkpoint.keep=1 --set checkpoint.dir="$WORK/b"
expect_in prune_damaged "step-00000002 is not a complete checkpoint .*checkpoint.keep leaves it alone"
[ -d "$WORK/b/step-00000002" ] && [ ! -d "$WORK/b/step-00000004" ] && [ -f "$WORK/b/step-00000008/manifest.json" ] \
  && pass "keep pruned complete checkpoints only" || fail "pruning: $(ls -a "$WORK/b")"
if ls -a "$WORK/b" | grep -q '^\.tmp-'; then fail "temporary directories left: $(ls -a "$WORK/b")"; else pass "no temporary directories left"; fi

# Hand-edited state with a recomputed checksum.
expect_code 0 base_c run --no-resume --set steps=4 --set checkpoint.every_steps=4 --set checkpoint.dir="$WORK/c"
# edit NAME FILE PYTHON-STATEMENT PATTERN: applies the statement to the file's dict `d` (shard-00000.pt
# holds Θ, shard-00001.pt the 4 task groups), rechecksums, resumes.
edit() {
  local name=$1 file=$2 stmt=$3 pattern=$4
  rm -rf "$WORK/$name" && cp -r "$WORK/c" "$WORK/$name" && rm -f "$WORK/$name/.lock"
  $py - "$WORK/$name/step-00000004/$file" "$stmt" <<'PY'
import sys, torch
d = torch.load(sys.argv[1])
exec(sys.argv[2])
torch.save(d, sys.argv[1])
PY
  $py "$HERE/rechecksum.py" "$WORK/$name/step-00000004"
  local before; before=$(md5sum < "$WORK/$name/step-00000004/$file")
  expect_code 2 "$name" run --set steps=6 --set checkpoint.dir="$WORK/$name"
  expect_in "$name" "$pattern"
  [ "$(md5sum < "$WORK/$name/step-00000004/$file")" = "$before" ] && pass "$name: shard unchanged" \
    || fail "$name: shard changed"
}
edit neg_sq shard-00001.pt "d['exp_avg_sq'][100] = -1.0" \
  "shard-00001.pt: group 4: exp_avg_sq value [0-9]+ is -1.0+, where second moments are finite and >= 0"
edit nan_m shard-00000.pt "d['exp_avg'][3] = float('nan')" "shard-00000.pt: group 0: exp_avg value 3 is nan, where moments are finite"
edit steps_neg shard-00001.pt "d['steps'][1] = -5" "shard-00001.pt: key 'steps': group 2: step count -5 outside 0..4"
edit steps_huge shard-00000.pt "d['steps'][0] = 2**62" "shard-00000.pt: key 'steps': group 0: step count 4611686018427387904 outside 0..4"
# A shard whose pickle claims more values than the record of their storage holds (LibTorch's
# reader read past the record): refused naming the file and the tensor, the shard left as it is.
rm -rf "$WORK/short" && cp -r "$WORK/c" "$WORK/short" && rm -f "$WORK/short/.lock"
$py - "$WORK/short/step-00000004/shard-00000.pt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_STORED) as z:
    for name, data in records:
        z.writestr(name, data[:4] if name.endswith("/data/0") else data)
PY
$py "$HERE/rechecksum.py" "$WORK/short/step-00000004"
short_before=$(md5sum < "$WORK/short/step-00000004/shard-00000.pt")
expect_code 2 short run --set steps=6 --set checkpoint.dir="$WORK/short"
expect_in short "shard-00000.pt: tensor 'param': its storage 'data/0' holds 4 bytes, where the pickle says [0-9]+ float32 values \(the checkpoint is damaged"
[ "$(md5sum < "$WORK/short/step-00000004/shard-00000.pt")" = "$short_before" ] && pass "short: shard unchanged" \
  || fail "short: shard changed"
finish
