#!/usr/bin/env bash
# Outputs that cannot go wrong silently. An export that cannot be written is refused before any
# step, naming the key and the directory; a complete run whose export is missing writes it again
# (exit 0); an export of NaN adapters is refused and writes nothing. thetad's outputs (the metrics
# file and its lock, checkpoint.dir's lock and probe, the metrics kept at resume, exports) never
# follow a symbolic link planted where they go, nor write into another user's file or directory;
# the directories thetad makes are private (0700).
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/transformer.yaml
LLAMA=(--set model.arch=llama --set model.kv_heads=1 --set lora.targets=[q,gate,down] --set model.tasks=2
       --set model.train_shared=false --set steps=4 --set log.level=info)
run() { "$thetad" run "$job" "${LLAMA[@]}" "$@"; }
# untouched NAME: the victim file a planted link pointed at still holds what it held.
untouched() { [ "$(cat "$WORK/victim")" = secret ] && pass "$1: the link's target untouched" || fail "$1: victim now: $(head -c 80 "$WORK/victim")"; }
echo secret > "$WORK/victim"
trap 'chattr -i "$WORK/ro" 2>/dev/null; [ -n "$KEEP_WORK" ] && echo "kept $WORK" >&2 || rm -rf "$WORK"' EXIT

# A complete run whose export is gone (it failed after the final checkpoint, or was removed):
# the rerun writes it again, the same files, and exits 0.
expect_code 0 first run --no-resume --set checkpoint.dir="$WORK/ck" --set export.adapters_dir="$WORK/ex/{task}" \
  --set metrics.path="$WORK/m.jsonl"
sums() { (cd "$WORK/ex" 2>/dev/null && md5sum ./*/*); }
before=$(sums)
rm -rf "$WORK/ex"
expect_code 0 rerun run --set checkpoint.dir="$WORK/ck" --set export.adapters_dir="$WORK/ex/{task}"
expect_in rerun "already complete: resumed at step 4 = steps; nothing to train"
[ -n "$before" ] && [ "$(sums)" = "$before" ] && pass "rerun: the export written again, the same files" || fail "rerun: export $(sums)"
# What thetad made is private: checkpoint.dir, its steps, the export's directories.
modes=$(stat -c %a "$WORK/ck" "$WORK/ck/step-00000004" "$WORK/ex" "$WORK/ex/0" 2>/dev/null | sort -u | tr "\n" " " || true)
[ "$modes" = "700 " ] && pass "directories made 0700" || fail "directory modes: $modes"

# An export directory files cannot be created in: refused before any step (exit 2).
mkdir "$WORK/ro"
if chattr +i "$WORK/ro" 2>/dev/null; then
  expect_code 2 read_only run --no-resume --set export.adapters_dir="$WORK/ro/{task}"
  expect_in read_only "ro/0: export.adapters_dir: not writable: .*\\(found before any step"
  expect_not_in read_only "step 1/"
  chattr -i "$WORK/ro"
else
  echo "(chattr +i is not available here: the read-only export directory is not tried)"
fi

# NaN adapters (a diverged run that train.on_nonfinite: warn lets finish): the export is refused
# naming the task and the parameter, and no adapter file is left.
expect_code 1 nan run --no-resume --set optimizer.lr=1e30 --set train.on_nonfinite=warn \
  --set export.adapters_dir="$WORK/nan/{task}"
expect_in nan "export.adapters_dir: task [0-9]+'s adapter: parameter 'lora\\.[0-9]+\\.[0-9]+\\.[a-z]+\\.[ab]' holds NaN or Inf; no adapter of this export is written"
[ -z "$(find "$WORK/nan" -type f 2>/dev/null)" ] && pass "nan: nothing written" || fail "nan: $(find "$WORK/nan" -type f)"

# Links planted where outputs go: refused or replaced, never followed.
ln -s "$WORK/victim" "$WORK/linked.jsonl"
expect_code 2 metrics_link run --no-resume --set metrics.path="$WORK/linked.jsonl"
expect_in metrics_link "linked.jsonl: metrics.path: cannot open the metrics file for writing: is a symbolic link"
untouched metrics_link
ln -s "$WORK/victim" "$WORK/m2.jsonl.lock"
expect_code 2 metrics_lock_link run --no-resume --set metrics.path="$WORK/m2.jsonl"
expect_in metrics_lock_link "m2.jsonl.lock: metrics.path: cannot create the metrics file's lock: is a symbolic link"
untouched metrics_lock_link
mkdir -p "$WORK/ck2" && ln -s "$WORK/victim" "$WORK/ck2/.lock"
expect_code 2 ckpt_lock_link run --no-resume --set checkpoint.dir="$WORK/ck2"
expect_in ckpt_lock_link "checkpoint.dir .*ck2: .*ck2/.lock: not writable: is a symbolic link"
untouched ckpt_lock_link
rm "$WORK/ck2/.lock" && ln -s "$WORK/victim" "$WORK/ck2/.write-probe.part"
ln -s "$WORK/victim" "$WORK/m.jsonl.resume-tmp"
expect_code 0 planted_temps run --set steps=6 --set checkpoint.dir="$WORK/ck2" --set metrics.path="$WORK/m.jsonl" \
  --set export.adapters_dir="$WORK/ex/{task}" --no-resume
untouched planted_temps
mkdir -p "$WORK/ex3/0" && ln -s "$WORK/victim" "$WORK/ex3/0/adapter_model.safetensors.tmp"
expect_code 0 export_temp run --no-resume --set export.adapters_dir="$WORK/ex3/{task}"
untouched export_temp
[ -f "$WORK/ex3/0/adapter_model.safetensors" ] && [ ! -L "$WORK/ex3/0/adapter_model.safetensors" ] \
  && pass "export_temp: the adapter written as a file of its own" || fail "export_temp: $(ls -l "$WORK/ex3/0")"
# Another user's directory or link (uid 65534 here: the test runs as root or skips these).
if [ "$(id -u)" = 0 ]; then
  mkdir "$WORK/theirs" && chown 65534 "$WORK/theirs"
  expect_code 2 ckpt_theirs run --no-resume --set checkpoint.dir="$WORK/theirs"
  expect_in ckpt_theirs "checkpoint.dir .*theirs: .*is owned by uid 65534, not by this user"
  mkdir -p "$WORK/mine" && ln -s "$WORK/mine" "$WORK/ex5_0" && chown -h 65534 "$WORK/ex5_0"
  expect_code 2 export_their_task_link run --no-resume --set export.adapters_dir="$WORK/ex5_{task}"
  expect_in export_their_task_link "ex5_0: export.adapters_dir: .*is a symbolic link of uid 65534"
fi
finish
