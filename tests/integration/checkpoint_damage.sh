#!/usr/bin/env bash
# Checkpoints trust nothing: a checkpoint whose files were damaged
# (flipped bytes, truncated, empty, a directory, a key missing inside) or whose manifest lies
# (one bit flipped anywhere: its own checksum; behind a recomputed checksum: unknown format,
# another step, a file path out of the directory, unknown keys, runs that do not cover the
# groups, name a file without the group or another step count than the file's) stops
# resume with exit 2 naming the file and the key, before any step; every manifest carries a
# checksum per file and one of its own; checkpoint.dir that is a file is refused before step 0; a second job on a
# checkpoint.dir in use is refused naming the holder.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
run() { mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set steps=4 "$@"; }

expect_code 0 good run --set checkpoint.dir="$WORK/good" --no-resume
ck=$WORK/good/step-00000004
$py - "$ck/manifest.json" <<'PY' && pass "manifest: format 6, Θ and the task groups in a file each, with checksums" || fail "manifest"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["format"] == "thetad-checkpoint-6", m["format"]
assert m["groups"] == 5 and [f["file"] for f in m["files"]] == ["shard-00000.pt", "shard-00001.pt"], m
assert m["runs"] == [[0, 1, 0, 4], [1, 4, 1, 2]], m["runs"]
assert len(m["checksum"]) == 16 and list(m)[-1] == "checksum", m
import torch
d = torch.load(sys.argv[1].replace("manifest.json", "shard-00000.pt"))
assert sorted(d) == ["exp_avg", "exp_avg_sq", "groups", "offsets", "param", "steps"], sorted(d)
assert d["offsets"].tolist() == [0, 1600] and d["groups"].tolist() == [0], d["offsets"]
t = torch.load(sys.argv[1].replace("manifest.json", "shard-00001.pt"))
assert t["offsets"].tolist() == [0, 33, 66, 99, 132] and t["groups"].tolist() == [1, 2, 3, 4], t["offsets"]
assert all(len(f["fnv1a64"]) == 16 and f["bytes"] == 12 * n for f, n in zip(m["files"], (1600, 132))), m["files"]
PY
[ "$(ls "$ck")" = "$(printf 'manifest.json\nshard-00000.pt\nshard-00001.pt')" ] && pass "checkpoint: a manifest and two files" \
  || fail "checkpoint files: $(ls "$ck" | tr '\n' ' ')"
cp -r "$WORK/good" "$WORK/good_copy"; rm -f "$WORK/good_copy/.lock"
expect_code 0 resume_good run --set checkpoint.dir="$WORK/good_copy" --set steps=5
expect_in resume_good "resumed from .*step-00000004 at step 4"
# Format-5 (no checksum of the manifest, no step counts in its runs), format-4 (format 5's files,
# checksummed over words), format-3 (shards of consecutive groups) and format-2 (a file per
# group) checkpoints, as earlier releases wrote, still resume.
for v in 2 3 4 5; do
cp -r "$WORK/good" "$WORK/v$v"; rm -f "$WORK/v$v/.lock"
HERE=$HERE $py - "$WORK/v$v/step-00000004" "$v" <<'PY'
import json, os, sys, torch
sys.path.insert(0, os.environ["HERE"])
from ckpt_groups import load
os.chdir(sys.argv[1])
m = json.load(open('manifest.json'))
groups = load('.')
del m['checksum']
m['runs'] = [r[:3] for r in m['runs']]
if sys.argv[2] in ('4', '5'):
    m['format'] = 'thetad-checkpoint-' + sys.argv[2]
    json.dump(m, open('manifest.json', 'w'))
    sys.exit(0)
for f in m['files']:
    os.remove(f['file'])
for k in ('files', 'runs'):
    del m[k]
if sys.argv[2] == '3':
    d = {k: torch.cat([groups[g][k] for g in range(5)]) for k in ('param', 'exp_avg', 'exp_avg_sq')}
    d['steps'] = torch.tensor([groups[g]['steps'] for g in range(5)])
    d['offsets'] = torch.tensor([0] + [sum(groups[h]['param'].numel() for h in range(g + 1)) for g in range(5)])
    torch.save(d, 'shard-00000.pt')
    m.update(format='thetad-checkpoint-3', shards=[{'file': 'shard-00000.pt', 'first': 0, 'count': 5}])
    json.dump(m, open('manifest.json', 'w'))
    sys.exit(0)
