#!/usr/bin/env python3
"""PyTorch DDP peer of thetad's `model.kind: transformer` with per-task LoRA adapters.

The same model as daemon/models/transformer.cpp (pre-norm decoder blocks, learned positions,
causal attention, GELU MLP, no projection biases, an untied output layer, LoRA
W x + (alpha / r) B A x on --targets with B zero at the start; the same parameter names), the
same synthetic data (per task a walk through the vocabulary with stride 1 + t*7919 mod (vocab-1),
--noise of the tokens replaced; drawn from torch's generator, so thetad's batches are not
reproduced bit for bit), round_robin with --tasks-per-rank tasks per rank per step, next-token
cross-entropy, AdamW in fp32 (autocast bf16 with --precision bf16). DDP runs with
find_unused_parameters=True; --frozen-base makes the base require no gradient (DDP then reduces
the adapters only, every adapter every step: its buckets are fixed).

    mpirun -np 2 python3 bench/peer/ddp_lora_transformer.py --device cuda --backend nccl --out r.json

Rank 0 writes --out (JSON) as ddp_multitask.py does: step_ms_median/p90/mean (steps after
--warmup), peak_mem_bytes, bytes_allreduced_per_step, losses, error, oom.
"""
import argparse
import contextlib
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_multitask import launch_env, record_failure, report, summarize_steps  # noqa: E402

TARGETS = ("q", "k", "v", "o", "up", "down")


class Lora(nn.Module):
    def __init__(self, d_in, d_out, rank):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.a = nn.Parameter(torch.empty(rank, d_in).uniform_(-bound, bound))
        self.b = nn.Parameter(torch.zeros(d_out, rank))


class LoraTransformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, ff = a.d_model, a.d_ff
        self.a = a
        self.scale = a.alpha / a.rank
        self.embed = nn.Embedding(a.vocab, d)
        self.pos = nn.Embedding(a.seq_len, d)
        shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "up": (d, ff), "down": (ff, d)}
        self.blocks = nn.ModuleList()
        for _ in range(a.layers):
            blk = nn.Module()
            blk.ln1, blk.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            blk.attn, blk.mlp = nn.Module(), nn.Module()
            for t in ("q", "k", "v", "o"):
                setattr(blk.attn, t, nn.Linear(*shapes[t], bias=False))
            for t in ("up", "down"):
                setattr(blk.mlp, t, nn.Linear(*shapes[t], bias=False))
            self.blocks.append(blk)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, a.vocab, bias=False)
        # lora.{t}.{i}.{target}.{a,b}: thetad's names.
        self.lora = nn.ModuleList([nn.ModuleList([nn.ModuleDict({t: Lora(*shapes[t], a.rank) for t in a.targets})
                                                  for _ in range(a.layers)]) for _ in range(a.tasks)])

    def proj(self, x, linear, adapters, target):
        y = linear(x)
        if target in adapters:
            ad = adapters[target]
            y = y + F.linear(F.linear(x, ad.a), ad.b) * self.scale
        return y

    def forward(self, batches):
        """[(task, x)] -> [logits]: every task of a rank's step in one call (DDP allows one
        backward per forward of the wrapped module)."""
        return [self.forward_task(x, task) for task, x in batches]

    def forward_task(self, x, task):
        rows, seq = x.shape
        d, heads = self.a.d_model, self.a.heads
        h = self.embed(x) + self.pos.weight[:seq]
        for blk, ad in zip(self.blocks, self.lora[task]):
            n = blk.ln1(h.float())
            q, k, v = (self.proj(n, getattr(blk.attn, t), ad, t).view(rows, seq, heads, d // heads).transpose(1, 2)
                       for t in ("q", "k", "v"))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") \
                else self.plain_attention(q, k, v)
            h = h + self.proj(att.transpose(1, 2).reshape(rows, seq, d), blk.attn.o, ad, "o")
            f = blk.ln2(h.float())
            h = h + self.proj(F.gelu(self.proj(f, blk.mlp.up, ad, "up")), blk.mlp.down, ad, "down")
        return self.lm_head(self.ln_f(h.float()))

    @staticmethod
    def plain_attention(q, k, v):
        seq = q.shape[2]
        scores = torch.matmul(q, k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        return torch.matmul(torch.softmax(scores.masked_fill(mask, float("-inf")), -1).to(v.dtype), v)


def walks(a, step, rank, task, rows, device):
    """thetad's synthetic token walks (daemon/models/transformer.cpp SyntheticTokens)."""
    g = torch.Generator().manual_seed((a.seed * 1000003 + step * 7919 + rank * 104729 + task) % (1 << 62))
    stride = 1 + (task * 7919) % (a.vocab - 1)
    w = (torch.randint(a.vocab, (rows, 1), generator=g) + torch.arange(a.seq_len + 1) * stride) % a.vocab
    if a.noise > 0:
        flip = torch.rand(rows, a.seq_len + 1, generator=g) < a.noise
        w = torch.where(flip, torch.randint(a.vocab, (rows, a.seq_len + 1), generator=g), w)
    w = w.to(device)
    return w[:, :-1], w[:, 1:]


def build_model(a, device):
    """The model on `device` (seeded by --seed) and the parameters AdamW trains (the adapters
    only with --frozen-base, whose base then requires no gradient)."""
    torch.manual_seed(a.seed)
    # Built where it runs (torch >= 2.0: a device is a context): at large T a user would not
    # build every adapter in host memory first (T = 10,000 at rank 16 is 168 GB of them).
    with device if hasattr(device, "__enter__") else contextlib.nullcontext():
        model = LoraTransformer(a).to(device)
    for n, p in model.named_parameters():
        if not n.startswith("lora."):
            p.requires_grad_(not a.frozen_base)
    return model, [p for p in model.parameters() if p.requires_grad]


def step_loss(module, a, s, rank, world, device):
    """Step s of `rank`: its --tasks-per-rank tasks (round_robin), their batches, the mean of
    their next-token cross-entropies under --precision's autocast. Returns (loss, tasks)."""
    rows = max(1, a.batch // a.tasks_per_rank)
    tasks = [((s * world + rank) * a.tasks_per_rank + i) % a.tasks for i in range(a.tasks_per_rank)]
    data = [(t,) + walks(a, s, rank, t, rows, device) for t in tasks]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        outs = module([(t, x) for t, x, _ in data])
        loss = sum(F.cross_entropy(o.float().reshape(-1, a.vocab), y.reshape(-1))
                   for o, (_, _, y) in zip(outs, data)) / len(tasks)
    return loss, tasks


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("layers", 2), ("d-model", 64), ("heads", 4), ("d-ff", 256), ("vocab", 256),
                          ("seq-len", 32), ("tasks", 4), ("rank", 8), ("tasks-per-rank", 1), ("batch", 16),
                          ("steps", 40), ("warmup", 5), ("seed", 1), ("master-port", 29531)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="q,v", help="comma-separated, of q,k,v,o,up,down")
    p.add_argument("--frozen-base", action="store_true", help="model.train_shared: false")
    p.add_argument("--noise", type=float, default=0.01)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    a.targets = [t for t in a.targets.split(",") if t]
    if not a.targets or any(t not in TARGETS for t in a.targets) or a.d_model % a.heads:
        p.error("--targets must be of q,k,v,o,up,down and --heads must divide --d-model")
    return a


def main(argv=None):
    a = parse_args(argv)
    rank, world, local = launch_env(a)
    cuda = a.device == "cuda"
    result = {"peer": "pytorch-ddp-lora-transformer", "torch": torch.__version__, "rank": rank, "world": world,
              "config": {k: v for k, v in vars(a).items() if k != "out"}, "error": None, "oom": False,
              "losses": [], "step_ms": [], "steps_done": 0, "peak_mem_bytes": None}
    try:
        if cuda:
            torch.cuda.set_device(local % torch.cuda.device_count())
            torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        dist.init_process_group(a.backend, rank=rank, world_size=world)
        model, trained = build_model(a, device)
        result["bytes_allreduced_per_step"] = 4 * sum(p.numel() for p in trained)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                                  find_unused_parameters=True, bucket_cap_mb=a.bucket_cap_mb)
        opt = torch.optim.AdamW(trained, lr=a.lr)
        for s in range(a.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss, _ = step_loss(ddp, a, s, rank, world, device)
            loss.backward()
            opt.step()
            lv = loss.item()
            if cuda:
                torch.cuda.synchronize()
            result["step_ms"].append((time.perf_counter() - t0) * 1e3)
            result["losses"].append(lv)
            result["steps_done"] = s + 1
        summarize_steps(result, a.warmup)
    except BaseException as e:  # noqa: BLE001 (reported, then the process ends)
        record_failure(result, e)
    if cuda:
        result["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    report("ddp_lora_transformer", a.out, rank, result, ("rank", "steps_done", "step_ms_median", "peak_mem_bytes", "bytes_allreduced_per_step", "error"))
    if result["error"]:
        os._exit(1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def lora_step(module, a, device):
    """The step function of a one-GPU LoRA peer (bench/peer/plain_loop.py, peft_llama.py):
    module([(task, x)]) -> logits per task (step_loss)."""
    def step(s, opt):
        opt.zero_grad(set_to_none=True)
        loss, tasks = step_loss(module, a, s, 0, 1, device)
        loss.backward()
        opt.step()
        return loss, tasks
    return step


if __name__ == "__main__":
    sys.exit(main())

