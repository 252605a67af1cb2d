#!/usr/bin/env bash
# 8 fake ranks under real mpirun, each writing THETAD_FLOOD_LINES (default 100,000) lines of 100
# bytes (10 MB per rank) to stderr as fast as awk can: the launcher's merged stream and
# launcher.log must hold every line of every rank whole, in each rank's order, tagged once,
# and each rank-R.log all of its own lines. Usage: log_flood.sh [LINES]
set -euo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"

lines=${1:-${THETAD_FLOOD_LINES:-100000}}
job=$T/flood.yaml
printf 'job: flood-%s\nsteps: 1\nmodel: {kind: multitask_mlp, tasks: 2}\ndata: {kind: synthetic}\n' "$MARKER" >"$job"
start=$SECONDS
rc=0
THETAD_FLOOD_LINES=$lines timeout -k 5 120 "$LAUNCHER" --thetad "$LAUNCH_TEST_DIR/fake_flood.sh" \
  --nproc-per-node 8 --log-dir "$T/logs" "$job" >"$T/out" 2>"$T/err" || rc=$?
((rc == 0)) || { tail -n 20 "$T/err" >&2; fail "8 flooding ranks: want exit 0, got $rc"; }
echo "8 ranks x $lines lines of 100 bytes: launcher done in $((SECONDS - start)) s"

# check FILE RANKS: every flood line well-formed ("[rank R] flood R I PAD"), each rank's indices
# 0..lines-1 in order; prints the first problem.
check() {
  awk -v n="$lines" -v ranks="$2" -v tagged="$3" '
    /(^| )flood [0-9]+ [0-9]+ / {
      if (tagged) { ok = match($0, /^\[rank [0-9]+\] flood [0-9]+ [0-9]+ 0+$/) }
      else { ok = match($0, /^(\[rank [0-9]+\] )?flood [0-9]+ [0-9]+ 0+$/) }
      if (!ok) { print "malformed line " NR ": " substr($0, 1, 120); bad = 1; exit 1 }
      k = $0 ~ /^\[/ ? 4 : 2
      split($0, f, " ")
      r = f[k]; i = f[k + 1] + 0
      if (tagged && f[2] != r "]") { print "line " NR " tagged as " f[2] " but from rank " r; bad = 1; exit 1 }
      if (i != next_i[r] + 0) { print "rank " r ": line " i " where " next_i[r] + 0 " was due (line " NR ")"; bad = 1; exit 1 }
      next_i[r] = i + 1
    }
    END {
      if (bad) exit 1
      split(ranks, rs, ",")
      for (j in rs) if (next_i[rs[j]] + 0 != n) { print "rank " rs[j] ": " next_i[rs[j]] + 0 " of " n " lines"; exit 1 }
    }' "$1"
}
all=0,1,2,3,4,5,6,7
check "$T/err" "$all" 1 || fail "merged stream (the launcher's stderr)"
check "$T/logs/launcher.log" "$all" 1 || fail "launcher.log"
for r in 0 1 2 3 4 5 6 7; do
  check "$T/logs/rank-$r.log" "$r" 0 || fail "rank-$r.log"
done
no_leftovers
pass "8 ranks x $lines lines: merged stream, launcher.log and rank logs whole, in order, tagged once ($((SECONDS - start)) s)"
