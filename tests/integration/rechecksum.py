#!/usr/bin/env python3
"""Rewrites the checksums of a checkpoint's manifest.json to match its files as they are now,
so that a test can damage a file's contents (a key removed, a NaN written) past the checksum
check and reach the reader's own checks. Formats 2 (a file per group), 3 (shards; FNV-1a 64 of
the bytes), 4 (files; FNV-1a 64 of the 64-bit little-endian words, the last len % 8 bytes
one by one) and 5 (files; that words hash of each 4 MiB block, then FNV-1a 64 of the blocks'
hashes as little-endian 64-bit values: daemon/core/file_checksum.hpp).

    rechecksum.py CHECKPOINT_STEP_DIR
"""
import json
import os
import struct
import sys

PRIME, BASIS, MASK = 0x100000001b3, 0xcbf29ce484222325, 0xFFFFFFFFFFFFFFFF
BLOCK = 4 << 20


def fnv1a64(data, h=BASIS):
    for b in data:
        h = ((h ^ b) * PRIME) & MASK
    return h


def fnv1a64_words(data):
    h, whole = BASIS, len(data) // 8 * 8
    for (w,) in struct.iter_unpack("<Q", data[:whole]):
        h = ((h ^ w) * PRIME) & MASK
    return fnv1a64(data[whole:], h)


def block_checksum(data):
    blocks = [fnv1a64_words(data[i:i + BLOCK]) for i in range(0, len(data), BLOCK)]
    return fnv1a64(b"".join(struct.pack("<Q", h) for h in blocks))


def main(step_dir):
    path = os.path.join(step_dir, "manifest.json")
    m = json.load(open(path))
    checksum = {"thetad-checkpoint-5": block_checksum, "thetad-checkpoint-4": fnv1a64_words}.get(m["format"], fnv1a64)
    entries = m["files"] if "files" in m else m["shards"] if "shards" in m else m["groups"]
    for e in entries:
        data = open(os.path.join(step_dir, e["file"]), "rb").read()
        e["fnv1a64"] = "%016x" % checksum(data)
    json.dump(m, open(path, "w"))


if __name__ == "__main__":
    main(sys.argv[1])
