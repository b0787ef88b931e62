"""The device a rank computes on: chosen once, and everything the pipeline holds or receives is there.

On a machine without CUDA these run the device-generic code with ``cpu``; the
CUDA branches are exercised by benchmarks/gpu where a GPU is available.
"""

from __future__ import annotations

import datetime
import functools
import math
import time
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch._C._distributed_c10d import HashStore

from hintpipe.device import ReceivedBytes
from hintpipe.runtime.assembly import Seams
from hintpipe.runtime.errors import PeerFailure
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.loop.executor import StageExecutor
from hintpipe.runtime.loop.timing import DeviceTimer
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.runtime.rank_process import gather_over_store
from hintpipe.runtime.transport.links import NcclTransport
from hintpipe.runtime.transport.wire import Message, tensors_of
from hintpipe.schedule.task import Kind, Task


def test_every_ranks_gpu_is_gathered_through_the_rendezvous_store() -> None:
    store = HashStore()
    store.set("hintpipe/gpu/1", "node-a/GPU-2")  # rank 1 said its GPU first
    assert gather_over_store(store, 0, 2, "hintpipe/gpu", "node-a/GPU-1") == ["node-a/GPU-1", "node-a/GPU-2"]
    assert gather_over_store(store, 1, 2, "hintpipe/gpu", "node-a/GPU-2") == ["node-a/GPU-1", "node-a/GPU-2"]


def test_a_rank_that_never_reaches_the_start_is_named() -> None:
    # A rank stopped or killed while it starts (importing torch) never says its device: the others name it
    # when the store's wait runs out, not the store's keys.
    store = HashStore()
    store.set_timeout(datetime.timedelta(seconds=0.2))
    store.set("hintpipe/gpu/1", "")
    with pytest.raises(PeerFailure) as never:
        gather_over_store(store, 0, 4, "hintpipe/gpu", "")
    assert str(never.value) == (
        "rank 0: rank 2, rank 3 never joined the run (waited 0.2 s for them at the start: stopped, killed, or "
        "still starting)"
    )


def test_an_unknown_device_is_refused_before_any_rank_starts() -> None:
    with pytest.raises(ValueError, match=r"^unknown device 'gpu': choose one of auto, cpu, cuda$"):
        run_ranks(_never_runs, 2, device="gpu")


def _never_runs(rank: int, world: int) -> None:
    raise AssertionError("a rank started")


class _Spy:
    """A transport that keeps what it delivers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.delivered: list[Message] = []

    def get(self, timeout: float | None) -> Message | None:
        msg: Message | None = self.inner.get(timeout)
        if msg is not None:
            self.delivered.append(msg)
        return msg

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _device_worker(rank: int, world: int, device: str, links: bool) -> tuple[str, list[str], list[str], int]:
    spies: list[_Spy] = []

    def spied(transport: Any) -> _Spy:
        spies.append(_Spy(transport))
        return spies[-1]

    # The NCCL transport's path, its links on gloo; the spy around what carries the messages.
    on_gloo = functools.partial(NcclTransport.connect, backend="gloo")
    seams = Seams(transport=on_gloo if links else None, watch_transport=spied)
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 2)]
    with Pipeline.from_modules(
        stages, loss_fn=nn.functional.mse_loss, microbatches=4, policy="ready", device=device, seams=seams
    ) as pipe:
        (spy,) = spies
        assert pipe.carrier is spy
        xs = [torch.randn(n, 4) for n in (1, 3, 2, 5)]
        ys = [torch.randn(n, 2) for n in (1, 3, 2, 5)]
        for _ in range(3):
            pipe.step(xs if rank == 0 else None, ys if rank == 1 else None)
        params = [p for m in pipe.modules.values() for p in m.parameters()]
        held = sorted({str(p.device) for p in params} | {str(p.grad.device) for p in params if p.grad is not None})
        received = [t for msg in spy.delivered for t in tensors_of(msg.tensors)]
        places = sorted({str(t.device) for t in received})
        return str(pipe.device), held, places, len(received)


@pytest.mark.parametrize("links", [False, True], ids=["gloo", "links"])
def test_every_parameter_and_every_delivered_tensor_is_on_the_ranks_device(links: bool) -> None:
    for device, held, received, count in run_ranks(_device_worker, 2, "cpu", links, timeout=120):
        assert device == "cpu"
        assert held == ["cpu"]
        assert received == ["cpu"] and count == 3 * 4  # 4 activations a step to rank 1, 4 gradients to rank 0


# -- task times from device events ------------------------------------------------------------------


class _FakeEvent:
    """A timing event whose time is the host's when recorded: the GPU's event timing, run on a CPU."""

    made: ClassVar[list[_FakeEvent]] = []

    def __init__(self) -> None:
        self.at = math.nan
        _FakeEvent.made.append(self)

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        assert not math.isnan(self.at), "waited for an event never recorded"

    def elapsed_time(self, end_event: _FakeEvent) -> float:
        return (end_event.at - self.at) * 1e3


def test_the_device_timer_turns_events_into_seconds_from_the_loops_start() -> None:
    timer = DeviceTimer(_FakeEvent)
    timer.begin()
    origin = _FakeEvent.made[-1]
    tasks = [Task(0, Kind.F, 0), Task(0, Kind.B, 0)]
    events = []
    for _ in tasks:
        start, end = timer.mark(), timer.mark()
        timer.task(start, end)
        assert isinstance(start, _FakeEvent) and isinstance(end, _FakeEvent)
        events.append((start, end))
    host = [(0, t, 100.0, 200.0) for t in tasks]  # the host's times are replaced
    resolved = timer.resolve(host)
    assert resolved == [(0, t, (s.at - origin.at), (e.at - origin.at)) for t, (s, e) in zip(tasks, events, strict=True)]
    with pytest.raises(ValueError, match=r"^1 records for 2 timed tasks$"):
        timer.resolve(host[:1])


class _DeviceEvent:
    """A timing event that passes at a time set by the test: the device's, which may lag the host's."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.at = math.nan

    def record(self, stream: Any = None) -> None:
        self.at = self.clock[0]

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: _DeviceEvent) -> float:
        return (end_event.at - self.at) * 1e3


