#!/usr/bin/env python3
"""The include rules of docs/architecture.md, checked: every #include "..." of a source file in a
room (common/, config/, comm/, offload/, daemon/<room>/, launch/) must name its own room or one
the rules block ("## Include rules (checked)", at the end of the document) lets it use, and the
torch-free rooms include no LibTorch header. Exit 0: clean; 1: violations, one line each
(file:line: room -> room: "include"); 2: the rules block is missing or malformed, or a source
file lies in no room.

    scripts/check_includes.py [--root DIR] [--doc FILE]     # ctest: include_rules
    scripts/check_includes.py --self-test                    # ctest: include_rules_self_test
"""
import argparse
import os
import re
import sys
import tempfile

HEADING = "## Include rules (checked)"
SOURCE_TOPS = ("common", "config", "comm", "offload", "daemon", "launch")
SOURCE_EXT = (".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
TORCH = re.compile(r"^(torch|ATen|c10|caffe2)/")


class RulesError(Exception):
    pass


def parse_rules(doc_text):
    """{room: set of rooms it may include}, [torch-free rooms] from the block under HEADING:
    a fenced block of lines "room: other other ..." ("-": nothing), "torch-free: room ...", and
    "#" comments."""
    at = doc_text.find(HEADING)
    if at < 0:
        raise RulesError(f'no "{HEADING}" section')
    fence = re.search(r"^```[^\n]*\n(.*?)^```", doc_text[at:], re.S | re.M)
    if not fence:
        raise RulesError(f'no fenced block under "{HEADING}"')
    allowed, torch_free = {}, []
    for n, raw in enumerate(fence.group(1).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" not in line:
            raise RulesError(f"rules line {n}: '{raw.strip()}' is not 'room: rooms...'")
        room, rest = (s.strip() for s in line.split(":", 1))
        targets = [] if rest == "-" else rest.split()
        if room == "torch-free":
            torch_free = targets
        elif room in allowed:
            raise RulesError(f"rules line {n}: room '{room}' given twice")
        else:
            allowed[room] = set(targets)
    for room, targets in allowed.items():
        unknown = sorted(targets - set(allowed))
        if unknown:
            raise RulesError(f"room '{room}' may use unknown room(s): {' '.join(unknown)}")
    for room in torch_free:
        if room not in allowed:
            raise RulesError(f"torch-free names unknown room '{room}'")
    return allowed, torch_free


def room_of(path, rooms):
    """The longest room that is `path` or a folder above it (None: no room)."""
    best = None
    for r in rooms:
        if (path == r or path.startswith(r + "/")) and (best is None or len(r) > len(best)):
            best = r
    return best


def sources(root):
    for top in SOURCE_TOPS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")


def check(root, allowed, torch_free):
    """(violations, files outside every room): lists of messages."""
    violations, homeless = [], []
    for rel in sources(root):
        room = room_of(rel, allowed)
        if room is None:
            homeless.append(f"{rel}: in no room of the include rules")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                kind, name = m.groups()
                if kind == "<":
                    if room in torch_free and TORCH.match(name):
                        violations.append(f"{rel}:{n}: {room} is torch-free but includes <{name}>")
                    continue
                # Quoted: a path from the checkout's root, else from the file's own folder.
                target = name if os.path.exists(os.path.join(root, name)) else \
                    os.path.normpath(os.path.join(os.path.dirname(rel), name)).replace(os.sep, "/")
                other = room_of(target, allowed)
                if other is None or other == room or other in allowed[room]:
                    continue
                violations.append(f'{rel}:{n}: {room} -> {other}: "{name}" '
                                  f"({room} may use: {' '.join(sorted(allowed[room])) or 'nothing'})")
    return violations, homeless


def self_test():
    """The check fails where it should: a forbidden edge, torch in a torch-free room, a file in no
    room, a malformed block; and passes a clean tree."""
    rules = f"{HEADING}\n\n```\ncommon: -\ncomm: common\ndaemon/train: comm common\n" \
            f"daemon: daemon/train comm common\ntorch-free: common comm\n```\n"
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("common/a.hpp", "#pragma once\n#include <vector>\n")
        write("comm/b.cpp", '#include "comm/b.hpp"\n#include "common/a.hpp"\n')
        write("comm/b.hpp", "#pragma once\n")
        write("daemon/train/t.cpp", '#include "comm/b.hpp"\n#include <torch/torch.h>\n')
        allowed, torch_free = parse_rules(rules)
        v, h = check(root, allowed, torch_free)
        assert not v and not h, (v, h)
        write("comm/up.cpp", '#include <cstdio>\n#include "daemon/train/t.hpp"\n')
        write("daemon/train/t.hpp", "#pragma once\n")
        write("common/torch.cpp", "#include <ATen/ATen.h>\n")
        write("launch/x.cpp", "\n")
        v, h = check(root, allowed, torch_free)
        assert any(s.startswith('comm/up.cpp:2: comm -> daemon/train: "daemon/train/t.hpp"') for s in v), v
        assert any(s.startswith("common/torch.cpp:1: common is torch-free") for s in v), v
        assert h == ["launch/x.cpp: in no room of the include rules"], h
        for bad in (rules.replace("```\n", "", 1), "no block", rules.replace("comm: common", "comm: nowhere")):
            try:
                parse_rules(bad)
                raise AssertionError("malformed rules accepted: " + bad)
            except RulesError:
                pass
    print("check_includes self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--root", default=here)
    ap.add_argument("--doc", default=None, help="default: ROOT/docs/architecture.md")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    doc = a.doc or os.path.join(a.root, "docs", "architecture.md")
    try:
        with open(doc, encoding="utf-8") as f:
            allowed, torch_free = parse_rules(f.read())
    except (OSError, RulesError) as e:
        print(f"{doc}: {e}", file=sys.stderr)
        return 2
    violations, homeless = check(a.root, allowed, torch_free)
    for line in homeless + violations:
        print(line, file=sys.stderr)
    if homeless:
        return 2
    if violations:
        print(f"{len(violations)} include(s) cross an edge {doc} forbids", file=sys.stderr)
        return 1
    print(f"include rules of {os.path.relpath(doc, a.root)}: every include of {len(allowed)} rooms allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
