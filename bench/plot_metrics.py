#!/usr/bin/env python3
"""Plots a thetad metrics file (JSON lines, one record per step and rank) as PNGs.

    /usr/bin/python3 bench/plot_metrics.py runs/demo/metrics.jsonl [-o OUTDIR]

Writes loss_per_task.png (loss of each task over steps: rank 0's records hold the loss of every
task any rank trained in the step; each task's raw points and a moving average over them; the
number of tasks drawn is noted on stderr), step_time.png (the phases of each step stacked,
averaged over the ranks present) and bytes.png (cumulative bytes allreduced, against what DDP,
which reduces every gradient every step, would have sent: bytes_allreduced + bytes_pruned + bytes_kept)
where the file has evaluation records (eval.dir: `"kind": "eval"`), eval_loss_per_task.png (each
evaluated task's held-out loss at each evaluation, its lowest point marked). Needs matplotlib (Debian: python3-matplotlib; without it, exit 2 saying so).

The phases are disjoint (docs/configuration.md, `metrics`): forward, backward (autograd and the
hooks, buckets launched as they fill), comm_wait (waiting for the last buckets after backward),
optimizer, and "other" = step_ms less their sum (data, schedule, the loss check, the stop
agreement, checkpoints). Their stack is the step line; a record whose phases exceed its step_ms
(GPU device times against host wall time) is drawn scaled down to it and counted in a note.
Bad input (a missing or unreadable file, no records) is exit 2 with a one-line message.
"""
import argparse
import json
import math
import os
import sys
from collections import defaultdict


def fail(message):
    print(f"plot_metrics: {message}", file=sys.stderr)
    sys.exit(2)


try:
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes and CI
    import matplotlib.pyplot as plt
except ImportError as e:
    fail(f"needs matplotlib ({e}): on Debian or Ubuntu `apt-get install python3-matplotlib`, "
         f"elsewhere `{os.path.basename(sys.executable) or 'python3'} -m pip install matplotlib`")


