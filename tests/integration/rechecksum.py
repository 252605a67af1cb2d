#!/usr/bin/env python3
"""Rewrites the checksums of a checkpoint's manifest.json to match its files as they are now,
so that a test can damage a file's contents (a key removed, a NaN written) past the checksum
check and reach the reader's own checks. Formats 2 (a file per group), 3 (shards; FNV-1a 64 of
the bytes) and 4 (files; FNV-1a 64 of the 64-bit little-endian words, the last len % 8 bytes
one by one).

    rechecksum.py CHECKPOINT_STEP_DIR
"""
import json
import os
import struct
import sys

PRIME, BASIS, MASK = 0x100000001b3, 0xcbf29ce484222325, 0xFFFFFFFFFFFFFFFF


def fnv1a64(data, h=BASIS):
    for b in data:
        h = ((h ^ b) * PRIME) & MASK
    return h


def fnv1a64_words(data):
    h, whole = BASIS, len(data) // 8 * 8
    for (w,) in struct.iter_unpack("<Q", data[:whole]):
        h = ((h ^ w) * PRIME) & MASK
    return fnv1a64(data[whole:], h)


def main(step_dir):
    path = os.path.join(step_dir, "manifest.json")
    m = json.load(open(path))
    words = "files" in m
    entries = m["files"] if words else m["shards"] if "shards" in m else m["groups"]
    for e in entries:
        data = open(os.path.join(step_dir, e["file"]), "rb").read()
        e["fnv1a64"] = "%016x" % (fnv1a64_words(data) if words else fnv1a64(data))
    json.dump(m, open(path, "w"))


if __name__ == "__main__":
    main(sys.argv[1])
