"""Node times read off whole runs of the graph, as a stage will run it: the GPU profile.

[Note: a GPU's node times]
A node timed on its own pays a launch and a synchronisation around kernels
that may take microseconds: a GPT-2 planned that way on one H200 predicted 63
ms for stages that ran in 21 and 28 ms, and balanced cuts came out 1.33x
apart. A stage does not synchronise between nodes: the host queues kernels
ahead of the device, and a node costs what the device spends on it, or the
host's launch time where that is longer. So the whole graph runs here forward
and backward, as one autograd graph, with a timing event recorded on the
stream between nodes and nothing synchronised until the end; a node's
forward is the span between its two events. Its backward starts when the
gradient of its output is complete (a hook on that tensor records an event)
and lasts until the next such event; autograd runs the graph's backward in
reverse order of creation, so the spans follow one another and add up to the
whole backward. Each run's spans are read once it finished; the fastest of
the runs is kept per node ([Note: the fastest run] in
:mod:`~hintpipe.planner.profile`).

On a CPU the per-node profile stays by default (a CPU runs each op in the
calling thread, so a node timed alone costs what it costs in the stage, and
its thread clock sees no one else's work); the same code runs there on the
CPU's clock (:func:`marks_for`), which is how it is tested without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx as fx

from hintpipe.device import Clock
from hintpipe.planner.capture import CapturedGraph
from hintpipe.tensor_bytes import tensors_in


class Marks(Protocol):
    """Points in the device's time, read after the work between them finished."""

    def mark(self) -> Any:
        """A point after every piece of work queued so far (not waited for)."""

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two points, once the device reached ``end``."""


class EventMarks:
    """CUDA timing events on the current stream: no synchronisation until a span is read."""

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3


class HostMarks:
    """The host's clock (a CPU computes in the calling thread: a call returns when its work is done)."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class ThreadMarks:
    """The calling thread's CPU time: a CPU computing in one thread, whoever shares its cores ([Note: a CPU's
    clock] in :mod:`hintpipe.device`)."""

    def mark(self) -> float:
        return time.thread_time()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class ClockMarks:
    """Marks read off a :class:`~hintpipe.device.Clock` (which waits for the device's work itself)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def mark(self) -> float:
        return self.clock.now()

    def seconds(self, start: float, end: float) -> float:
        return end - start


def marks_for(device: torch.device) -> Marks:
    """The marks that time work on ``device``, on the clock :func:`hintpipe.device.clock_for` chooses: CUDA
    events on a GPU; on a CPU computing in one thread, the thread's CPU time, else the host's clock."""
    if device.type == "cuda":
        return EventMarks()
    return ThreadMarks() if torch.get_num_threads() == 1 else HostMarks()


def graph_times(
    graph: CapturedGraph,
    inputs: Sequence[Any],
    run: Callable[[fx.GraphModule, fx.Node, dict[fx.Node, Any]], Any],
    *,
    repeats: int,
    marks: Marks,
) -> list[tuple[float, float]]:
    """Each compute node's forward and backward seconds, from ``repeats`` runs of the whole graph after one
    warm-up (see [Note: a GPU's node times]); ``run`` evaluates one node
    (:func:`~hintpipe.planner.profile.run_node`)."""
    n = len(graph.nodes)
    best = [(float("inf"), float("inf"))] * n
    for attempt in range(repeats + 1):
        times = _one_run(graph, inputs, run, marks)
        if attempt:  # the first run warms the kernels and the allocator
            best = [(min(f, tf), min(b, tb)) for (f, b), (tf, tb) in zip(best, times, strict=True)]
    return best


def _one_run(
    graph: CapturedGraph,
    inputs: Sequence[Any],
    run: Callable[[fx.GraphModule, fx.Node, dict[fx.Node, Any]], Any],
    marks: Marks,
) -> list[tuple[float, float]]:
    root = graph.module
    env: dict[fx.Node, Any] = {}
    for node, value in zip(graph.inputs, inputs, strict=True):
        env[node] = leaf(value)
    for node in root.graph.nodes:
        if node.op == "get_attr":
            env[node] = run(root, node, env)
    started: list[tuple[int, Any]] = []  # (node position, mark) as each node's backward starts
    forward_marks = [marks.mark()]
    with torch.enable_grad():
        for i, node in enumerate(graph.nodes):
            env[node] = run(root, node, env)
            forward_marks.append(marks.mark())
            for t in tensors_in(env[node]):
                if t.requires_grad:
                    t.register_hook(_starter(started, i, marks))  # type: ignore[no-untyped-call]
                    break  # one start per node: the first output whose gradient completes
    backward_of_ones(fx.node.map_arg(graph.output.args[0], lambda n: env[n]))
    finished = marks.mark()
    forward = [marks.seconds(forward_marks[i], forward_marks[i + 1]) for i in range(len(graph.nodes))]
    backward = [0.0] * len(graph.nodes)
    ends = [mark for _, mark in started[1:]] + [finished]
    for (i, start), end in zip(started, ends, strict=True):
        backward[i] += marks.seconds(start, end)
    return list(zip(forward, backward, strict=True))


def run_seconds(graph: CapturedGraph, inputs: Sequence[Any], *, repeats: int, marks: Marks) -> float:
    """The whole graph's forward + backward seconds, run as one module as a stage runs (nothing recorded between
    nodes): the fastest of ``repeats`` runs after one warm-up. See [Note: the profile's scale]."""
    best = float("inf")
    for attempt in range(repeats + 1):
        leaves = [leaf(v) for v in inputs]
        start = marks.mark()
        with torch.enable_grad():
            out = graph.module(*leaves)
        backward_of_ones(out)
        spent = marks.seconds(start, marks.mark())
        if attempt:
            best = min(best, spent)
    graph.module.zero_grad(set_to_none=True)
    return best


def _starter(started: list[tuple[int, Any]], position: int, marks: Marks) -> Callable[[torch.Tensor], None]:
    def hook(_: torch.Tensor) -> None:
        started.append((position, marks.mark()))

    return hook


def leaf(value: Any) -> Any:
    """An input as a leaf of the run's graph: a floating-point tensor requires grad (a later stage's input
    does), others stay as they are."""
    if isinstance(value, torch.Tensor):
        leaf = value.detach()
        return leaf.requires_grad_(True) if leaf.is_floating_point() else leaf
    return value


def backward_of_ones(out: Any) -> None:
    """Backward from every output tensor that requires grad, a gradient of ones into each (what a stage's
    backward costs, whatever its loss)."""
    outputs = [t for t in tensors_in(out) if t.requires_grad]
    if outputs:
        torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
