#!/usr/bin/env python3
"""Where a step's device time goes, from a profiler trace of thetad (THETAD_DEVICE_PROFILE=
FIRST:LAST:PATH, docs/gpu.md): the device time of every kernel, copy and memset summed by name
and by kind (GEMM, attention, elementwise, reduction, copy, other), per step.

    python3 bench/gpu/kernel_summary.py TRACE.json STEPS [--top 25]
"""
import argparse
import collections
import json
import re

KINDS = [("GEMM", re.compile(r"gemm|cutlass|xmma|cublas|sm90_|nvjet", re.I)),
         ("attention", re.compile(r"flash|fmha|attention|efficient", re.I)),
         ("reduction", re.compile(r"reduce|norm|softmax|cross_entropy|sum|max|argmax|cat_|CatArray", re.I)),
         ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|silu|gelu|copy_kernel|fill", re.I))]


def kind_of(name, cat):
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy/memset"
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("steps", type=int)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    with open(a.trace) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    by_name, by_kind, count = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        cat = e.get("cat", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in e:
            continue
        name = e.get("name", "?")
        by_name[name] += e["dur"] / 1000.0
        count[name] += 1
        by_kind[kind_of(name, cat)] += e["dur"] / 1000.0
    total = sum(by_kind.values())
    print(f"device time per step: {total / a.steps:.1f} ms over {a.steps} step(s)")
    for kind, ms in by_kind.most_common():
        print(f"  {kind:12s} {ms / a.steps:8.2f} ms  {ms / total:6.1%}")
    print(f"top {a.top} by time (ms per step, launches per step, name):")
    for name, ms in by_name.most_common(a.top):
        print(f"  {ms / a.steps:8.2f}  {count[name] / a.steps:7.0f}  {name[:150]}")


if __name__ == "__main__":
    main()
