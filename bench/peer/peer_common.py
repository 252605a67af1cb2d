"""Pieces the one-GPU peer (plain_loop.py) and bench/gpu/plain.sh's table share: the AdamW a
careful PyTorch user picks, step times over windows of steps, and the peak-memory fields.
Python stdlib + torch only; torch 1.13 and 2.x.
"""
import inspect
import statistics
import time

import torch


def make_adamw(params, device, fused=True, **kw):
    """torch.optim.AdamW, fused where this torch has it for this device (torch >= 2 on CUDA),
    else foreach, else the default loop. Every variant creates its state at a parameter's first
    step with a gradient and skips parameters whose .grad is None. Returns (optimizer, variant)."""
    names = inspect.signature(torch.optim.AdamW.__init__).parameters
    if fused and device.type == "cuda" and "fused" in names:
        return torch.optim.AdamW(params, fused=True, **kw), "fused"
    if "foreach" in names:
        return torch.optim.AdamW(params, foreach=True, **kw), "foreach"
    return torch.optim.AdamW(params, **kw), "default"


def window_means(per_step, warmup, window):
    """Means of consecutive windows of `window` steps after the first `warmup` steps (a last
    incomplete window is left out): e.g. thetad's per-step step_ms from metrics.jsonl."""
    timed = list(per_step[warmup:])
    return [statistics.mean(timed[i:i + window]) for i in range(0, len(timed) - window + 1, window)]


def window_summary(means, prefix="step_ms"):
    """{prefix_median, prefix_min, prefix_max} over window means (None when there are none)."""
    if not means:
        return {prefix + "_median": None, prefix + "_min": None, prefix + "_max": None}
    return {prefix + "_median": statistics.median(means), prefix + "_min": min(means),
            prefix + "_max": max(means)}


class WindowClock:
    """Per-window step time without a host wait inside a window: the host synchronizes only at
    window boundaries (wall time / steps, what a training run's throughput is), and with
    cuda_events also records CUDA events there (device time between them, on the current stream)."""

    def __init__(self, cuda, cuda_events):
        self.cuda, self.events = cuda, cuda and cuda_events
        self.host, self.device = [], []
        self.t0, self.e0, self.n = None, None, 0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def start(self):
        self.sync()
        self.t0, self.n = time.perf_counter(), 0
        if self.events:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e0.record()

    def stop(self, steps):
        e1 = None
        if self.events:
            e1 = torch.cuda.Event(enable_timing=True)
            e1.record()
        self.sync()
        self.host.append((time.perf_counter() - self.t0) * 1e3 / steps)
        if e1 is not None:
            self.device.append(self.e0.elapsed_time(e1) / steps)


def memory_fields(cuda):
    """The allocator's peaks since the process started (model, data and optimizer included)."""
    if not cuda:
        return {"peak_mem_bytes": None, "peak_reserved_bytes": None}
    return {"peak_mem_bytes": torch.cuda.max_memory_allocated(),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved()}
