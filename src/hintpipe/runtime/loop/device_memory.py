"""A GPU rank's memory over a step: the allocator's peak, and what forwards left beyond the bytes counted.

On a CPU there is no allocator to read: the hook measures nothing, and the
report's fields stay -1 and NaN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from hintpipe.device import peak_memory, reset_peak_memory
from hintpipe.runtime.loop.executor import Executor, StageExecutor
from hintpipe.runtime.loop.hooks import Hook

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState


class DeviceMemory(Hook):
    """Resets the device's peak at the start of a step and reads it, with the forwards' memory check, at
    the end (a step hook).

    Args:
        device: the rank's device.
        compute: the rank's executor before any wrapper (a :class:`StageExecutor` keeps the memory check).
    """

    def __init__(self, device: torch.device, compute: Executor) -> None:
        self.device = device
        self.compute = compute

    def begin_step(self, state: StepState) -> None:
        reset_peak_memory(self.device)

    def end_step(self, state: StepState) -> None:
        if self.device.type != "cuda":
            return
        state.measured["device_peak"] = peak_memory(self.device)
        state.measured["allocated_over_counted"] = self.allocated_over_counted()

    def allocated_over_counted(self) -> float:
        """What this step's forwards left allocated on the device over the bytes the runtime counted for them
        (see :attr:`~hintpipe.runtime.loop.reports.StepReport.allocated_over_counted`); NaN where nothing was
        measured."""
        if not isinstance(self.compute, StageExecutor) or not self.compute.memory_check:
            return math.nan
        counted = sum(c for c, _ in self.compute.memory_check)
        return sum(a for _, a in self.compute.memory_check) / counted if counted else math.nan
