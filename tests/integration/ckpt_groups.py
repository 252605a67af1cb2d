"""A format-6 (or 5, 4) checkpoint's groups, for the tests' Python checks: group -> {"param", "exp_avg",
"exp_avg_sq": float32 [n], "steps": int, "file": name} through manifest.json's runs (initial
groups are absent)."""
import json
import os

import torch


def load(step_dir):
    m = json.load(open(os.path.join(step_dir, "manifest.json")))
    assert m["format"] in ("thetad-checkpoint-6", "thetad-checkpoint-5", "thetad-checkpoint-4"), m["format"]
    files, out = {}, {}
    for run in m["runs"]:
        first, count, f = run[:3]
        if f < 0:
            continue
        name = m["files"][f]["file"]
        if name not in files:
            files[name] = torch.load(os.path.join(step_dir, name))
        d = files[name]
        held = d["groups"].tolist()
        for g in range(first, first + count):
            i = held.index(g)
            lo, hi = int(d["offsets"][i]), int(d["offsets"][i + 1])
            out[g] = {k: d[k][lo:hi] for k in ("param", "exp_avg", "exp_avg_sq")}
            out[g].update(steps=int(d["steps"][i]), file=name)
    return out
