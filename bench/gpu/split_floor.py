#!/usr/bin/env python3
"""The host's floor for updating one uncached group per step, split between the CPU AdamW and
the device, measured without any model: for a share f of the group's N parameters
updated on the device, each step must move (4k + 8f) B per parameter to the device (the values,
k times: once for forward, twice for a streamed trunk layer that comes back for backward; and
the device share's m and v) and 4 + 8f back (the host share's gradient, the device share's
values, m and v), and run the
CPU AdamW (28 B of host memory per parameter) on the other (1 - f) N. The copies and the AdamW
share the host's memory, so the step's floor is their joint wall time, measured here by running
them at once: H2D and D2H on two CUDA streams from pinned memory, the AdamW on the CPU threads
(torch's fused CPU AdamW, a stand-in for thetad's: its rate alone is printed beside).

    python3 bench/gpu/split_floor.py [--numel 33554432] [--values-in 1] [--reps 20] [--step-ms 5.0]

The defaults are the bf16 offload benchmark's head; a streamed trunk of
12 layers of 6144 is --numel 452984832 --values-in 2 --step-ms 141.5 --reps 5 (goal 1).

Prints, per f, the median wall time per step of the copies alone, the AdamW alone and both at
once, and that time over --step-ms (the all-resident step it is compared with).
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--numel", type=int, default=32 << 20)  # a 33.6 M head: bench/jobs/reference-offload.yaml
    p.add_argument("--values-in", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--shares", default="0,0.25,0.5,0.6,0.7,0.8,1")
    a = p.parse_args()
    n = a.numel
    dev = torch.device("cuda")
    vin = a.values_in
    # Room for the largest copy each way, as float32: 4k + 8 B per parameter in, 12 B out.
    host_in = torch.empty((vin + 2) * n, dtype=torch.float32).pin_memory()
    host_out = torch.empty(3 * n, dtype=torch.float32).pin_memory()
    host_in.uniform_()
    dev_in = torch.empty((vin + 2) * n, dtype=torch.float32, device=dev)
    dev_out = torch.empty(3 * n, dtype=torch.float32, device=dev).uniform_()
    h2d, d2h = torch.cuda.Stream(), torch.cuda.Stream()
    # The AdamW's operands, in ordinary (pageable) host memory as the store's arena is.
    prm, grd, m, v = (torch.rand(n) for _ in range(4))
    step_t = torch.tensor(1.0)

    def adam(k):
        if k == 0:
            return
        try:
            torch._fused_adamw_([prm[:k]], [grd[:k]], [m[:k]], [v[:k]], [], [step_t], lr=1e-4, beta1=0.9,
                                beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        except (RuntimeError, AttributeError, TypeError):  # no fused CPU AdamW (torch < 2.4): its passes
            m[:k].mul_(0.9).add_(grd[:k], alpha=0.1)
            v[:k].mul_(0.999).addcmul_(grd[:k], grd[:k], value=0.001)
            prm[:k].addcdiv_(m[:k], v[:k].sqrt().add_(1e-8), value=-1e-4)

    def copies(f):
        k_in, k_out = int((vin + 2 * f) * n), int((1 + 2 * f) * n)  # in floats
        with torch.cuda.stream(h2d):
            dev_in[:k_in].copy_(host_in[:k_in], non_blocking=True)
        with torch.cuda.stream(d2h):
            host_out[:k_out].copy_(dev_out[:k_out], non_blocking=True)

    def timed(fn):
        ts = []
        for _ in range(a.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    timed(lambda: (copies(1.0), adam(n)))  # warm-up: pages, kernels, threads
    print("numel %d, values in %d times, %d CPU threads, the step compared with %.2f ms"
          % (n, vin, torch.get_num_threads(), a.step_ms))
    alone = timed(lambda: adam(n))
    print("CPU AdamW alone, all N: %.2f ms (%.0f GB/s at 28 B per parameter)" % (alone, 28 * n / alone / 1e6))
    print("%5s %10s %10s %10s %8s" % ("f", "copies ms", "AdamW ms", "both ms", "x step"))
    for f in (float(s) for s in a.shares.split(",")):
        k = int((1 - f) * n)
        tc = timed(lambda: copies(f))
        ta = timed(lambda: adam(k))
        tb = timed(lambda: (copies(f), adam(k)))
        print("%5.2f %10.2f %10.2f %10.2f %8.2f" % (f, tc, ta, tb, tb / a.step_ms))


if __name__ == "__main__":
    main()
