#!/usr/bin/env python3
"""Device time of the Llama layer's memory-bound pieces, forward and backward, at one shape:
grouped-query attention with key/value heads repeated against SDPA's own GQA (and that per SDPA
backend, in thetad's layout: heads as a view of [rows, seq, heads, head]), RMSNorm as a formula
against the fused op, rotary positions. Tells where a layer's time goes besides its GEMMs.

--floor: the step's compute-bound work alone, the floor of a LoRA step on a frozen base at this
shape: every layer's base GEMMs (q/k/v joined, o, gate/up joined, down) forward and backward to
their inputs, grouped-query flash attention forward and backward, the output layer forward and
backward to its input; nothing else (no norms, rotary, SwiGLU, residual adds, adapters, loss).
Printed for the rows at once and for one row at a time (a pass per task), with the share of
--peak (dense bf16 TFLOP/s) each reaches.

--adapters: the LoRA adapters' products beside the base GEMMs of each projection (q/k/v joined,
o, gate/up joined, down; a task per row, rank --rank per target): the base GEMM alone, then the
two orders of adding the low-rank product into its output (and, backward, into the input's
gradient): base first and the product added by a second GEMM with beta = 1 (a pass that reads
and writes the output), or the product first and the base GEMM adding into it (its epilogue
reads what the product wrote).

    python3 bench/gpu/llama_ops.py [--rows 8 --seq 2048 --d 2048 --heads 32 --kv 4]
    python3 bench/gpu/llama_ops.py --floor [--layers 22 --ff 5632 --vocab 32000 --peak 989]
    python3 bench/gpu/llama_ops.py --adapters [--rank 16 --layers 22]
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
    p.add_argument("--floor", action="store_true")
    p.add_argument("--adapters", action="store_true")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--ff", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--peak", type=float, default=989.0)
    a = p.parse_args()
    if a.floor:
        for rows in (a.rows, 1):
            floor(a, rows)
        return
    if a.adapters:
        adapters(a)
        return
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

    # thetad's layout: the rotary split writes [rows, seq, heads, head]; SDPA reads transposed views.
    tq = torch.randn(a.rows, a.seq, a.heads, dh, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
    tk = torch.randn(a.rows, a.seq, a.kv, dh, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
    tv = torch.randn(a.rows, a.seq, a.kv, dh, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
    tg = torch.randn(a.rows, a.seq, a.heads, dh, device=dev, dtype=bf).transpose(1, 2)

    def backend(b):
        def run():
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel([b]):
                F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True).backward(tg)
        return run

    from torch.nn.attention import SDPBackend
    backends = [(f"attention, gqa, {b.name.lower()}", backend(b))
                for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)]

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
    for name, fn in [("attention, kv repeated", repeated), ("attention, enable_gqa", native)] + backends + [
                     ("rmsnorm formula (fp32)", rms_formula), ("rmsnorm fused (fp32)", rms_fused),
                     ("rotary on q", rotary)]:
        try:
            ms = timed(fn)
            extra = f"  ({flops / ms / 1e9:.0f} TFLOP/s)" if name.startswith("attention") else ""
            print(f"{name:36s} {ms:8.3f} ms fwd+bwd{extra}")
        except Exception as e:  # an op this PyTorch lacks
            print(f"{name:36s} failed: {str(e).splitlines()[0][:100]}")


def floor(a, rows):
    """The compute-bound work of a step of a.rows rows, run `rows` rows at a time."""
    dev, bf, dh = "cuda", torch.bfloat16, a.d // a.heads
    t = rows * a.seq
    kv = a.kv * dh
    mats = [(a.d + 2 * kv, a.d), (a.d, a.d), (2 * a.ff, a.d), (a.d, a.ff)]  # [out, in]
    ws = [torch.randn(o, i, device=dev, dtype=bf) * 0.02 for o, i in mats]
    xs = [torch.randn(t, i, device=dev, dtype=bf) for _, i in mats]
    gs = [torch.randn(t, o, device=dev, dtype=bf) for o, _ in mats]
    head = torch.randn(a.vocab, a.d, device=dev, dtype=bf) * 0.02
    q = torch.randn(rows, a.heads, a.seq, dh, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(rows, a.kv, a.seq, dh, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(rows, a.kv, a.seq, dh, device=dev, dtype=bf, requires_grad=True)
    go = torch.randn(rows, a.heads, a.seq, dh, device=dev, dtype=bf)

    def gemms():
        for w, x, g in zip(ws, xs, gs):
            torch.mm(x, w.t())  # forward
            torch.mm(g, w)      # backward to the input

    def attention():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(go)

    h, g_logits = xs[1], torch.randn(t, a.vocab, device=dev, dtype=bf)

    def output_layer():
        torch.mm(h, head.t())
        torch.mm(g_logits, head)

    parts = {"layer GEMMs": timed(gemms), "attention": timed(attention), "output layer": timed(output_layer)}
    passes = a.rows // rows
    ms = passes * (a.layers * (parts["layer GEMMs"] + parts["attention"]) + parts["output layer"])
    per_token = 2 * 2 * (sum(o * i for o, i in mats) * a.layers + a.vocab * a.d)  # forward + backward to inputs
    attn = a.layers * 4 * a.heads * a.seq * dh / 2 * 3.5  # per token: causal, forward + backward (2.5x)
    tflop = a.rows * a.seq * (per_token + attn) / 1e12
    print(f"floor, {passes} pass(es) of {rows} x {a.seq}: {ms:.1f} ms for {tflop:.1f} TFLOP = "
          f"{tflop / ms * 1e3:.0f} TFLOP/s ({tflop / ms * 1e3 / a.peak:.0%} of {a.peak:.0f}); per layer and pass: "
          + ", ".join(f"{n} {v:.3f} ms" for n, v in parts.items()))


def adapters(a):
    """Per projection: the base GEMM, and the adapters' product added after it or before it."""
    dev, bf, n, t = "cuda", torch.bfloat16, a.rows, a.seq
    kv = a.kv * a.d // a.heads
    # [out, in, targets joined]
    mats = {"q/k/v": (a.d + 2 * kv, a.d, 3), "o": (a.d, a.d, 1), "gate/up": (2 * a.ff, a.d, 2), "down": (a.d, a.ff, 1)}
    total = {}
    for name, (out, inp, joined) in mats.items():
        r = a.rank * joined
        w = torch.randn(out, inp, device=dev, dtype=bf) * 0.02
        x = torch.randn(n, t, inp, device=dev, dtype=bf)
        g = torch.randn(n, t, out, device=dev, dtype=bf)
        A = torch.randn(n, r, inp, device=dev, dtype=bf) * 0.02
        B = torch.randn(n, out, r, device=dev, dtype=bf) * 0.02
        z = torch.bmm(x, A.transpose(1, 2))
        dz = torch.bmm(g, B)
        y = torch.empty(n, t, out, device=dev, dtype=bf)
        dx = torch.empty(n, t, inp, device=dev, dtype=bf)
        y2, dx2, x2, g2 = y.view(-1, out), dx.view(-1, inp), x.view(-1, inp), g.view(-1, out)
        cases = {
            "forward, base alone": lambda: torch.mm(x2, w.t(), out=y2),
            "forward, base then product": lambda: (torch.mm(x2, w.t(), out=y2), y.baddbmm_(z, B.transpose(1, 2))),
            "forward, product then base": lambda: (torch.bmm(z, B.transpose(1, 2), out=y), y2.addmm_(x2, w.t())),
            "dx, base alone": lambda: torch.mm(g2, w, out=dx2),
            "dx, base then product": lambda: (torch.mm(g2, w, out=dx2), dx.baddbmm_(dz, A)),
            "dx, product then base": lambda: (torch.bmm(dz, A, out=dx), dx2.addmm_(g2, w)),
        }
        for case, fn in cases.items():
            ms = timed(fn)
            total[case] = total.get(case, 0.0) + ms
            print(f"{name:8s} {case:28s} {ms:8.3f} ms")
    for case, ms in total.items():
        print(f"{a.layers} layers, {case:28s} {a.layers * ms:8.2f} ms")


if __name__ == "__main__":
    main()
