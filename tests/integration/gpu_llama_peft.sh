#!/usr/bin/env bash
# Proof against the real libraries (ctest label gpu, exit 77 = skipped: no GPU, or no
# transformers/peft/safetensors in python3). A small Llama built by transformers and saved with
# save_pretrained (safetensors):
#  1. thetad's step-0 logits (on the GPU and on the CPU) equal LlamaForCausalLM's within 1e-5
#     relative in fp32, and within 1e-2 with precision: bf16 (autocast on both sides);
#  2. thetad trains two tasks' adapters on the frozen base (NCCL, one GPU), exports them, and
#     PeftModel.from_pretrained on each gives the logits thetad gives with those adapters
#     (lora.init_from) within 1e-5 (fp32) and 1e-2 (bf16).
#   gpu_llama_peft.sh THETAD THETAD_LOGITS
source "$(dirname "$0")/lib.sh"
thetad=$1
logits_bin=$2
py=${THETAD_PYTHON:-python3}
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo "SKIP: no GPU visible"; exit 77; fi
if ! $py -c 'import transformers, peft, safetensors, torch' 2>/dev/null; then
  echo "SKIP: $py lacks transformers, peft or safetensors"; exit 77
fi
job=$HERE/jobs/llama.yaml
base=$WORK/base
$py - "$base" "$WORK/tokens.npy" <<'PY' || fail "building the Llama with transformers"
import sys, numpy as np, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(35)
cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=128, max_position_embeddings=64, rope_theta=10000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=False)
model = LlamaForCausalLM(cfg)
with torch.no_grad():  # norms away from 1, so that their weights matter
    for n, p in model.named_parameters():
        if "norm" in n: p.add_(0.1 * torch.randn_like(p))
model.save_pretrained(sys.argv[1], safe_serialization=True)
np.save(sys.argv[2], torch.randint(128, (3, 16)).numpy().astype(np.int64))
PY
# The Hugging Face side: logits of the base, or of the base with a PEFT adapter, fp32 or bf16.
hf_logits() {  # out.npy precision [adapter_dir]
  $py - "$base" "$WORK/tokens.npy" "$@" <<'PY'
import sys, numpy as np, torch
from transformers import LlamaForCausalLM
base, tokens, out, precision = sys.argv[1:5]
model = LlamaForCausalLM.from_pretrained(base, torch_dtype=torch.float32, attn_implementation="eager").cuda().eval()
if len(sys.argv) > 5:
    from peft import PeftModel
    model = PeftModel.from_pretrained(model, sys.argv[5]).eval()
x = torch.from_numpy(np.load(tokens)).cuda()
with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
    y = model(input_ids=x).logits
np.save(out, y.float().cpu().numpy())
PY
}
close() {  # what a b tol
  $py - "$WORK/$2.npy" "$WORK/$3.npy" "$4" > "$WORK/cmp.log" 2>&1 <<'PY' && pass "$1: $(cat "$WORK/cmp.log")" || { fail "$1"; cat "$WORK/cmp.log"; }
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.shape == b.shape, (a.shape, b.shape)
rel = float(np.abs(a - b).max() / np.abs(b).max())
print(f"max |a - b| / max |b| = {rel:.2e} (tolerance {sys.argv[3]})")
assert rel <= float(sys.argv[3])
PY
}
logits() {  # name device task sets...
  local name=$1 device=$2 task=$3; shift 3
  expect_code 0 "$name" "$logits_bin" "$job" --set model.init_from="$base" --tokens "$WORK/tokens.npy" \
    --task "$task" --device "$device" --out "$WORK/$name.npy" "$@"
}

hf_logits "$WORK/hf_fp32.npy" fp32 || fail "transformers logits"
hf_logits "$WORK/hf_bf16.npy" bf16 || fail "transformers logits (bf16)"
logits base_cuda cuda 0
logits base_cpu cpu 0
logits base_bf16 cuda 0 --set precision=bf16
close "step 0, GPU: thetad == transformers (fp32)" base_cuda hf_fp32 1e-5
close "step 0, CPU: thetad == transformers (fp32)" base_cpu hf_fp32 1e-5
close "step 0, GPU: thetad == transformers (bf16)" base_bf16 hf_bf16 1e-2

expect_code 0 train mpirun "${MPIRUN_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 -np 1 "$thetad" run "$job" --no-resume \
  --set comm.backend=nccl --set model.init_from="$base" --set export.adapters_dir="$WORK/adapters/{task}" \
  --set checkpoint.dir="$WORK/train.ckpt" --set steps=20 --set log.level=info
for t in 0 1; do
  hf_logits "$WORK/peft$t.npy" fp32 "$WORK/adapters/$t" || fail "peft logits"
  hf_logits "$WORK/peft${t}_bf16.npy" bf16 "$WORK/adapters/$t" || fail "peft logits (bf16)"
  logits "tuned$t" cuda $t --set lora.init_from="$WORK/adapters/{task}"
  logits "tuned${t}_bf16" cuda $t --set lora.init_from="$WORK/adapters/{task}" --set precision=bf16
  close "task $t: PeftModel.from_pretrained == thetad (fp32)" "tuned$t" "peft$t" 1e-5
  close "task $t: PeftModel.from_pretrained == thetad (bf16)" "tuned${t}_bf16" "peft${t}_bf16" 1e-2
done
$py - "$WORK/tuned0.npy" "$WORK/base_cuda.npy" <<'PY' && pass "the adapters moved the logits" || fail "adapters did nothing"
import numpy as np, sys
assert np.abs(np.load(sys.argv[1]) - np.load(sys.argv[2])).max() > 1e-3
PY
finish
