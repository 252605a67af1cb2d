#!/usr/bin/env python3
"""One-GPU peer of thetad's Llama with per-task LoRA adapters: the plain PyTorch loop a careful
user writes by hand, with fused attention and torch.compile, no Hugging Face library. The same
function as LlamaForCausalLM (and thetad's model.arch: llama): token embedding; per layer an RMSNorm
(in float32, then the weight, as Hugging Face), q/k/v/o projections without bias, rotary positions
in Hugging Face's half-split layout (rotate_half; the cos/sin tables computed once), grouped-query
attention through scaled_dot_product_attention(is_causal=True, enable_gqa=True) (torch >= 2.5;
older torch repeats the key/value heads, torch 1.x computes it as ddp_lora_transformer.py does),
a SwiGLU MLP down(silu(gate x) * up x); a final RMSNorm and an untied output layer. The base is
drawn on the device in bf16 (normal, std 0.02; norms 1) and frozen; per task and --targets an
adapter y = x W^T + (alpha/r) (x A^T) B^T in float32 (as peft keeps them: A uniform in
+-1/sqrt(in), B zero), trained under torch.autocast(bf16).

A step is peft_llama.py's (bench/peer/ddp_lora_transformer.py's lora_step and data walks): the
round_robin tasks of the step, the mean of their next-token cross-entropies, one backward, fused
AdamW over every adapter, zero_grad(set_to_none=True). With --fuse-tasks (the default; what a
careful user writes, since the base is shared) the step's tasks go through the base as one batch:
every base GEMM, norm and attention runs once over all the tasks' rows, and each target adds its
adapters' terms through two batched GEMMs (torch.bmm over the tasks, each task's rows against its
own A and B, stacked per layer each step); --no-fuse-tasks sends each task's rows through the
model on their own (a pass per task). The adapters are arguments of the layer function, as the layer's
weights are: one compiled graph serves every layer and every task (dynamic=False; the first
layer's input, which needs no gradient, makes a second variant). --compile (the default with
--device cuda on torch >= 2.0; --no-compile: eager) compiles that function, not the optimizer;
all compilation happens in step 0 (its forward and its backward), so --warmup 1 leaves it out of
the timed windows and plain.sh's warmup of 10 is ample. Step 0 then lasts as long as the
compilation, which a run's timeout (plain.sh's PLAIN_CAP_S) must allow for. Timing, memory and the
JSON: plain_loop.py's.

    python3 bench/peer/plain_loop.py --model compiled-llama --device cuda --layers 22 --d-model 2048 \\
        --heads 32 --kv-heads 4 --d-ff 5632 --vocab 32000 --seq-len 2048 --tasks 64 --tasks-per-rank 8 \\
        --batch 8 --rank 16 --alpha 32 --targets q,k,v,o,gate,up,down --steps 40 --warmup 10 --out r.json
"""
import argparse
import math
import os
import re
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_lora_transformer as lora  # noqa: E402
import peft_llama  # noqa: E402  (torch only at import: transformers and peft load in its setup)

VERSION = tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0
HAS_GQA = VERSION >= (2, 5)  # scaled_dot_product_attention(..., enable_gqa=True)
HAS_COMPILE = hasattr(torch, "compile")
# A layer's frozen weights, in the order the layer function takes them.
BASE = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


def parse_args(argv):
    def add(p):
        p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="torch.compile the decoder layer (default: on with --device cuda where torch has it)")
        p.add_argument("--fuse-tasks", action=argparse.BooleanOptionalAction, default=True,
                       help="one base pass over every task's rows, the adapters as batched GEMMs (default)")

    def check(a):
        if a.compile and not HAS_COMPILE:
            return "--compile needs torch >= 2.0 (this is %s)" % torch.__version__
        return None
    a = peft_llama.parse_llama_args(argv, __doc__, add, check)
    if a.compile is None:
        a.compile = HAS_COMPILE and a.device == "cuda"
    return a


def shapes(a):
    """[out, in] of every projection."""
    d, ff, kv = a.d_model, a.d_ff, a.kv_heads * (a.d_model // a.heads)
    return {"q": (d, d), "k": (kv, d), "v": (kv, d), "o": (d, d), "gate": (ff, d), "up": (ff, d), "down": (d, ff)}


def rms_norm(h, weight, eps):
    """Hugging Face's LlamaRMSNorm: the statistics in float32, the weight on the input's dtype."""
    x = h.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype)


