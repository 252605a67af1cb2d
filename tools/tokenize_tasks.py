#!/usr/bin/env python3
"""Turns JSON lines of text per task into thetad's token files (data.kind: tokens).

    tools/tokenize_tasks.py --tokenizer DIR_OR_tokenizer.json --out data/ task0.jsonl task1.jsonl ...
    tools/tokenize_tasks.py --vocab-file vocab.txt --out data/ --eval-out eval/ --eval-docs 8 t0.jsonl t1.jsonl

The i-th input file is task i. Each line is a document: {"text": "..."} (every token counts in
the loss) or {"prompt": "...", "completion": "..."} (the prompt's tokens do not: they are read
but not predicted). Per task it writes OUT/task{i}.bin, the documents' ids one after another,
each followed by the end-of-sequence id, as little-endian uint16 where the vocabulary has at most
65,536 ids and uint32 above (Llama 3's 128,256), and OUT/task{i}.mask.bin, one byte per token: 1
where the token is a target the loss counts, 0 where it is not (a prompt's tokens). With
--eval-out, the last --eval-docs documents of each task go to EVAL/task{i}.bin (and .mask.bin)
instead: held-out files for `eval.dir`. At the end it prints the job keys that read them.

Tokenizers: --tokenizer reads a Hugging Face tokenizer (a directory holding tokenizer.json, or
the file) with the `tokenizers` package, or with `transformers` where only that is installed;
the end-of-sequence token comes from the tokenizer (tokenizer_config.json's eos_token) unless
--eos names it. A prompt is encoded with the tokenizer's special tokens (a BOS where it adds one),
its completion without, each alone. --vocab-file is the package-free tokenizer: one token per line
(its id is its line number, from 0), text split on whitespace, a word not in it is the id of
<unk> (an error where there is none); its EOS is </s> unless --eos names another token.
Every file is written under a temporary name in its directory (.NAME.tmp-PID) and synced, and
all are renamed into place only once every one is written: a failed run leaves the earlier files
as they were and no temporary behind. Bad input (a missing, unreadable or empty file, a line that
is not UTF-8 or not such a JSON object, an --out that is not a directory) is exit 2 naming the
file (and the line); a tokenizer package that is missing is exit 2 with the command that installs it.
"""
import argparse
import json
import os
import sys
from array import array


def fail(message):
    print(f"tokenize_tasks: {message}", file=sys.stderr)
    sys.exit(2)


def text_lines(path, what):
    """(line number, text) of a UTF-8 file; exit 2 naming the file and line where it cannot be read."""
    try:
        with open(path, "rb") as f:
            # Decoded a line at a time (not by a text-mode file, which decodes in blocks) so that
            # a byte that is not UTF-8 is reported at its line.
            for n, raw in enumerate(f, 1):
                try:
                    yield n, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    fail(f"{path}:{n}: not UTF-8 (byte {e.start + 1} of the line: {e.reason})")
    except OSError as e:
        fail(f"{path}: cannot read {what}: {e.strerror}")


class VocabFile:
    """The package-free tokenizer: whitespace words looked up in a list of tokens."""

    def __init__(self, path, eos):
        # "\r\n" endings too, as the text-mode reading of earlier releases took them.
        tokens = [line.removesuffix("\n").removesuffix("\r") for _, line in text_lines(path, "the vocabulary")]
        self.ids = {}
        for i, t in enumerate(tokens):
            if not t or t in self.ids:
                fail(f"{path}:{i + 1}: {'an empty token' if not t else repr(t) + ' given twice'}")
            self.ids[t] = i
        self.vocab_size = len(tokens)
        self.unk = self.ids.get("<unk>")
        name = eos if eos is not None else "</s>"
        if name not in self.ids:
            fail(f"{path}: no end-of-sequence token {name!r} in the vocabulary (name it with --eos)")
        self.eos_id = self.ids[name]

    def encode(self, text, special):
        del special  # no special tokens but EOS
        out = []
        for w in text.split():
            i = self.ids.get(w, self.unk)
            if i is None:
                raise ValueError(f"the word {w!r} is not in the vocabulary, which has no <unk>")
            out.append(i)
        return out


def eos_of_config(directory):
    """tokenizer_config.json's eos_token (a string or {"content": ...}), or None."""
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not JSON, or not UTF-8
        fail(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}")
    tok = config.get("eos_token") if isinstance(config, dict) else None
    return tok.get("content") if isinstance(tok, dict) else tok


