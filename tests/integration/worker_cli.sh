#!/usr/bin/env bash
# The `thetad` command line as a user meets it: version, validate (examples pass, bad jobs exit 2
# naming file, line and key), run with a bad job exits 2 and writes nothing, unknown commands.
source "$(dirname "$0")/lib.sh"
thetad=$1
root=$(cd "$HERE/../.." && pwd)
expect_code 0 version "$thetad" version
expect_in version "^thetad [0-9]+\.[0-9]+\.[0-9]+ \(commit"
expect_in version "^libtorch [0-9.]+"
expect_in version "^mpi [0-9]"
expect_in version "^nccl "
for f in "$root"/config/examples/*.yaml; do
  expect_code 0 "validate_$(basename "$f" .yaml)" "$thetad" validate "$f"
done
expect_in validate_demo "^steps: 300"
cat > "$WORK/bad.yaml" <<'YAML'
job: bad
steps: 0
model: {kind: multitask_mlp, tasks: 4, hiden: 8}
data: {kind: synthetic}
checkpoint: {dir: WORKDIR/should-not-exist, every_steps: 5}
YAML
sed -i "s|WORKDIR|$WORK|" "$WORK/bad.yaml"
expect_code 2 validate_bad "$thetad" validate "$WORK/bad.yaml"
expect_in validate_bad "bad.yaml:2:[0-9]+: steps"
expect_in validate_bad "bad.yaml:3:[0-9]+: model.hiden.*did you mean 'hidden'"
expect_code 2 run_bad mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$WORK/bad.yaml"
[ ! -e "$WORK/should-not-exist" ] && pass "bad job wrote nothing" || fail "bad job created its checkpoint dir"
expect_code 2 missing_file "$thetad" validate "$WORK/nope.yaml"
expect_in missing_file "nope.yaml"
expect_code 2 bad_set "$thetad" validate "$root/config/examples/demo.yaml" --set optimizer.lr=-1
expect_in bad_set "optimizer.lr"
expect_code 2 unknown_command "$thetad" frobnicate
expect_code 2 no_job "$thetad" run
# The test aid run-jobs: a list it cannot use is exit 2 naming the file (and the line), before MPI.
expect_code 2 run_jobs_missing "$thetad" run-jobs "$WORK/nope.list"
expect_in run_jobs_missing "nope.list: cannot read the job list"
printf '# a comment\n%s\n' "$WORK/only_a_log.log" > "$WORK/bad.list"
expect_code 2 run_jobs_bad_line "$thetad" run-jobs "$WORK/bad.list"
expect_in run_jobs_bad_line "bad.list:2: expected LOG JOB.yaml \\[options\\]"
# Ranks started with different job files: exit 2 naming the differing key.
sed 's/lr: 0.005/lr: 0.006/' "$HERE/jobs/small.yaml" > "$WORK/other.yaml"
expect_code 2 mismatch mpirun "${MPIRUN_FLAGS[@]}" -np 1 "$thetad" run "$HERE/jobs/small.yaml" --no-resume \
  : -np 1 "$thetad" run "$WORK/other.yaml" --no-resume
expect_in mismatch "optimizer.lr"
finish
