#!/usr/bin/env bash
# npy data: a good data set trains; every data error (missing file, wrong dtype, shape mismatch,
# task count mismatch) exits 2 with a message naming the file, before any training step.
source "$(dirname "$0")/lib.sh"
thetad=$1
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then echo "numpy missing: skipped"; exit 0; fi
make_data() {  # dir tasks
  /usr/bin/python3 - "$1" "$2" <<'PY'
import numpy as np, sys, os
d, T = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
for t in range(T):
    x = rng.standard_normal((50, 16)).astype(np.float32)
    w = rng.standard_normal((16, 1)).astype(np.float32)
    np.save(f"{d}/task{t}_x.npy", x)
    np.save(f"{d}/task{t}_y.npy", np.tanh(x @ w).astype(np.float32))
PY
}
job=$HERE/jobs/small.yaml
run() {  # name dir
  expect_code "$3" "$1" mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set data.kind=npy \
    --set data.dir="$2" --set steps=10 --set metrics.path="$WORK/$1.jsonl" --no-resume
}
make_data "$WORK/good" 4
run good "$WORK/good" 0
make_data "$WORK/missing" 4; rm "$WORK/missing/task2_y.npy"
run missing "$WORK/missing" 2; expect_in missing "task2_y.npy"
make_data "$WORK/dtype" 4
/usr/bin/python3 -c "import numpy as np; np.save('$WORK/dtype/task1_x.npy', np.zeros((50,16)))"
run dtype "$WORK/dtype" 2; expect_in dtype "task1_x.npy.*float32"
make_data "$WORK/shape" 4
/usr/bin/python3 -c "import numpy as np; np.save('$WORK/shape/task0_y.npy', np.zeros((49,1), np.float32))"
run shape "$WORK/shape" 2; expect_in shape "task0_y.npy"
make_data "$WORK/fewer" 3
run fewer "$WORK/fewer" 2; expect_in fewer "task3_x.npy"
printf 'garbage' > "$WORK/good/task3_x.npy"
run corrupt "$WORK/good" 2; expect_in corrupt "task3_x.npy"
# Class labels for the extreme classifier (int64, per slice): good ones train, one out of range fails.
/usr/bin/python3 - "$WORK/labels" <<'PY'
import numpy as np, sys, os
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(1)
for t in range(4):                      # 40 classes in 4 slices of 10
    np.save(f"{d}/task{t}_x.npy", rng.standard_normal((30, 16)).astype(np.float32))
    np.save(f"{d}/task{t}_y.npy", rng.integers(0, 10, 30).astype(np.int64))
PY
xc=(--set model.kind=extreme_classifier --set model.classes=40)
expect_code 0 labels mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set data.kind=npy \
  --set data.dir="$WORK/labels" --set steps=5 "${xc[@]}" --no-resume
/usr/bin/python3 -c "import numpy as np; y=np.load('$WORK/labels/task2_y.npy'); y[7]=10; np.save('$WORK/labels/task2_y.npy', y)"
expect_code 2 label_range mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" --set data.kind=npy \
  --set data.dir="$WORK/labels" --set steps=5 "${xc[@]}" --no-resume --set metrics.path="$WORK/label_range.jsonl"
expect_in label_range "task2_y.npy: label 10 at row 7 is out of range"
for n in missing dtype shape fewer corrupt label_range; do
  [ ! -s "$WORK/$n.jsonl" ] && pass "$n: no training step ran" || fail "$n: steps ran before the error"
done
finish
