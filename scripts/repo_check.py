"""The command line shared by the repository's checks (scripts/check_*.py): `--root REPO` runs the
check and lists its problems on stderr (exit 1) or says what held (exit 0); `--self-test` runs the
check's self-test, which shows that each of its checks can fail."""
import argparse
import sys


def run(name, check, self_test):
    """check(root) -> (problems, what held); self_test() -> exit code."""
    ap = argparse.ArgumentParser(prog=name)
    ap.add_argument("--root", default=".")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    problems, held = check(args.root)
    for p in problems:
        print(f"{name}: {p}", file=sys.stderr)
    if not problems:
        print(f"{name}: {held}")
    return 1 if problems else 0
