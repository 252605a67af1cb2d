#!/usr/bin/env python3
"""Follows a thetad metrics file while the job runs and sends its records to TensorBoard and/or W&B.

    tools/metrics_bridge.py runs/job/metrics.jsonl --tensorboard runs/job/tb
    tools/metrics_bridge.py runs/job/metrics.jsonl --wandb my-project [--wandb-run NAME]
    tools/metrics_bridge.py runs/job/metrics.jsonl --tensorboard runs/job/tb --once   # a finished file

Step records (`"kind": "train"`, or no kind: files of earlier releases) become scalars at their
step: train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/samples_per_s,
train/step_ms, task_loss/<t>, grad_norm_task/<t>, and every other number of the record under
system/<key>; evaluation records (`"kind": "eval"`) become eval/loss/<t> and eval/loss_mean at
their step. Only rank 0's records are sent unless --all-ranks (each rank's then under rank<r>/).

Following: new lines are read as they are appended (a partial last line waits for its newline);
a file replaced under the same name (a resumed run rewrites it, keeping the records before its
step), or truncated and written again in place, is read again from its start (told by its inode,
a size below what was read, or first bytes that changed), and records already sent (same kind,
step and rank) are not sent twice. A line that is not a thetad record (not JSON, or JSON of
another shape) is skipped with a warning naming the file and line. A fresh run (`--no-resume`)
moves the old file aside: start a new bridge for it. The bridge ends with the file's writer:
after --idle-exit seconds without a new line (default: never), on Ctrl-C, or at once after one
pass with --once.

TensorBoard needs `torch.utils.tensorboard` (PyTorch and the `tensorboard` package) or
`tensorboardX`; W&B needs `wandb`. Without the one asked for: exit 2 with the command that
installs it. A missing file is waited for (exit 2 with --once).
"""
import argparse
import json
import math
import os
import sys
import time


def fail(message):
    print(f"metrics_bridge: {message}", file=sys.stderr)
    sys.exit(2)


MAIN = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens_per_s": "train/tokens_per_s",
        "samples_per_s": "train/samples_per_s", "step_ms": "train/step_ms"}
SKIP = {"step", "rank", "kind", "time"}


def integer(v):
    return isinstance(v, int) and not isinstance(v, bool)


def number(v):
    """Whether v is a finite number that a float holds (an integer past 1e308 is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def shape_error(rec):
    """Why rec is not shaped as thetad writes a record (daemon/observe/metrics.cpp), or None.
    Checked before use: a foreign line must be skipped, not raise in scalars() or in the set of
    keys sent (an unhashable rank)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    if not integer(rec.get("step")):
        return "no integer \"step\""
    if not integer(rec.get("rank", 0)):
        return "a \"rank\" that is not an integer"
    if rec.get("kind", "train") not in ("train", "eval"):
        return "a \"kind\" that is neither \"train\" nor \"eval\""
    if rec.get("kind") == "eval" and not isinstance(rec.get("eval_loss", {}), dict):
        return "an \"eval_loss\" that is not an object"
    for key in ("task_loss", "grad_norm_task"):
        v = rec.get(key, [])
        if not isinstance(v, list) or not all(isinstance(e, dict) and integer(e.get("task")) for e in v):
            return f"a \"{key}\" that is not a list of {{\"task\": integer, ...}}"
    return None


def scalars(rec):
    """The (tag, value) pairs of one record; [] for a record that is not thetad's."""
    out = []
    if rec.get("kind") == "eval":
        losses = [(t, float(v)) for t, v in rec.get("eval_loss", {}).items() if number(v)]
        for t, v in losses:
            out.append((f"eval/loss/{t}", v))
        if losses:
            out.append(("eval/loss_mean", sum(v for _, v in losses) / len(losses)))
        return out
    for key, v in rec.items():
        if key in SKIP:
            continue
        if key in ("task_loss", "grad_norm_task") and isinstance(v, list):
            field = "loss" if key == "task_loss" else "norm"
            out += [(f"{key}/{e['task']}", float(e[field])) for e in v if number(e.get(field))]
        elif number(v):
            out.append((MAIN.get(key, f"system/{key}"), float(v)))
    return out


class Follower:
    """Lines of a file as they are appended; a file replaced or rewritten under its name is read
    again from its start."""

    HEAD = 4096  # the first bytes kept to tell a file truncated and rewritten past the offset

    def __init__(self, path):
        self.path, self.f = path, None

    def restart(self):
        if self.f:
            self.f.close()
        # Bytes, unbuffered: offsets are exact, a UTF-8 character is never split, and no buffer
        # holds bytes of the file from before a rewrite.
        self.f = open(self.path, "rb", buffering=0)
        st = os.fstat(self.f.fileno())
        self.id, self.offset, self.head, self.partial, self.lineno = (st.st_dev, st.st_ino), 0, b"", b"", 0

    def changed(self, st):
        """Whether the file under the name is no longer the one read so far. The open file keeps
        its inode in use, so a new file cannot have it; a truncation is a size below the offset,
        or, where the file grew back past it between two looks, first bytes that differ."""
        if (st.st_dev, st.st_ino) != self.id or st.st_size < self.offset:
            return True
        return os.pread(self.f.fileno(), len(self.head), 0) != self.head

    def lines(self):
        """(line number, line) of the complete lines appended since the last call (after a
        replacement: all of them), blank lines left out."""
        try:
            if self.f is None or self.changed(os.stat(self.path)):
                self.restart()
            self.f.seek(self.offset)
            data = self.f.readall()
        except FileNotFoundError:
            return []  # not written yet, or between a move aside and the new file
        except OSError as e:
            fail(f"{self.path}: cannot read: {e.strerror}")
        if len(self.head) < self.HEAD:  # then the head is every byte read so far
            self.head = (self.head + data)[:self.HEAD]
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")  # the last: a line being written
        out = []
        for raw in complete:
            self.lineno += 1
            if raw.strip():
                out.append((self.lineno, raw.decode("utf-8", errors="replace")))
        return out


