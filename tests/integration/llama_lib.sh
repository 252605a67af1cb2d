# The Llama scripts' set-up over llama_ref.py (llama_peft.sh, llama_nf4.sh, llama_streamed.sh, llama_sharded.sh): a tiny Hugging Face
# base in $WORK/base with token ids in $WORK/tokens.npy, the job that trains on it, and two
# helpers; sourced after lib.sh with $logits_bin set (thetad_logits).
#   logits NAME TASK SETS...   thetad's logits of the job's model over the base into $WORK/NAME.npy
#   close WHAT A B             $WORK/A.npy equals $WORK/B.npy within 1e-5 relative: pass or fail
#   exported NAME              tasks 0 and 1's adapters in $WORK/adapters/T are PEFT directories
#                              (names, shapes, adapter_config.json), and the base with each gives
#                              thetad's logits with it (lora.init_from: $WORK/NAME$T.npy; the
#                              reference's: $WORK/ref_NAME$T.npy)
#   twin_exports WHAT A B SETS...  runs A (the job on the base, 2 ranks) and B (the same with SETS),
#                              each exporting its PEFT adapters and task 0's merged model; B's
#                              final hash and exports must be A's, byte for byte
#   drawn_resumes WHAT WHOLE JOB SETS...  a drawn frozen base (JOB with SETS) run 3 steps on 2 ranks:
#                              its checkpoint holds no Θ (the seed draws it again), and resumed
#                              from it the run ends with WHOLE's final hash (WHOLE: SETS, 6 steps)
# shellcheck shell=bash
py=/usr/bin/python3
ref=$HERE/llama_ref.py
job=$HERE/jobs/llama.yaml
base=$WORK/base
$py "$ref" base "$base" "$WORK/tokens.npy" || fail "llama_ref.py base"

logits() {
  local name=$1 task=$2; shift 2
  expect_code 0 "$name" "$logits_bin" "$job" --set model.init_from="$base" --tokens "$WORK/tokens.npy" \
    --task "$task" --out "$WORK/$name.npy" "$@"
}
close() {
  $py "$ref" compare "$WORK/$2.npy" "$WORK/$3.npy" 1e-5 > "$WORK/cmp.log" 2>&1 && pass "$1: $(cat "$WORK/cmp.log")" \
    || { fail "$1"; cat "$WORK/cmp.log"; }
}
exported() {
  local t
  for t in 0 1; do
    $py "$ref" adapter "$WORK/adapters/$t" "$base" 4 8 q,k,v,o,gate,up,down > "$WORK/adapter$t.log" 2>&1 \
      && pass "task $t: a PEFT directory (names, shapes, adapter_config.json)" || { fail "task $t adapter"; cat "$WORK/adapter$t.log"; }
    logits "$1$t" $t --set lora.init_from="$WORK/adapters/{task}"
    $py "$ref" logits "$base" "$WORK/tokens.npy" "$WORK/ref_$1$t.npy" "$WORK/adapters/$t"
    close "task $t: the base + its PEFT adapter == thetad's logits" "$1$t" "ref_$1$t"
  done
}
twin_exports() {
  local what=$1 a=$2 b=$3 n; shift 3
  for n in "$a" "$b"; do
    local extra=()
    [ "$n" = "$b" ] && extra=("$@")
    run_np "$n" 2 "$job" --set model.init_from="$base" --set steps=6 --set export.adapters_dir="$WORK/${n}_adapters/{task}" \
      --set export.merged_dir="$WORK/${n}_merged/{task}" --set 'export.merged_tasks=[0]' "${extra[@]}"
  done
  same_hash "$what" "$a" "$b"
  if diff -r "$WORK/${a}_merged" "$WORK/${b}_merged" > /dev/null && diff -r "$WORK/${a}_adapters" "$WORK/${b}_adapters" > /dev/null; then
    pass "$what: the merged model and the PEFT adapters are the same, byte for byte"
  else
    fail "$what: the exports differ"
  fi
}
drawn_resumes() {
  local what=$1 whole=$2 job=$3; shift 3
  run_np drawn_first3 2 "$job" "$@" --set steps=3
  $py - "$WORK/drawn_first3.ckpt/step-00000003/manifest.json" <<'PY' && pass "$what: the drawn base is not in the checkpoint" \
    || fail "$what: the checkpoint holds the drawn base"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert [r for r in runs if r[0] == 0][0][2] == -1, runs  # group 0's run: no file (initial)
PY
  expect_code 0 drawn_resumed mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" "$@" \
    --set checkpoint.dir="$WORK/drawn_first3.ckpt" --set log.level=info
  expect_in drawn_resumed "resumed from .*step-00000003 at step 3"
  same_hash "$what: stopped at step 3 and resumed == uninterrupted" "$whole" drawn_resumed
}
