#!/usr/bin/env python3
"""CPU check of compiled_llama.py's model against the Llama formula written out plainly, on a tiny
shape with grouped-query attention (4 heads over 2 key/value heads) and adapters on every target:
float64, one head at a time, the adapters merged into the weights (W + (alpha/r) B A), each pair
(j, j + head_dim/2) of q and k turned by the angle pos * theta^(-2j/head_dim).

  1. The model's logits, with base weights of unit scale and random adapters (B != 0), agree with
     the formula's: to rounding with a float64 base, within bf16's error with the bf16 base under
     autocast (as a step runs it).
  2. Step 0's loss of `plain_loop.py --model compiled-llama` (2 tasks a step) is the formula's loss
     of the same base on the same batches without adapters (B is zero at the start), and the
     losses of the run fall.

    python3 bench/peer/check_compiled_llama.py     # exit 0: both hold
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compiled_llama as cl  # noqa: E402
import ddp_lora_transformer as lora  # noqa: E402
import plain_loop  # noqa: E402

ARGS = ("--layers 2 --d-model 32 --heads 4 --kv-heads 2 --d-ff 48 --vocab 32 --seq-len 12 --tasks 3 "
        "--tasks-per-rank 2 --batch 8 --rank 4 --alpha 12 --targets q,k,v,o,gate,up,down --rope-theta 500 "
        "--lr 1e-2 --noise 0 --steps 16 --warmup 1 --device cpu --seed 7").split()


def reference_logits(model, a, x, task):
    """The formula's logits [rows, seq, vocab] (float64) of `model`'s weights for task `task`
    (None: the base alone)."""
    d = lambda t: t.detach().double()  # noqa: E731
    hd, group, seq = a.d_model // a.heads, a.heads // a.kv_heads, x.shape[1]

    def weight(i, name):
        w = d(model.layers[i][name])
        if task is not None and name in a.targets:
            ad = model.lora[task][i]
            w = w + (a.alpha / a.rank) * d(ad[name + "_b"]) @ d(ad[name + "_a"])
        return w

    def norm(h, w):
        return h / torch.sqrt((h * h).mean(-1, keepdim=True) + a.norm_eps) * d(w)
    turn = torch.zeros(seq, hd, hd, dtype=torch.float64)  # turn[p] @ v: v rotated for position p
    for p in range(seq):
        for j in range(hd // 2):
            angle = p * a.rope_theta ** (-2.0 * j / hd)
            c, s = math.cos(angle), math.sin(angle)
            turn[p, j, j], turn[p, j, j + hd // 2] = c, -s
            turn[p, j + hd // 2, j], turn[p, j + hd // 2, j + hd // 2] = s, c
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    out = []
    for row in x:
        h = d(model.embed)[row]
        for i in range(a.layers):
            n = norm(h, model.layers[i]["attn_norm"])
            q, k, v = (n @ weight(i, t).T for t in ("q", "k", "v"))
            heads = []
            for head in range(a.heads):
                kv = head // group
                qh = torch.einsum("pij,pj->pi", turn, q[:, head * hd:(head + 1) * hd])
                kh = torch.einsum("pij,pj->pi", turn, k[:, kv * hd:(kv + 1) * hd])
                scores = (qh @ kh.T / math.sqrt(hd)).masked_fill(causal, float("-inf"))
                heads.append(torch.softmax(scores, -1) @ v[:, kv * hd:(kv + 1) * hd])
            h = h + torch.cat(heads, -1) @ weight(i, "o").T
            n = norm(h, model.layers[i]["mlp_norm"])
            g = n @ weight(i, "gate").T
            h = h + (g * torch.sigmoid(g) * (n @ weight(i, "up").T)) @ weight(i, "down").T
        out.append(norm(h, model.norm) @ d(model.head).T)
    return torch.stack(out)


def model_logits(model, x, tasks, autocast):
    """The model's logits of x for each of `tasks`, in one call (fused: one base pass)."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return [o.double() for o in model([(task, x) for task in tasks])]


def check_logits(a, dtype, tolerance):
    """1: weights of unit scale (B != 0), so that attention, rotary and every adapter move the
    logits; bf16 under autocast as a step runs, or float64 (the formula to rounding); every task's
    rows in one call (--fuse-tasks: one base pass, each task's adapter on its own rows)."""
    model = cl.Llama(a, torch.device("cpu"), dtype)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm") or name == "norm":
                p.copy_(1 + 0.5 * torch.rand(p.shape, generator=g))
            elif name.endswith("_b"):  # the adapter's term about 0.3 of the base's
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 * a.rank / a.alpha / math.sqrt(a.rank))
            elif not name.endswith("_a"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(1 if name == "embed" else p.shape[1]))
    x = torch.randint(a.vocab, (2, a.seq_len), generator=g)
    worst = 0.0
    tasks = list(range(a.tasks))
    for task, got in zip(tasks, model_logits(model, x, tasks, dtype == torch.bfloat16)):
        ref = reference_logits(model, a, x, task)
        worst = max(worst, float((got - ref).abs().max() / ref.std()))
    ok = worst < tolerance
    print("compiled-llama logits (%s, %s) vs the formula, %d tasks: max |diff| / std %.2g (< %g): %s"
          % (str(dtype).replace("torch.", ""), "fused" if a.fuse_tasks else "a pass per task", a.tasks, worst,
             tolerance, "ok" if ok else "FAILED"), flush=True)
    return ok


def check_run(a):
    """2: step 0 of the plain loop against the formula, on the run's own base and batches."""
    fuse = "--fuse-tasks" if a.fuse_tasks else "--no-fuse-tasks"
    own, rest = plain_loop.parse_args(["--model", "compiled-llama", "--window", "3", fuse] + ARGS)
    r = plain_loop.run(own, rest)
    if r["error"]:
        print("compiled-llama run FAILED: %s" % r["error"])
        return False
    model = cl.Llama(a, torch.device("cpu"))  # the run's initial weights: same seed, same draws
    rows, losses = a.batch // a.tasks_per_rank, []
    for task in r["tasks"][0]:
        x, y = lora.walks(a, 0, 0, task, rows, torch.device("cpu"))
        losses.append(F.cross_entropy(reference_logits(model, a, x, None).reshape(-1, a.vocab), y.reshape(-1)))
    want, got, ls = float(sum(losses) / len(losses)), r["losses"][0], r["losses"]
    ok = (r["tasks"][0] == [0, 1] and abs(got - want) < 5e-4 and all(map(math.isfinite, ls))
          and sum(ls[-3:]) < sum(ls[:3]) - 0.05)
    print("compiled-llama %s: step 0 loss %.5f, the formula's %.5f (tasks %s); losses %s: %s" % (
        fuse, got, want, r["tasks"][0], ", ".join("%.4f" % v for v in ls), "ok" if ok else "FAILED"), flush=True)
    return ok


def main():
    # bf16's rounding moves these logits by ~0.1 std; a wrong rotary layout, key/value head or
    # causal mask by > 2 std.
    ok = []
    for fuse in ("--fuse-tasks", "--no-fuse-tasks"):
        a = cl.parse_args(ARGS + [fuse])
        ok += [check_logits(a, torch.float64, 1e-4), check_logits(a, torch.bfloat16, 0.5), check_run(a)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
