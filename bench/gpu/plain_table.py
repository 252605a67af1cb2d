#!/usr/bin/env python3
"""bench/gpu/plain.sh's table: thetad all-resident against the plain PyTorch loop, per shape.

    python3 bench/gpu/plain_table.py OUT_DIR SHAPE...

Per shape OUT_DIR/SHAPE/ holds spec.txt (key=value ..., warmup and window included),
thetad/metrics.jsonl and peer/result.json (bench/peer/plain_loop.py). A llama shape run against
several peers (spec `peers=peft,compiled`: the first in peer/, the others in peer_NAME/) has a row
per peer, the peer named after the shape; one peer, one row as any shape's. Step ms: the median (and
min-max) of the means of windows of `window` steps after `warmup` steps, the same windows on both
sides (thetad's per-step step_ms add up to its run time, as the peer's windows measure
throughput). Peak: thetad's device_mem_peak_bytes (max over steps), the peer's
max_memory_allocated (reserved in summary.json). Loss: the mean over the last window, both sides.
Writes OUT_DIR/summary.md and summary.json (per shape: spec, thetad, peer, last_window_loss; a
further peer's side as peer_NAME, its losses as last_window_loss_peer_NAME); prints the table.
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peer"))
from peer_common import window_means, window_summary  # noqa: E402

GIB = float(1 << 30)


def read_spec(path):
    spec = {}
    for kv in open(path).read().split():
        k, _, v = kv.partition("=")
        spec[k] = v
    return spec


def status(d):
    p = os.path.join(d, "status")
    return open(p).read().strip() if os.path.exists(p) else "not run"


def thetad_side(d, warmup, window):
    path = os.path.join(d, "metrics.jsonl")
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    rows = sorted((r for r in rows if r.get("rank", 0) == 0), key=lambda r: r.get("step", 0))
    r = {"status": status(d), "steps": len(rows)}
    if rows:
        means = window_means([x.get("step_ms") or 0.0 for x in rows], warmup, window)
        r.update(window_summary(means), step_ms_windows=means,
                 peak_mem_bytes=max(x.get("device_mem_peak_bytes") or 0 for x in rows) or None,
                 losses=[x.get("loss") for x in rows])
    return r


def peer_side(d):
    path = os.path.join(d, "result.json")
    r = {"status": status(d)}
    if os.path.exists(path):
        p = json.load(open(path))
        r.update({k: p.get(k) for k in ("step_ms_median", "step_ms_min", "step_ms_max", "step_ms_windows",
                                        "device_step_ms_median", "peak_mem_bytes", "peak_reserved_bytes",
                                        "optimizer", "steps_done", "losses", "error", "oom", "gpu")})
    return r


def peer_dirs(spec):
    """[(row label suffix, folder)] of a shape's peers: one unnamed, or each of several llama peers."""
    peers = [p for p in spec.get("peers", "").split(",") if p]
    if len(peers) < 2:
        return [("", "peer")]
    return [(" (peer: %s)" % p, "peer" if i == 0 else "peer_" + p) for i, p in enumerate(peers)]


def last_window_loss(r, window):
    xs = [v for v in (r.get("losses") or [])[-window:] if isinstance(v, (int, float))]
    return statistics.mean(xs) if xs else None


def fmt(v, scale=1.0, digits=2):
    return "%.*f" % (digits, v / scale) if isinstance(v, (int, float)) else "-"


def ratio(a, b):
    return "%.2f" % (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def ms(r):
    if r.get("step_ms_median") is None:
        return "failed (%s)" % r["status"] if r["status"] != "rc 0" else "no windows"
    return "%s (%s–%s)" % (fmt(r["step_ms_median"]), fmt(r["step_ms_min"]), fmt(r["step_ms_max"]))


def row(label, t, p, lt, lp):
    """A table row: thetad's side `t` against a peer's side `p`."""
    note = p.get("error") or ""
    return "| %s | %s | %s | %s | %s | %s | %s | %s / %s | %s |" % (
        label, ms(t), ms(p), ratio(t.get("step_ms_median"), p.get("step_ms_median")),
        fmt(t.get("peak_mem_bytes"), GIB), fmt(p.get("peak_mem_bytes"), GIB),
        ratio(t.get("peak_mem_bytes"), p.get("peak_mem_bytes")), fmt(lt, 1, 4), fmt(lp, 1, 4), note[:80])


def main():
    out, names = sys.argv[1], sys.argv[2:]
    rows, summary = [], {}
    for name in names:
        d = os.path.join(out, name)
        spec = read_spec(os.path.join(d, "spec.txt"))
        warmup, window = int(spec.get("warmup", 10)), int(spec.get("window", 20))
        t = thetad_side(os.path.join(d, "thetad"), warmup, window)
        lt = last_window_loss(t, window)
        for suffix, folder in peer_dirs(spec):
            p = peer_side(os.path.join(d, folder))
            lp = last_window_loss(p, window)
            if folder == "peer":
                summary[name] = {"spec": spec, "thetad": t, "peer": p, "last_window_loss": [lt, lp]}
            else:
                summary[name][folder] = p
                summary[name]["last_window_loss_" + folder] = [lt, lp]
            rows.append(row(name + suffix, t, p, lt, lp))
    head = ["| shape | thetad step ms, median (min–max) of windows | plain peer step ms | ratio | thetad peak GiB "
            "| peer peak GiB | ratio | loss, last window, thetad / peer | note |",
            "|---|---|---|---|---|---|---|---|---|"]
    table = "\n".join(head + rows)
    with open(os.path.join(out, "summary.md"), "w") as f:
        env = os.path.join(out, "env.txt")
        f.write((open(env).read() if os.path.exists(env) else "") + "\n" + table + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
