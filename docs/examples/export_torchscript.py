#!/usr/bin/env python3
"""Exports a multi-task model as TorchScript for thetad's `model.kind: torchscript`.

thetad calls `forward(x, task)` with a float32 batch of one task's rows and the task index
(0-based), and assigns parameters to groups by name: `shared: ["trunk.*"]` for Θ and
`task: "heads.{t}.*"` for θ[t].

    /usr/bin/python3 docs/examples/export_torchscript.py runs/export/model.pt --input-dim 16 --tasks 4
"""
import argparse
import os

import torch
from torch import nn


class MultiTask(nn.Module):
    def __init__(self, input_dim: int, hidden: int, tasks: int, output_dim: int):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(input_dim, hidden), nn.GELU(),
                                   nn.Linear(hidden, hidden), nn.GELU())
        self.heads = nn.ModuleList([nn.Linear(hidden, output_dim) for _ in range(tasks)])

    def forward(self, x: torch.Tensor, task: int) -> torch.Tensor:
        h = self.trunk(x)
        out = torch.zeros(x.shape[0], 0)
        for i, head in enumerate(self.heads):  # TorchScript unrolls loops over a ModuleList
            if i == task:
                out = head(h)
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--input-dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--output-dim", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    model = torch.jit.script(MultiTask(a.input_dim, a.hidden, a.tasks, a.output_dim))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    model.save(a.out)
    print(f"wrote {a.out}: parameters", [n for n, _ in model.named_parameters()])


if __name__ == "__main__":
    main()
