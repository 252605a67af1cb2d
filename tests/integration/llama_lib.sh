# The Llama scripts' set-up over llama_ref.py (llama_peft.sh, llama_nf4.sh): a tiny Hugging Face
# base in $WORK/base with token ids in $WORK/tokens.npy, the job that trains on it, and two
# helpers; sourced after lib.sh with $logits_bin set (thetad_logits).
#   logits NAME TASK SETS...   thetad's logits of the job's model over the base into $WORK/NAME.npy
#   close WHAT A B             $WORK/A.npy equals $WORK/B.npy within 1e-5 relative: pass or fail
#   exported NAME              tasks 0 and 1's adapters in $WORK/adapters/T are PEFT directories
#                              (names, shapes, adapter_config.json), and the base with each gives
#                              thetad's logits with it (lora.init_from: $WORK/NAME$T.npy; the
#                              reference's: $WORK/ref_NAME$T.npy)
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
