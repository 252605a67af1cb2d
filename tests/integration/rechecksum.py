#!/usr/bin/env python3
"""Rewrites the checksums of a checkpoint's manifest.json to match its files as they are now,
and (format 6) the manifest's own checksum to match its text, so that a test can damage a
file's contents (a key removed, a NaN written) or edit the manifest past the checksum checks and
reach the reader's own checks. Formats 2 (a file per group), 3 (shards; FNV-1a 64 of the bytes),
4 (files; FNV-1a 64 of the 64-bit little-endian words, the last len % 8 bytes one by one), 5 and
6 (files; that words hash of each 4 MiB block, then FNV-1a 64 of the blocks' hashes as
little-endian 64-bit values: daemon/checkpoint_format/file_checksum.hpp); format 6's manifest ends with
"checksum", FNV-1a 64 of every byte of its text before that key (daemon/checkpoint_format/manifest.hpp).

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


def sealed(m):
    """Format 6's text: the manifest with its checksum as its last key."""
    m = {k: v for k, v in m.items() if k != "checksum"}
    prefix = json.dumps(m, indent=2)[:-2] + ",\n  "
    return prefix + '"checksum": "%016x"\n}\n' % fnv1a64(prefix.encode())


def main(step_dir):
    path = os.path.join(step_dir, "manifest.json")
    m = json.load(open(path))
    checksum = {"thetad-checkpoint-6": block_checksum, "thetad-checkpoint-5": block_checksum,
                "thetad-checkpoint-4": fnv1a64_words}.get(m["format"], fnv1a64)
    entries = m["files"] if "files" in m else m["shards"] if "shards" in m else m["groups"]
    for e in entries:
        try:
            data = open(os.path.join(step_dir, e["file"]), "rb").read()
        except OSError:  # a name the test made wrong on purpose: its entry stays as it is
            continue
        e["fnv1a64"] = "%016x" % checksum(data)
    if m["format"] == "thetad-checkpoint-6":
        open(path, "w").write(sealed(m))
    else:
        json.dump({k: v for k, v in m.items() if k != "checksum"}, open(path, "w"))


if __name__ == "__main__":
    main(sys.argv[1])
