"""Which device a rank computes on, and moving a step's data there.

A rank's device is its GPU where it has one (``cuda:LOCAL_RANK`` under
torchrun, or the spawn index, modulo the GPUs present: several ranks may share
one), else the CPU. The choice is made once, before the pipeline allocates
anything, and ``torch.cuda.set_device`` makes it the rank's current device, so
that collectives and any tensor created without a device land there too.
Stage modules are moved there, the first stage's inputs and the last stage's
targets follow, and the transport delivers received tensors there.

The stream and event helpers live here too, below both the planner (offload
copies) and the runtime (transfers, task timing), so that neither reaches into
the other for them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from hintpipe.options import DeviceChoice


def rank_device(choice: str | DeviceChoice | torch.device | None = None, rank: int = 0) -> torch.device:
    """The device of the rank with (spawn or torchrun) index ``rank``; sets it current on CUDA.

    Args:
        choice: ``auto``, ``cpu``, ``cuda`` (the rank's GPU), or an explicit
            ``torch.device``; ``None``: ``cpu``.
        rank: the rank's index, used where ``LOCAL_RANK`` is not set.

    Raises:
        ValueError: for an unknown choice, or ``cuda`` on a machine without CUDA.
    """
    if isinstance(choice, torch.device):
        device = choice
    else:
        which = DeviceChoice.parse(choice) if choice is not None else DeviceChoice.CPU
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        if which is DeviceChoice.CUDA and not cuda:
            raise ValueError("device cuda was asked for, but torch.cuda.is_available() is False on this machine")
        if which is DeviceChoice.CPU or not cuda:
            return torch.device("cpu")
        local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        device = torch.device("cuda", local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


class Clock(Protocol):
    """Seconds on a clock that counts the device's work: what profiling reads before and after a node."""

    def now(self) -> float:
        """Seconds, read once every piece of work queued so far has finished."""


class HostClock:
    """The host's clock: on a CPU the work runs in the calling thread, so it is done when a call returns."""

    def now(self) -> float:
        return time.perf_counter()


class DeviceClock:
    """The host's clock read after the device finished its queued work: a GPU's calls return once their
    kernels are queued, so timing them without waiting measures the launches, not the work.

    Args:
        synchronize: waits for the device's queued work (``torch.cuda.synchronize`` of the device).
    """

    def __init__(self, synchronize: Callable[[], None]) -> None:
        self.synchronize = synchronize

    def now(self) -> float:
        self.synchronize()
        return time.perf_counter()


def clock_for(device: torch.device) -> Clock:
    """The clock that times work on ``device``: the host's on a CPU, synchronised with the GPU on CUDA."""
    if device.type == "cuda":
        return DeviceClock(lambda: torch.cuda.synchronize(device))
    return HostClock()


def own_gpu() -> bool:
    """Whether every rank on this node has a GPU to itself (``LOCAL_WORLD_SIZE``, set by torchrun and by the
    spawning launcher, at most the GPUs present)."""
    if not torch.cuda.is_available():
        return False
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return local_world <= torch.cuda.device_count()


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak of the allocator's memory on ``device`` (a GPU's; nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int:
    """The most bytes the allocator held on ``device`` since :func:`reset_peak_memory`; -1 on the CPU, which
    keeps no such count."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else -1


def allocated_probe(device: torch.device) -> Callable[[], int] | None:
    """Bytes the allocator holds on ``device`` now, as a function (``torch.cuda.memory_allocated``); None on
    the CPU."""
    if device.type != "cuda":
        return None
    return lambda: int(torch.cuda.memory_allocated(device))


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (nested in tuples, lists and dicts) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def use_when_ready(tensors: list[torch.Tensor | None], ready: torch.cuda.Event | None) -> None:
    """Make the current stream wait for ``tensors``' transfer (``ready``) before it uses them, and tell the
    allocator that the current stream uses them (they were allocated on the transfer stream)."""
    if ready is None:
        return
    stream = torch.cuda.current_stream()
    stream.wait_event(ready)
    for t in tensors:
        if t is not None:
            t.record_stream(stream)


def new_stream(device: torch.device) -> torch.cuda.Stream:
    """A CUDA stream of its own on ``device`` (for transfers)."""
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def new_event(*, timing: bool = False) -> torch.cuda.Event:
    """A CUDA event (to mark a transfer's end; with ``timing``, to time a task)."""
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
