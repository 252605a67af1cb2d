#!/usr/bin/env python3
"""The CPU stand-in for Hugging Face in llama_peft.sh, with python3-torch only: writes a
tiny Llama as a Hugging Face directory (config.json, safetensors shards and their index, written
here byte by byte), computes its logits with Hugging Face's LlamaForCausalLM formulas (and a PEFT
LoRA adapter's: W x + lora_alpha / r * B A x), checks exported adapter directories, and writes the
bad files thetad must refuse.

  llama_ref.py base DIR TOKENS.npy            a base (BF16, F16 and F32 tensors, 2 shards) + token ids
  llama_ref.py logits DIR TOKENS.npy OUT.npy [ADAPTER_DIR]
  llama_ref.py compare A.npy B.npy TOL        max |a - b| / max |b| <= TOL
  llama_ref.py adapter ADAPTER_DIR R ALPHA LAYERS TARGETS   PEFT names, shapes and config
  llama_ref.py bad BASE_DIR OUT_DIR           damaged copies of the base, one directory each
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 48, "vocab_size": 40, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
          "max_position_embeddings": 64, "torch_dtype": "float32"}
MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def header_bytes(header):
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def write_st(path, tensors):
    """tensors: {name: (dtype word, torch tensor)}"""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (word, t) in tensors.items():
        raw = t.to(DTYPES[word][0]).contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": word, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    with open(path, "wb") as f:
        f.write(header_bytes(header) + b"".join(blobs))


def read_st(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        raw = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.uint8)
        out[name] = raw.view(DTYPES[h["dtype"]][0]).reshape(h["shape"]).float()
    return out


def read_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_st(os.path.join(d, f)))
    return w


def base(d, tokens):
    os.makedirs(d, exist_ok=True)
    c = CONFIG
    g = torch.Generator().manual_seed(35)
    d_, ff, dh = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * dh

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    shard = [{}, {}]
    shard[0]["model.embed_tokens.weight"] = ("BF16", r(c["vocab_size"], d_, scale=1.0))
    for i in range(c["num_hidden_layers"]):
        word = "F16" if i == 0 else "F32"  # layer 0 in half precision, layer 1 in float32
        p = f"model.layers.{i}."
        s = shard[i]
        s[p + "input_layernorm.weight"] = (word, 1 + r(d_, scale=0.1))
        s[p + "post_attention_layernorm.weight"] = (word, 1 + r(d_, scale=0.1))
        for name, shape in (("self_attn.q_proj", (d_, d_)), ("self_attn.k_proj", (kv, d_)), ("self_attn.v_proj", (kv, d_)),
                            ("self_attn.o_proj", (d_, d_)), ("mlp.gate_proj", (ff, d_)), ("mlp.up_proj", (ff, d_)),
                            ("mlp.down_proj", (d_, ff))):
            s[p + name + ".weight"] = (word, r(*shape))
    shard[1]["model.norm.weight"] = ("F32", 1 + r(d_, scale=0.1))
    shard[1]["lm_head.weight"] = ("BF16", r(c["vocab_size"], d_))
    weight_map = {}
    for k, s in enumerate(shard):
        name = f"model-0000{k + 1}-of-00002.safetensors"
        write_st(os.path.join(d, name), s)
        weight_map.update({t: name for t in s})
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    np.save(tokens, torch.randint(c["vocab_size"], (3, 16), generator=g).numpy().astype(np.int64))


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rot(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def forward(w, c, x, lora=None):
    """HF LlamaForCausalLM (eager attention) in float32; lora: {(layer, target): (A, B, scale)}."""
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    d_ = c["hidden_size"]
    dh, eps, (b, s) = d_ // H, c["rms_norm_eps"], x.shape
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, dh, 2, dtype=torch.int64).float() / dh))
    ang = torch.arange(s).float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    mask = torch.full((s, s), float("-inf")).triu(1)

    def lin(i, t, v):
        y = v @ w[f"model.layers.{i}.{MODULES[t]}.weight"].T
        if lora and (i, t) in lora:
            A, B, scale = lora[(i, t)]
            y = y + (v @ A.T @ B.T) * scale
        return y

    h = w["model.embed_tokens.weight"][x]
    for i in range(c["num_hidden_layers"]):
        a = rms(h, w[f"model.layers.{i}.input_layernorm.weight"], eps)
        q = lin(i, "q", a).view(b, s, H, dh).transpose(1, 2)
        k = lin(i, "k", a).view(b, s, KV, dh).transpose(1, 2)
        v = lin(i, "v", a).view(b, s, KV, dh).transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / dh ** 0.5 + mask, -1)
        h = h + lin(i, "o", (att @ v).transpose(1, 2).reshape(b, s, d_))
        f = rms(h, w[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        h = h + lin(i, "down", torch.nn.functional.silu(lin(i, "gate", f)) * lin(i, "up", f))
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms(h, w["model.norm.weight"], eps) @ head.T


def logits(d, tokens, out, adapter=None):
    c = json.load(open(os.path.join(d, "config.json")))
    lora = None
    if adapter:
        ac = json.load(open(os.path.join(adapter, "adapter_config.json")))
        t = read_st(os.path.join(adapter, "adapter_model.safetensors"))
        scale = ac["lora_alpha"] / ac["r"]
        lora = {}
        for i in range(c["num_hidden_layers"]):
            for short, mod in MODULES.items():
                if mod.split(".")[1] in ac["target_modules"]:
                    p = f"base_model.model.model.layers.{i}.{mod}"
                    lora[(i, short)] = (t[p + ".lora_A.weight"], t[p + ".lora_B.weight"], scale)
    with torch.no_grad():
        y = forward(read_dir(d), c, torch.from_numpy(np.load(tokens)), lora)
    np.save(out, y.numpy().astype(np.float32))


def compare(a, b, tol):
    a, b = np.load(a), np.load(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    rel = float(np.abs(a - b).max() / np.abs(b).max())
    print(f"max |a - b| / max |b| = {rel:.2e} (tolerance {tol})")
    assert rel <= float(tol)


def adapter(d, r, alpha, layers, targets):
    ac = json.load(open(os.path.join(d, "adapter_config.json")))
    mods = [MODULES[t].split(".")[1] for t in targets.split(",")]
    assert ac["peft_type"] == "LORA" and ac["task_type"] == "CAUSAL_LM", ac
    assert ac["r"] == int(r) and ac["lora_alpha"] == float(alpha) and sorted(ac["target_modules"]) == sorted(mods), ac
    assert "base_model_name_or_path" in ac
    t = read_st(os.path.join(d, "adapter_model.safetensors"))
    c = CONFIG
    dh = c["hidden_size"] // c["num_attention_heads"]
    out = {"q": c["hidden_size"], "k": c["num_key_value_heads"] * dh, "v": c["num_key_value_heads"] * dh,
           "o": c["hidden_size"], "gate": c["intermediate_size"], "up": c["intermediate_size"], "down": c["hidden_size"]}
    want = {}
    for i in range(int(layers)):
        for short in targets.split(","):
            p = f"base_model.model.model.layers.{i}.{MODULES[short]}"
            fan_in = c["intermediate_size"] if short == "down" else c["hidden_size"]
            want[p + ".lora_A.weight"] = [int(r), fan_in]
            want[p + ".lora_B.weight"] = [out[short], int(r)]
    got = {k: list(v.shape) for k, v in t.items()}
    assert got == want, (sorted(set(got) ^ set(want)), [(k, got.get(k), v) for k, v in want.items() if got.get(k) != v])
    assert any(float(v.abs().max()) > 0 for k, v in t.items() if "lora_B" in k), "B never trained"


def bad(src, out):
    """One damaged copy of the base per case: the test expects exit 2 naming file and tensor."""
    first = "model-00001-of-00002.safetensors"

    def copy(name):
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        return d, os.path.join(d, first)

    def rewrite(name, edit):
        d, f = copy(name)
        data = open(f, "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        h = json.loads(data[8:8 + n])
        body = edit(h, data[8 + n:])
        open(f, "wb").write(header_bytes(h) + body)

    d, f = copy("truncated")
    open(f, "r+b").truncate(os.path.getsize(f) - 7)
    d, f = copy("oversized")
    data = open(f, "rb").read()
    open(f, "wb").write(struct.pack("<Q", 1 << 40) + data[8:])
    rewrite("overlap", lambda h, b: (h["model.layers.0.mlp.up_proj.weight"].__setitem__(
        "data_offsets", [h["model.layers.0.mlp.gate_proj.weight"]["data_offsets"][0] + 2,
                         h["model.layers.0.mlp.gate_proj.weight"]["data_offsets"][0] + 2 +
                         h["model.layers.0.mlp.up_proj.weight"]["data_offsets"][1] - h["model.layers.0.mlp.up_proj.weight"]["data_offsets"][0]]), b)[1])
    rewrite("dtype", lambda h, b: (h["model.layers.0.self_attn.q_proj.weight"].__setitem__("dtype", "Q8"), b)[1])
    rewrite("shape", lambda h, b: (h["model.layers.0.self_attn.k_proj.weight"].__setitem__(
        "shape", list(reversed(h["model.layers.0.self_attn.k_proj.weight"]["shape"]))), b)[1])
    rewrite("intdtype", lambda h, b: (h["model.layers.0.mlp.down_proj.weight"].__setitem__("dtype", "I16"), b)[1])

    def drop(h, b):
        del h["model.layers.0.mlp.gate_proj.weight"]
        return b
    rewrite("missing", drop)
    idx = os.path.join(out, "missing", "model.safetensors.index.json")  # and from the index
    m = json.load(open(idx))
    del m["weight_map"]["model.layers.0.mlp.gate_proj.weight"]
    json.dump(m, open(idx, "w"))
    d, _ = copy("extra")  # an extra tensor: a warning, not an error
    idx = os.path.join(d, "model.safetensors.index.json")
    m = json.load(open(idx))
    write_st(os.path.join(d, "extra.safetensors"), {"model.layers.0.self_attn.rotary_emb.inv_freq": ("F32", torch.ones(4))})
    m["weight_map"]["model.layers.0.self_attn.rotary_emb.inv_freq"] = "extra.safetensors"
    json.dump(m, open(idx, "w"))
    d, _ = copy("index")  # the index names a shard that lacks the tensor
    m = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    m["weight_map"]["model.norm.weight"] = first
    json.dump(m, open(os.path.join(d, "model.safetensors.index.json"), "w"))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"base": base, "logits": logits, "compare": compare, "adapter": adapter, "bad": bad}[cmd](*args)