class Bridge:
    """Records to writers, each (kind, rank, step) once."""

    def __init__(self, writers, all_ranks):
        self.writers, self.all_ranks, self.sent = writers, all_ranks, set()

    def feed(self, line, where=None):
        """1 where the line is a record sent now; where (FILE:LINE) names it in a warning."""
        try:
            rec = json.loads(line)
            why = shape_error(rec)
        except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
            why = f"not JSON ({getattr(e, 'msg', e)})"
        except RecursionError:
            why = "not JSON (nested too deep)"
        if why:
            print(f"metrics_bridge: {where + ': ' if where else ''}skipping a line that is not a thetad record: "
                  f"{why}: {line[:80]!r}", file=sys.stderr)
            return 0
        rank = rec.get("rank", 0)
        if rank != 0 and not self.all_ranks:
            return 0
        key = (rec.get("kind", "train"), rank, rec["step"])
        if key in self.sent:
            return 0
        self.sent.add(key)
        prefix = f"rank{rank}/" if self.all_ranks else ""
        pairs = [(prefix + tag, v) for tag, v in scalars(rec)]
        for w in self.writers:
            w.write(rec["step"], pairs)
        return 1


class TensorBoard:
    def __init__(self, logdir):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                fail(f"--tensorboard needs `tensorboard` (with PyTorch) or `tensorboardX`, which {sys.executable} "
                     f"cannot import: `{sys.executable} -m pip install tensorboard` (Debian: apt-get install "
                     f"python3-tensorboard where packaged)")
        self.w = SummaryWriter(logdir)

    def write(self, step, pairs):
        for tag, v in pairs:
            self.w.add_scalar(tag, v, step)

    def close(self):
        self.w.flush()
        self.w.close()


class WandB:
    def __init__(self, project, run, config):
        try:
            import wandb
        except ImportError:
            fail(f"--wandb needs `wandb`, which {sys.executable} cannot import: `{sys.executable} -m pip install wandb`")
        self.wandb = wandb
        self.run = wandb.init(project=project, name=run, config=config)

    def write(self, step, pairs):
        self.run.log(dict(pairs), step=step)

    def close(self):
        self.run.finish()


def job_config(path):
    """The job beside the metrics (PATH.job.yaml) as a dict for W&B's config, if readable."""
    try:
        import yaml
        with open(path + ".job.yaml", encoding="utf-8") as f:
            return yaml.safe_load(f)
    except Exception:  # optional: the config is a convenience
        return None


def run(bridge, follower, once, poll_s, idle_exit_s):
    sent, idle_since = 0, time.monotonic()
    while True:
        lines = follower.lines()
        for n, line in lines:
            sent += bridge.feed(line, f"{follower.path}:{n}")
        if once:
            return sent
        if lines:
            idle_since = time.monotonic()
        elif idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
            return sent
        time.sleep(poll_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", help="the job's metrics.path")
    ap.add_argument("--tensorboard", metavar="LOGDIR", help="write TensorBoard event files here")
    ap.add_argument("--wandb", metavar="PROJECT", help="log to this W&B project")
    ap.add_argument("--wandb-run", metavar="NAME", help="the W&B run's name (default: W&B's)")
    ap.add_argument("--once", action="store_true", help="convert the file as it is, then exit")
    ap.add_argument("--all-ranks", action="store_true", help="every rank's records (metrics.all_ranks)")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between looks at the file")
    ap.add_argument("--idle-exit", type=float, default=None, help="exit after this many seconds without a new line")
    a = ap.parse_args()
    if not a.tensorboard and not a.wandb:
        fail("nothing to write to: give --tensorboard LOGDIR and/or --wandb PROJECT")
    if a.once and not os.path.isfile(a.metrics):
        fail(f"{a.metrics}: no such file")
    writers = []
    if a.tensorboard:
        writers.append(TensorBoard(a.tensorboard))
    if a.wandb:
        writers.append(WandB(a.wandb, a.wandb_run, job_config(a.metrics)))
    sent = 0
    try:
        sent = run(Bridge(writers, a.all_ranks), Follower(a.metrics), a.once, a.poll, a.idle_exit)
    except KeyboardInterrupt:
        pass
    finally:
        for w in writers:
            w.close()
    print(f"metrics_bridge: {sent} record(s) sent", file=sys.stderr)


if __name__ == "__main__":
    main()
