#!/usr/bin/env python3
"""The test suite's conventions, checked on what ctest registered and on the shell tests' sources.

  - every test has labels, none of them empty (the tiers: `ctest -L unit`, `-L mpi`, ...);
  - every test reads exit 77 as "skipped" (SKIP_RETURN_CODE 77);
  - every shell script a test runs sources the one library, tests/lib/test_lib.sh (directly or
    through a lib.sh that does), and defines none of its results (pass, fail, die, skip, finish);
  - the tests' mpirun flags are written in tests/lib/mpirun.flags only (no other file of tests/
    or cmake/ names their transports, `btl self,vader,tcp`).

  check_tests.py --ctest CTEST --build BUILD_DIR --source SOURCE_DIR
  check_tests.py --self-test      # each check fails on a registration made to break it

Runs --self-test first in the normal mode too, so that the test shows it can fail.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SKIP_CODE = 77
LIBRARY = "tests/lib/test_lib.sh"
FLAGS_FILE = "tests/lib/mpirun.flags"
FLAGS_MARK = "self,vader,tcp"  # the transports of the tests' mpirun flags
OWN_RESULTS = re.compile(r"^\s*(pass|fail|die|skip|finish)\s*\(\)", re.M)
SOURCED = re.compile(r"^\s*(?:source|\.)\s+(.+)$", re.M)


def prop(test, name):
    for p in test.get("properties", []):
        if p["name"] == name:
            return p["value"]
    return None


def sourced_files(path):
    """The files a script sources, resolved against its own folder: `"$(dirname "$0")/lib.sh"`
    and `"$HERE/lib.sh"` name ./lib.sh, `.../../lib.sh` the folder above's."""
    here = os.path.dirname(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for line in SOURCED.findall(text):
        words = line.split("#")[0].replace('"', "")
        rel = re.split(r"[)}]|\$[A-Za-z_]+", words)[-1].strip().lstrip("/")
        if rel:
            out.append(os.path.normpath(os.path.join(here, rel)))
    return text, out


def uses_library(path, seen=None):
    seen = seen if seen is not None else set()
    if os.path.basename(path) == os.path.basename(LIBRARY):
        return True
    if path in seen or not os.path.isfile(path):
        return False
    seen.add(path)
    _, files = sourced_files(path)
    return any(uses_library(f, seen) for f in files)


def check(tests, source_dir):
    """Every problem with the registered tests (ctest's json-v1 `tests`) and the tree's scripts."""
    problems = []
    scripts = set()
    for t in tests:
        name = t["name"]
        labels = prop(t, "LABELS")
        if not labels:
            problems.append(f"{name}: no label")
        elif any(not label.strip() for label in labels):
            problems.append(f"{name}: an empty label in {labels}")
        if prop(t, "SKIP_RETURN_CODE") != SKIP_CODE:
            problems.append(f"{name}: exit {SKIP_CODE} is not read as skipped (SKIP_RETURN_CODE)")
        # The script the test runs: its command, or the first argument of bash/sh.
        command = t.get("command") or []
        if len(command) > 1 and os.path.basename(command[0]) in ("bash", "sh"):
            run = command[1]
        else:
            run = command[0] if command else ""
        if run.endswith(".sh"):
            scripts.add(os.path.abspath(run))
    library = os.path.join(source_dir, LIBRARY)
    for script in sorted(scripts):
        rel = os.path.relpath(script, source_dir)
        if not uses_library(script):
            problems.append(f"{rel}: does not source {LIBRARY}")
    for root in ("tests", "cmake"):
        for folder, _, files in os.walk(os.path.join(source_dir, root)):
            for f in files:
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, source_dir)
                if not f.endswith((".sh", ".cmake", ".txt", ".py")) or rel == FLAGS_FILE:
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                if f.endswith(".sh") and path != library and OWN_RESULTS.search(text):
                    problems.append(f"{rel}: defines {OWN_RESULTS.search(text).group(1)}() (the library's)")
                if FLAGS_MARK in text and rel != "tests/lib/check_tests.py":
                    problems.append(f"{rel}: writes mpirun flags (they belong in {FLAGS_FILE})")
    return problems


def self_test():
    """Each check must catch the registration or script made to break it."""
    with tempfile.TemporaryDirectory() as src:
        os.makedirs(os.path.join(src, "tests/lib"))
        os.makedirs(os.path.join(src, "tests/x"))
        open(os.path.join(src, LIBRARY), "w").write("pass() { :; }\n")
        open(os.path.join(src, FLAGS_FILE), "w").write(f"--mca btl {FLAGS_MARK}\n")
        good = os.path.join(src, "tests/x/good.sh")
        open(good, "w").write('source "$(dirname "$0")/lib.sh"\nfinish\n')
        open(os.path.join(src, "tests/x/lib.sh"), "w").write('source "$(dirname "${BASH_SOURCE[0]}")/../lib/test_lib.sh"\n')
        bad = os.path.join(src, "tests/x/bad.sh")
        open(bad, "w").write(f"skip() {{ exit 0; }}\nmpirun --mca btl {FLAGS_MARK} x\n")

        def t(name, labels=("unit",), skip=SKIP_CODE, command=("x",)):
            props = [{"name": "SKIP_RETURN_CODE", "value": skip}] if skip is not None else []
            if labels is not None:
                props.append({"name": "LABELS", "value": list(labels)})
            return {"name": name, "command": list(command), "properties": props}

        refused = [p for p in check([t("ok", command=("bash", good))], src) if "bad.sh" not in p]
        if refused:
            raise SystemExit("self-test: a test that keeps every convention was refused: " + "; ".join(refused))
        cases = {
            "no label": [t("a", labels=None)],
            "an empty label": [t("a", labels=("mpi", ""))],
            "is not read as skipped": [t("a", skip=None)],
            "does not source": [t("a", command=("bash", bad))],
        }
        for want, tests in cases.items():
            got = check(tests, src)
            if not any(want in p for p in got):
                raise SystemExit(f"self-test: a test with '{want}' went through ({got})")
        tree = check([], src)
        for want in ("defines skip()", "writes mpirun flags"):
            if not any(want in p for p in tree):
                raise SystemExit(f"self-test: a script that {want} went through ({tree})")
    print("check_tests.py self-test: every check fails when it should")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctest")
    ap.add_argument("--build")
    ap.add_argument("--source")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    self_test()
    if a.self_test:
        return 0
    if not (a.ctest and a.build and a.source):
        ap.error("--ctest, --build and --source are needed")
    out = subprocess.run([a.ctest, "--test-dir", a.build, "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    tests = json.loads(out)["tests"]
    problems = check(tests, a.source)
    for p in problems:
        print("FAIL", p)
    print(f"{len(tests)} tests checked: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
