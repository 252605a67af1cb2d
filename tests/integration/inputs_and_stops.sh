#!/usr/bin/env bash
# Inputs that are not regular files (FIFOs) are refused before they are opened (exit 2 naming
# the file, within seconds, never a hang); a stop signal ends a
# process whose start-up is stuck (exit 4 with a line saying so); {job} and {rank} are expanded in
# data.dir and model.path; a TorchScript model whose output shape differs from the targets is
# exit 2 naming both shapes; a stop without checkpoint.dir says nothing is written;
# THETAD_DEVICE_PROFILE: malformed is exit 2 naming it, valid traces its steps (a LibTorch without
# Kineto, Debian's: a warning, and the run goes on).
source "$(dirname "$0")/lib.sh"
thetad=$1
job=$HERE/jobs/small.yaml
py=/usr/bin/python3
make_data() {  # dir tasks
  $py - "$1" "$2" <<'PY'
import sys, numpy as np
d, tasks = sys.argv[1], int(sys.argv[2])
import os; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(3)
for t in range(tasks):
    x = rng.standard_normal((50, 16)).astype(np.float32)
    np.save(f"{d}/task{t}_x.npy", x)
    np.save(f"{d}/task{t}_y.npy", np.tanh(x[:, :1]).astype(np.float32))
PY
}
npy() { echo --set data.kind=npy --set steps=3 --no-resume; }

# FIFOs: the job file, a data file (seen by validate), a data file only the run sees ({rank}).
mkfifo "$WORK/job.fifo"
expect_code 2 fifo_job timeout 20 "$thetad" validate "$WORK/job.fifo"
expect_in fifo_job "job.fifo: cannot read job file: not a regular file \(a FIFO\)"
expect_code 2 fifo_job_run timeout 20 "$thetad" run "$WORK/job.fifo"
make_data "$WORK/d" 4 && rm "$WORK/d/task1_x.npy" && mkfifo "$WORK/d/task1_x.npy"
expect_code 2 fifo_npy_validate timeout 20 "$thetad" validate "$job" --set data.kind=npy --set data.dir="$WORK/d"
expect_in fifo_npy_validate "data.dir: .*task1_x.npy: not a regular file"
make_data "$WORK/small-0" 4 && rm "$WORK/small-0/task2_y.npy" && mkfifo "$WORK/small-0/task2_y.npy"
expect_code 2 fifo_npy_run timeout 30 "$thetad" run "$job" $(npy) --set data.dir="$WORK/{job}-{rank}"
expect_in fifo_npy_run "small-0/task2_y.npy: .*not a regular file"

# {job} and {rank} in data.dir: each rank reads its own directory.
rm -rf "$WORK/small-0" && make_data "$WORK/small-0" 4 && make_data "$WORK/small-1" 4
expect_code 0 rank_dirs mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" $(npy) --set data.dir="$WORK/{job}-{rank}"
rm -rf "$WORK/small-1"
expect_code 2 rank_dir_missing mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" $(npy) --set data.dir="$WORK/{job}-{rank}"
expect_in rank_dir_missing "data.dir: '$WORK/small-1' is not a directory"

# A stop signal reaches a start-up stuck on an output FIFO nobody reads (log.file): exit 4.
mkfifo "$WORK/log.fifo"
"$thetad" run "$job" --no-resume --set log.file="$WORK/log.fifo" > "$WORK/stuck.log" 2>&1 &
pid=$!
# Until it waits in open() for a reader (MPI's start-up before it ends on SIGTERM anyway).
for _ in $(seq 1 300); do [ "$(cat /proc/$pid/wchan 2>/dev/null)" = wait_for_partner ] && break; sleep 0.1; done
kill -TERM "$pid"
t0=$SECONDS
code=0
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then fail "stuck start-up ignored SIGTERM for 30 s"; kill -9 "$pid"; fi
wait "$pid" || code=$?
[ "$code" -eq 4 ] && pass "stuck start-up: exit 4 after SIGTERM ($((SECONDS - t0)) s)" || fail "stuck start-up: exit $code"
expect_in stuck "stop signal received during start-up"

