#!/usr/bin/env bash
# tools/tokenize_tasks.py, the path from text to thetad's token files, on the CPU without any
# tokenizer package (--vocab-file): EOS after every document, the prompt's tokens masked (0) and
# the completion's and EOS counted (1), uint16 for a small vocabulary and uint32 above 65,536
# ids, held-out documents to --eval-out, bad lines exit 2 naming file and line, --tokenizer
# without the package exit 2 with the pip command. Where `tokenizers` is importable, a real
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
