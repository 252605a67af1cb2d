#!/usr/bin/env python3
"""PyTorch FSDP2 peer of thetad's streamed trunk: the multitask MLP of ddp_multitask.py
with every trunk layer and the root wrapped in `fully_shard`, parameters, gradients and the AdamW
step on the CPU (`CPUOffloadPolicy(pin_memory=True)`), or, with --offload none, FSDP2 on the
device; --activations save_on_cpu puts forward's saved tensors in pinned host memory
(`torch.autograd.graph.save_on_cpu(pin_memory=True)`), the peer of `offload.activations: true`.

    mpirun -np 1 python3 bench/peer/fsdp2_offload.py --trunk-layers 8 --hidden 4096 --batch 256 --out r.json

Same sizes, data and initialization as ddp_multitask.py (whose helpers it uses); --tasks defaults
to 1 (the trunk is what is compared; FSDP2 gives unused heads no gradient). Rank 0 writes --out
(JSON): step_ms_median/p90/mean (steps after --warmup), peak_mem_bytes (device), losses, error, oom.
Needs PyTorch >= 2.6 (fully_shard in torch.distributed.fsdp); older versions report an error.
"""
import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_multitask import MultitaskMlp, SyntheticData, launch_env, record_failure, report, summarize_steps, task_of  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("input-dim", 4096), ("hidden", 4096), ("output-dim", 4096), ("trunk-layers", 8),
                          ("head-layers", 2), ("tasks", 1), ("batch", 256), ("steps", 20), ("warmup", 5),
                          ("seed", 1234), ("init-seed", -1), ("master-port", 29571)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--noise", type=float, default=0.01)
    p.add_argument("--init", choices=["exact", "fast"], default="fast")
    p.add_argument("--offload", choices=["cpu", "none"], default="cpu")
    p.add_argument("--activations", choices=["device", "save_on_cpu"], default="device")
    p.add_argument("--precision", choices=["fp32", "tf32"], default="fp32")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    rank, world, local = launch_env(a)
    cuda = a.device == "cuda"
    result = {"peer": "pytorch-fsdp2", "torch": torch.__version__, "rank": rank, "world": world,
              "config": {k: v for k, v in vars(a).items() if k != "out"}, "error": None, "oom": False,
              "losses": [], "step_ms": [], "steps_done": 0, "peak_mem_bytes": None}
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        if cuda:
            torch.cuda.set_device(local % torch.cuda.device_count())
            torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        dist.init_process_group(a.backend, rank=rank, world_size=world)
        # Built on the device (fast init), then sharded; with CPU offload fully_shard moves the
        # shards to pinned host memory, so only the layers in use come back to the device.
        model = MultitaskMlp(a, device)
        data = SyntheticData(a, device)
        policy = {"offload_policy": CPUOffloadPolicy(pin_memory=True)} if a.offload == "cpu" else {}
        for layer in model.trunk:
            fully_shard(layer, **policy)
        fully_shard(model, **policy)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
        result["params"] = sum(p.numel() for p in model.parameters())
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        saved = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)) if a.activations == "save_on_cpu" \
            else contextlib.nullcontext
        for s in range(a.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            task = task_of(s, rank, world, a.tasks)
            x, y = data.batch(s, rank, task, a.batch)
            with saved():
                loss = F.mse_loss(model(x, task).float(), y)
            loss.backward()
            opt.step()
            lv = loss.item()
            if cuda:
                torch.cuda.synchronize()
            result["step_ms"].append((time.perf_counter() - t0) * 1e3)
            result["losses"].append(lv)
            result["steps_done"] = s + 1
        summarize_steps(result, a.warmup)
    except BaseException as e:  # noqa: BLE001 (reported, then the process ends)
        record_failure(result, e)
    if cuda and torch.cuda.is_available():
        result["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    report("fsdp2_offload", a.out, rank, result, ("rank", "steps_done", "step_ms_median", "peak_mem_bytes", "params", "error"))
    if result["error"]:
        os._exit(1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