class HuggingFace:
    """A Hugging Face tokenizer through `tokenizers`, or `transformers` where only that exists."""

    def __init__(self, path, eos):
        directory = path if os.path.isdir(path) else os.path.dirname(path) or "."
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        try:
            import tokenizers  # noqa: F401  (the lighter package first)
            have_tokenizers = True
        except ImportError:
            have_tokenizers = False
        if have_tokenizers:
            if not os.path.isfile(file):
                fail(f"{file}: no tokenizer.json (give a directory holding one, or the file)")
            try:
                self.tok = tokenizers.Tokenizer.from_file(file)
            except Exception as e:  # the Rust binding raises a bare Exception for a bad file
                fail(f"{file}: not a tokenizer the `tokenizers` package reads: {e}")
            self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
            self.kind = "tokenizers"
            token_to_id = self.tok.token_to_id
        else:
            try:
                import transformers
            except ImportError:
                fail(f"--tokenizer needs the `tokenizers` (or `transformers`) package, which {sys.executable} "
                     f"cannot import: `{sys.executable} -m pip install tokenizers`; or tokenize with --vocab-file")
            try:
                self.tok = transformers.AutoTokenizer.from_pretrained(directory)
            except Exception as e:  # OSError, ValueError, KeyError ... by the file that is wrong
                fail(f"{directory}: not a tokenizer `transformers` reads: {e}")
            self.vocab_size = len(self.tok)
            self.kind = "transformers"
            token_to_id = self.tok.convert_tokens_to_ids
        name = eos if eos is not None else eos_of_config(directory)
        if name is None:
            fail(f"{directory}: no eos_token in tokenizer_config.json: name the end-of-sequence token with --eos")
        self.eos_id = token_to_id(name)
        if self.eos_id is None or (self.kind == "transformers" and self.eos_id == self.tok.unk_token_id):
            fail(f"the end-of-sequence token {name!r} is not in the tokenizer's vocabulary")

    def encode(self, text, special):
        if self.kind == "tokenizers":
            return self.tok.encode(text, add_special_tokens=special).ids
        return self.tok.encode(text, add_special_tokens=special)


def documents(path):
    """(prompt ids source, completion text) pairs of a JSONL file: ("", text) for a text line."""
    for n, line in text_lines(path, "the documents"):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
            fail(f"{path}:{n}: not JSON ({getattr(e, 'msg', e)})")
        except RecursionError:
            fail(f"{path}:{n}: not JSON (nested too deep)")
        if not isinstance(doc, dict):
            fail(f"{path}:{n}: a line must be an object with \"text\", or \"prompt\" and \"completion\"")
        if isinstance(doc.get("text"), str) and "prompt" not in doc:
            yield n, None, doc["text"]
        elif isinstance(doc.get("prompt"), str) and isinstance(doc.get("completion"), str):
            yield n, doc["prompt"], doc["completion"]
        else:
            fail(f"{path}:{n}: a line must be an object with a string \"text\", or strings \"prompt\" and \"completion\"")


def tokenize(tok, prompt, text):
    """A document's ids and mask bytes, EOS last."""
    if prompt is None:
        ids = tok.encode(text, True)
        return ids + [tok.eos_id], [1] * (len(ids) + 1)
    p = tok.encode(prompt, True)
    c = tok.encode(text, False)
    return p + c + [tok.eos_id], [0] * len(p) + [1] * (len(c) + 1)


