#!/usr/bin/env python3
"""Exports a decoder-only transformer with one LoRA adapter set per task as TorchScript for
thetad's `model.kind: torchscript`, and its weights as a state dict.

The model is thetad's built-in `model.kind: transformer` written in Python (pre-norm blocks,
learned positions, causal attention, GELU MLP, no biases in the projections, LoRA
W x + (alpha / r) B A x with B zero at the start), with the built-in's parameter names, so:

  - as TorchScript, thetad trains it with `shared: ["embed.*", "pos.*", "blocks.*", "ln_f.*",
    "lm_head.*"]` and `task: "lora.{t}.*"` on `data.kind: tokens` (next-token cross-entropy);
  - its state dict (`--state-dict FILE`) starts the built-in transformer at the same weights
    (`model.init_from: FILE`): both then follow the same loss curve (tests/integration/transformer.sh).

    /usr/bin/python3 docs/examples/export_transformer.py runs/export/tfm.pt --state-dict runs/export/tfm-init.pt
"""
import argparse
import math
import os

import torch
from torch import nn
import torch.nn.functional as F


class Lora(nn.Module):
    def __init__(self, d_in: int, d_out: int, rank: int):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.a = nn.Parameter(torch.empty(rank, d_in).uniform_(-bound, bound))
        self.b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.a), self.b)


class Attention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)


class Mlp(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)


class Block(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = Mlp(d, d_ff)


class LayerAdapters(nn.Module):
    """One task's adapters of one block: q and v (lora.targets: [q, v])."""

    def __init__(self, d: int, rank: int):
        super().__init__()
        self.q = Lora(d, d, rank)
        self.v = Lora(d, d, rank)


class LoraTransformer(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int, heads: int, d_ff: int, layers: int, tasks: int,
                 rank: int, alpha: float):
        super().__init__()
        self.heads = heads
        self.scale = alpha / rank
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList([Block(d, d_ff) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        # lora.{t}.{i}.{q,v}.{a,b}: the built-in's names (nested ModuleLists, no attribute between).
        self.lora = nn.ModuleList([nn.ModuleList([LayerAdapters(d, rank) for _ in range(layers)])
                                   for _ in range(tasks)])

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, seq, d = q.shape
        dh = d // self.heads
        q = q.view(rows, seq, self.heads, dh).transpose(1, 2)
        k = k.view(rows, seq, self.heads, dh).transpose(1, 2)
        v = v.view(rows, seq, self.heads, dh).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)).float() / math.sqrt(dh)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        p = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
        return torch.matmul(p.to(v.dtype), v).transpose(1, 2).reshape(rows, seq, d)

    def forward(self, x: torch.Tensor, task: int) -> torch.Tensor:
        """x: int64 token ids [rows, seq]; returns logits [rows, seq, vocab]."""
        seq = x.shape[1]
        h = self.embed(x) + self.pos.weight[:seq]
        for i, block in enumerate(self.blocks):
            n = block.ln1(h.float())
            q = block.attn.q(n)
            v = block.attn.v(n)
            # The task's adapters of block i (TorchScript unrolls loops over a ModuleList; modules
            # are not values, so the adapted projections are computed inside the loops).
            for t, adapters in enumerate(self.lora):
                if t == task:
                    for j, layer in enumerate(adapters):
                        if j == i:
                            q = q + layer.q(n) * self.scale
                            v = v + layer.v(n) * self.scale
            k = block.attn.k(n)
            h = h + block.attn.o(self.attention(q, k, v))
            f = block.ln2(h.float())
            h = h + block.mlp.down(F.gelu(block.mlp.up(f)))
        return self.lm_head(self.ln_f(h.float()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--state-dict", default="", help="also torch.save the weights (for model.init_from)")
    p.add_argument("--vocab", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--d-model", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--rank", type=int, default=2)
    p.add_argument("--alpha", type=float, default=4.0)
    a = p.parse_args()
    torch.manual_seed(0)
    model = LoraTransformer(a.vocab, a.seq_len, a.d_model, a.heads, a.d_ff, a.layers, a.tasks, a.rank, a.alpha)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    scripted = torch.jit.script(model)
    scripted.save(a.out)
    if a.state_dict:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.state_dict)
    print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters())} parameters, e.g.",
          [n for n, _ in model.named_parameters()][:3], "...", [n for n, _ in model.named_parameters()][-2:])


if __name__ == "__main__":
    main()