def read_records(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"{path}: cannot read the metrics file: {e.strerror}")
    last = max((i for i, l in enumerate(lines) if l.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            # A run killed mid-write leaves a partial last line; anything else is an error.
            if i == last:
                print(f"{path}:{i + 1}: ignoring a truncated last line", file=sys.stderr)
                continue
            fail(f"{path}:{i + 1}: not JSON: {e}")
        if not isinstance(records[-1], dict) or "step" not in records[-1]:
            fail(f"{path}:{i + 1}: not a thetad metrics record (no step)")
    if not records:
        fail(f"{path}: no metrics records")
    return records


def num(v):
    """null (NaN/Inf in the writer) and missing values become NaN, so lines show a gap."""
    return float(v) if isinstance(v, (int, float)) else math.nan


def per_step_mean(records, key):
    acc = defaultdict(list)
    for r in records:
        acc[r["step"]].append(num(r.get(key)))
    steps = sorted(acc)
    return steps, [sum(acc[s]) / len(acc[s]) for s in steps]


def moving_average(values, window):
    """The mean of each value and its neighbours (window wide, shorter at the ends); NaN points
    are left out of the means, and a window with no finite value stays NaN."""
    half = window // 2
    out = []
    for i in range(len(values)):
        finite = [v for v in values[max(0, i - half):i + half + 1] if not math.isnan(v)]
        out.append(sum(finite) / len(finite) if finite else math.nan)
    return out


def plot_loss(records, out):
    per_task = defaultdict(dict)  # task -> step -> [losses]
    for r in records:
        for tl in r.get("task_loss") or []:
            per_task[tl["task"]].setdefault(r["step"], []).append(num(tl["loss"]))
    fig, ax = plt.subplots(figsize=(9, 5))
    for i, task in enumerate(sorted(per_task)):
        pts = sorted(per_task[task].items())
        steps = [s for s, _ in pts]
        losses = [sum(v) / len(v) for _, v in pts]
        color = f"C{i % 10}"
        # Each step's loss is one batch's: noisy. The raw points stay, faint; the line is their
        # moving average over about a tenth of the task's points, which shows the trend.
        ax.plot(steps, losses, linestyle="none", marker=".", markersize=2, alpha=0.3, color=color)
        ax.plot(steps, moving_average(losses, max(1, len(losses) // 10)), linewidth=1.5,
                color=color, label=f"task {task}")
    if not per_task:  # no per-task losses recorded: fall back to the mean loss
        steps, loss = per_step_mean(records, "loss")
        ax.plot(steps, loss, label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Loss per task")
    finite = [v for r in records for v in [num(r.get("loss"))] if not math.isnan(v)]
    if finite and min(finite) > 0:  # losses span decades; log only where it can show them all
        ax.set_yscale("log")
    if not finite:  # a run whose every loss is NaN/Inf (null) would be an empty or one-point plot
        note = f"no finite loss in {len(records)} records: every loss is NaN or Inf (see train.on_nonfinite)"
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", wrap=True)
        print(f"plot_metrics: note: {note}", file=sys.stderr)
    return save_per_task(fig, ax, per_task, out, "loss_per_task.png")


def save_per_task(fig, ax, per_task, out, name):
    """A plot of one line per task: the legend where it is readable, the grid, the file. Returns the tasks."""
    if len(per_task) <= 20:
        ax.legend(fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=120)
    plt.close(fig)
    return sorted(per_task)


def plot_eval(evals, out):
    """Each task's eval loss over the evaluations, its best (lowest) point marked. Returns the tasks."""
    per_task = defaultdict(list)  # task -> [(step, loss)]
    for r in evals:
        for task, loss in (r.get("eval_loss") or {}).items():
            per_task[int(task)].append((r["step"], num(loss)))
    if not per_task:
        return []
    fig, ax = plt.subplots(figsize=(9, 5))
    for i, task in enumerate(sorted(per_task)):
        pts = sorted(per_task[task])
        color = f"C{i % 10}"
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", linewidth=1.2, color=color, label=f"task {task}")
        finite = [(v, s) for s, v in pts if not math.isnan(v)]
        if finite:
            v, s = min(finite)
            ax.plot([s], [v], marker="*", markersize=9, color=color)
    ax.set_xlabel("step")
    ax.set_ylabel("eval loss")
    ax.set_title("Held-out loss per task (* = lowest)")
    return save_per_task(fig, ax, per_task, out, "eval_loss_per_task.png")


def plot_step_time(records, out):
    parts = ["forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms"]
    steps, total = per_step_mean(records, "step_ms")
    series = [[0.0 if math.isnan(v) else v for v in per_step_mean(records, p)[1]] for p in parts]
    other, over = [], 0
    for i, step_ms in enumerate(total):
        step_ms = 0.0 if math.isnan(step_ms) else step_ms
        used = sum(s[i] for s in series)
        if used > step_ms > 0:  # never stack above the step: scale this record's phases to it
            over += 1
            for s in series:
                s[i] *= step_ms / used
            used = step_ms
        other.append(max(step_ms - used, 0.0))
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.stackplot(steps, *series, other, labels=[p[:-3] for p in parts] + ["other"], alpha=0.85)
    ax.plot(steps, total, color="black", linewidth=0.8, label="step")
    if over:
        note = f"{over} of {len(steps)} steps: phases above step_ms, scaled down to it"
        ax.text(0.01, 0.99, note, transform=ax.transAxes, va="top", fontsize="small")
        print(f"plot_metrics: note: {note}", file=sys.stderr)
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title("Step time breakdown")
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "step_time.png"), dpi=120)
    plt.close(fig)


def plot_bytes(records, out):
    steps, sent = per_step_mean(records, "bytes_allreduced")
    _, pruned = per_step_mean(records, "bytes_pruned")
    _, kept = per_step_mean(records, "bytes_kept")  # absent in older files: NaN, counted as 0

    def cumulative(xs):
        total, out_ = 0.0, []
        for x in xs:
            total += 0.0 if math.isnan(x) else x
            out_.append(total / 2**20)
        return out_

    # DDP reduces every gradient every step: what thetad sent, what it pruned (no rank used the
    # group) and what it kept (one rank alone trained the group: comm.sole_user keep).
    zero = lambda x: 0.0 if math.isnan(x) else x
    ddp = cumulative([a + zero(b) + zero(c) for a, b, c in zip(sent, pruned, kept)])
    sent_and_kept = cumulative([a + zero(c) for a, c in zip(sent, kept)])
    sent = cumulative(sent)
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(steps, ddp, color="C1", label="DDP would send (every gradient, every step)")
    ax.plot(steps, sent, color="C0", label="thetad sent (allreduced)")
    if sent_and_kept[-1] > sent[-1]:
        ax.fill_between(steps, sent, sent_and_kept, color="C2", alpha=0.15,
                        label="kept by the one rank that trained it: not sent")
    ax.fill_between(steps, sent_and_kept, ddp, color="C1", alpha=0.15, label="pruned (no rank used it): not sent")
    ax.set_xlabel("step")
    ax.set_ylabel("MiB (cumulative, per rank)")
    ratio = sent[-1] / ddp[-1] if ddp and ddp[-1] > 0 else None
    title = "Bytes allreduced: thetad against DDP"
    if ratio is not None:
        title += f" (thetad sent {ratio:.2f}x)"
    ax.set_title(title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bytes.png"), dpi=120)
    plt.close(fig)
    return ratio


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("metrics", help="metrics JSON-lines file written by thetad")
    p.add_argument("-o", "--outdir", default=None, help="output directory (default: next to the metrics file)")
    args = p.parse_args(argv)
    out = args.outdir or os.path.dirname(os.path.abspath(args.metrics))
    os.makedirs(out, exist_ok=True)
    records = read_records(args.metrics)
    # Evaluation records (a kind of their own) are drawn apart; records without kind are steps.
    evals = [r for r in records if r.get("kind") == "eval"]
    records = [r for r in records if r.get("kind", "train") == "train"]
    if not records:
        fail(f"{args.metrics}: no step records")
    names = ["loss_per_task.png", "step_time.png", "bytes.png"]
    evaluated = plot_eval(evals, out)
    if evaluated:
        names.append("eval_loss_per_task.png")
        print(f"plot_metrics: eval_loss_per_task.png: {len(evaluated)} task(s) over {len(evals)} evaluation(s)",
              file=sys.stderr)
    tasks = plot_loss(records, out)
    if tasks:  # rank 0's records hold every rank's tasks (all_ranks files: that rank's own)
        print(f"plot_metrics: loss_per_task.png: {len(tasks)} task(s), {tasks[0]}..{tasks[-1]}", file=sys.stderr)
    plot_step_time(records, out)
    ratio = plot_bytes(records, out)
    if ratio is not None:
        print(f"plot_metrics: bytes.png: thetad sent {ratio:.2f}x the bytes DDP would have sent", file=sys.stderr)
    for name in names:
        print(os.path.join(out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
