#!/usr/bin/env python3
"""docs/configuration.md documents exactly the job keys of config/schema.cpp, in short rows.

Each key of the schema's table (`THETAD_FIELD` / `THETAD_ENUM_FIELD`: section and key) must have
one row `| `key` | ...` in its section's key table (the one headed `| key |`) under "## Keys" ("### Top level" for keys without a
section, "### `section`" otherwise), and every such row must name a key of the schema. Rows stay
short enough to scan (at most MAX_ROW characters: the long explanations live in the key's
`#### section.key` subsection below the table), and every in-page link (`](#anchor)`) names a
heading of the page.

    scripts/check_config_doc.py --root REPO     exit 0, or 1 listing each problem
    scripts/check_config_doc.py --self-test     shows that each check can fail
"""
import os
import re
import sys

import repo_check

MAX_ROW = 600


def schema_keys(text):
    keys = set()
    for m in re.finditer(r'THETAD_(?:ENUM_)?FIELD\(\s*"([^"]*)",\s*"([^"]+)"', text):
        keys.add((m.group(1), m.group(2)))
    return keys


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def doc_rows(text):
    """(section, key) -> [row lengths], the headings' anchors, and the in-page links."""
    rows, anchors, links = {}, set(), re.findall(r"\]\(#([^)]+)\)", text)
    section, in_keys, in_table = None, False, False
    for line in text.splitlines():
        # A section's key table starts with its `| key |` header and ends at the first line that
        # is not a row (other tables of a section, e.g. the schedules', list no keys).
        if not line.startswith("|"):
            in_table = False
        elif line.startswith("| key |"):
            in_table = True
        h = re.match(r"^(#+)\s+(.*)$", line)
        if h:
            anchors.add(anchor(h.group(2)))
            level, title = len(h.group(1)), h.group(2)
            if level == 2:
                in_keys = title.strip() == "Keys"
                section = None
            elif level == 3 and in_keys:
                s = re.match(r"^`([a-z_]+)`", title)
                section = "" if title.startswith("Top level") else (s.group(1) if s else None)
            continue
        r = re.match(r"^\| `([a-z_0-9]+)` \|", line)
        if r and in_keys and in_table and section is not None:
            rows.setdefault((section, r.group(1)), []).append(len(line))
    return rows, anchors, links


def problems(root):
    schema = schema_keys(open(os.path.join(root, "config/schema.cpp")).read())
    rows, anchors, links = doc_rows(open(os.path.join(root, "docs/configuration.md")).read())
    name = lambda k: f"{k[0]}.{k[1]}" if k[0] else k[1]
    out = []
    for k in sorted(schema - set(rows)):
        out.append(f"{name(k)}: a key of config/schema.cpp without a row in its section's table")
    for k in sorted(set(rows) - schema):
        out.append(f"{name(k)}: a row of docs/configuration.md that names no key of config/schema.cpp")
    for k, lengths in sorted(rows.items()):
        if len(lengths) > 1:
            out.append(f"{name(k)}: {len(lengths)} rows")
        if max(lengths) > MAX_ROW:
            out.append(f"{name(k)}: its row is {max(lengths)} characters (at most {MAX_ROW}: move the "
                       f"explanation to a '#### `{name(k)}`' subsection below the table)")
    for link in links:
        if link not in anchors:
            out.append(f"link #{link}: no heading of docs/configuration.md has that anchor")
    return out, len(schema)


def self_test():
    import shutil
    import tempfile
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as root:
        for rel in ("config/schema.cpp", "docs/configuration.md"):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            shutil.copy(os.path.join(here, rel), os.path.join(root, rel))
        doc = os.path.join(root, "docs/configuration.md")
        text = open(doc).read()
        assert problems(root)[0] == [], problems(root)[0]
        cases = [
            (re.sub(r"^\| `seq_len` \|.*\n", "", text, count=1, flags=re.M), "model.seq_len: a key of config/schema.cpp without"),
            (text.replace("| `seed` |", "| `seed` | " + "x" * MAX_ROW + " |", 1), "seed: its row is"),
            (text.replace("## Keys\n", "## Keys\n\n[x](#no-such-heading)\n", 1), "link #no-such-heading"),
            (text.replace("| `seed` |", "| `sead` |", 1), "sead: a row of docs/configuration.md that names no key"),
        ]
        for changed, expect in cases:
            open(doc, "w").write(changed)
            found = problems(root)[0]
            assert any(expect in p for p in found), (expect, found)
    print("check_config_doc self-test: a missing row, a long row, a broken link and an unknown key are reported")
    return 0


def main():
    def check(root):
        found, n = problems(root)
        return found, f"{n} keys, each in one row of at most {MAX_ROW} characters; every link resolves"
    return repo_check.run("check_config_doc", check, self_test)


if __name__ == "__main__":
    sys.exit(main())