def test_the_steps_start_is_the_wall_clock_time_of_the_devices_origin() -> None:
    device = [10.0]  # seconds on the device's clock when the next event passes
    timer = DeviceTimer(lambda: _DeviceEvent(device), wall=lambda: 1000.0)
    timer.begin()  # the device reaches the origin at 10.0 (the host recorded it earlier: it lags)
    device[0] = 10.5
    start = timer.mark()
    device[0] = 11.25
    timer.task(start, timer.mark())
    device[0] = 12.0  # the anchor passes at 12.0, when the wall clock reads 1000.0
    assert timer.resolve([(0, Task(0, Kind.F, 0), 0.0, 0.0)]) == [(0, Task(0, Kind.F, 0), 0.5, 1.25)]
    assert timer.started == 998.0  # not the host's time at begin(): the device's origin, on the wall clock


def _timed_worker(rank: int, world: int) -> tuple[int, int, list[Any]]:
    _FakeEvent.made = []
    stages = [nn.Linear(4, 4), nn.Linear(4, 2)]
    seams = Seams(timing_events=_FakeEvent)
    with Pipeline.from_modules(
        stages, loss_fn=nn.functional.mse_loss, microbatches=4, policy="fixed", seams=seams
    ) as pipe:
        xs, ys = [torch.randn(2, 4) for _ in range(4)], [torch.randn(2, 2) for _ in range(4)]
        pipe.step(xs if rank == 0 else None, ys if rank == 1 else None)
        origin, *marks, _ = _FakeEvent.made  # the last: the wall clock's anchor, after the step's tasks
        mine = [r for r in pipe.reports[-1].records if r[0] == rank]
        expected = [(m.at - origin.at) for m in marks]
        return len(marks), len(mine), [(mine, expected)]


def test_a_pipeline_given_timing_events_reports_the_times_they_measured() -> None:
    for marks, tasks, [(records, times)] in run_ranks(_timed_worker, 2, timeout=60):
        assert tasks == 8 and marks == 2 * tasks  # one origin, then an event before and after each task
        measured = [t for _, _, start, end in records for t in (start, end)]
        # The report's clock starts at the earliest rank's loop start, so the times are shifted alike (by a
        # difference of wall-clock readings, exact to a microsecond).
        shift = measured[0] - times[0]
        assert measured == pytest.approx([t + shift for t in times], abs=1e-6)


# -- device memory: the counted bytes against the allocator's -------------------------------------------


class _Allocating(nn.Module):
    """A stage whose forward makes the (fake) allocator gain 1000 bytes."""

    def __init__(self, allocator: list[int]) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.allocator = allocator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.allocator[0] += 1000
        return torch.tanh(self.linear(x))


def test_each_forwards_counted_bytes_are_checked_against_the_allocator() -> None:
    allocator = [0]
    executor = StageExecutor(
        {0: _Allocating(allocator)}, 1, nn.functional.mse_loss, False, allocated=lambda: allocator[0]
    )
    executor.begin_step(0)
    for mb, rows in enumerate((2, 3, 4)):
        executor.forward(0, mb, [torch.randn(rows, 4, requires_grad=True)], None, 1.0)
    counted = [executor._bytes[(0, mb)] for mb in range(3)]
    # The stage's first forward is not checked: it also allocates what stays (cuBLAS's workspace).
    assert executor.memory_check == [(counted[1], 1000), (counted[2], 1000)]
    executor.begin_step(1)
    assert executor.memory_check == []


class _Receiving(nn.Module):
    """A stage whose forward makes the (fake) allocator gain 1000 bytes while a receiving thread allocates a
    received tensor of 700 bytes (1024 as the allocator rounds it)."""

    def __init__(self, allocator: list[int], received: ReceivedBytes) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.allocator = allocator
        self.received = received

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.allocator[0] += 1000
        with self.received.allocating([700, 0]):
            self.allocator[0] += 1024
        return torch.tanh(self.linear(x))


def test_what_the_receiving_threads_allocate_is_left_out_of_a_forwards_check() -> None:
    allocator = [0]
    received = ReceivedBytes()
    stage = _Receiving(allocator, received)
    executor = StageExecutor(
        {0: stage}, 1, nn.functional.mse_loss, False, allocated=lambda: received.read(lambda: allocator[0])
    )
    for mb in range(2):
        executor.forward(0, mb, [torch.randn(2, 4, requires_grad=True)], None, 1.0)
    assert executor.memory_check == [(executor._bytes[(0, 1)], 1000)]
    assert received.total == 2 * 1024 and received.read(lambda: allocator[0]) == 2000