# The small job's parameters per group, in the flat layout's order.
layout = [[('trunk.0.weight', (32, 16)), ('trunk.0.bias', (32,)), ('trunk.1.weight', (32, 32)), ('trunk.1.bias', (32,))]]
layout += [[('heads.%d.0.weight' % t, (1, 32)), ('heads.%d.0.bias' % t, (1,))] for t in range(4)]
entries = []
for g, params in enumerate(layout):
    d, at = {'steps': torch.tensor(groups[g]['steps'])}, 0
    for name, shape in params:
        n = torch.Size(shape).numel()
        for key in ('param', 'exp_avg', 'exp_avg_sq'):
            d[key + '/' + name] = groups[g][key][at:at + n].reshape(shape).clone()
        at += n
    assert at == groups[g]['param'].numel()
    torch.save(d, 'group-%04d.pt' % g)
    entries.append({'group': g, 'file': 'group-%04d.pt' % g})
m.update(format='thetad-checkpoint-2', groups=entries)
json.dump(m, open('manifest.json', 'w'))
PY
$py "$HERE/rechecksum.py" "$WORK/v$v/step-00000004"
expect_code 0 resume_v$v run --set checkpoint.dir="$WORK/v$v" --set steps=5
expect_in resume_v$v "resumed from .*step-00000004 at step 4"
h_old=$(final_hash "$WORK/resume_v$v.log"); h_good=$(final_hash "$WORK/resume_good.log")
[ -n "$h_old" ] && [ "$h_old" = "$h_good" ] && pass "format $v resumes to the same parameters" || fail "format $v: $h_old vs $h_good"
done
# The checkpoint written after resuming a format-4 one shares none of its files (their checksums
# are of format 4's kind): it resumes in turn.
expect_code 0 resume_after_v4 run --set checkpoint.dir="$WORK/v4" --set steps=6
expect_in resume_after_v4 "resumed from .*step-00000005 at step 5"
# A format-5 one is read saying what it cannot check; the checkpoint after it is of format 6.
expect_in resume_v5 "manifest.json is of format 5 .*no checksum of its own"
grep -q '"format": "thetad-checkpoint-6"' "$WORK/v5/step-00000005/manifest.json" && pass "format 5 resumed, format 6 written" \
  || fail "after format 5: $(head -3 "$WORK/v5/step-00000005/manifest.json")"

# damaged NAME 'PATTERN' SHELL-CODE: a copy of the good checkpoint, damaged by SHELL-CODE (run in
# the copy's step directory); resume must exit 2 with PATTERN in its error. edited: the same, the
# manifest's checksums recomputed after SHELL-CODE (what the reader checks behind them).
damaged() {
  local name=$1 pattern=$2 code=$3
  rm -rf "$WORK/$name"; cp -r "$WORK/good" "$WORK/$name"; rm -f "$WORK/$name/.lock"
  (cd "$WORK/$name/step-00000004" && eval "$code")
  expect_code 2 "$name" run --set checkpoint.dir="$WORK/$name" --set steps=5
  expect_in "$name" "$pattern"
  if grep -q "step 5/5\|final params hash" "$WORK/$name.log"; then fail "$name: trained"; else pass "$name: no step ran"; fi
}
edited() { damaged "$1" "$2" "$3 && $py $HERE/rechecksum.py ."; }
g=shard-00000.pt
damaged flipped "$g: checksum [0-9a-f]{16} where manifest.json says" \
  "$py -c \"import sys; b=bytearray(open('$g','rb').read()); b[len(b)//2]^=0x41; open('$g','wb').write(b)\""
damaged truncated "$g: checksum .*where manifest.json says" "truncate -s 100 $g"
damaged empty "$g: checksum .*\\(0 bytes\\)" ": > $g"
damaged directory "$g: not a regular file" "rm $g && mkdir $g"
damaged missing_file "$g: missing" "rm $g"
# One bit of the manifest flipped (a run's file 1 -> 0): its own checksum refuses it.
damaged manifest_bit "manifest.json: checksum: the manifest's text hashes to [0-9a-f]{16} where its checksum says" \
  "sed -i 's/\\[1, 4, 1, 2\\]/[1, 4, 0, 2]/' manifest.json"
