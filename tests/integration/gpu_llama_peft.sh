#!/usr/bin/env bash
# Proof against the real libraries, one line per family (ctest label gpu; exit 77 = skipped: no
# GPU, or no transformers/peft/safetensors in python3). For each of llama (2), llama3
# (rope_scaling llama3, tied), mistral (head_dim wider than hidden_size / heads), qwen2 (q/k/v
# biases, tied) and qwen3 (q/k head norms, head_dim of its own), a tiny random model built by
# transformers and saved with save_pretrained (safetensors), its norms and biases moved off their
# initial values so that they matter:
#  1. thetad's step-0 logits (GPU and CPU) equal AutoModelForCausalLM's within 1e-5 relative in
#     fp32, and within 1e-2 with precision: bf16 (autocast on both sides; or no further from the
#     float32 logits than 1.5 x transformers' bf16 ones: the two round differently);
#  2. thetad trains two tasks' adapters on the frozen base (NCCL, one GPU) and exports task 0's
#     adapter (qwen3: in bf16) and merged model: PeftModel.from_pretrained on the adapter gives the
#     logits thetad gives with it (lora.init_from) within 1e-5 (fp32) and 1e-2 (bf16), and
#     AutoModelForCausalLM.from_pretrained on the merged directory within 1e-5 (bf16 weights: 3e-2);
#  3. llama with model.base_quant: nf4: the adapter trained on the 4-bit base (bf16, the GPU's
#     dequantization kernel) on the full base with peft gives thetad's logits within 1e-5, and the
#     nf4 base's logits on the GPU equal the CPU's within 1e-5.
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
families="llama llama3 mistral qwen2 qwen3"

# The bases, built and saved by transformers (a family this transformers lacks is said so: SKIP).
$py - "$WORK" $families <<'PY' || die "building the bases with transformers"
import os, sys, numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
work, families = sys.argv[1], sys.argv[2:]
def config_class(name):
    return getattr(transformers, name, None) or (lambda **kw: None)
LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config = map(config_class, ["LlamaConfig", "MistralConfig", "Qwen2Config",
                                                                          "Qwen3Config"])
common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=128, max_position_embeddings=64, rms_norm_eps=1e-6)
configs = {
    "llama": lambda: LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False),
    "llama3": lambda: LlamaConfig(**dict(common, max_position_embeddings=16384), rope_theta=500000.0,
                                  tie_word_embeddings=True, head_dim=16,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "mistral": lambda: MistralConfig(**common, head_dim=32, rope_theta=1000000.0, sliding_window=4096,
                                     tie_word_embeddings=False),
    "qwen2": lambda: Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
    "qwen3": lambda: Qwen3Config(**common, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=False,
                                 attention_bias=False, use_sliding_window=False),
}
for fam in families:
    os.makedirs(os.path.join(work, fam), exist_ok=True)
    config = configs[fam]()
    if config is None:
        open(os.path.join(work, fam, "unavailable"), "w").write(f"transformers {transformers.__version__} lacks it")
        continue
    torch.manual_seed(35)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norms away from 1, biases away from 0: their weights matter
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(os.path.join(work, fam, "base"))  # safetensors: transformers' default
    np.save(os.path.join(work, fam, "tokens.npy"), torch.randint(128, (3, 16)).numpy().astype(np.int64))
PY

for fam in $families; do
  d=$WORK/$fam
  [ -e "$d/unavailable" ] && continue
  dtype=fp32; [ "$fam" = qwen3 ] && dtype=bf16
  expect_code 0 "${fam}_train" mpirun "${MPIRUN_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 -np 1 "$thetad" run "$job" --no-resume \
    --set comm.backend=nccl --set model.init_from="$d/base" --set export.adapters_dir="$d/adapters/{task}" \
    --set export.merged_dir="$d/merged/{task}" --set 'export.merged_tasks=[0]' --set export.dtype=$dtype \
    --set checkpoint.dir="$d/train.ckpt" --set steps=20 --set log.level=info
  # Task 1 has no adapter directory (the base: B = 0), task 0 its exported one.
  mkdir -p "$d/only" && cp -r "$d/adapters/0" "$d/only/0"
  for run in "cuda fp32" "cuda bf16" "cpu fp32"; do
    set -- $run
    expect_code 0 "${fam}_logits_$1_$2" "$logits_bin" "$job" --set model.init_from="$d/base" --set precision=$2 \
      --set lora.init_from="$d/only/{task}" --tokens "$d/tokens.npy" --device "$1" \
      --task 1 --out "$d/base_$1_$2.npy" --task 0 --out "$d/tuned_$1_$2.npy"
  done
done

# model.base_quant: nf4 on llama: adapters trained on the 4-bit base (bf16 compute, the GPU's
# kernel) are PEFT adapters of the full base; the GPU's and the CPU's nf4 base give one function.
d=$WORK/llama
if [ ! -e "$d/unavailable" ]; then
  expect_code 0 nf4_train mpirun "${MPIRUN_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 -np 1 "$thetad" run "$job" --no-resume \
    --set comm.backend=nccl --set model.init_from="$d/base" --set model.base_quant=nf4 --set precision=bf16 \
    --set export.adapters_dir="$d/nf4_adapters/{task}" --set checkpoint.dir="$d/nf4.ckpt" --set steps=20 --set log.level=info
  expect_in nf4_train "frozen base in nf4"
  mkdir -p "$d/nf4_only" && cp -r "$d/nf4_adapters/0" "$d/nf4_only/0"
  expect_code 0 nf4_tuned "$logits_bin" "$job" --set model.init_from="$d/base" --set lora.init_from="$d/nf4_only/{task}" \
    --tokens "$d/tokens.npy" --device cuda --task 0 --out "$d/nf4_tuned_cuda_fp32.npy"
  for dev in cuda cpu; do
    expect_code 0 "nf4_base_$dev" "$logits_bin" "$job" --set model.init_from="$d/base" --set model.base_quant=nf4 \
      --tokens "$d/tokens.npy" --device $dev --task 1 --out "$d/nf4_base_$dev.npy"
  done
