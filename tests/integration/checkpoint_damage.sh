#!/usr/bin/env bash
# Checkpoints trust nothing (issue 19, classes 3 and 5): a checkpoint whose files were damaged
# (flipped bytes, truncated, empty, a directory, a key missing inside) or whose manifest lies
# (unknown format, another step, a group file path out of the directory, unknown keys) stops
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
$py - "$ck/manifest.json" <<'PY' && pass "manifest: format 2, a checksum per group file" || fail "manifest lacks checksums"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["format"] == "thetad-checkpoint-2", m["format"]
assert len(m["groups"]) == 5 and all(len(g["fnv1a64"]) == 16 for g in m["groups"]), m["groups"]
PY
cp -r "$WORK/good" "$WORK/good_copy"; rm -f "$WORK/good_copy/.lock"
expect_code 0 resume_good run --set checkpoint.dir="$WORK/good_copy" --set steps=5
expect_in resume_good "resumed from .*step-00000004 at step 4"

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
g=group-0002.pt
damaged flipped "$g: checksum [0-9a-f]{16} where manifest.json says" \
  "$py -c \"import sys; b=bytearray(open('$g','rb').read()); b[len(b)//2]^=0x41; open('$g','wb').write(b)\""
damaged truncated "$g: checksum .*where manifest.json says" "truncate -s 100 $g"
damaged empty "$g: checksum .*\\(0 bytes\\)" ": > $g"
damaged directory "$g: not a regular file" "rm $g && mkdir $g"
damaged missing_file "$g: missing" "rm $g"
damaged bad_format "manifest.json: format: 'thetad-checkpoint-9' is not a format" \
  "sed -i 's/thetad-checkpoint-2/thetad-checkpoint-9/' manifest.json"
damaged other_step "manifest.json: step: 7 but the directory is of step 4" "sed -i 's/\"step\": 4/\"step\": 7/' manifest.json"
damaged path_escape "manifest.json: groups\\[2\\].file: '../../../etc/passwd' is not group-0002.pt" \
  "sed -i 's#\"group-0002.pt\"#\"../../../etc/passwd\"#' manifest.json"
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
