#!/usr/bin/env bash
# A FAKE thetad that floods its stderr, for launch.fake.log_flood: `run JOB` writes
# THETAD_FLOOD_LINES lines of 100 bytes, every other one with its own rank tag, through awk's
# block buffering (so that lines reach the wrapper cut at arbitrary bytes), then exits 0.
set -euo pipefail
[[ ${1:-} == run ]] || { echo "fake flood: only 'run'" >&2; exit 1; }
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}
exec 1>&2  # stdout is the rank's stderr: awk block-buffers it
exec awk -v r="$rank" -v n="${THETAD_FLOOD_LINES:-100000}" 'BEGIN {
  pad = sprintf("%0" (80 - length(r)) "d", 0)
  for (i = 0; i < n; i++)
    if (i % 2) printf "[rank %d] flood %d %07d %s\n", r, r, i, pad
    else printf "flood %d %07d %s\n", r, i, pad
}'
