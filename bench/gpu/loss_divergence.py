#!/usr/bin/env python3
"""Per-step relative difference of rank 0's loss between runs: thetad metrics (JSON lines) or
the DDP peer's result.json. Shows whether two runs part at step 0 (a different model or data)
or drift apart from float32 rounding (a different reduction order) amplified by Adam.

    loss_divergence.py A B [C ...]     (the first is the reference)
"""
import json
import sys


def losses(path):
    with open(path) as f:
        text = f.read()
    try:
        d = json.loads(text)
        if isinstance(d, dict) and "losses" in d:
            return list(d["losses"])
    except ValueError:
        pass
    rows = [json.loads(l) for l in text.splitlines() if l.strip()]
    rows = [r for r in rows if r.get("rank", 0) == 0]
    rows.sort(key=lambda r: r["step"])
    return [r["loss"] for r in rows]


def main(argv):
    runs = [(p, losses(p)) for p in argv[1:]]
    ref_name, ref = runs[0]
    n = min(len(l) for _, l in runs)
    print("step  " + "  ".join("%-14s" % p.split("/")[-1][:14] for p, _ in runs[1:]) + "  (rel. to %s)" % ref_name)
    for s in range(n):
        cells = ["%.2e" % (abs(l[s] - ref[s]) / max(abs(ref[s]), 1e-12)) for _, l in runs[1:]]
        print("%4d  %s" % (s, "  ".join("%-14s" % c for c in cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
