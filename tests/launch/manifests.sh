#!/usr/bin/env bash
# Parses deploy/ (MPIJob YAML, sbatch, Dockerfiles) and checks the fields that must agree;
# skips (exit 0, "SKIP") when no python3 with the yaml module is installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=""
for cand in /usr/bin/python3 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import yaml' 2>/dev/null; then py=$cand; break; fi
done
if [[ -z $py ]]; then echo "SKIP: no python3 with the yaml module"; exit 0; fi
exec "$py" "$here/check_manifests.py" "$root"
