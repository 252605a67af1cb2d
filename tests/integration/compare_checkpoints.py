#!/usr/bin/env python3
"""The newest complete checkpoints in two directories hold the same parameters within a tolerance.

    compare_checkpoints.py DIR_A DIR_B [TOL]      (TOL default 1e-4)

Each parameter tensor's largest difference is taken relative to its largest magnitude; the worst
over all tensors must be <= TOL. Prints one line (for a test log) and exits 0 if so, 1 if not or
on any error. The GPU tests use it where bits may differ (CPU and device AdamW round differently).
"""
import glob
import inspect
import os
import sys

import torch

# PyTorch >= 2.6 loads with weights_only=True by default; the comparison needs the values only.
KW = {"weights_only": False} if "weights_only" in inspect.signature(torch.load).parameters else {}


def latest(d):  # the newest complete checkpoint
    return sorted(os.path.dirname(m) for m in glob.glob(os.path.join(d, "step-*", "manifest.json")))[-1]


def main():
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    try:
        a, b = latest(sys.argv[1]), latest(sys.argv[2])
        worst, n = 0.0, 0
        # Format 3: shard-*.pt with one flat `param` tensor per shard (format 2: group-*.pt, param/NAME).
        files = sorted(glob.glob(os.path.join(a, "shard-*.pt")) + glob.glob(os.path.join(a, "group-*.pt")))
        for f in files:
            x = torch.load(f, map_location="cpu", **KW)
            y = torch.load(os.path.join(b, os.path.basename(f)), map_location="cpu", **KW)
            for k, v in x.items():
                if k != "param" and not k.startswith("param/"):
                    continue
                d = (v - y[k]).abs().max().item() / max(v.abs().max().item(), 1e-12)
                worst, n = max(worst, d), n + 1
        assert n > 0, "no parameters compared"
    except Exception as e:  # one line for the test log
        print("error: %r" % (e,))
        return 1
    print("max relative difference %.2e over %d tensors (tolerance %.0e)" % (worst, n, tol))
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
