#!/usr/bin/env python3
"""The CPU stand-in for Hugging Face in llama_peft.sh and hf_families.sh, with python3-torch only:
writes tiny models of the Llama (2 and 3.x), Mistral, Qwen2 and Qwen3 families as Hugging Face
directories (config.json, safetensors files and their index, written here byte by byte), computes
their logits with the formulas of Hugging Face's LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM and Qwen3ForCausalLM (and a PEFT LoRA adapter's: W x + lora_alpha / r * B A x),
checks exported adapter and merged model directories, and writes the bad files thetad must refuse.

  llama_ref.py base DIR TOKENS.npy [FAMILY]   a base (llama: BF16, F16 and F32 tensors, 2 shards) + token ids
  llama_ref.py logits DIR TOKENS.npy OUT.npy [ADAPTER_DIR]
  llama_ref.py compare A.npy B.npy TOL        max |a - b| / max |b| <= TOL
  llama_ref.py adapter ADAPTER_DIR BASE_DIR R ALPHA TARGETS [DTYPE]   PEFT names, shapes, dtype and config
  llama_ref.py verify WORK DTYPE              a family's run in WORK (hf_families.sh): one line per check
  llama_ref.py bad BASE_DIR OUT_DIR           damaged copies of the base, one directory each
"""
import json
import math
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
# The other families, each as its own config.json would say it (transformers 4's keys, but
# Qwen3's rotary positions in transformers 5's rope_parameters).
FAMILIES = {
    "llama": CONFIG,
    # Llama 3.2's: rope_scaling llama3 (its three bands all met by the tiny head's frequencies),
    # tied embeddings, head_dim given.
    "llama3": dict(CONFIG, rope_theta=500000.0, tie_word_embeddings=True, head_dim=8, mlp_bias=False,
                   rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    # Mistral-Nemo's shape: heads of head_dim 12, wider together (48) than hidden_size (32); a
    # sliding window no row reaches.
    "mistral": {k: v for k, v in dict(CONFIG, model_type="mistral", architectures=["MistralForCausalLM"],
                                      rope_theta=1000000.0, head_dim=12, sliding_window=4096).items()
                if k != "attention_bias"},
    # Biases on q, k and v, tied embeddings, the window off.
    "qwen2": {k: v for k, v in dict(CONFIG, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                                    rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                                    sliding_window=32, max_window_layers=2).items() if k != "attention_bias"},
    # Each query and key head RMS-normed; heads of 16 (hidden_size / heads would be 8).
    "qwen3": {k: v for k, v in dict(CONFIG, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16,
                                    use_sliding_window=False, sliding_window=None,
                                    layer_types=["full_attention", "full_attention"],
                                    rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}).items()
              if k != "rope_theta"},
}
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
    w = {}
    for f in weight_files(d):
        w.update(read_st(os.path.join(d, f)))
    return w


def st_dtypes(path):
    """{tensor: dtype word} of a safetensors file's header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def weight_files(d):
    index = os.path.join(d, "model.safetensors.index.json")
    return sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]


def head_dim(c):
    return c.get("head_dim") or (128 if c["model_type"] == "qwen3" else c["hidden_size"] // c["num_attention_heads"])


def rope(c):
    """(rope_theta, the llama3 scaling or None): transformers 4's rope_scaling and rope_theta, or 5's rope_parameters."""
    r = c.get("rope_scaling") or c.get("rope_parameters") or {}
    theta = r.get("rope_theta", c.get("rope_theta", 10000.0))
    return theta, (r if r.get("rope_type", r.get("type", "default")) == "llama3" else None)


def llama3_inv_freq(inv, s):
    """Llama 3.1's remapping of the rotary frequencies (long wavelengths slowed by factor, short ones
    kept, those between blended)."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    context = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    slow = torch.where(wavelen > context / low, inv / factor, inv)
    blend = (context / wavelen - low) / (high - low)
    blended = (1 - blend) * slow / factor + blend * slow
    between = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(between, blended, slow)


