"""A rank's device memory over a step (:mod:`hintpipe.runtime.loop.device_memory`): what its forwards left on the
allocator over the bytes counted for them, and nothing measured where there is no allocator."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from hintpipe.runtime.loop.device_memory import DeviceMemory
from hintpipe.runtime.loop.executor import StageExecutor
from hintpipe.runtime.loop.hooks import Hook, StepHook


def _executor() -> StageExecutor:
    return StageExecutor({0: nn.Linear(2, 2)}, 0, nn.functional.mse_loss, False)


def test_the_forwards_allocations_over_their_counted_bytes_are_one_ratio_for_the_step() -> None:
    executor = _executor()
    memory = DeviceMemory(torch.device("cpu"), executor)
    executor.memory_check = [(1000, 1500), (3000, 2500)]  # counted, allocated
    assert memory.allocated_over_counted() == 1.0
    executor.memory_check = [(1000, 1500)]
    assert memory.allocated_over_counted() == 1.5


def test_nothing_measured_is_nan_not_a_ratio() -> None:
    executor = _executor()
    assert math.isnan(DeviceMemory(torch.device("cpu"), executor).allocated_over_counted())  # no forward checked
    executor.memory_check = [(0, 100)]
    assert math.isnan(DeviceMemory(torch.device("cpu"), executor).allocated_over_counted())  # nothing counted
    wrapped = cast(Any, SimpleNamespace(memory_check=[(1000, 1500)]))  # an executor that keeps no check
    assert math.isnan(DeviceMemory(torch.device("cpu"), wrapped).allocated_over_counted())


def test_on_a_cpu_a_step_reports_no_device_figures() -> None:
    memory: StepHook = DeviceMemory(torch.device("cpu"), _executor())
    assert isinstance(memory, Hook)  # a step hook: the verbs it does not need do nothing
    state = cast(Any, SimpleNamespace(measured={"loss": 1.0}))
    memory.begin_step(state)
    memory.stage_done(0)
    memory.end_step(state)
    assert state.measured == {"loss": 1.0}
