#!/usr/bin/env bash
# tools/tokenize_tasks.py, the path from text to thetad's token files, on the CPU without any
# tokenizer package (--vocab-file): EOS after every document, the prompt's tokens masked (0) and
# the completion's and EOS counted (1), uint16 for a small vocabulary and uint32 above 65,536
# ids, held-out documents to --eval-out, bad lines exit 2 naming file and line, a failed run
# leaves the earlier files as they were (all renamed in at the end, or none), bad UTF-8, an --out
# that is a file and other bad inputs exit 2 without a traceback, --tokenizer without the package
# exit 2 with the pip command. Where `tokenizers` is importable, a real
# tokenizer.json is exercised too (skipped otherwise).
#   tokenize_tasks.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
py=/usr/bin/python3
tool="$HERE/../../tools/tokenize_tasks.py"
[ -x "$py" ] || skip "no $py"

printf '%s\n' '<unk>' '</s>' a b c d hello world > "$WORK/vocab.txt"   # ids 0..7
cat > "$WORK/t0.jsonl" <<'J'
{"text": "hello world"}
{"prompt": "a b", "completion": "c d"}

{"text": "zzz a"}
J
printf '%s\n' '{"prompt": "a", "completion": "b"}' '{"text": "c"}' > "$WORK/t1.jsonl"
expect_code 0 tok "$py" "$tool" --vocab-file "$WORK/vocab.txt" --out "$WORK/data" --eval-out "$WORK/eval" \
  --eval-docs 1 "$WORK/t0.jsonl" "$WORK/t1.jsonl"
expect_in tok "token_dtype: uint16, loss_mask: true"
if out=$("$py" - "$WORK" <<'PY' 2>&1
import sys
w = sys.argv[1]
def u16(p):
    b = open(p, "rb").read()
    return [int.from_bytes(b[i:i + 2], "little") for i in range(0, len(b), 2)]
assert u16(f"{w}/data/task0.bin") == [6, 7, 1, 2, 3, 4, 5, 1], u16(f"{w}/data/task0.bin")
assert list(open(f"{w}/data/task0.mask.bin", "rb").read()) == [1, 1, 1, 0, 0, 1, 1, 1]
assert u16(f"{w}/eval/task0.bin") == [0, 2, 1]  # zzz is <unk>; the last document held out
assert list(open(f"{w}/eval/task0.mask.bin", "rb").read()) == [1, 1, 1]
assert u16(f"{w}/data/task1.bin") == [2, 3, 1] and list(open(f"{w}/data/task1.mask.bin", "rb").read()) == [0, 1, 1]
assert u16(f"{w}/eval/task1.bin") == [4, 1]
print("ids, EOS, masks and the held-out document")
PY
); then pass "$out"; else fail "$out"; fi

# A vocabulary over 65,536 ids: uint32; uint16 asked for is refused.
"$py" -c "
print('<unk>'); print('</s>')
for i in range(70000): print(f'w{i}')" > "$WORK/big.txt"
echo '{"text": "w69999 w0"}' > "$WORK/big.jsonl"
expect_code 0 tok_big "$py" "$tool" --vocab-file "$WORK/big.txt" --out "$WORK/big" "$WORK/big.jsonl"
expect_in tok_big "token_dtype: uint32, loss_mask: false"
if [ "$(od -An -tu4 -v "$WORK/big/task0.bin" | xargs)" = "70001 2 1" ]; then pass "uint32 ids"; else
  fail "uint32 ids: $(od -An -tu4 -v "$WORK/big/task0.bin")"; fi
expect_code 2 tok_big16 "$py" "$tool" --vocab-file "$WORK/big.txt" --dtype uint16 --out "$WORK/big16" "$WORK/big.jsonl"
expect_in tok_big16 "uint16 holds ids up to 65535, but the vocabulary has 70002"

# Bad input: exit 2 naming the file and line, nothing half-written.
printf '%s\n' '{"text": "a"}' '{"prompt": "a"}' > "$WORK/bad.jsonl"
expect_code 2 tok_bad "$py" "$tool" --vocab-file "$WORK/vocab.txt" --out "$WORK/bad" "$WORK/bad.jsonl"
expect_in tok_bad "bad.jsonl:2: a line must be an object"
expect_not_in tok_bad "Traceback"
# A run failing at its second input leaves the first run's files bitwise as they were (none of
# the new task0 renamed in) and no temporary beside them.
cp -a "$WORK/data" "$WORK/data.before"; cp -a "$WORK/eval" "$WORK/eval.before"
printf '%s\n' '{"text": "a a a"}' '{"text": "b"}' > "$WORK/t0new.jsonl"
printf '{"text": "a"}\n{"text": "b \xff c"}\n' > "$WORK/badutf.jsonl"
expect_code 2 tok_midway "$py" "$tool" --vocab-file "$WORK/vocab.txt" --out "$WORK/data" --eval-out "$WORK/eval" \
  --eval-docs 1 "$WORK/t0new.jsonl" "$WORK/badutf.jsonl"