# A stop without checkpoint.dir: exit 4, and the log says nothing is written.
"$thetad" run "$job" --no-resume --set steps=1000000 --set metrics.path="$WORK/nock.jsonl" > "$WORK/nock.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$WORK/nock.jsonl" ] && break; sleep 0.1; done
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
[ "$code" -eq 4 ] && pass "stop without checkpoint.dir: exit 4" || fail "stop without checkpoint.dir: exit $code"
expect_in nock "stop requested \(signal\); no checkpoint.dir: nothing is written, stopping after step [0-9]+"
if grep -q "checkpointing at step" "$WORK/nock.log"; then fail "nock claims a checkpoint"; else pass "nock claims no checkpoint"; fi

if $py -c 'import torch' 2>/dev/null; then
  # {job} and {rank} in model.path; a [rows, 2] output against [rows, 1] targets is refused.
  for r in 0 1; do $py "$HERE/../../docs/examples/export_torchscript.py" "$WORK/small-$r.pt" --input-dim 16 --tasks 4; done
  $py "$HERE/../../docs/examples/export_torchscript.py" "$WORK/wide.pt" --input-dim 16 --tasks 4 --output-dim 2
  ts=(--set model.kind=torchscript --set model.trust_code=true --set 'model.shared=["trunk.*"]' --set 'model.task=heads.{t}.*' --set steps=3 --no-resume)
  expect_code 0 ts_rank_path mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" "${ts[@]}" --set model.path="$WORK/{job}-{rank}.pt"
  expect_code 2 ts_shape "$thetad" run "$job" "${ts[@]}" --set model.path="$WORK/wide.pt"
  expect_in ts_shape "wide.pt: model.path: the model's output for task [0-9]+ has shape \[[0-9]+, 2\] where its targets have shape \[[0-9]+, 1\]"
  expect_in ts_shape "note: --set model.trust_code: the code of model.path \('.*wide.pt'\) runs with your rights"
  mkfifo "$WORK/small-2.pt"
  expect_code 2 ts_fifo timeout 30 mpirun "${MPIRUN_FLAGS[@]}" -np 3 "$thetad" run "$job" "${ts[@]}" --set model.path="$WORK/{job}-{rank}.pt"
  expect_in ts_fifo "small-2.pt: model.path: not a regular file"
else
  echo "python3-torch missing: TorchScript part skipped"
fi
expect_code 2 profile_malformed env THETAD_DEVICE_PROFILE=2:1:"$WORK/trace.json" "$thetad" run "$job" --set steps=3 --no-resume
expect_in profile_malformed "THETAD_DEVICE_PROFILE: '2:1:.*trace.json' is not FIRST:LAST:PATH"
expect_code 0 profile env THETAD_DEVICE_PROFILE=1:2:"$WORK/trace.json" "$thetad" run "$job" --set steps=3 --no-resume --set log.level=info
if grep -q "THETAD_DEVICE_PROFILE: no trace" "$WORK/profile.log"; then pass "profile: no Kineto here, the run went on"
elif [ -s "$WORK/trace.json" ]; then expect_in profile "THETAD_DEVICE_PROFILE: steps 1..2 written to"
else fail "profile: neither a trace nor a warning"; fi

# --checked-copy (thetad-launch's: the bytes it checked): the copy runs, not the job file read
# again, and messages name the job file.
cp "$job" "$WORK/checked.yaml" && sed 's/^steps:.*/steps: 2/' "$job" >"$WORK/copy.yaml"
echo "steps: [not a number]" >>"$WORK/checked.yaml"  # edited after the check: never read
expect_code 0 checked_copy "$thetad" run "$WORK/checked.yaml" --checked-copy "$WORK/copy.yaml" --no-resume \
  --set metrics.path="$WORK/checked.jsonl" --set checkpoint.dir=
[ "$(wc -l <"$WORK/checked.jsonl")" -eq 2 ] && pass "checked_copy: the copy's 2 steps ran" || fail "checked_copy: $(wc -l <"$WORK/checked.jsonl") records"
echo "steps: -1" >>"$WORK/copy.yaml"
expect_code 2 checked_copy_bad "$thetad" run "$WORK/checked.yaml" --checked-copy "$WORK/copy.yaml" --no-resume
expect_in checked_copy_bad "checked.yaml:[0-9]+:[0-9]+: .*steps"
finish
