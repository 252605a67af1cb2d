#!/usr/bin/env python3
"""Where the host's time goes in a thetad step: the median duration per span name of a timeline
(timeline.path; Chrome trace JSON), over the spans after the first SKIP of each name.

    host_spans.py TIMELINE.json [SKIP=10]
"""
import json
import statistics
import sys


def main(argv):
    path = argv[1]
    skip = int(argv[2]) if len(argv) > 2 else 10
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    by_name = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_name.setdefault(e["name"], []).append(float(e["dur"]) / 1000.0)
    rows = []
    for name, durs in by_name.items():
        timed = durs[skip:] or durs
        rows.append((statistics.median(timed), name, len(durs)))
    for med, name, n in sorted(rows, reverse=True)[:25]:
        print("%9.3f ms  x%-4d %s" % (med, n, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
