#!/usr/bin/env python3
"""The include rules of docs/architecture.md, checked: every #include "..." of a source file in a
room (common/, config/, comm/, offload/, daemon/<room>/, launch/) must name its own room or one
the rules block ("## Include rules (checked)", at the end of the document) lets it use; the
torch-free rooms include no LibTorch header; only the rooms the block's "mpi:" line names include
<mpi.h> or name anything of MPI's (MPI_...); no file includes its way back to itself through
other units (a unit: x.hpp and x.cpp with their helpers x_*.* and x/*); and no source file is
longer than MAX_LINES. Exit 0: clean; 1: violations, one line each (file:line: what); 2: the
rules block is missing or malformed, or a source file lies in no room.

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
# Anything of MPI's in code (a call, a type, a constant), not the thetad macro MPI_CHECK itself.
MPI_NAME = re.compile(r"\bMPI_(?!CHECK(?:_NOTHROW)?\b)[A-Za-z]\w*")
STRING = re.compile(r'"(?:\\.|[^"\\])*"')
# A file longer than this has more than one job (docs: "Files of a few hundred lines").
MAX_LINES = 500


class RulesError(Exception):
    pass


def parse_rules(doc_text):
    """{room: set of rooms it may include}, [torch-free rooms], [rooms that may use MPI] from the
    block under HEADING: a fenced block of lines "room: other other ..." ("-": nothing),
    "torch-free: room ...", "mpi: room ...", and "#" comments."""
    at = doc_text.find(HEADING)
    if at < 0:
        raise RulesError(f'no "{HEADING}" section')
    fence = re.search(r"^```[^\n]*\n(.*?)^```", doc_text[at:], re.S | re.M)
    if not fence:
        raise RulesError(f'no fenced block under "{HEADING}"')
    allowed, torch_free, mpi = {}, [], []
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
        elif room == "mpi":
            mpi = targets
        elif room in allowed:
            raise RulesError(f"rules line {n}: room '{room}' given twice")
        else:
            allowed[room] = set(targets)
    for room, targets in allowed.items():
        unknown = sorted(targets - set(allowed))
        if unknown:
            raise RulesError(f"room '{room}' may use unknown room(s): {' '.join(unknown)}")
    for name, rooms in (("torch-free", torch_free), ("mpi", mpi)):
        for room in rooms:
            if room not in allowed:
                raise RulesError(f"{name} names unknown room '{room}'")
    return allowed, torch_free, mpi


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


def code_of(line):
    """The line without its string literals and its // comment (block comments are not used)."""
    return STRING.sub('""', line).split("//", 1)[0]


def unit_of(rel, stems):
    """The unit a file belongs to: the longest stem x (of x.hpp or x.cpp) of which the file is x
    itself or a helper (x_*.* beside it, or anything under x/); its own stem otherwise."""
    stem = os.path.splitext(rel)[0]
    best = stem
    for other in stems:
        if stem.startswith(other + "_") or stem.startswith(other + "/"):
            if best == stem or len(other) > len(best):
                best = other
    return best