for d in data eval; do
  if diff -r "$WORK/$d.before" "$WORK/$d" >/dev/null; then pass "$d/ after a failed run: the old files, unchanged, no temporaries"
  else fail "$d/ after a failed run: $(diff -r "$WORK/$d.before" "$WORK/$d" | tr '\n' ';')"; fi
done
# Bad UTF-8 names the file and line; --out a file; other bad inputs: exit 2, a message, no traceback.
expect_in tok_midway "badutf.jsonl:2: not UTF-8"
expect_not_in tok_midway "Traceback"
: > "$WORK/afile"
expect_code 2 tok_outfile "$py" "$tool" --vocab-file "$WORK/vocab.txt" --out "$WORK/afile" "$WORK/t1.jsonl"
expect_in tok_outfile "afile: not a directory"
expect_not_in tok_outfile "Traceback"
if [ -s "$WORK/afile" ]; then fail "--out a file: the file was written to"; else pass "--out a file: left empty"; fi
"$py" -c 'print("[" * 100000)' > "$WORK/deep.jsonl"
: > "$WORK/empty.jsonl"
printf '<unk>\n</s>\n\xfe\n' > "$WORK/badvocab.txt"
# refused NAME PATTERN ARGS...: exit 2 saying PATTERN, no traceback, no $WORK/o_NAME made.
refused() {
  local name=$1 want=$2; shift 2
  expect_code 2 "tok_$name" "$py" "$tool" "$@"
  expect_in "tok_$name" "$want"
  expect_not_in "tok_$name" "Traceback"
  if [ -e "$WORK/o_$name" ]; then fail "tok_$name: made $WORK/o_$name"; else pass "tok_$name: no output directory left"; fi
}
v=(--vocab-file "$WORK/vocab.txt")
refused deep "deep.jsonl:1: not JSON" "${v[@]}" --out "$WORK/o_deep" "$WORK/deep.jsonl"
refused empty "empty.jsonl: no documents" "${v[@]}" --out "$WORK/o_empty" "$WORK/empty.jsonl"
refused missing "none.jsonl: cannot read" "${v[@]}" --out "$WORK/o_missing" "$WORK/none.jsonl"
refused vocab "badvocab.txt:3: not UTF-8" --vocab-file "$WORK/badvocab.txt" --out "$WORK/o_vocab" "$WORK/t1.jsonl"
refused same "is --out" "${v[@]}" --out "$WORK/o_same" --eval-out "$WORK/o_same" --eval-docs 1 "$WORK/t0.jsonl"
# --eval-docs above a task's documents: all held out, none left to train on (not the last few).
refused fewer "no documents left for .*o_fewer" "${v[@]}" --out "$WORK/o_fewer" --eval-out "$WORK/e_fewer" \
  --eval-docs 5 "$WORK/t0.jsonl"
# --tokenizer without the packages: the pip command.
mkdir -p "$WORK/nopkg/tokenizers" "$WORK/nopkg/transformers"
echo 'raise ImportError("no")' > "$WORK/nopkg/tokenizers/__init__.py"
echo 'raise ImportError("no")' > "$WORK/nopkg/transformers/__init__.py"
expect_code 2 tok_nopkg env PYTHONPATH="$WORK/nopkg" "$py" "$tool" --tokenizer "$WORK" --out "$WORK/x" "$WORK/t0.jsonl"
expect_in tok_nopkg "pip install tokenizers"
expect_not_in tok_nopkg "Traceback"

# The real tokenizer path, where the package exists: a word-level tokenizer.json.
if "$py" -c 'import tokenizers' 2>/dev/null; then
  "$py" - "$WORK/hf" <<'PY'
import json, os, sys, tokenizers
from tokenizers import models, pre_tokenizers
d = sys.argv[1]; os.makedirs(d)
vocab = {"<unk>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "d": 5, "hello": 6, "world": 7}
t = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
t.save(f"{d}/tokenizer.json")
json.dump({"eos_token": "</s>"}, open(f"{d}/tokenizer_config.json", "w"))
PY
  expect_code 0 tok_hf "$py" "$tool" --tokenizer "$WORK/hf" --out "$WORK/hfdata" "$WORK/t0.jsonl"
  if cmp -s "$WORK/hfdata/task0.bin" <(cat "$WORK/data/task0.bin"; printf '\000\000\002\000\001\000'); then
    pass "tokenizers: the same ids as the vocabulary file"; else fail "tokenizers: other ids"; fi
else
  echo "SKIP: the tokenizers package is not installed: its path is not exercised"
fi
finish