fi

# The Hugging Face side of every family, and one line per family.
$py - "$WORK" $families > "$WORK/compare.log" 2>&1 <<'PY' || { fail "transformers/peft side"; cat "$WORK/compare.log"; }
import os, sys, numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
from peft import PeftModel
work, families = sys.argv[1], sys.argv[2:]
fp32 = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}

def hf(path, tokens, precision, adapter=None):
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **fp32).cuda().eval()
    if adapter:
        model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
        return model(input_ids=torch.from_numpy(np.load(tokens)).cuda()).logits.float().cpu().numpy()

def family(fam):
    d = os.path.join(work, fam)
    tokens = os.path.join(d, "tokens.npy")
    ours = lambda name: np.load(os.path.join(d, name + ".npy"))
    merged_tol = 3e-2 if fam == "qwen3" else 1e-5  # qwen3's merged weights are bf16
    adapter = os.path.join(d, "adapters", "0")
    base_fp32, tuned_fp32 = hf(os.path.join(d, "base"), tokens, "fp32"), hf(os.path.join(d, "base"), tokens, "fp32", adapter)
    # bf16 checks carry the float32 logits too: two bf16 computations differ by their roundings
    # (transformers rounds the head norms' output to bf16, thetad keeps float32), so thetad's
    # bf16 logits pass where they are within 1e-2 of transformers' bf16 ones, or no further from
    # the float32 function than 1.5 x transformers' own bf16 logits are.
    checks = [
        ("step 0 GPU", ours("base_cuda_fp32"), base_fp32, 1e-5, None),
        ("step 0 CPU", ours("base_cpu_fp32"), base_fp32, 1e-5, None),
        ("step 0 bf16", ours("base_cuda_bf16"), hf(os.path.join(d, "base"), tokens, "bf16"), 1e-2, base_fp32),
        ("PEFT", ours("tuned_cuda_fp32"), tuned_fp32, 1e-5, None),
        ("PEFT bf16", ours("tuned_cuda_bf16"), hf(os.path.join(d, "base"), tokens, "bf16", adapter), 1e-2, tuned_fp32),
        ("merged", ours("tuned_cuda_fp32"), hf(os.path.join(d, "merged", "0"), tokens, "fp32"), merged_tol, None),
    ]
    moved = float(np.abs(ours("tuned_cuda_fp32") - ours("base_cuda_fp32")).max())
    parts, good = [], moved > 1e-3
    rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max()) if a.shape == b.shape else float("inf")
    for what, a, b, tol, exact in checks:
        r = rel(a, b)
        ok = r <= tol
        note = ""
        if not ok and exact is not None:
            mine, theirs = rel(a, exact), rel(b, exact)
            ok = mine <= 1.5 * theirs
            note = f" (from float32: thetad {mine:.1e}, transformers {theirs:.1e})"
        good = good and ok
        parts.append(f"{what} {r:.1e}{note}{'' if ok else ' > ' + str(tol)}")
    return ("ok   " if good else "FAIL ") + f"{fam}: " + ", ".join(parts) + f"; the adapter moved the logits by {moved:.1e}"

def nf4(d):
    """The adapter trained on the nf4 base, on the full base with peft; the nf4 base on GPU and CPU."""
    tokens, ours = os.path.join(d, "tokens.npy"), lambda name: np.load(os.path.join(d, name + ".npy"))
    rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())
    peft_r = rel(ours("nf4_tuned_cuda_fp32"), hf(os.path.join(d, "base"), tokens, "fp32", os.path.join(d, "nf4_adapters", "0")))
    cpu_r = rel(ours("nf4_base_cuda"), ours("nf4_base_cpu"))
    full_r = rel(ours("nf4_base_cuda"), ours("base_cuda_fp32"))
    good = peft_r <= 1e-5 and cpu_r <= 1e-5 and 1e-4 < full_r < 0.5
    return ("ok   " if good else "FAIL ") + (f"llama nf4: its adapter on the full base with peft {peft_r:.1e}, the nf4 base's logits "
                                            f"GPU against CPU {cpu_r:.1e}, against the full base's {full_r:.1e}")

for fam in families:
    if os.path.exists(os.path.join(work, fam, "unavailable")):
        print(f"SKIP {fam}: " + open(os.path.join(work, fam, "unavailable")).read(), flush=True)
        continue
    try:
        print(family(fam), flush=True)
    except Exception as e:  # the other families still report
        print(f"FAIL {fam}: {type(e).__name__}: {e}", flush=True)
if "llama" in families and not os.path.exists(os.path.join(work, "llama", "unavailable")):
    try:
        print(nf4(os.path.join(work, "llama")), flush=True)
    except Exception as e:
        print(f"FAIL llama nf4: {type(e).__name__}: {e}", flush=True)
PY
while IFS= read -r line; do
  case $line in
    "ok   "*) pass "${line#ok   }" ;;
    "FAIL "*) fail "${line#FAIL }" ;;
    "SKIP "*) echo "$line" ;;
  esac
done < "$WORK/compare.log"
grep -qE '^(ok   |FAIL )' "$WORK/compare.log" || fail "no family was compared"
finish