def rotary_tables(a, device, dtype):
    """cos and sin [seq, head_dim] of Hugging Face's rotary embedding (the angles repeated over
    both halves), computed once in float32 and held in the activations' dtype."""
    hd = a.d_model // a.heads
    inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, device=device).float() / hd))
    angles = torch.outer(torch.arange(a.seq_len, device=device).float(), inv_freq)
    angles = torch.cat((angles, angles), -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def attention(q, k, v):
    """Causal grouped-query attention of q [rows, heads, seq, hd] over k, v [rows, kv_heads, seq, hd]."""
    if HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return lora.LoraTransformer.plain_attention(q, k, v)


def make_layer(a, fused):
    """The decoder layer as a function of its input, the rotary tables, its weights (BASE's order)
    and the adapters ((A, B) per target of --targets): nothing of a layer or a task is captured, so
    one compiled graph serves them all. Not fused: h is one task's rows and A [r, in], B [out, r]
    its adapter. Fused: h is the rows of T tasks, task by task (each as many), and A [T, r, in],
    B [T, out, r] their adapters stacked."""
    hd, scale, eps, targets = a.d_model // a.heads, a.alpha / a.rank, a.norm_eps, tuple(a.targets)

    def adapter_term(x, adapter):
        if not fused:
            return F.linear(F.linear(x, adapter[0]), adapter[1])
        A, B = adapter
        xt = x.reshape(A.shape[0], -1, x.shape[-1])  # [T, rows * seq, in]
        return torch.bmm(torch.bmm(xt, A.transpose(1, 2)), B.transpose(1, 2)).view(*x.shape[:-1], B.shape[1])

    def proj(x, w, adapter):
        y = F.linear(x, w)
        return y if adapter is None else y + adapter_term(x, adapter) * scale

    def layer(h, cos, sin, base, adapters):
        attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd = base
        ad = dict(zip(targets, adapters))
        rows, seq, d = h.shape

        def heads(y):  # [rows, seq, n * hd] -> [rows, n, seq, hd]
            return y.view(rows, seq, -1, hd).transpose(1, 2)
        x = rms_norm(h, attn_norm, eps)
        q, k = heads(proj(x, wq, ad.get("q"))), heads(proj(x, wk, ad.get("k")))
        att = attention(rotate(q, cos, sin), rotate(k, cos, sin), heads(proj(x, wv, ad.get("v"))))
        h = h + proj(att.transpose(1, 2).reshape(rows, seq, d), wo, ad.get("o"))
        x = rms_norm(h, mlp_norm, eps)
        return h + proj(F.silu(proj(x, wg, ad.get("gate"))) * proj(x, wu, ad.get("up")), wd, ad.get("down"))
    return layer


class Llama(nn.Module):
    """The frozen bf16 base and every task's float32 adapters as parameters (layers[i][name],
    lora[task][i][target + "_a" / "_b"]); called with [(task, tokens)], returns logits per task.
    dtype: the base's (check_compiled_llama.py also builds one in float64, adapters then too)."""

    def __init__(self, a, device, dtype=torch.bfloat16):
        super().__init__()
        torch.manual_seed(a.seed)
        base, d = dict(device=device, dtype=dtype), a.d_model
        fp32 = dict(device=device, dtype=torch.promote_types(dtype, torch.float32))

        def frozen(tensor):
            return nn.Parameter(tensor, requires_grad=False)

        def weight(out, inp):
            return frozen(torch.empty(out, inp, **base).normal_(0.0, 0.02))

        def adapter(out, inp):
            bound = 1.0 / math.sqrt(inp)  # peft's kaiming_uniform(a=sqrt(5)) bound
            return {"a": torch.empty(a.rank, inp, **fp32).uniform_(-bound, bound),
                    "b": torch.zeros(out, a.rank, **fp32)}
        sh = shapes(a)
        self.eps = a.norm_eps
        self.embed = weight(a.vocab, d)
        self.layers = nn.ModuleList(nn.ParameterDict(
            {name: frozen(torch.ones(d, **base)) if name.endswith("norm") else weight(*sh[name]) for name in BASE})
            for _ in range(a.layers))
        self.norm, self.head = frozen(torch.ones(d, **base)), weight(a.vocab, d)
        self.lora = nn.ModuleList(nn.ModuleList(nn.ParameterDict(
            {t + "_" + k: nn.Parameter(v) for t in a.targets for k, v in adapter(*sh[t]).items()})
            for _ in range(a.layers)) for _ in range(a.tasks))
        self.cos, self.sin = rotary_tables(a, device, dtype)
        # The layer function's arguments, gathered once (not a dictionary look-up per layer and step).
        self.base_args = [tuple(layer[name] for name in BASE) for layer in self.layers]
        self.adapter_args = [[tuple((ad[t + "_a"], ad[t + "_b"]) for t in a.targets) for ad in task]
                             for task in self.lora]
        self.fuse = getattr(a, "fuse_tasks", True)
        self.layer = make_layer(a, self.fuse)
        if a.compile:
            self.layer = torch.compile(self.layer, dynamic=False)

    def adapters(self):
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, batches):
        if not self.fuse or len({x.shape for _, x in batches}) != 1:
            return [self.forward_task(x, task) for task, x in batches]
        tasks = [task for task, _ in batches]
        h = F.embedding(torch.cat([x for _, x in batches]), self.embed)
        for i, base in enumerate(self.base_args):
            # Per target: the step's tasks' A and B of layer i, stacked (tiny: r rows or columns).
            stacked = tuple((torch.stack([self.adapter_args[t][i][j][0] for t in tasks]),
                             torch.stack([self.adapter_args[t][i][j][1] for t in tasks]))
                            for j in range(len(self.adapter_args[tasks[0]][i])))
            h = self.layer(h, self.cos, self.sin, base, stacked)
        return list(F.linear(rms_norm(h, self.norm, self.eps), self.head).chunk(len(tasks)))

    def forward_task(self, x, task):
        h = F.embedding(x, self.embed)
        for base, adapters in zip(self.base_args, self.adapter_args[task]):
            h = self.layer(h, self.cos, self.sin, base, adapters)
        return F.linear(rms_norm(h, self.norm, self.eps), self.head)


def setup(a, device):
    """(step function, model, trained parameters, AdamW arguments): plain_loop.py's contract."""
    model = Llama(a, device)
    model.train()
    return lora.lora_step(model, a, device), model, model.adapters(), dict(lr=a.lr, weight_decay=0.0)


if __name__ == "__main__":
    sys.exit("run it through bench/peer/plain_loop.py --model compiled-llama (bench/gpu/plain.sh)")
