#!/usr/bin/env python3
"""PyTorch DDP peer of thetad's `multitask_mlp`: what users run today.

The same model as daemon/models/models.cpp MultitaskMlp: a trunk of `trunk_layers` Linear+GELU layers
(input_dim->hidden, then hidden->hidden), one head per task of `head_layers` Linear layers
(hidden->hidden with GELU between, the last hidden->output_dim), parameters U(-1/sqrt(in),
1/sqrt(in)) drawn from per-parameter CPU generators seeded exactly as thetad seeds them
(mix_seed(seed, group, index_in_group)), so with --init exact the initial parameters are
bitwise thetad's. The data is thetad's synthetic teacher (same seeds, same CPU generation on
every step, same sizes); the schedule is round_robin with one task per rank (rank r trains task
(s*W + r) mod T at step s); the loss is the task head's MSE weighted by rows/batch (= 1).
DDP runs with find_unused_parameters=True (what users must use here), AdamW in fp32.

Launch with torchrun or mpirun (rank/size/local rank from RANK/WORLD_SIZE/LOCAL_RANK or else
OMPI_COMM_WORLD_*), e.g.
    mpirun -np 2 python3 bench/peer/ddp_multitask.py --device cuda --backend nccl --out r.json
Rank 0 writes --out (JSON): step_ms_median, step_ms_p90, bytes_allreduced_per_step (DDP reduces
every bucket every step: 4 x all parameters), peak_mem_bytes (torch.cuda.max_memory_allocated),
losses, oom, error, ... A rank that fails (out of memory included) writes OUT.rank<r>.json and
exits non-zero at once, so that the launcher ends the others (they would wait in a collective).
Python stdlib + torch only; works with torch 1.13 and 2.x.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MASK64 = (1 << 64) - 1
TEACHER_SALT = 0x7EAC4E2  # daemon/models/models.cpp SyntheticData


def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix_seed(a, b, c=0, d=0):
    """daemon/models/models.cpp mix_seed (uint64 arithmetic)."""
    return splitmix(splitmix(splitmix(splitmix(a & MASK64) ^ (b & MASK64)) ^ (c & MASK64)) ^ (d & MASK64))


def cpu_generator(seed):
    g = torch.Generator()
    g.manual_seed(seed & MASK64)
    return g


def oom_types():
    t = getattr(torch.cuda, "OutOfMemoryError", None)
    return (t,) if t is not None else ()


def is_oom(e):
    if oom_types() and isinstance(e, oom_types()):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


class Linear(nn.Module):
    """torch::addmm(b, x, w.t()), as thetad's Linear."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight.t())


class ParamFactory:
    """thetad's ParamBuilder: U(-1/sqrt(in), 1/sqrt(in)), seed mix_seed(seed, group, index)."""

    def __init__(self, seed, device, init):
        self.seed = seed
        self.device = device
        self.init = init
        self.counts = {}
        self.fast_gen = None
        if init == "fast":
            self.fast_gen = torch.Generator(device=device)
            self.fast_gen.manual_seed(seed & ((1 << 63) - 1))

    def tensor(self, group, sizes, bound):
        index = self.counts.get(group, 0)
        self.counts[group] = index + 1
        if self.init == "exact":
            t = torch.empty(sizes, dtype=torch.float32)
            t.uniform_(-bound, bound, generator=cpu_generator(mix_seed(self.seed, group, index)))
            return t.to(self.device)
        # Same distribution, drawn on the device (the large-T sweep, where drawing billions of
        # values on the CPU would only cost time; those runs compare speed and memory only).
        t = torch.empty(sizes, dtype=torch.float32, device=self.device)
        t.uniform_(-bound, bound, generator=self.fast_gen)
        return t

    def linear(self, group, d_in, d_out):
        bound = 1.0 / math.sqrt(float(d_in))
        w = self.tensor(group, [d_out, d_in], bound)
        b = self.tensor(group, [d_out], bound)
        return Linear(w, b)


