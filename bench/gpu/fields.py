#!/usr/bin/env python3
"""Side by side: the median of every per-step time field (*_ms) and byte count over a window of
steps, for several runs' metrics.jsonl. Where time goes when two runs' step times differ.

  python3 bench/gpu/fields.py FIRST_STEP LAST_STEP name=path/metrics.jsonl name2=path2/metrics.jsonl
"""
import json
import statistics
import sys

first, last = int(sys.argv[1]), int(sys.argv[2])
runs = {}
for arg in sys.argv[3:]:
    name, path = arg.split("=", 1)
    rows = [json.loads(line) for line in open(path)]
    runs[name] = [r for r in rows if first <= r.get("step", -1) <= last]
keys = sorted({k for rows in runs.values() for r in rows for k, v in r.items()
               if isinstance(v, (int, float)) and (k.endswith("_ms") or k.endswith("_bytes"))})
print("| field | " + " | ".join(runs) + " |")
print("|---|" + "---|" * len(runs))
for k in keys:
    vals = []
    for rows in runs.values():
        xs = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        vals.append(statistics.median(xs) if xs else None)
    if all(v in (None, 0) for v in vals):
        continue
    fmt = (lambda v: "" if v is None else f"{v:.3f}") if k.endswith("_ms") else (lambda v: "" if v is None else f"{v:.4g}")
    print(f"| {k} | " + " | ".join(fmt(v) for v in vals) + " |")
