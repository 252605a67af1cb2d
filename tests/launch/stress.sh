#!/usr/bin/env bash
# Not in CI: runs the launcher's storm cases N times each and reports the failures, e.g.
#   tests/launch/stress.sh 1000                       # every storm case, 1000 runs each
#   tests/launch/stress.sh 50 startup_storm early_stop
# Cases (launcher_fake.sh): startup_storm (stops from the first moment through the ranks'
# start), sigterm_storm (during the checkpoint), rank_signal_storm (the wrappers' sessions during
# exit), early_stop, stop_twice, stop_outlives_srun, kill9_wrapper. Failed runs' output is kept in
# $STRESS_DIR (default /tmp/thetad-launch-stress.*). Exit 1 when any run failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
n=${1:-10}
shift || true
cases=("$@")
((${#cases[@]})) || cases=(startup_storm sigterm_storm rank_signal_storm early_stop stop_twice stop_outlives_srun)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
dir=${STRESS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/thetad-launch-stress.XXXXXX")}
mkdir -p "$dir"
total_bad=0
for c in "${cases[@]}"; do
  bad=0 start=$SECONDS
  for ((i = 1; i <= n; i++)); do
    if ! bash "$here/launcher_fake.sh" "$c" >"$dir/$c.$i.log" 2>&1; then
      bad=$((bad + 1))
      echo "FAIL $c run $i: $(grep -m1 FAIL "$dir/$c.$i.log")" >&2
    else
      rm -f "$dir/$c.$i.log"
    fi
  done
  echo "$c: $bad failure(s) in $n run(s), $((SECONDS - start)) s"
  total_bad=$((total_bad + bad))
done
echo "logs of failed runs: $dir"
((total_bad == 0))
