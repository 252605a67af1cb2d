#!/usr/bin/env bash
# A rank that never comes to an agreement makes the others exit 3 (TimeoutError) naming it
# within the timeout: rank 1 stalls (the test aid THETAD_TEST_STALL, common/test_hooks.hpp) 60 s
# before POINT, the others wait 2 s. Without the stall every rank gets through (exit 0).
#   stalled_agreement.sh STALL_AGREEMENT_BINARY POINT WHAT_PATTERN
source "$(dirname "$0")/../lib/test_lib.sh"
bin=$1 point=$2 what=$3
mpirun=("${THETAD_MPIRUN:-mpirun}" "${MPIRUN_FLAGS[@]}")
expect_code 0 "${point}_no_stall" "${mpirun[@]}" -np 2 "$bin" "$point" 2
start=$SECONDS
expect_code 3 "$point" "${mpirun[@]}" -np 2 -x "THETAD_TEST_STALL=$point@1:60" "$bin" "$point" 2
took=$((SECONDS - start))
expect_in "$point" "rank 0: TimeoutError: collective #[0-9]+ \\($what\\) did not finish within 2 s \\(exit 3\\)"
# The stalled rank sleeps 60 s: ending well before shows the timeout ended the job, not the stall.
if ((took < 30)); then pass "$point: the job ended in $took s"; else fail "$point: the job took $took s"; fi
finish
