#!/usr/bin/env python3
"""One-GPU peer: the plain loop a careful PyTorch user writes on one GPU, no DDP and
no process group: eager forward/backward, optimizer.zero_grad(set_to_none=True), AdamW fused
where available (torch >= 2 on CUDA; else foreach), which creates Adam state lazily and skips
parameters without a gradient. --model multitask is ddp_multitask.py's model, init, data,
round_robin schedule and loss (thetad's multitask_mlp); --model lora is ddp_lora_transformer.py's
(--frozen-base, --precision bf16 = autocast); --model peft-llama is peft_llama.py's (Hugging Face
transformers' Llama in bf16, frozen, a peft LoRA adapter per task); --model compiled-llama is
compiled_llama.py's (the same Llama and adapters written by hand: SDPA attention, the decoder layer
under torch.compile on CUDA, eager on the CPU and on torch 1.x). Every other option is that
peer's own (same names, same defaults), parsed by it; the DDP-only ones (--backend,
--bucket-cap-mb, ...) are ignored.

    python3 bench/peer/plain_loop.py --model multitask --tasks 24 --steps 130 --out r.json
    python3 bench/peer/plain_loop.py --model lora --frozen-base --precision bf16 --tasks 48 ...
    python3 bench/peer/plain_loop.py --model compiled-llama --layers 16 --d-model 2048 --heads 16 ...
    python3 bench/peer/plain_loop.py --check      # a few CPU steps of each (not peft-llama) on tiny shapes

Step time: the host waits for the device only at the edges of windows of --window steps after
--warmup (losses stay on the device until the end), so a window's wall time / steps is the
throughput; --timing cuda-events adds device time between CUDA events at the same edges.
--out (JSON): step_ms_windows and step_ms_median/min/max over them (device_step_ms_* with
events), peak_mem_bytes (torch.cuda.max_memory_allocated), peak_reserved_bytes, losses, tasks,
optimizer (fused/foreach/default), error, oom.
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_lora_transformer as lora  # noqa: E402
import ddp_multitask as mt  # noqa: E402
from peer_common import WindowClock, make_adamw, memory_fields, window_summary  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Other options: those of ddp_multitask.py / ddp_lora_transformer.py.")
    p.add_argument("--model", choices=["multitask", "lora", "peft-llama", "compiled-llama"])
    p.add_argument("--window", type=int, default=20, help="steps per timing window")
    p.add_argument("--timing", choices=["host", "cuda-events"], default="host")
    p.add_argument("--no-fused", action="store_true", help="AdamW foreach instead of fused")
    p.add_argument("--check", action="store_true", help="self-test on the CPU, then exit")
    own, rest = p.parse_known_args(argv)
    if not own.check and not own.model:
        p.error("--model is required (or --check)")
    if own.window < 1:
        p.error("--window must be >= 1")
    return own, rest


def multitask_setup(a, device):
    """(step function, model, trained parameters, AdamW arguments) of the multitask MLP."""
    model = mt.MultitaskMlp(a, device)
    data = mt.SyntheticData(a, device)

    def step(s, opt):
        task = mt.task_of(s, 0, 1, a.tasks)
        opt.zero_grad(set_to_none=True)
        x, y = data.batch(s, 0, task, a.batch)
        loss = mt.task_loss(model, x, y, task, a, device)
        loss.backward()
        opt.step()
        return loss, [task]
    kw = dict(lr=a.lr, betas=tuple(a.betas), eps=a.eps, weight_decay=a.weight_decay)
    return step, model, list(model.parameters()), kw


def lora_setup(a, device):
    model, trained = lora.build_model(a, device)
    return lora.lora_step(model, a, device), model, trained, dict(lr=a.lr)


def model_of(name):
    """(the module whose parse_args reads the model's options, its setup function)."""
    if name == "multitask":
        return mt, multitask_setup
    if name == "lora":
        return lora, lora_setup
    if name == "compiled-llama":
        import compiled_llama
        return compiled_llama, compiled_llama.setup
    import peft_llama  # transformers and peft: only where they are used
    return peft_llama, peft_llama.setup


def train(own, a, result):
    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
        result["gpu"] = torch.cuda.get_device_name()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    t0 = time.perf_counter()
    step, model, trained, kw = model_of(own.model)[1](a, device)
    opt, result["optimizer"] = make_adamw(trained, device, fused=not own.no_fused, **kw)
    result["total_params"] = sum(p.numel() for p in model.parameters())
    result["trained_params"] = sum(p.numel() for p in trained)
    if cuda:
        torch.cuda.synchronize()
        result["mem_after_build_bytes"] = torch.cuda.memory_allocated()
    result["init_s"] = time.perf_counter() - t0
    clock = WindowClock(cuda, own.timing == "cuda-events")
    losses, start, t_run = [], None, time.perf_counter()
    for s in range(a.steps):
        if start is None and s >= a.warmup and s + own.window <= a.steps and (s - a.warmup) % own.window == 0:
            start = s
            clock.start()
        loss, tasks = step(s, opt)
        losses.append(loss.detach())
        result["tasks"].append(tasks if len(tasks) > 1 else tasks[0])
        if start is not None and s + 1 - start == own.window:
            clock.stop(own.window)
            start = None
    result["losses"] = [float(v) for v in torch.stack(losses).cpu().tolist()]  # waits for the device
    result["step_ms_all_mean"] = (time.perf_counter() - t_run) * 1e3 / a.steps
    result["steps_done"] = a.steps
    result["step_ms_windows"] = clock.host
    result.update(window_summary(clock.host))
    if clock.events:
        result["device_step_ms_windows"] = clock.device
        result.update(window_summary(clock.device, "device_step_ms"))


def run(own, rest):
    a = model_of(own.model)[0].parse_args(rest)
    result = {"peer": "pytorch-plain-" + own.model, "model": own.model, "torch": torch.__version__, "device": a.device,
              "window": own.window, "timing": own.timing,
              "config": {k: v for k, v in vars(a).items() if k != "out"},
              "error": None, "oom": False, "steps_done": 0, "losses": [], "tasks": []}
    try:
        train(own, a, result)
    except BaseException as e:  # noqa: BLE001 (reported in the JSON, then a non-zero exit)
        mt.record_failure(result, e)
    result.update(memory_fields(a.device == "cuda"))
    mt.report("plain_loop", a.out, 0, result, ("model", "optimizer", "steps_done", "step_ms_median", "step_ms_min",
                                               "step_ms_max", "peak_mem_bytes", "peak_reserved_bytes", "error"))
    return result


CHECK_ARGS = {
    "multitask": "--input-dim 16 --hidden 32 --output-dim 8 --trunk-layers 2 --tasks 1 --batch 16 --lr 1e-2",
    "lora": "--layers 1 --d-model 32 --heads 2 --d-ff 64 --vocab 32 --seq-len 16 --tasks 2 --tasks-per-rank 2 "
            "--batch 8 --frozen-base --lr 3e-2 --noise 0",
    "compiled-llama": "--layers 2 --d-model 32 --heads 4 --kv-heads 2 --d-ff 64 --vocab 32 --seq-len 16 "
                      "--tasks 3 --tasks-per-rank 2 --batch 8 --rank 4 --alpha 8 --targets q,k,v,o,gate,up,down "
                      "--lr 3e-2 --noise 0",
}


def check():
    """A few CPU steps of each model on a tiny shape: finite losses that go down."""
    ok = True
    for model, args in CHECK_ARGS.items():
        own, rest = parse_args(["--model", model, "--window", "2"] + args.split() +
                               ["--device", "cpu", "--steps", "8", "--warmup", "2"])
        r = run(own, rest)
        ls = r["losses"]
        good = (r["error"] is None and len(ls) == 8 and all(math.isfinite(v) for v in ls)
                and sum(ls[-2:]) < sum(ls[:2]) and len(r["step_ms_windows"]) == 3)
        print("plain_loop --check %s: %s (losses %s)" % (model, "ok" if good else "FAILED",
                                                        ", ".join("%.4f" % v for v in ls)), flush=True)
        ok = ok and good
    return 0 if ok else 1


def main(argv=None):
    own, rest = parse_args(sys.argv[1:] if argv is None else argv)
    if own.check:
        return check()
    return 1 if run(own, rest)["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
