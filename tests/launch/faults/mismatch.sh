#!/usr/bin/env bash
# Fault: two ranks started with different job files (raw MPMD mpirun, no launcher) must both
# stop at startup with exit 2, naming the key that differs, writing no checkpoint.
# Usage: mismatch.sh PATH/TO/thetad
set -euo pipefail
# shellcheck source=tests/launch/faults/common.sh
source "$(dirname "$0")/common.sh"

fault_job "$T/a.yaml" mismatch "$T/ckpt-mm"
fault_job "$T/b.yaml" mismatch "$T/ckpt-mm"
sed -i 's/hidden: 32/hidden: 48/' "$T/b.yaml"
rc=0
timeout -k 5 90 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np 1 "$THETAD" run "$T/a.yaml" : -np 1 "$THETAD" run "$T/b.yaml" \
  >"$T/mm.out" 2>&1 || rc=$?
((rc != 124 && rc != 137)) || fail "ranks with different jobs hung (killed after 90 s)"
((rc == 2)) || { tail -n 30 "$T/mm.out" >&2; fail "want exit 2, got $rc"; }
assert_grep 'hidden' "$T/mm.out" "no message naming the differing key model.hidden"
[[ -z $(find "$T/ckpt-mm" -name manifest.json 2>/dev/null) ]] || fail "a checkpoint was written"
no_leftovers
pass "different job files on two ranks: exit 2 naming model.hidden"
