#!/usr/bin/env python3
"""QLoRA's 4-bit NormalFloat written from its definition (Dettmers et al., 2023), for llama_nf4.sh:
the code book from the normal distribution's quantiles, blocks of 64 consecutive values (the
matrix read row by row, zeros padding the last) scaled by their absmax as thetad holds it (rounded
to bf16), each value replaced by the nearest level, dequantized as level * absmax rounded once to
bf16; a frozen base whose linear
weights went through it, and llama_ref.py's Hugging Face formulas over that base.

  nf4_ref.py logits BASE_DIR TOKENS.npy OUT.npy [ADAPTER_DIR]   logits of the nf4 base (+ adapter)
  nf4_ref.py loss A.npy B.npy TOKENS.npy TOL                   the next-token losses of two logits agree within TOL
"""
import json
import os
import sys
from statistics import NormalDist

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402


def code_book():
    """8 quantiles of the positive half at probabilities evenly spaced from 0.9677083 to 1/2 (the
    last left out), 7 of the negative half, and 0, normalised by the largest (probabilities in
    float32, as QLoRA's reference code computes them)."""
    q = NormalDist().inv_cdf
    pos = [q(float(p)) for p in torch.linspace(0.9677083, 0.5, 9)[:-1]]
    neg = [-q(float(p)) for p in torch.linspace(0.9677083, 0.5, 8)[:-1]]
    v = torch.tensor(pos + [0.0] + neg).sort().values
    return v / v.max()


def quantize_dequantize(w):
    """w's values after nf4 and back, in float32."""
    book = code_book()
    flat = w.float().reshape(-1)
    n = flat.numel()
    blocks = torch.cat([flat, torch.zeros((-n) % 64)]).view(-1, 64)
    absmax = blocks.abs().amax(1, keepdim=True).to(torch.bfloat16).float()  # the scale held in bf16
    scaled = torch.where(absmax > 0, blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax)), torch.zeros_like(blocks))
    codes = (scaled.unsqueeze(-1) - book).abs().argmin(-1)  # the first of two equally near
    values = (book[codes] * absmax).to(torch.bfloat16).float()
    return values.reshape(-1)[:n].view(w.shape)


# The matrices thetad quantizes as one (those that read one input, their rows joined).
JOINED = [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
          ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]


def nf4_base(w, c):
    w = dict(w)
    for i in range(c["num_hidden_layers"]):
        for group in JOINED:
            names = [f"model.layers.{i}.{m}.weight" for m in group]
            joined = quantize_dequantize(torch.cat([w[n] for n in names], 0))
            for n, part in zip(names, joined.split([w[n].shape[0] for n in names], 0)):
                w[n] = part
    if not c.get("tie_word_embeddings"):
        w["lm_head.weight"] = quantize_dequantize(w["lm_head.weight"])
    return w


def logits(d, tokens, out, adapter=None):
    c = json.load(open(os.path.join(d, "config.json")))
    with torch.no_grad():
        w = nf4_base(llama_ref.read_dir(d), c)
        lora = llama_ref.read_adapter(adapter, c) if adapter else None
        y = llama_ref.forward(w, c, torch.from_numpy(np.load(tokens)), lora)
    np.save(out, y.numpy().astype(np.float32))


def loss(a, b, tokens, tol):
    t = torch.from_numpy(np.load(tokens))
    la, lb = (torch.nn.functional.cross_entropy(torch.from_numpy(np.load(x))[:, :-1].reshape(-1, np.load(x).shape[-1]),
                                                t[:, 1:].reshape(-1)).item() for x in (a, b))
    print(f"next-token loss {la:.5f} against {lb:.5f}: {abs(la - lb) / lb:.2%} apart (tolerance {float(tol):.0%})")
    assert abs(la - lb) <= float(tol) * lb


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"logits": logits, "loss": loss}[cmd](*args)