class MultitaskMlp(nn.Module):
    def __init__(self, a, device):
        super().__init__()
        pf = ParamFactory(a.seed if a.init_seed < 0 else a.init_seed, device, a.init)
        self.trunk = nn.ModuleList()
        dim = a.input_dim
        for _ in range(a.trunk_layers):
            self.trunk.append(pf.linear(0, dim, a.hidden))
            dim = a.hidden
        self.heads = nn.ModuleList()
        for t in range(a.tasks):
            head = nn.ModuleList()
            d = dim
            for i in range(a.head_layers):
                out = a.output_dim if i + 1 == a.head_layers else a.hidden
                head.append(pf.linear(t + 1, d, out))
                d = out
            self.heads.append(head)

    def forward(self, x, task):
        h = x
        for layer in self.trunk:
            h = F.gelu(layer(h))
        head = self.heads[task]
        for i, layer in enumerate(head):
            h = layer(h)
            if i + 1 < len(head):
                h = F.gelu(h)
        return h


class SyntheticData:
    """thetad's synthetic teacher: y = tanh(2 x A_t) B_t + noise, all drawn on the CPU."""

    def __init__(self, a, device):
        self.seed, self.in_dim, self.out_dim, self.noise, self.device = (
            a.seed, a.input_dim, a.output_dim, a.noise, device)
        k = 16
        self.teachers = []
        for t in range(a.tasks):
            g = cpu_generator(mix_seed(self.seed, TEACHER_SALT, t))
            ta = torch.randn(self.in_dim, k, generator=g, dtype=torch.float32) / math.sqrt(float(self.in_dim))
            tb = torch.randn(k, self.out_dim, generator=g, dtype=torch.float32) / math.sqrt(float(k))
            self.teachers.append((ta.to(device), tb.to(device)))

    def batch(self, step, rank, task, rows):
        # As thetad's SyntheticData: drawn where the model runs (a CUDA generator on GPUs, the
        # CPU generator otherwise), from the same per-(step, rank, task) seed.
        seed = mix_seed(self.seed, step, rank, task + 1)
        if torch.device(self.device).type == "cuda":
            g = torch.Generator(device=self.device)
            g.manual_seed(seed & MASK64)
        else:
            g = cpu_generator(seed)
        x = torch.randn(rows, self.in_dim, generator=g, dtype=torch.float32, device=self.device)
        ta, tb = self.teachers[task]
        y = torch.matmul(torch.tanh(torch.matmul(x, ta) * 2.0), tb)
        if self.noise > 0:
            y = y + self.noise * torch.randn(rows, self.out_dim, generator=g, dtype=torch.float32,
                                             device=self.device)
        return x, y


def task_of(step, rank, world, tasks):
    """round_robin with one task per rank (daemon/plan/schedule.cpp)."""
    return (step * world + rank) % tasks


def task_loss(module, x, y, task, a, device):
    """One task's weighted MSE (rows / batch_per_rank = 1 here) under --precision's autocast."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        out = module(x, task)
        # The loss in float32, as thetad computes it (autocast keeps mse_loss in fp32 too).
        return F.mse_loss(out.float(), y) * (float(x.shape[0]) / float(a.batch))


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(math.ceil(q / 100.0 * len(s))) - 1))
    return s[k]


def summarize_steps(result, warmup):
    """Step-time statistics over the steps after the warm-up (all of them in a shorter run)."""
    timed = result["step_ms"][warmup:] or result["step_ms"]
    result.update(step_ms_median=statistics.median(timed), step_ms_p90=percentile(timed, 90),
                  step_ms_mean=statistics.mean(timed))


def record_failure(result, e):
    """A peer's failure in its result: the error, whether it was an out-of-memory, the traceback."""
    result["oom"] = is_oom(e)
    result["error"] = "%s: %s" % (type(e).__name__, str(e).strip()[:400])
    result["traceback"] = traceback.format_exc()[-4000:]


def report(name, out, rank, result, keys):
    """Rank 0 (or a failed rank, to OUT.rank<r>.json) writes the result and prints a summary line."""
    if rank == 0 or result["error"]:
        write_json(out if rank == 0 else (out + ".rank%d.json" % rank if out else ""), result)
        print(name + ": " + json.dumps({k: result.get(k) for k in keys}), flush=True)


