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

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from hintpipe.device_choice import DeviceChoice


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
        if which is DeviceChoice.CPU:  # not a single CUDA call: a CPU rank makes no CUDA context
            return torch.device("cpu")
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        if which is DeviceChoice.CUDA and not cuda:
            raise ValueError("device cuda was asked for, but torch.cuda.is_available() is False on this machine")
        if not cuda:  # auto on a machine without CUDA
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


class ThreadClock:
    """The calling thread's CPU time: what a CPU computing in this thread alone spent, whoever else shares its
    cores (see [Note: a CPU's clock])."""

    def now(self) -> float:
        return time.thread_time()


def clock_for(device: torch.device) -> Clock:
    """The clock that times work on ``device``: synchronised with the GPU on CUDA; on a CPU computing in one
    thread, that thread's CPU time, else the host's clock.

    [Note: a CPU's clock]
    With one intra-op thread (``torch.set_num_threads(1)``, as each CPU rank runs) a CPU op runs in the
    calling thread, forward and backward, so the thread's CPU time is the op's work, and the time the
    scheduler gave other processes is not in it. The wall clock was: on a 2-core machine beside three busy
    processes, nodes timed at many times their cost drew the planner's cuts around themselves, and a small
    GPT-2 planned into 3 stages left one stage without parameters in 8 plans of 15 (one thread, the wall
    clock), in 0 of 15 with this clock. With more threads the op's work is spread over threads the calling
    one does not account for, so the wall clock remains.
    """
    if device.type == "cuda":
        return DeviceClock(lambda: torch.cuda.synchronize(device))
    return ThreadClock() if torch.get_num_threads() == 1 else HostClock()


def gpu_identity(device: torch.device) -> str:
    """The GPU a rank computes on, as every rank can compare it: its host's name and the device's UUID
    (two ranks with different ``CUDA_VISIBLE_DEVICES`` may both call theirs ``cuda:0``); "" on a CPU."""
    if device.type != "cuda":
        return ""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", index)
    return f"{socket.gethostname()}/{uuid}"


def own_gpu(identities: Sequence[str]) -> bool:
    """Whether every rank has a GPU to itself, from every rank's :func:`gpu_identity` (gathered from all).

    [Note: who shares a GPU]
    NCCL refuses two ranks of one communicator on one device ("Duplicate GPU"), so the default group's
    NCCL half and the ``nccl`` transport need each rank on a GPU of its own. Counting ranks per node
    (``LOCAL_WORLD_SIZE``) against the GPUs present trusts a variable that launchers other than torchrun
    do not set, and a rank that sees one GPU (``CUDA_VISIBLE_DEVICES``) cannot tell alone. Every rank
    names its GPU (host and UUID); they share one exactly when two names are equal.
    """
    return bool(identities) and all(identities) and len(set(identities)) == len(identities)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak of the allocator's memory on ``device`` (a GPU's; nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int:
    """The most bytes the allocator held on ``device`` since :func:`reset_peak_memory`; -1 on the CPU, which
    keeps no such count."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else -1


#: The CUDA caching allocator's granularity: it hands out (and ``memory_allocated`` counts) blocks of a
#: multiple of this many bytes.
ALLOCATION_GRANULE = 512


class ReceivedBytes:
    """Device bytes the receiving threads allocated (received tensors), so that a reading of the allocator
    taken by the computing thread can leave them out.

    [Note: what a forward left allocated]
    The step loop compares the bytes it counted for a forward with what the allocator gained over it
    (``allocated_over_counted``). The allocator is one per device, and the receiving threads allocate the
    tensors that arrive while the forward runs: read before and after, the gain would count them. So each
    receiving thread's allocation and its count here happen under one lock, and :meth:`read` takes the
    allocator's figure under the same lock, less everything received so far: the difference of two
    readings is then the computing thread's own. Sizes are counted as the allocator rounds them
    (:data:`ALLOCATION_GRANULE`; an allocator configured to round otherwise, ``roundup_power2_divisions``,
    makes the figure approximate).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    @contextlib.contextmanager
    def allocating(self, sizes: Sequence[int]) -> Iterator[None]:
        """Around a receiving thread's allocation of tensors of ``sizes`` bytes."""
        with self._lock:
            yield
            self.total += sum(-(-n // ALLOCATION_GRANULE) * ALLOCATION_GRANULE for n in sizes if n > 0)

    def read(self, allocated: Callable[[], int]) -> int:
        """``allocated()`` (the allocator's bytes) less the bytes received so far."""
        with self._lock:
            return allocated() - self.total


def allocated_probe(device: torch.device, received: ReceivedBytes | None = None) -> Callable[[], int] | None:
    """Bytes the allocator holds on ``device`` now, as a function (``torch.cuda.memory_allocated``), less the
    tensors the receiving threads allocated (``received``: see [Note: what a forward left allocated]); None
    on the CPU."""
    if device.type != "cuda":
        return None
    ledger = received if received is not None else ReceivedBytes()
    return lambda: ledger.read(lambda: int(torch.cuda.memory_allocated(device)))


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (nested in tuples, lists and dicts) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


class Arrival(Protocol):
    """A transfer of received tensors to the device, as their consumer sees it (on a GPU: the transfer
    stream's event, :class:`EventArrival`; None where the tensors are usable as they come)."""

    def wait(self) -> None:
        """Block the calling thread until the transfer is done."""

    def use(self, tensors: Sequence[object]) -> None:
        """Make the current stream wait for the transfer before it uses ``tensors``, and tell the allocator
        that the current stream uses them (they were allocated on the transfer's stream)."""


class EventArrival:
    """An :class:`Arrival` marked by a CUDA event recorded on the transfer's stream after it."""

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def wait(self) -> None:
        self.event.synchronize()

    def use(self, tensors: Sequence[object]) -> None:
        stream = torch.cuda.current_stream()
        stream.wait_event(self.event)
        for t in tensors:
            if isinstance(t, torch.Tensor):  # (not a number that came in the header, nor an absent tensor)
                t.record_stream(stream)

    def query(self) -> bool:
        """Whether the transfer is done (without waiting)."""
        return bool(self.event.query())  # type: ignore[no-untyped-call]


def use_when_ready(tensors: Sequence[object], ready: Arrival | None) -> None:
    """Let the current stream use ``tensors`` once their transfer (``ready``) is done; nothing to wait for
    when ``ready`` is None."""
    if ready is not None:
        ready.use(tensors)


def new_stream(device: torch.device) -> torch.cuda.Stream:
    """A CUDA stream of its own on ``device`` (for transfers)."""
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def new_event(*, timing: bool = False) -> torch.cuda.Event:
    """A CUDA event (to mark a transfer's end; with ``timing``, to time a task)."""
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