def shapes(c):
    """{module: [out, in]} of a layer's matrices."""
    d_, ff, dh = c["hidden_size"], c["intermediate_size"], head_dim(c)
    q, kv = c["num_attention_heads"] * dh, c["num_key_value_heads"] * dh
    return {"self_attn.q_proj": [q, d_], "self_attn.k_proj": [kv, d_], "self_attn.v_proj": [kv, d_],
            "self_attn.o_proj": [d_, q], "mlp.gate_proj": [ff, d_], "mlp.up_proj": [ff, d_], "mlp.down_proj": [d_, ff]}


def base(d, tokens, family="llama"):
    """llama: two shards of BF16, F16 and F32 tensors with their index; the other families one F32
    model.safetensors, with Qwen2's biases and Qwen3's head norms."""
    os.makedirs(d, exist_ok=True)
    c = FAMILIES[family]
    g = torch.Generator().manual_seed(35)
    d_ = c["hidden_size"]

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    llama = family == "llama"
    shard = [{}, {}]
    shard[0]["model.embed_tokens.weight"] = ("BF16" if llama else "F32", r(c["vocab_size"], d_, scale=1.0))
    for i in range(c["num_hidden_layers"]):
        word = ("F16" if i == 0 else "F32") if llama else "F32"  # llama: layer 0 in half precision
        p = f"model.layers.{i}."
        s = shard[i] if llama else shard[0]
        s[p + "input_layernorm.weight"] = (word, 1 + r(d_, scale=0.1))
        s[p + "post_attention_layernorm.weight"] = (word, 1 + r(d_, scale=0.1))
        for name, shape in shapes(c).items():
            s[p + name + ".weight"] = (word, r(*shape))
        if c["model_type"] == "qwen2":
            for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                s[p + name + ".bias"] = (word, r(shapes(c)[name][0]))
        if c["model_type"] == "qwen3":
            for name in ("self_attn.q_norm", "self_attn.k_norm"):
                s[p + name + ".weight"] = (word, 1 + r(head_dim(c), scale=0.1))
    last = shard[1] if llama else shard[0]
    last["model.norm.weight"] = ("F32", 1 + r(d_, scale=0.1))
    if not c.get("tie_word_embeddings"):
        last["lm_head.weight"] = ("BF16" if llama else "F32", r(c["vocab_size"], d_))
    if llama:
        weight_map = {}
        for k, s in enumerate(shard):
            name = f"model-0000{k + 1}-of-00002.safetensors"
            write_st(os.path.join(d, name), s)
            weight_map.update({t: name for t in s})
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"))
    else:
        write_st(os.path.join(d, "model.safetensors"), shard[0])
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, open(os.path.join(d, "generation_config.json"), "w"))
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    np.save(tokens, torch.randint(c["vocab_size"], (3, 16), generator=g).numpy().astype(np.int64))


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rot(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def forward(w, c, x, lora=None):
    """The family's ForCausalLM (eager attention) in float32; lora: {(layer, target): (A, B, scale)}."""
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    dh, eps, (b, s) = head_dim(c), c["rms_norm_eps"], x.shape
    theta, scaling = rope(c)
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.int64).float() / dh))
    if scaling:
        inv = llama3_inv_freq(inv, scaling)
    ang = torch.arange(s).float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    mask = torch.full((s, s), float("-inf")).triu(1)
    qk_norm = c["model_type"] == "qwen3"

    def lin(i, t, v):
        p = f"model.layers.{i}.{MODULES[t]}"
        y = v @ w[p + ".weight"].T
        if p + ".bias" in w:
            y = y + w[p + ".bias"]
        if lora and (i, t) in lora:
            A, B, scale = lora[(i, t)]
            y = y + (v @ A.T @ B.T) * scale
        return y

    h = w["model.embed_tokens.weight"][x]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(h, w[p + "input_layernorm.weight"], eps)
        q, k = lin(i, "q", a).view(b, s, H, dh), lin(i, "k", a).view(b, s, KV, dh)
        if qk_norm:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"], eps), rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(i, "v", a).view(b, s, KV, dh).transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / dh ** 0.5 + mask, -1)
        h = h + lin(i, "o", (att @ v).transpose(1, 2).reshape(b, s, H * dh))
        f = rms(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + lin(i, "down", torch.nn.functional.silu(lin(i, "gate", f)) * lin(i, "up", f))
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms(h, w["model.norm.weight"], eps) @ head.T


def read_adapter(adapter, c):
    """{(layer, target): (A, B, scale)} of a PEFT directory."""
    ac = json.load(open(os.path.join(adapter, "adapter_config.json")))
    t = read_st(os.path.join(adapter, "adapter_model.safetensors"))
    scale = ac["lora_alpha"] / ac["r"]
    lora = {}
    for i in range(c["num_hidden_layers"]):
        for short, mod in MODULES.items():
            if mod.split(".")[1] in ac["target_modules"]:
                p = f"base_model.model.model.layers.{i}.{mod}"
                lora[(i, short)] = (t[p + ".lora_A.weight"], t[p + ".lora_B.weight"], scale)
    return lora


def model_logits(d, tokens, adapter=None):
    c = json.load(open(os.path.join(d, "config.json")))
    with torch.no_grad():
        return forward(read_dir(d), c, torch.from_numpy(np.load(tokens)), read_adapter(adapter, c) if adapter else None)


def logits(d, tokens, out, adapter=None):
    np.save(out, model_logits(d, tokens, adapter).numpy().astype(np.float32))


def rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def compare(a, b, tol):
    a, b = np.load(a), np.load(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    print(f"max |a - b| / max |b| = {rel(a, b):.2e} (tolerance {tol})")
    assert rel(a, b) <= float(tol)


def adapter(d, base_dir, r, alpha, targets, dtype="F32"):
    ac = json.load(open(os.path.join(d, "adapter_config.json")))
    mods = [MODULES[t].split(".")[1] for t in targets.split(",")]
    assert ac["peft_type"] == "LORA" and ac["task_type"] == "CAUSAL_LM", ac
    assert ac["r"] == int(r) and ac["lora_alpha"] == float(alpha) and sorted(ac["target_modules"]) == sorted(mods), ac
    assert "base_model_name_or_path" in ac
    c = json.load(open(os.path.join(base_dir, "config.json")))
    file = os.path.join(d, "adapter_model.safetensors")
    t = read_st(file)
    want = {}
    for i in range(c["num_hidden_layers"]):
        for short in targets.split(","):
            p = f"base_model.model.model.layers.{i}.{MODULES[short]}"
            out, fan_in = shapes(c)[MODULES[short]]
            want[p + ".lora_A.weight"] = [int(r), fan_in]
            want[p + ".lora_B.weight"] = [out, int(r)]
    got = {k: list(v.shape) for k, v in t.items()}
    assert got == want, (sorted(set(got) ^ set(want)), [(k, got.get(k), v) for k, v in want.items() if got.get(k) != v])
    assert set(st_dtypes(file).values()) == {dtype}, (set(st_dtypes(file).values()), dtype)
    assert any(float(v.abs().max()) > 0 for k, v in t.items() if "lora_B" in k), "B never trained"


# A tolerance of the merged weights and logits per export dtype: fp32 exact but for the order of
# the sums; bf16 and fp16 a rounding of each weight (one unit in the last place: thetad merges its
# float32 adapters, the reference the adapters as exported).
MERGED_TOL = {"F32": (1e-6, 1e-5), "F16": (2.0 ** -10, 5e-3), "BF16": (2.0 ** -7, 3e-2)}


def verify(work, dtype):
    """A family's run (hf_families.sh): thetad's logits of the base (task 1, no adapter) and of task
    0 with its exported adapter, against the reference with the base, the adapter and the merged
    model. One line per check: "ok ..." or "FAIL ..."."""
    base_dir, tokens = os.path.join(work, "base"), os.path.join(work, "tokens.npy")
    adapter_dir, merged_dir = os.path.join(work, "adapters", "0"), os.path.join(work, "merged", "0")
    c = json.load(open(os.path.join(base_dir, "config.json")))
    ours_base, ours_tuned = np.load(os.path.join(work, "thetad_base.npy")), np.load(os.path.join(work, "thetad_tuned.npy"))
    w_tol, l_tol = MERGED_TOL[dtype]
    checks = []

    def check(what, fn):
        try:
            note = fn()
            checks.append(f"ok   {what}" + (f": {note}" if note else ""))
        except Exception as e:  # every check reports, whatever fails
            checks.append(f"FAIL {what}: {type(e).__name__}: {e}")

    def close(a, b, tol):
        assert np.shape(a) == np.shape(b), (np.shape(a), np.shape(b))
        assert rel(a, b) <= tol, f"{rel(a, b):.2e} > {tol}"
        return f"{rel(a, b):.2e}"

    ref_base = model_logits(base_dir, tokens).numpy()
    check("step 0: thetad's logits == the family's formulas (fp32, 1e-5)", lambda: close(ours_base, ref_base, 1e-5))
    check(f"task 0: a PEFT directory ({dtype})", lambda: adapter(adapter_dir, base_dir, 4, 8, "q,k,v,o,gate,up,down", dtype))
    check("task 0: base + its PEFT adapter == thetad's logits (1e-5)",
          lambda: close(ours_tuned, model_logits(base_dir, tokens, adapter_dir).numpy(), 1e-5))

    def moved():
        d = float(np.abs(ours_tuned - ours_base).max())
        assert d > 1e-3, d
        return f"max |a - b| = {d:.2e}"
    check("the adapter moved the logits", moved)

    def merged_files():
        mc = json.load(open(os.path.join(merged_dir, "config.json")))
        want = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
        assert mc == dict(c, torch_dtype=want), (mc, c)
        files = weight_files(merged_dir)
        dtypes = {}
        for f in files:
            dtypes.update(st_dtypes(os.path.join(merged_dir, f)))
        assert sorted(dtypes) == sorted(read_dir(base_dir)), sorted(set(dtypes) ^ set(read_dir(base_dir)))
        assert set(dtypes.values()) == {dtype}, set(dtypes.values())
        for f in ("generation_config.json",):
            if os.path.exists(os.path.join(base_dir, f)):
                assert open(os.path.join(base_dir, f)).read() == open(os.path.join(merged_dir, f)).read(), f
        return f"{len(files)} safetensors file(s)"
    check(f"task 0: a merged model directory (config.json, names, {dtype})", merged_files)

    def merged_weights():
        w, m = read_dir(base_dir), read_dir(merged_dir)
        lora = read_adapter(adapter_dir, c)
        worst = 0.0
        for name, want in w.items():
            for (i, t), (A, B, scale) in lora.items():
                if name == f"model.layers.{i}.{MODULES[t]}.weight":
                    want = want + (B @ A) * scale
            err = (m[name] - want).abs() - w_tol * want.abs()
            worst = max(worst, float(err.max() / want.abs().max()))
        assert worst <= 1e-4, f"a merged weight is {worst:.2e} of its tensor's largest beyond the dtype's rounding"
    check("task 0: merged weights == W + alpha / r B A", merged_weights)
    check(f"task 0: the merged model's logits == thetad's ({l_tol})",
          lambda: close(ours_tuned, model_logits(merged_dir, tokens).numpy(), l_tol))
    print("\n".join(checks))


def drop(src, out, tensor):
    """A copy of the base directory without one tensor (in its file and its index)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    for f in weight_files(out):
        path = os.path.join(out, f)
        t = read_st(path)
        if tensor in t:
            words = st_dtypes(path)
            write_st(path, {k: (words[k], v) for k, v in t.items() if k != tensor})
    index = os.path.join(out, "model.safetensors.index.json")
    if os.path.exists(index):
        m = json.load(open(index))
        m["weight_map"].pop(tensor, None)
        json.dump(m, open(index, "w"))


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
    {"base": base, "logits": logits, "compare": compare, "adapter": adapter, "verify": verify, "drop": drop,
     "bad": bad}[cmd](*args)
