#!/usr/bin/env python3
"""One-GPU peer of thetad's Llama with per-task LoRA adapters: what a PyTorch user
writes with Hugging Face `transformers` and `peft` on one GPU. A LlamaForCausalLM built from a
LlamaConfig of the same shape as the thetad job (random weights, SDPA attention, untied output
layer), held in bf16 and frozen; one named peft LoRA adapter per task ("t0", "t1", ...; the same
r, lora_alpha and target modules, dropout 0, B zero at the start as thetad's); trained under
torch.autocast(bf16) (thetad's precision: bf16), AdamW fused over every adapter's parameters with
zero_grad(set_to_none=True) (parameters without a gradient are skipped, state created lazily).

A step: the round_robin tasks of the step (--tasks-per-rank of --tasks), each task's rows through
the model with its own adapter active, the mean of their next-token cross-entropies, one
backward, one optimizer step (bench/peer/ddp_lora_transformer.py's step_loss and data walks, as
thetad's job runs them). The adapter is switched by setting the active adapter of each LoRA layer
(--switch direct, what set_adapter does without re-marking every adapter's requires_grad, which
would cost ~14k calls per switch at 64 tasks); --switch set_adapter uses peft's API as documented,
re-enabling every adapter's gradients afterwards. Timing, memory and the JSON: plain_loop.py's.

    python3 bench/peer/peft_llama.py --device cuda --layers 16 --d-model 2048 --heads 16 --kv-heads 4 \\
        --d-ff 5632 --vocab 32000 --seq-len 512 --tasks 64 --tasks-per-rank 2 --batch 8 --rank 16 \\
        --alpha 32 --targets q,k,v,o,gate,up,down --precision bf16 --steps 140 --out r.json
"""
import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_lora_transformer as lora  # noqa: E402

HF_TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
              "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def parse_llama_args(argv, doc, add=None, check=None):
    """The options of a one-GPU Llama peer (bench/gpu/plain.sh's llama shapes give them):
    add(parser) adds a peer's own, check(args) returns what is wrong with them (or None)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    for name, default in (("layers", 2), ("d-model", 64), ("heads", 4), ("kv-heads", 0), ("d-ff", 256),
                          ("vocab", 256), ("seq-len", 32), ("tasks", 4), ("rank", 8), ("tasks-per-rank", 1),
                          ("batch", 16), ("steps", 40), ("warmup", 5), ("seed", 1)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="q,v", help="comma-separated, of " + ",".join(HF_TARGETS))
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--noise", type=float, default=0.01)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--precision", choices=["bf16"], default="bf16", help="the base in bf16, autocast bf16")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default="")
    if add:
        add(p)
    a = p.parse_args(argv)
    a.targets = [t for t in a.targets.split(",") if t]
    a.kv_heads = a.kv_heads or a.heads
    if not a.targets or any(t not in HF_TARGETS for t in a.targets) or a.d_model % a.heads or a.heads % a.kv_heads:
        p.error("--targets must be of %s; --heads must divide --d-model, --kv-heads --heads" % ",".join(HF_TARGETS))
    problem = check(a) if check else None
    if problem:
        p.error(problem)
    a.frozen_base = True
    return a


def parse_args(argv):
    return parse_llama_args(argv, __doc__, lambda p: p.add_argument(
        "--switch", choices=["direct", "set_adapter"], default="direct"))


def build_base(a, device):
    """LlamaForCausalLM of the job's shape, built in bf16 where it runs, frozen."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.d_ff,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.seq_len, rms_norm_eps=a.norm_eps, rope_theta=a.rope_theta,
                      tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(a.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # no fp32 copy of the base, ever
    try:
        with device if hasattr(device, "__enter__") else contextlib.nullcontext():
            base = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    base = base.to(device=device, dtype=torch.bfloat16)
    base.requires_grad_(False)
    return base


def add_adapters(a, base):
    """One named adapter per task; returns (peft model, LoRA layers, trained parameters)."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    cfg = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, bias="none",
                     target_modules=[HF_TARGETS[t] for t in a.targets])
    model = get_peft_model(base, cfg, adapter_name="t0")
    for t in range(1, a.tasks):
        model.add_adapter("t%d" % t, cfg)
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    trained = []
    for n, p in model.named_parameters():
        if "lora_" in n:
            p.data = p.data.float()  # adapters in float32, as peft's autocast_adapter_dtype makes them
            p.requires_grad_(True)
            trained.append(p)
    return model, layers, trained


def setup(a, device):
    """(step function, model, trained parameters, AdamW arguments): plain_loop.py's contract."""
    model, layers, trained = add_adapters(a, build_base(a, device))
    model.train()

    def activate(task):
        name = "t%d" % task
        if a.switch == "set_adapter":
            model.set_adapter(name)
            for p in trained:  # set_adapter marks only the active adapter trainable
                p.requires_grad_(True)
            return
        for m in layers:
            m._active_adapter = name

    def forward(batches):
        outs = []
        for task, x in batches:
            activate(task)
            outs.append(model(input_ids=x, use_cache=False).logits)
        return outs
    return lora.lora_step(forward, a, device), model, trained, dict(lr=a.lr, weight_decay=0.0)


if __name__ == "__main__":
    sys.exit("run it through bench/peer/plain_loop.py --model peft-llama (bench/gpu/llama_peft.sh)")
