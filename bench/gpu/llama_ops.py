#!/usr/bin/env python3
"""Device time of the Llama layer's memory-bound pieces, forward and backward, at one shape:
grouped-query attention with key/value heads repeated against SDPA's own GQA, RMSNorm as a
formula against the fused op, rotary positions. Tells where a layer's time goes besides its GEMMs.

    python3 bench/gpu/llama_ops.py [--rows 8 --seq 2048 --d 2048 --heads 32 --kv 4]
"""
import argparse

import torch
import torch.nn.functional as F


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv", type=int, default=4)
    a = p.parse_args()
    dh, rep = a.d // a.heads, a.heads // a.kv
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(a.rows, a.heads, a.seq, dh, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(a.rows, a.kv, a.seq, dh, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(a.rows, a.kv, a.seq, dh, device=dev, dtype=bf, requires_grad=True)
    g = torch.randn(a.rows, a.heads, a.seq, dh, device=dev, dtype=bf)

    def repeated():
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        o.backward(g)

    def native():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(g)

    x = torch.randn(a.rows * a.seq, a.d, device=dev, requires_grad=True)
    w = torch.ones(a.d, device=dev, requires_grad=True)
    gx = torch.randn_like(x)

    def rms_formula():
        y = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
        y.backward(gx)

    def rms_fused():
        F.rms_norm(x, (a.d,), w, 1e-5).backward(gx)

    cos = torch.randn(a.seq, dh, device=dev, dtype=bf)
    sin = torch.randn(a.seq, dh, device=dev, dtype=bf)

    def rotary():
        half = dh // 2
        r = torch.cat([-q[..., half:], q[..., :half]], -1)
        (q * cos + r * sin).backward(g)

    flops = 4 * a.rows * a.heads * a.seq * a.seq * dh / 2 * 3.5  # causal; fwd + bwd (2.5x)
    for name, fn in [("attention, kv repeated", repeated), ("attention, enable_gqa", native),
                     ("rmsnorm formula (fp32)", rms_formula), ("rmsnorm fused (fp32)", rms_fused),
                     ("rotary on q", rotary)]:
        try:
            ms = timed(fn)
            extra = f"  ({flops / ms / 1e9:.0f} TFLOP/s)" if name.startswith("attention") else ""
            print(f"{name:28s} {ms:8.3f} ms fwd+bwd{extra}")
        except Exception as e:  # an op this PyTorch lacks
            print(f"{name:28s} failed: {str(e).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