def include_loops(edges):
    """Loops among units: edges {(unit, unit): "file:line includes name"}; one message per loop,
    naming each include that closes it."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, loops, count = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = count[0]
        count[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                loops.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    messages = []
    for part in loops:
        # One circle through the component, from its first unit: the path back to it.
        start, inside = part[0], set(part)
        path, seen = [start], {start}
        while True:
            nxt = sorted(w for w in graph[path[-1]] if w in inside)
            back = start in nxt and len(path) > 1
            if back:
                break
            step = next((w for w in nxt if w not in seen), start)
            if step == start:
                break
            path.append(step)
            seen.add(step)
        path.append(start)
        why = "; ".join(edges[(a, b)] for a, b in zip(path, path[1:]))
        messages.append(f"include loop {' -> '.join(path)}: {why}")
    return messages


def check(root, allowed, torch_free, mpi=()):
    """(violations, files outside every room): lists of messages."""
    violations, homeless = [], []
    files = list(sources(root))
    stems = {os.path.splitext(rel)[0] for rel in files}
    edges = {}  # (unit, unit) -> the first include that makes it
    for rel in files:
        room = room_of(rel, allowed)
        if room is None:
            homeless.append(f"{rel}: in no room of the include rules")
            continue
        unit = unit_of(rel, stems)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        if len(lines) > MAX_LINES:
            violations.append(f"{rel}:{len(lines)}: {len(lines)} lines, more than {MAX_LINES} (split it by job)")
        for n, line in enumerate(lines, 1):
            if room not in mpi:
                named = MPI_NAME.search(code_of(line))
                if named and not INCLUDE.match(line):
                    violations.append(f"{rel}:{n}: {room} names {named.group(0)}: MPI belongs to "
                                      f"{' '.join(mpi) or 'no room'} (comm/'s interfaces serve the rest)")
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, name = m.groups()
            if kind == "<":
                if room in torch_free and TORCH.match(name):
                    violations.append(f"{rel}:{n}: {room} is torch-free but includes <{name}>")
                if name == "mpi.h" and room not in mpi:
                    violations.append(f"{rel}:{n}: {room} includes <mpi.h>: MPI belongs to {' '.join(mpi) or 'no room'}")
                continue
            # Quoted: a path from the checkout's root, else from the file's own folder.
            target = name if os.path.exists(os.path.join(root, name)) else \
                os.path.normpath(os.path.join(os.path.dirname(rel), name)).replace(os.sep, "/")
            other_unit = unit_of(target, stems)
            if other_unit != unit and os.path.splitext(target)[0] in stems:
                edges.setdefault((unit, other_unit), f"{rel}:{n} includes {name}")
            other = room_of(target, allowed)
            if other is None or other == room or other in allowed[room]:
                continue
            violations.append(f'{rel}:{n}: {room} -> {other}: "{name}" '
                              f"({room} may use: {' '.join(sorted(allowed[room])) or 'nothing'})")
    return violations + include_loops(edges), homeless


def self_test():
    """The check fails where it should: a forbidden edge, torch in a torch-free room, MPI outside
    its rooms, an include loop, a file too long, a file in no room, a malformed block; and passes
    a clean tree (helpers that include their unit back, MPI named in comments and strings)."""
    rules = f"{HEADING}\n\n```\ncommon: -\ncomm: common\ndaemon/train: comm common\n" \
            f"daemon: daemon/train comm common\ntorch-free: common comm\nmpi: comm daemon\n```\n"
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("common/a.hpp", "#pragma once\n#include <vector>\n")
        write("comm/b.cpp", '#include "comm/b.hpp"\n#include "common/a.hpp"\n#include <mpi.h>\nint r = MPI_Barrier(x);\n')
        write("comm/b.hpp", "#pragma once\n")
        # A unit's helpers (x_*.*, x/*) include it back: one unit, no loop.
        write("comm/e.hpp", "#pragma once\n")
        write("comm/e.cpp", '#include "comm/e.hpp"\n#include "comm/e_part.hpp"\n#include "comm/e/more.hpp"\n')
        write("comm/e_part.hpp", '#include "comm/e.hpp"\n')
        write("comm/e/more.hpp", '#include "comm/e.hpp"\n')
        write("daemon/train/t.cpp", '#include "comm/b.hpp"\n#include <torch/torch.h>\n'
                                    '// after MPI_Finalize\nconst char* s = "MPI_COMM_WORLD";\n')
        write("daemon/main.cpp", "#include <mpi.h>\nint main() { MPI_Init(0, 0); }\n")
        write("common/long.cpp", "\n" * MAX_LINES)
        allowed, torch_free, mpi = parse_rules(rules)
        v, h = check(root, allowed, torch_free, mpi)
        assert not v and not h, (v, h)
        write("comm/up.cpp", '#include <cstdio>\n#include "daemon/train/t.hpp"\n')
        write("daemon/train/t.hpp", "#pragma once\n")
        write("common/torch.cpp", "#include <ATen/ATen.h>\n")
        write("launch/x.cpp", "\n")
        write("common/m.cpp", "#include <mpi.h>\n")
        write("daemon/train/w.cpp", "int size(MPI_Comm c);  // the world: MPI_COMM_WORLD\n")
        write("common/x.hpp", '#pragma once\n#include "common/y.hpp"\n')
        write("common/y.cpp", '#include "common/y.hpp"\n#include "common/z.hpp"\n')
        write("common/y.hpp", "#pragma once\n")
        write("common/z.hpp", '#pragma once\n#include "common/x.hpp"\n')
        write("common/long.cpp", "\n" * (MAX_LINES + 1))
        v, h = check(root, allowed, torch_free, mpi)
        assert any(s.startswith('comm/up.cpp:2: comm -> daemon/train: "daemon/train/t.hpp"') for s in v), v
        assert any(s.startswith("common/torch.cpp:1: common is torch-free") for s in v), v
        assert any(s.startswith("common/m.cpp:1: common includes <mpi.h>") for s in v), v
        assert any(s.startswith("daemon/train/w.cpp:1: daemon/train names MPI_Comm") for s in v), v
        assert any(s.startswith("include loop common/x -> common/y -> common/z -> common/x: common/x.hpp:2 "
                                "includes common/y.hpp; common/y.cpp:2 includes common/z.hpp; common/z.hpp:2")
                   for s in v), v
        assert any(s.startswith(f"common/long.cpp:{MAX_LINES + 1}: {MAX_LINES + 1} lines") for s in v), v
        assert len(v) == 6, v
        assert h == ["launch/x.cpp: in no room of the include rules"], h
        for bad in (rules.replace("```\n", "", 1), "no block", rules.replace("comm: common", "comm: nowhere"),
                    rules.replace("mpi: comm", "mpi: nowhere")):
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
            allowed, torch_free, mpi = parse_rules(f.read())
    except (OSError, RulesError) as e:
        print(f"{doc}: {e}", file=sys.stderr)
        return 2
    violations, homeless = check(a.root, allowed, torch_free, mpi)
    for line in homeless + violations:
        print(line, file=sys.stderr)
    if homeless:
        return 2
    if violations:
        print(f"{len(violations)} violation(s) of the rules of {doc}", file=sys.stderr)
        return 1
    print(f"include rules of {os.path.relpath(doc, a.root)}: every include of {len(allowed)} rooms allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