damaged bad_format "manifest.json: format: 'thetad-checkpoint-9' is not a format" \
  "sed -i 's/thetad-checkpoint-6/thetad-checkpoint-9/' manifest.json"
edited other_step "manifest.json: step: 7 but the directory is of step 4" "sed -i 's/\"step\": 4/\"step\": 7/' manifest.json"
edited path_escape "manifest.json: files\\[0\\].file: '../../../etc/passwd' is not shard-NNNNN.pt" \
  "sed -i 's#\"shard-00000.pt\"#\"../../../etc/passwd\"#' manifest.json"
edited runs_short "manifest.json: runs: hold groups 0..3 of groups: 5" \
  "sed -i 's/\\[1, 4, 1, 2\\]/[1, 3, 1, 2]/' manifest.json"
edited run_file "manifest.json: runs\\[1\\]\\[2\\]: 7 is outside \\[-2, 1\\]" \
  "sed -i 's/\\[1, 4, 1, 2\\]/[1, 4, 7, 2]/' manifest.json"
edited group_not_in_file "shard-00000.pt: group 1 is not in it, where manifest.json says it is" \
  "sed -i 's/\\[\\[0, 1, 0, 4\\], \\[1, 4, 1, 2\\]\\]/[[0, 2, 0, 4], [2, 3, 1, 2]]/' manifest.json"
edited run_steps "shard-00001.pt: group 1: step count 2 in the file, 1 in manifest.json's runs" \
  "sed -i 's/\\[1, 4, 1, 2\\]/[1, 4, 1, 1]/' manifest.json"
edited unknown_key "manifest.json: extra: unknown key" "sed -i 's/\"format\"/\"extra\": 1, \"format\"/' manifest.json"
damaged not_json "manifest.json: manifest: not valid JSON" "echo '{\"format\": [' > manifest.json"
# A key missing inside a group file whose checksum was made to match: the file and key named.
damaged missing_key "$g: key 'steps' missing" "$py - <<'PY'
import torch
d = torch.load('$g')
del d['steps']
torch.save(d, '$g')
PY
$py $HERE/rechecksum.py ."

# checkpoint.dir is a file: refused before step 0, nothing trained.
: > "$WORK/a_file"
expect_code 2 dir_is_file run --set checkpoint.dir="$WORK/a_file" --no-resume
expect_in dir_is_file "checkpoint.dir .*a_file: exists and is not a directory \\(found before any step\\)"

# Two jobs on one checkpoint.dir: the second is refused, naming the first (its pid and host).
mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set steps=100000 --set checkpoint.dir="$WORK/shared" \
  --no-resume > "$WORK/holder.log" 2>&1 &
holder=$!
for _ in $(seq 1 100); do grep -q "steps 0\.\." "$WORK/holder.log" && break; sleep 0.2; done
expect_code 2 second run --set checkpoint.dir="$WORK/shared" --no-resume
expect_in second "checkpoint.dir .*shared: in use by another job \\(job .*, pid [0-9]+ on .* since "
kill -TERM "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
# The lock goes with its holder: the directory is usable again.
expect_code 0 after_holder run --set checkpoint.dir="$WORK/shared" --no-resume

# A disk that fills up during a checkpoint (a 512 KiB tmpfs; the checkpoint needs ~1 MiB): exit 1
# with the cause, and no .tmp-step-* directory left to fill the disk further.
mkdir -p "$WORK/full"
if mount -t tmpfs -o size=512k tmpfs "$WORK/full" 2>/dev/null; then
  expect_code 1 disk_full run --set checkpoint.dir="$WORK/full/ck" --set model.hidden=256 --no-resume
  expect_in disk_full "checkpoint at step 4 failed: .*No space left on device.*removed \\(the newest complete checkpoint in .* is unchanged\\)"
  left=$(ls -A "$WORK/full/ck" | grep -c '^\.tmp-step' || true)
  [ "$left" -eq 0 ] && pass "disk_full: no .tmp-step directory left" || fail "disk_full: $left .tmp-step directories left"
  umount "$WORK/full"
else
  echo "cannot mount a tmpfs here: disk-full case skipped"
fi
finish
