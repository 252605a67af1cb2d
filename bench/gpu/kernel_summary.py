#!/usr/bin/env python3
"""Where a step's device time goes, from a profiler trace of thetad (THETAD_DEVICE_PROFILE=
FIRST:LAST:PATH, docs/gpu.md): the device time of every kernel, copy and memset summed by name
and by kind (GEMM, attention, elementwise, reduction, copy, other), per step.

    python3 bench/gpu/kernel_summary.py TRACE.json STEPS [--top 25] [--ops 30 [--match REGEX]]

--ops N also sums the device time by the operator that launched it (the innermost aten op and
the autograd node or top-level op around it; eager steps only: a graph's replay names none),
over the kernels whose name matches REGEX (default: all), to say where copies and casts come from.
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


def busy_and_span(events):
    """Milliseconds in which any kernel, copy or memset ran (overlaps counted once), and from the
    first one's start to the last one's end: what is left is device idle time (the host behind)."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    if not spans:
        return 0.0, 0.0
    busy, start, end = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    return busy / 1000.0, (max(e for _, e in spans) - spans[0][0]) / 1000.0


def launching_ops(events):
    """External id -> 'innermost op < the autograd node or top-level op around it'."""
    by_tid = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and "dur" in e:
            by_tid[e.get("tid")].append(e)
    labels = {}
    for ops in by_tid.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in ops:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            stack.append(e)
            context = next((o["name"] for o in stack if o["name"].startswith("autograd::engine")), stack[0]["name"])
            context = context.replace("autograd::engine::evaluate_function: ", "backward of ")
            ext = e.get("args", {}).get("External id")
            if ext is not None:
                labels[ext] = e["name"] if context == e["name"] else f"{e['name']} < {context}"
    return labels


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("steps", type=int)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--ops", type=int, default=0)
    p.add_argument("--match", default="")
    a = p.parse_args()
    with open(a.trace) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    by_name, by_kind, count = collections.Counter(), collections.Counter(), collections.Counter()
    labels = launching_ops(events) if a.ops else {}
    match = re.compile(a.match, re.I) if a.match else None
    by_op, op_count = collections.Counter(), collections.Counter()
    for e in events:
        cat = e.get("cat", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in e:
            continue
        name = e.get("name", "?")
        by_name[name] += e["dur"] / 1000.0
        count[name] += 1
        by_kind[kind_of(name, cat)] += e["dur"] / 1000.0
        if a.ops and (match is None or match.search(name)):
            op = labels.get(e.get("args", {}).get("External id"), "?")
            by_op[op] += e["dur"] / 1000.0
            op_count[op] += 1
    total = sum(by_kind.values())
    print(f"device time per step: {total / a.steps:.1f} ms over {a.steps} step(s)")
    busy, span = busy_and_span(events)
    print(f"the device busy {busy:.1f} ms of the {span:.1f} ms from its first kernel to its last ({busy / span:.1%}; "
          f"idle {span - busy:.1f} ms)")
    for kind, ms in by_kind.most_common():
        print(f"  {kind:12s} {ms / a.steps:8.2f} ms  {ms / total:6.1%}")
    print(f"top {a.top} by time (ms per step, launches per step, name):")
    for name, ms in by_name.most_common(a.top):
        print(f"  {ms / a.steps:8.2f}  {count[name] / a.steps:7.0f}  {name[:150]}")
    if a.ops:
        print(f"top {a.ops} launching ops{' of ' + a.match if a.match else ''} (ms per step, launches per step):")
        for op, ms in by_op.most_common(a.ops):
            print(f"  {ms / a.steps:8.2f}  {op_count[op] / a.steps:7.0f}  {op[:150]}")


if __name__ == "__main__":
    main()
