#!/usr/bin/env python3
"""Where the frozen output layer's loss spends its time (the fp32 LoRA step of bench/gpu/plain.sh): the unfused
pair a plain loop runs (logits = h @ W^T, cross_entropy, backward to h) against the chunked
computation of daemon/ops/fused_cross_entropy.cpp's LinearCrossEntropy, per chunk size, each
part timed with CUDA events (mean of --reps after --warmup), with the peak memory each adds.

    python3 bench/gpu/ce_chunks.py [--rows 4096 --d 2048 --vocab 32000 --dtype fp32]

Variants: `lse` = the logsumexp formulation (amax, sub, exp, sum, then sub_, exp_ again);
`lsm` = one log_softmax kernel, exp_ in place, the 1/rows scale as the gradient matmul's alpha
writing straight into the output rows.
"""
import argparse

import torch
import torch.nn.functional as F


def events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def unfused(h, w, t):
    h = h.detach().requires_grad_(True)
    loss = F.cross_entropy(h @ w.t(), t)
    loss.backward()
    return loss, h.grad


def chunked(h, w, t, rows, variant, parts):
    n_all = h.shape[0]
    inv = 1.0 / n_all
    out = torch.empty_like(h)
    per_row = torch.empty(n_all, device=h.device, dtype=torch.float32)
    for r in range(0, n_all, rows):
        n = min(rows, n_all - r)
        tt = t[r:r + n].unsqueeze(1)
        a, b, c, d = torch.cuda.Event(True), torch.cuda.Event(True), torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        l = h[r:r + n] @ w.t()
        b.record()
        if variant == "lse":
            lse = l.logsumexp(1, keepdim=True)
            per_row[r:r + n] = (lse - l.gather(1, tt)).squeeze(1)
            l.sub_(lse).exp_()
            l.scatter_add_(1, tt, torch.full((n, 1), -1.0, device=l.device, dtype=l.dtype))
            l.mul_(inv)
            c.record()
            out[r:r + n] = l @ w
        else:
            l = torch.log_softmax(l, 1)
            per_row[r:r + n] = -l.gather(1, tt).squeeze(1)
            l.exp_()
            l.scatter_add_(1, tt, torch.full((n, 1), -1.0, device=l.device, dtype=l.dtype))
            c.record()
            torch.addmm(out[r:r + n], l, w, beta=0, alpha=inv, out=out[r:r + n])
        d.record()
        parts.append((a, b, c, d))
    return per_row.mean(), out


def timed(fn, reps, warmup):
    for _ in range(warmup):
        fn([])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    s, e = events()
    all_parts = []
    s.record()
    for _ in range(reps):
        parts = []
        fn(parts)
        all_parts.append(parts)
    e.record()
    torch.cuda.synchronize()
    total = s.elapsed_time(e) / reps
    split = [0.0, 0.0, 0.0]
    for parts in all_parts:
        for a, b, c, d in parts:
            split[0] += a.elapsed_time(b)
            split[1] += b.elapsed_time(c)
            split[2] += c.elapsed_time(d)
    split = [x / reps for x in split]
    return total, split, (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--chunks", default="256,512,524,640,1024,1056,2048,4096")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(a.rows, a.d, device="cuda", generator=g)
    w = torch.randn(a.vocab, a.d, device="cuda", generator=g) * a.d ** -0.5
    t = torch.randint(0, a.vocab, (a.rows,), device="cuda", generator=g)
    ref_loss, ref_grad = unfused(h, w, t)
    total, _, mem = timed(lambda parts: unfused(h, w, t), a.reps, a.warmup)
    print("%-18s %8.3f ms total %38s peak +%7.1f MiB" % ("unfused", total, "", mem))
    for variant in ("lse", "lsm"):
        for rows in (int(x) for x in a.chunks.split(",")):
            loss, grad = chunked(h, w, t, rows, variant, [])
            err = ((grad - ref_grad).abs().max() / ref_grad.abs().max()).item()
            total, (mm, sm, gm), mem = timed(lambda parts: chunked(h, w, t, rows, variant, parts), a.reps, a.warmup)
            print("%-4s rows %-8d %8.3f ms total (logits %6.3f, softmax %6.3f, grad %6.3f) peak +%7.1f MiB"
                  "  loss %+.1e grad rel %.1e" % (variant, rows, total, mm, sm, gm, mem, (loss - ref_loss).item(), err))


if __name__ == "__main__":
    main()
