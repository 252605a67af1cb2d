#!/usr/bin/env python3
"""Writes a random Llama base as Hugging Face saves one (config.json, model.safetensors with its
tensor names, bf16 by default), one tensor at a time (Python's standard library only: it runs
where numpy is not installed): the input of bench/gpu/load_speed.sh. Values: a pool of 16 Mi
random bf16 values of magnitude 2^-7 to 2^-6 with random signs (seeded: the same file each time),
laid out cyclically (fast to write; load speed does not depend on them); norm weights 1.

    python3 bench/gpu/write_llama_safetensors.py DIR [--hidden 2048 --layers 22 --heads 32
        --kv-heads 4 --ff 5632 --vocab 32000 --dtype BF16|F32]
"""
import argparse
import json
import math
import os
import random
import struct
import sys


def tensors(a):
    """(name, shape) in Hugging Face's order."""
    d, kv = a.hidden, a.hidden // a.heads * a.kv_heads
    yield "model.embed_tokens.weight", (a.vocab, d)
    for i in range(a.layers):
        p = "model.layers.%d." % i
        yield p + "input_layernorm.weight", (d,)
        for t, shape in (("q", (d, d)), ("k", (kv, d)), ("v", (kv, d)), ("o", (d, d))):
            yield p + "self_attn.%s_proj.weight" % t, shape
        yield p + "post_attention_layernorm.weight", (d,)
        for t, shape in (("gate", (a.ff, d)), ("up", (a.ff, d)), ("down", (d, a.ff))):
            yield p + "mlp.%s_proj.weight" % t, shape
    yield "model.norm.weight", (d,)
    yield "lm_head.weight", (a.vocab, d)


POOL = 16 << 20


def pool_of(rng):
    """bf16 bits, little-endian: random sign and mantissa, exponent of 2^-7 (bits & 0x807F | 0x3C00)."""
    bits = bytearray(rng.randbytes(2 * POOL))
    bits[0::2] = bytes(bits[0::2]).translate(bytes(b & 0x7F for b in range(256)))
    bits[1::2] = bytes(bits[1::2]).translate(bytes((b & 0x80) | 0x3C for b in range(256)))
    return bytes(bits)


def chunks(name, shape, dtype, pool):
    """The tensor's bytes, in pieces of at most the pool's size (F32: the bf16 bits as the upper half)."""
    n = math.prod(shape)
    ones = b"\x80\x3f" * POOL if name.endswith("norm.weight") else None
    for first in range(0, n, POOL):
        m = min(POOL, n - first)
        bits = (ones or pool)[:2 * m]
        if dtype == "F32":
            wide = bytearray(4 * m)
            wide[2::4], wide[3::4] = bits[0::2], bits[1::2]
            bits = bytes(wide)
        yield bits


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    for k, v in (("hidden", 2048), ("layers", 22), ("heads", 32), ("kv-heads", 4), ("ff", 5632), ("vocab", 32000)):
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--dtype", choices=["BF16", "F32"], default="BF16")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    item = 2 if a.dtype == "BF16" else 4
    header, off, order = {"__metadata__": {"format": "pt"}}, 0, list(tensors(a))
    for name, shape in order:
        n = math.prod(shape) * item
        header[name] = {"dtype": a.dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pool = pool_of(random.Random(1))
    path = os.path.join(a.dir, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in order:
            for piece in chunks(name, shape, a.dtype, pool):
                f.write(piece)
    os.replace(path + ".tmp", path)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": a.hidden,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "intermediate_size": a.ff, "vocab_size": a.vocab, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
           "torch_dtype": "bfloat16" if a.dtype == "BF16" else "float32"}
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    params = sum(math.prod(s) for _, s in order)
    print("wrote %s: %d tensors, %.3f B parameters, %.3f GB" % (path, len(order), params / 1e9, off / 1e9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
