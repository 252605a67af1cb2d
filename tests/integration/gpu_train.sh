#!/usr/bin/env bash
# GPU end to end (ctest label gpu; skips cleanly without a GPU): real `thetad run` on NCCL.
#  1. thetad runs on 2 GPUs (1 when only one is visible) over NCCL;
#  2. optimizer.overlap on and off give bitwise-identical parameters (same arithmetic, other
#     stream and time);
#  3. offload on the GPU (real pinned arena, copy streams, CPU Adam) matches all-resident within
#     float tolerance.
# (The CPU reference cannot be the yardstick here: synthetic batches are drawn on the device.)
#   gpu_train.sh THETAD
source "$(dirname "$0")/lib.sh"
thetad=$1  # (the CMake test passes the reference too; it is not used here)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -lt 1 ]; then echo "SKIP: no GPU visible"; exit 0; fi
np=$(( ngpu >= 2 ? 2 : 1 ))
job=$HERE/jobs/small.yaml
common=(--set comm.backend=nccl --set model.hidden=256 --set model.input_dim=64 --set steps=20
        --set data.batch_per_rank=64 --set log.level=info)
run() {  # run NAME extra-sets...
  local name=$1; shift
  expect_code 0 "$name" mpirun "${MPIRUN_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 -np "$np" "$thetad" run "$job" \
    --no-resume "${common[@]}" --set checkpoint.dir="$WORK/$name/ckpt" "$@"
}
run overlap_on --set optimizer.overlap=true
run overlap_off --set optimizer.overlap=false
a=$(final_hash "$WORK/overlap_on.log"); b=$(final_hash "$WORK/overlap_off.log")
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "optimizer.overlap on == off bitwise ($a)"
else fail "optimizer.overlap on $a != off $b"; fi
expect_in overlap_on "data plane nccl"
run offload --set offload.enabled=true --set offload.device_slots=2
# Offload (CPU Adam on the host) against all-resident (fused Adam on the GPU): the same
# parameters within float tolerance (the two Adams round differently).
py=$(command -v python3 || echo /usr/bin/python3)
if out=$("$py" - "$WORK/overlap_on/ckpt" "$WORK/offload/ckpt" 2>&1 <<'PY'
import glob, inspect, os, sys, torch
# PyTorch >= 2.6 loads with weights_only=True by default; the comparison needs the values only.
KW = {"weights_only": False} if "weights_only" in inspect.signature(torch.load).parameters else {}
def latest(d):  # the newest complete checkpoint
    return sorted(os.path.dirname(m) for m in glob.glob(os.path.join(d, "step-*", "manifest.json")))[-1]
try:
    a, b = latest(sys.argv[1]), latest(sys.argv[2])
    worst, n = 0.0, 0
    for f in sorted(glob.glob(os.path.join(a, "group-*.pt"))):
        x = torch.load(f, map_location="cpu", **KW)
        y = torch.load(os.path.join(b, os.path.basename(f)), map_location="cpu", **KW)
        for k, v in x.items():
            if not k.startswith("param/"):
                continue
            d = (v - y[k]).abs().max().item() / max(v.abs().max().item(), 1e-12)
            worst, n = max(worst, d), n + 1
    assert n > 0, "no parameters compared"
except Exception as e:  # one line for the test log
    print("error: %r" % (e,))
    sys.exit(1)
try:
    torch.load(f, map_location="cpu")
    default = "default torch.load ok"
except Exception as e:
    default = "default torch.load fails: %s" % str(e).splitlines()[0][:200]
print("max relative difference %.2e over %d tensors; %s" % (worst, n, default))
sys.exit(0 if worst <= 1e-4 else 1)
PY
); then pass "offload vs all-resident on the GPU: $out"; else fail "offload vs all-resident on the GPU: $out"; fi
finish
