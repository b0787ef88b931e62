"""What the GPU check's tables share: a table's shape, the device's set-up, the runs' room and limits. The
tables themselves are :mod:`throughput` (check 6) and :mod:`memory` (checks 5 and 7).

Run through ``gpu_check.py``, which judges the tables' figures (:mod:`judge`): timing against the bound and
torch's schedule on CUDA, memory against the planner's bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

MiB = 2**20
#: Room for this many more in-flight micro-batches than 1F1B's own, for both policies (as the demo runs).
SLACK = 2.0
#: Seconds a rank may wait with nothing ready before the pipeline's watchdog ends the step.
TIMEOUT_S = 60.0
#: Host link bandwidth the planner is told for offload (bytes/s), and a generous one to fall back to when the
#: planner prefers recomputing at the real one (a fast GPU recomputes a small model's layers cheaply).
HOST_BANDWIDTH = 25e9
GENEROUS_HOST_BANDWIDTH = 1e12
#: Budgets that make a plan offload, as fractions of the unconstrained plan's busiest stage, tried in turn.
BUDGET_FRACTIONS = (0.85, 0.7, 0.55)
POLICIES = ("fixed", "ready")


@dataclasses.dataclass(frozen=True)
class Table:
    """A table's cells, its notes, its figures for the JSON file, and whether something in it failed."""

    headers: list[str]
    rows: list[list[str]]
    notes: list[str]
    data: dict[str, Any]
    failed: bool = False
    left: int = 1  # leading text columns


def configure(device: str) -> torch.device:
    """One CPU thread, and full float32 matmuls on CUDA (TF32 would make gradients differ by ~1e-3)."""
    torch.set_num_threads(1)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer read after it covers the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mib(value: float) -> str:
    return f"{value / MiB:.2f}"


class HostStaged(nn.Module):
    """A stage whose boundary tensors live on the host, its module on the device: torch's stage then sends CPU
    tensors over gloo (which moves no CUDA tensors between processes), as hintpipe's gloo transport stages a
    GPU's tensors through host memory. Every boundary tensor moves to the device on the way in and back to the
    host on the way out, but the last stage's."""

    def __init__(self, inner: nn.Module, device: torch.device, last: bool) -> None:
        super().__init__()
        self.inner, self.device, self.last = inner.to(device), device, last

    def forward(self, *values: torch.Tensor) -> Any:
        out = self.inner(*(v.to(self.device) for v in values))
        if self.last:
            return out
        return tuple(t.to("cpu") for t in out) if isinstance(out, tuple) else out.to("cpu")
