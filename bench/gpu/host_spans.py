#!/usr/bin/env python3
"""Where the host's time goes in a thetad step, from a timeline (timeline.path; Chrome trace
JSON): the median duration per span name over the spans after the first SKIP of each name, the
medians of the spans' numeric arguments, and, with --trace N, every span of step N in order
(offsets from that step's "forward" span; a step runs to the next "forward").

    host_spans.py TIMELINE.json [SKIP=10] [--trace N]
"""
import json
import statistics
import sys


def main(argv):
    args = argv[1:]
    trace = None
    if "--trace" in args:
        i = args.index("--trace")
        trace = int(args[i + 1])
        del args[i:i + 2]
    path = args[0]
    skip = int(args[1]) if len(args) > 1 else 10
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    by_name, arg_vals = {}, {}
    for e in spans:
        by_name.setdefault(e["name"], []).append(float(e["dur"]) / 1000.0)
        for k, v in (e.get("args") or {}).items():
            if isinstance(v, (int, float)):
                arg_vals.setdefault(e["name"], {}).setdefault(k, []).append(float(v))
    rows = []
    for name, durs in by_name.items():
        timed = durs[skip:] or durs
        rows.append((statistics.median(timed), name, len(durs)))
    for med, name, n in sorted(rows, reverse=True)[:25]:
        print("%9.3f ms  x%-4d %s" % (med, n, name))
        for k, vals in sorted(arg_vals.get(name, {}).items()):
            timed = vals[skip:] or vals
            print("              %-20s median %.3f" % (k, statistics.median(timed)))
    if trace is not None:
        starts = sorted(e["ts"] for e in spans if e["name"] == "forward")
        if trace + 1 >= len(starts):
            print("no step %d in the timeline (%d forward spans)" % (trace, len(starts)))
            return 0
        t0, t1 = starts[trace], starts[trace + 1]
        lanes = {}
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                lanes[e.get("tid")] = e["args"]["name"]
        print("\nstep %d, host spans (start and end in ms from its forward's start):" % trace)
        for e in sorted((e for e in spans if t0 <= e["ts"] < t1), key=lambda e: e["ts"]):
            s = (e["ts"] - t0) / 1000.0
            print("  %8.3f %8.3f  %-8s %s" % (s, s + e["dur"] / 1000.0, lanes.get(e.get("tid"), "?"), e["name"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
