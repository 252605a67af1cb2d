#!/usr/bin/env bash
# A checkpoint resumes only onto the parameter layout it was written for: the manifest records the
# layout keys (those that shape the parameters and those that change what they compute: lora.alpha,
# the transformer's norm epsilon, ...) and the parameters' names and shapes, and a resume with any
# of those keys changed (enumerated below, one by one) exits 2 naming the key, the saved and the
# requested value, before any step, the checkpoint left as it was. A layout change that no
# recorded key explains (here: the manifest's keys edited to match) is refused naming the first
# parameter that differs. Keys that do not change the layout still resume.
source "$(dirname "$0")/lib.sh"
thetad=$1
small=$HERE/jobs/small.yaml
tfm=$HERE/jobs/transformer.yaml
py=/usr/bin/python3
fingerprint() { (cd "$1" && find . -type f ! -name .lock | sort | xargs md5sum); }

# refused NAME JOB KEY SAVED REQUESTED PATTERN [ARGS...]: saved with KEY=SAVED, resumed with
# KEY=REQUESTED; PATTERN (grep -E) is what the refusal must say. The saves are queued and run
# together (run_queue), then every checkpoint's fingerprint is taken, then the resumes run
# together; the checks after.
REFUSED=()
refused() {
  local name=$1 job=$2 key=$3 saved=$4 asked=$5 pattern=$6; shift 6
  local ck=$WORK/$name.ckpt
  queue "${name}_save" 1 0 "$job" --no-resume --set steps=2 --set checkpoint.dir="$ck" --set "$key=$saved" "$@"
  RESUMES+=("${name}_resume 1 2 $job --set steps=3 --set checkpoint.dir=$ck --set $key=$asked $*")
  REFUSED+=("$name $pattern")
}
RESUMES=()

xc=(--set model.kind=extreme_classifier --set model.classes=64 --set data.noise=0.05)
# The keys that change a layout, each on a model it applies to.
refused shard_on "$small" offload.shard_mb 0 0.001 \
  'offload.shard_mb is 0 in the checkpoint, 0.001 in this job' "${xc[@]}"
refused shard_off "$small" offload.shard_mb 0.001 0 \
  'offload.shard_mb is 0.001 in the checkpoint, 0 in this job' "${xc[@]}"
refused lora_targets "$tfm" lora.targets '[q,v]' '[q,k]' \
  'lora.targets is \[q, v\] in the checkpoint, \[q, k\] in this job'
refused lora_rank "$tfm" lora.rank 2 3 'lora.rank is 2 in the checkpoint, 3 in this job'
# Keys that change the function the same parameters compute.
refused lora_alpha "$tfm" lora.alpha 4 8 'lora.alpha is 4(\.0)? in the checkpoint, 8(\.0)? in this job'
refused norm_eps "$tfm" model.norm_eps 1e-5 1e-6 'model.norm_eps is 1.0e-05 in the checkpoint, 1.0e-06 in this job'
refused d_model "$tfm" model.d_model 16 32 'model.d_model is 16 in the checkpoint, 32 in this job'
refused layers "$tfm" model.layers 2 3 'model.layers is 2 in the checkpoint, 3 in this job'
refused d_ff "$tfm" model.d_ff 32 48 'model.d_ff is 32 in the checkpoint, 48 in this job'
refused vocab "$tfm" model.vocab 24 30 'model.vocab is 24 in the checkpoint, 30 in this job'
refused hidden "$small" model.hidden 32 16 'model.hidden is 32 in the checkpoint, 16 in this job'
refused input_dim "$small" model.input_dim 16 8 'model.input_dim is 16 in the checkpoint, 8 in this job'
refused tasks "$small" model.tasks 4 5 'model.tasks is 4 in the checkpoint, 5 in this job'
refused trunk_layers "$small" model.trunk_layers 2 3 'model.trunk_layers is 2 in the checkpoint, 3 in this job'
refused head_layers "$small" model.head_layers 1 2 'model.head_layers is 1 in the checkpoint, 2 in this job'
refused output_dim "$small" model.output_dim 1 2 'model.output_dim is 1 in the checkpoint, 2 in this job'
refused kind "$small" model.kind multitask_mlp multitask_adapter \
  'model.kind is multitask_mlp in the checkpoint, multitask_adapter in this job'
refused classes "$small" model.classes 64 80 'model.classes is 64 in the checkpoint, 80 in this job' "${xc[@]:0:2}"
run_queue
declare -A before=()
for entry in "${REFUSED[@]}"; do
  name=${entry%% *}
  before[$name]=$(fingerprint "$WORK/$name.ckpt")
done
set -f  # the words hold brackets ([q,k]): no file name expansion
for entry in "${RESUMES[@]}"; do
  # shellcheck disable=SC2086  # a queued run's words, split as queued
  queue $entry
done
set +f
run_queue
for entry in "${REFUSED[@]}"; do
  name=${entry%% *} pattern=${entry#* }
  expect_in "${name}_resume" "$WORK/$name.ckpt/step-00000002/manifest.json: layout: $pattern"
  if grep -q "resumed from\|step 3" "$WORK/${name}_resume.log"; then fail "$name: a step ran"; fi
  [ "$(fingerprint "$WORK/$name.ckpt")" = "${before[$name]}" ] && pass "$name: checkpoint unchanged" || fail "$name: checkpoint changed"
done

# The manifest describes the layout: the keys, group 0 and group 1 by name and shape, a digest.
$py - "$WORK/lora_targets.ckpt/step-00000002/manifest.json" <<'PY' && pass "manifest: layout recorded" || fail "manifest layout"
import json, sys
l = json.load(open(sys.argv[1]))["layout"]
assert l["keys"]["lora.targets"] == "[q, v]" and l["keys"]["model.kind"] == "transformer", l["keys"]
assert len(l["groups"]) == 2 and len(l["digest"]) == 16, l
names = [p["name"] for p in l["groups"][1]]
assert any(".v." in n or "_v" in n or "v." in n for n in names), names
assert all(isinstance(p["shape"], list) for g in l["groups"] for p in g)
PY

# A layout change no recorded key names (the manifest's keys edited to agree with the job): the
# parameters themselves differ, and the refusal names the first one.
ck=$WORK/lora_targets.ckpt
$py - "$ck/step-00000002/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["layout"]["keys"]["lora.targets"] = "[q, k]"
json.dump(m, open(sys.argv[1], "w"))
PY
$py "$HERE/rechecksum.py" "$ck/step-00000002"  # the manifest's own checksum made to match the edit
expect_code 2 unnamed "$thetad" run "$tfm" --set steps=3 --set checkpoint.dir="$ck" --set 'lora.targets=[q,k]'
expect_in unnamed "layout: group [0-9]+ parameter [0-9]+ is '[^']*' \[[0-9, ]*\] in the checkpoint, '[^']*' \[[0-9, ]*\] in this job"

# Keys that do not change the layout resume (exit 0), as before.
expect_code 0 same_layout "$thetad" run "$tfm" --set steps=3 --set checkpoint.dir="$WORK/lora_rank.ckpt" \
  --set lora.rank=2 --set optimizer.lr=0.02 --set log.level=info
expect_in same_layout "resumed from .*step-00000002 at step 2"
finish
