#!/usr/bin/env bash
# Parses deploy/ (MPIJob YAML, sbatch, Dockerfiles) and checks the fields that must agree;
# skipped (exit 77) when no python3 with the yaml module is installed.
# shellcheck source=tests/lib/test_lib.sh
source "$(dirname "$0")/../lib/test_lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=""
for cand in /usr/bin/python3 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import yaml' 2>/dev/null; then py=$cand; break; fi
done
[[ -n $py ]] || skip "no python3 with the yaml module"
if "$py" "$here/check_manifests.py" "$root"; then pass "deploy/ files agree"; else fail "deploy/ files disagree"; fi
finish
