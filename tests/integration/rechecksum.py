#!/usr/bin/env python3
"""Rewrites the checksums of a checkpoint's manifest.json to match its files as they are now,
so that a test can damage a file's contents (a key removed, a NaN written) past the checksum
check and reach the reader's own checks. Formats 2 (a file per group) and 3 (shards).

    rechecksum.py CHECKPOINT_STEP_DIR
"""
import json
import os
import sys


def fnv1a64(path):
    h = 0xcbf29ce484222325
    for b in open(path, "rb").read():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main(step_dir):
    path = os.path.join(step_dir, "manifest.json")
    m = json.load(open(path))
    entries = m["shards"] if "shards" in m else m["groups"]
    for e in entries:
        e["fnv1a64"] = fnv1a64(os.path.join(step_dir, e["file"]))
    json.dump(m, open(path, "w"))


if __name__ == "__main__":
    main(sys.argv[1])
