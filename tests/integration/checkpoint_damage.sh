#!/usr/bin/env bash
# Checkpoints trust nothing (issue 19, classes 3, 5 and 8): a checkpoint whose files were damaged
# (flipped bytes, truncated, empty, a directory, a key missing inside) or whose manifest lies
# (unknown format, another step, a file path out of the directory, unknown keys, shards that do
# not cover the groups) stops
# resume with exit 2 naming the file and the key, before any step; every manifest carries a
# checksum per file; checkpoint.dir that is a file is refused before step 0; a second job on a
# checkpoint.dir in use is refused naming the holder.
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
run() { mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set steps=4 "$@"; }

expect_code 0 good run --set checkpoint.dir="$WORK/good" --no-resume
ck=$WORK/good/step-00000004
$py - "$ck/manifest.json" <<'PY' && pass "manifest: format 3, the groups in one shard file with its checksum" || fail "manifest"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["format"] == "thetad-checkpoint-3", m["format"]
assert m["groups"] == 5 and len(m["shards"]) == 1 and m["shards"][0]["count"] == 5, m
import torch
d = torch.load(sys.argv[1].replace("manifest.json", "shard-00000.pt"))
assert sorted(d) == ["exp_avg", "exp_avg_sq", "offsets", "param", "steps"], sorted(d)
assert d["offsets"].tolist() == [0, 1600, 1633, 1666, 1699, 1732] and d["param"].numel() == 1732, d["offsets"]
assert all(len(s["fnv1a64"]) == 16 for s in m["shards"]), m["shards"]
PY
[ "$(ls "$ck")" = "$(printf 'manifest.json\nshard-00000.pt')" ] && pass "checkpoint: a manifest and one shard file" \
  || fail "checkpoint files: $(ls "$ck" | tr '\n' ' ')"
cp -r "$WORK/good" "$WORK/good_copy"; rm -f "$WORK/good_copy/.lock"
expect_code 0 resume_good run --set checkpoint.dir="$WORK/good_copy" --set steps=5
expect_in resume_good "resumed from .*step-00000004 at step 4"
# A format-2 checkpoint (a file per group, as earlier releases wrote) still resumes.
cp -r "$WORK/good" "$WORK/v2"; rm -f "$WORK/v2/.lock"
$py - "$WORK/v2/step-00000004" <<'PY'
import json, os, sys, torch
os.chdir(sys.argv[1])
m = json.load(open('manifest.json'))
shard = torch.load('shard-00000.pt')
# The small job's parameters per group, in the flat layout's order.
layout = [[('trunk.0.weight', (32, 16)), ('trunk.0.bias', (32,)), ('trunk.1.weight', (32, 32)), ('trunk.1.bias', (32,))]]
layout += [[('heads.%d.0.weight' % t, (1, 32)), ('heads.%d.0.bias' % t, (1,))] for t in range(4)]
groups = []
for g, params in enumerate(layout):
    d, at = {'steps': shard['steps'][g].clone()}, int(shard['offsets'][g])
    for name, shape in params:
        n = torch.Size(shape).numel()
        for key in ('param', 'exp_avg', 'exp_avg_sq'):
            d[key + '/' + name] = shard[key][at:at + n].reshape(shape).clone()
        at += n
    assert at == int(shard['offsets'][g + 1])
    torch.save(d, 'group-%04d.pt' % g)
    groups.append({'group': g, 'file': 'group-%04d.pt' % g})
os.remove('shard-00000.pt')
del m['shards']
m.update(format='thetad-checkpoint-2', groups=groups)
json.dump(m, open('manifest.json', 'w'))
PY
$py "$HERE/rechecksum.py" "$WORK/v2/step-00000004"
expect_code 0 resume_v2 run --set checkpoint.dir="$WORK/v2" --set steps=5
expect_in resume_v2 "resumed from .*step-00000004 at step 4"
h_v2=$(final_hash "$WORK/resume_v2.log"); h_v3=$(final_hash "$WORK/resume_good.log")
[ -n "$h_v2" ] && [ "$h_v2" = "$h_v3" ] && pass "format 2 resumes to the same parameters" || fail "format 2: $h_v2 vs $h_v3"

# damaged NAME 'PATTERN' SHELL-CODE: a copy of the good checkpoint, damaged by SHELL-CODE (run in
# the copy's step directory); resume must exit 2 with PATTERN in its error.
damaged() {
  local name=$1 pattern=$2 code=$3
  rm -rf "$WORK/$name"; cp -r "$WORK/good" "$WORK/$name"; rm -f "$WORK/$name/.lock"
  (cd "$WORK/$name/step-00000004" && eval "$code")
  expect_code 2 "$name" run --set checkpoint.dir="$WORK/$name" --set steps=5
  expect_in "$name" "$pattern"
  if grep -q "step 5/5\|final params hash" "$WORK/$name.log"; then fail "$name: trained"; else pass "$name: no step ran"; fi
}
g=shard-00000.pt
damaged flipped "$g: checksum [0-9a-f]{16} where manifest.json says" \
  "$py -c \"import sys; b=bytearray(open('$g','rb').read()); b[len(b)//2]^=0x41; open('$g','wb').write(b)\""
damaged truncated "$g: checksum .*where manifest.json says" "truncate -s 100 $g"
damaged empty "$g: checksum .*\\(0 bytes\\)" ": > $g"
damaged directory "$g: not a regular file" "rm $g && mkdir $g"
damaged missing_file "$g: missing" "rm $g"
damaged bad_format "manifest.json: format: 'thetad-checkpoint-9' is not a format" \
  "sed -i 's/thetad-checkpoint-3/thetad-checkpoint-9/' manifest.json"
damaged other_step "manifest.json: step: 7 but the directory is of step 4" "sed -i 's/\"step\": 4/\"step\": 7/' manifest.json"
damaged path_escape "manifest.json: shards\\[0\\].file: '../../../etc/passwd' is not shard-00000.pt" \
  "sed -i 's#\"shard-00000.pt\"#\"../../../etc/passwd\"#' manifest.json"
damaged shards_short "manifest.json: shards: hold groups 0..3 of groups: 5" \
  "sed -i 's/\"count\": 5/\"count\": 4/' manifest.json"
damaged unknown_key "manifest.json: extra: unknown key" "sed -i 's/\"format\"/\"extra\": 1, \"format\"/' manifest.json"
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