class Output:
    """The run's files, each written under a temporary name beside its final one and synced; all
    renamed into place at the end (commit), or all removed (abort): an error leaves the files of
    an earlier run as they were. (A crash among the renames themselves may still leave a mix.)"""

    def __init__(self):
        self.pending = []  # (temporary, final) paths
        self.made = []  # directories this run created, removed again by abort where still empty

    def prepare(self, directory):
        if os.path.isdir(directory):
            return
        try:  # main refused a path that is not a directory; one put there since fails here
            os.makedirs(directory)
        except OSError as e:
            fail(f"{directory}: cannot create the directory: {e.strerror}")
        self.made.append(directory)

    def write(self, directory, name, data):
        self.prepare(directory)
        final = os.path.join(directory, name)
        if os.path.isdir(final):  # found now: a rename onto it would fail midway through commit
            fail(f"{final}: a directory is in the way of the file")
        tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
        self.pending.append((tmp, final))  # before the open: a half-written one is removed too
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            fail(f"{tmp}: cannot write: {e.strerror}")

    def commit(self):
        directories = dict.fromkeys(os.path.dirname(final) for _, final in self.pending)
        while self.pending:
            tmp, final = self.pending[0]
            try:
                os.replace(tmp, final)
            except OSError as e:  # abort removes the temporaries still pending
                fail(f"{final}: cannot rename into place: {e.strerror} (the files renamed before it are the new ones)")
            self.pending.pop(0)
        for directory in directories:
            try:  # makes the renames durable; the files are in place even where it cannot
                fd = os.open(directory, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:  # some file systems refuse fsync on a directory (EINVAL)
                pass
        self.made = []

    def abort(self):
        for tmp, _ in self.pending:
            try:
                os.unlink(tmp)
            except OSError:  # never written (the open failed), or not ours to remove
                pass
        self.pending = []
        for directory in reversed(self.made):
            try:
                os.rmdir(directory)
            except OSError:  # not empty: something else was put there meanwhile
                pass


def task_files(ids, mask, typecode):
    """task{t}.bin's bytes (little-endian ids) and task{t}.mask.bin's."""
    data = array(typecode, ids)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes(), bytes(mask)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", help="a Hugging Face tokenizer: a directory holding tokenizer.json, or the file")
    src.add_argument("--vocab-file", help="one token per line (id = line number): the package-free tokenizer")
    ap.add_argument("--eos", help="the end-of-sequence token (default: the tokenizer's; </s> for --vocab-file)")
    ap.add_argument("--out", required=True, help="directory for task{t}.bin and task{t}.mask.bin (data.dir)")
    ap.add_argument("--eval-out", help="directory for the held-out files (eval.dir)")
    ap.add_argument("--eval-docs", type=int, default=0, help="the last N documents of each task go to --eval-out")
    ap.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto")
    ap.add_argument("inputs", nargs="+", help="JSONL files, the i-th is task i")
    a = ap.parse_args()
    if (a.eval_out is None) != (a.eval_docs <= 0):
        fail("--eval-out and --eval-docs go together (--eval-docs > 0)")
    for directory in filter(None, (a.out, a.eval_out)):  # before the tokenizer loads: fail early
        if os.path.lexists(directory) and not os.path.isdir(directory):
            fail(f"{directory}: not a directory (--out and --eval-out name directories)")
    if a.eval_out and os.path.realpath(a.eval_out) == os.path.realpath(a.out):
        fail(f"--eval-out {a.eval_out} is --out: the held-out files would replace the training ones")
    tok = VocabFile(a.vocab_file, a.eos) if a.vocab_file else HuggingFace(a.tokenizer, a.eos)
    dtype = a.dtype if a.dtype != "auto" else ("uint16" if tok.vocab_size <= 1 << 16 else "uint32")
    if dtype == "uint16" and tok.vocab_size > 1 << 16:
        fail(f"--dtype uint16 holds ids up to 65535, but the vocabulary has {tok.vocab_size}: use uint32")
    typecode = "H" if dtype == "uint16" else "I"
    if array(typecode).itemsize != (2 if dtype == "uint16" else 4):
        typecode = "I" if dtype == "uint16" else "L"
    masked, written, out = False, [], Output()
    try:
        for task, path in enumerate(a.inputs):
            docs = []
            for n, prompt, text in documents(path):
                try:
                    docs.append(tokenize(tok, prompt, text))
                except ValueError as e:
                    fail(f"{path}:{n}: {e}")
                masked = masked or prompt is not None
            if not docs:
                fail(f"{path}: no documents (the file is empty or blank)")
            held = docs[max(0, len(docs) - a.eval_docs):] if a.eval_docs > 0 else []
            train = docs[:len(docs) - len(held)]
            for directory, part in ((a.out, train),) + (((a.eval_out, held),) if held else ()):
                if not part:
                    fail(f"{path}: no documents left for {directory} ({len(docs)} in the file)")
                ids = [i for d in part for i in d[0]]
                mask = [m for d in part for m in d[1]]
                data, mask_bytes = task_files(ids, mask, typecode)
                out.write(directory, f"task{task}.bin", data)
                out.write(directory, f"task{task}.mask.bin", mask_bytes)
                written.append(f"{directory}/task{task}.bin: {len(part)} documents, {len(ids)} tokens "
                               f"({sum(mask)} counted in the loss)")
        out.commit()
    finally:
        out.abort()  # after a failure (fail's SystemExit too); nothing is left to remove after commit
    print("\n".join(written))
    print("job keys:")
    print(f"  model: {{vocab: {tok.vocab_size}}}  # at least; a model.init_from config.json gives its own")
    print(f"  data: {{kind: tokens, dir: {a.out}, token_dtype: {dtype}, loss_mask: {'true' if masked else 'false'}}}")
    if a.eval_out:
        print(f"  eval: {{dir: {a.eval_out}}}")


if __name__ == "__main__":
    main()