def launch_env(a):
    """Rank, world size and local rank from torchrun's variables or else from OpenMPI's."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", "0"))
    elif "OMPI_COMM_WORLD_RANK" in env:
        rank, world = int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"])
        local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    elif "PMI_RANK" in env:
        rank, world = int(env["PMI_RANK"]), int(env["PMI_SIZE"])
        local = int(env.get("MPI_LOCALRANKID", "0"))
    else:
        rank, world, local = 0, 1, 0
    env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = str(rank), str(world), str(local)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(a.master_port))
    if a.backend == "gloo" and env["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return rank, world, local


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input-dim", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--trunk-layers", type=int, default=8)
    p.add_argument("--head-layers", type=int, default=2)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--output-dim", type=int, default=4096)
    p.add_argument("--batch", type=int, default=256, help="rows per rank per step (batch_per_rank)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the step-time statistics")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.999])
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234, help="the job's seed (data, and init unless --init-seed)")
    p.add_argument("--init-seed", type=int, default=-1)
    p.add_argument("--noise", type=float, default=0.01)
    p.add_argument("--init", choices=["exact", "fast"], default="exact",
                   help="exact: thetad's values (CPU generators); fast: same distribution on the device")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--grad-as-bucket-view", action="store_true",
                   help="DDP gradient_as_bucket_view=True (off by default, as in DDP)")
    p.add_argument("--average", choices=["world", "contributors"], default="world",
                   help="world: DDP's divide-by-world (default); contributors: rescale each task "
                        "head's reduced gradient to the mean over the ranks that trained it "
                        "(thetad's default), for loss comparisons")
    p.add_argument("--average-world", dest="average", action="store_const", const="world",
                   help="same as --average world")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32",
                   help="bf16: torch.autocast(bfloat16) around forward and loss; fp32 parameters and AdamW")
    p.add_argument("--compress-hook", choices=["none", "bf16"], default="none",
                   help="bf16: DDP's bf16_compress_hook (buckets reduced in bfloat16, half the bytes)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--master-port", type=int, default=29511)
    p.add_argument("--pg-timeout-s", type=float, default=300.0)
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="> 0: stop stepping (all ranks agree) once this long has passed since start")
    p.add_argument("--out", default="", help="rank 0's JSON result (failures: OUT.rank<r>.json)")
    a = p.parse_args(argv)
    if a.tasks < 1 or a.trunk_layers < 0 or a.head_layers < 1 or a.batch < 1 or a.steps < 1:
        p.error("tasks, head_layers, batch and steps must be >= 1, trunk_layers >= 0")
    return a


def write_json(path, obj):
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None):
    a = parse_args(argv)
    t_start = time.perf_counter()
    rank, world, local = launch_env(a)
    cuda = a.device == "cuda"
    result = {
        "peer": "pytorch-ddp", "torch": torch.__version__, "rank": rank, "world": world,
        "device": a.device, "backend": a.backend, "find_unused_parameters": True,
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "oom": False, "error": None, "steps_done": 0, "losses": [], "tasks": [],
        "step_ms": [], "step_ms_median": None, "step_ms_p90": None, "step_ms_mean": None,
        "data_ms_median": None, "peak_mem_bytes": None, "peak_reserved_bytes": None,
        "phase": "start",
    }
    if cuda:
        if not torch.cuda.is_available():
            result["error"] = "--device cuda but torch sees no CUDA device"
            write_json(a.out if rank == 0 else a.out + ".rank%d.json" % rank if a.out else "", result)
            print("ddp_multitask: " + result["error"], file=sys.stderr)
            return 2
        torch.cuda.set_device(local % torch.cuda.device_count())
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
        result["gpu"] = torch.cuda.get_device_name()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    # Parameter counts, known before anything is allocated.
    d_trunk_in = a.input_dim
    shared = 0
    for _ in range(a.trunk_layers):
        shared += d_trunk_in * a.hidden + a.hidden
        d_trunk_in = a.hidden
    per_task = 0
    d = d_trunk_in
    for i in range(a.head_layers):
        out = a.output_dim if i + 1 == a.head_layers else a.hidden
        per_task += d * out + out
        d = out
    total = shared + a.tasks * per_task
    n_tensors = 2 * (a.trunk_layers + a.tasks * a.head_layers)
    result.update({
        "shared_params": shared, "task_params_each": per_task, "total_params": total,
        # DDP allreduces every bucket every step (unused parameters' slots as zeros), plus the
        # int32 used-parameter map of find_unused_parameters.
        "bytes_allreduced_per_step": (2 if a.compress_hook == "bf16" else 4) * total,
        "bytes_used_map_per_step": 4 * n_tensors,
    })

    pg_ready = False
    try:
        result["phase"] = "init_process_group"
        dist.init_process_group(a.backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=a.pg_timeout_s))
        pg_ready = True
        result["phase"] = "model"
        t0 = time.perf_counter()
        model = MultitaskMlp(a, device)
        data = SyntheticData(a, device)
        result["phase"] = "ddp"
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None,
            find_unused_parameters=True, bucket_cap_mb=a.bucket_cap_mb,
            gradient_as_bucket_view=a.grad_as_bucket_view)
        if a.compress_hook == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, betas=tuple(a.betas), eps=a.eps,
                                weight_decay=a.weight_decay)
        if cuda:
            torch.cuda.synchronize()
        result["init_s"] = time.perf_counter() - t0
        result["phase"] = "train"
        rows = a.batch
        stop_flag = torch.zeros(1, dtype=torch.int32, device=device)
        data_ms = []
        fail_at = os.environ.get("DDP_MULTITASK_FAIL_AT", "")  # testing hook: "RANK:STEP:oom|error"
        for s in range(a.steps):
            task = task_of(s, rank, world, a.tasks)
            if fail_at and fail_at.split(":")[:2] == [str(rank), str(s)]:
                if fail_at.endswith(":oom") and oom_types():
                    raise oom_types()[0]("CUDA out of memory (simulated by DDP_MULTITASK_FAIL_AT)")
                raise RuntimeError("failure simulated by DDP_MULTITASK_FAIL_AT")
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            x, y = data.batch(s, rank, task, rows)
            td = time.perf_counter()
            loss = task_loss(ddp, x, y, task, a, device)
            loss.backward()
            if a.average == "contributors":
                # DDP divided every sum by W; a task head's mean over its contributors is W/c of it.
                counts = {}
                for r in range(world):
                    t = task_of(s, r, world, a.tasks)
                    counts[t] = counts.get(t, 0) + 1
                with torch.no_grad():
                    for t, c in counts.items():
                        if c != world:
                            for p in model.heads[t].parameters():
                                if p.grad is not None:
                                    p.grad.mul_(float(world) / float(c))
            opt.step()
            lv = loss.item()
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            result["step_ms"].append((t1 - t0) * 1e3)
            data_ms.append((td - t0) * 1e3)
            result["losses"].append(lv)
            result["tasks"].append(task)
            result["steps_done"] = s + 1
            if a.max_seconds > 0 and (s + 1) % 5 == 0 and s + 1 < a.steps:
                stop_flag.fill_(1 if time.perf_counter() - t_start > a.max_seconds else 0)
                dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
                if int(stop_flag.item()):
                    result["stopped_early"] = "max-seconds %.0f reached after %d steps" % (a.max_seconds, s + 1)
                    break
        timed = result["step_ms"][a.warmup:] if len(result["step_ms"]) > a.warmup else result["step_ms"][1:]
        if timed:
            result["step_ms_median"] = statistics.median(timed)
            result["step_ms_p90"] = percentile(timed, 90)
            result["step_ms_mean"] = statistics.mean(timed)
            result["data_ms_median"] = statistics.median(data_ms[len(data_ms) - len(timed):])
        result["phase"] = "done"
    except BaseException as e:  # noqa: BLE001 (reported, then the process ends)
        result["oom"] = is_oom(e)
        result["error"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:400] if str(e).strip() else "")
        if not result["oom"]:
            result["traceback"] = traceback.format_exc()[-4000:]
    if cuda:
        result["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    result["elapsed_s"] = time.perf_counter() - t_start
    failed = result["error"] is not None
    path = a.out if (rank == 0 or not a.out) else ""
    if failed and a.out:
        path = a.out + ".rank%d.json" % rank
        if rank == 0:
            write_json(a.out, result)
    write_json(path, result)
    if rank == 0 or failed:
        summary = {k: result.get(k) for k in ("rank", "steps_done", "step_ms_median", "step_ms_p90",
                                               "peak_mem_bytes", "bytes_allreduced_per_step", "oom", "error")}
        print("ddp_multitask: " + json.dumps(summary), flush=True)
    if failed:
        sys.stdout.flush()
        sys.stderr.flush()
        # The other ranks may wait in a collective for this one: end now, the launcher ends them.
        os._exit(3 if result["oom"] else 1)
    if pg_ready:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
