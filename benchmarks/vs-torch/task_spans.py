"""Where a step's time goes between the ranks (``paired.py --gaps``): every F and B's start and end, in both
libraries, timed at the same place, and the hand-overs between two ranks taken from them.

torch's tasks are timed around ``_PipelineStageBase.forward_one_chunk`` and ``backward_one_chunk`` (a private class:
what this measures is torch 2.13's), hintpipe's around its executor's ``forward`` and ``backward``: in both, the
stage's compute and the little around it, not the messages. Every rank's ``time.perf_counter`` reads the host's one
monotonic clock, so a producer's end on one rank and its consumer's start on another compare directly. On two
ranks of one stage each, a 1F1B step hands over twice per micro-batch on its critical path (the activation to
rank 1, the gradient back to rank 0): what a hand-over costs beyond the other library's is paid about twice a
micro-batch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

#: This rank's spans: (configuration, cycle, kind, micro-batch, start, end); kind "step" is a whole step.
SPANS: list[tuple[str, int, str, int, float, float]] = []
#: The configuration and cycle the spans recorded now belong to.
CURRENT: list[Any] = ["", 0]


def install() -> None:
    """Time every F, B and W of both libraries from now on (in this process)."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    from hintpipe.runtime.loop.executor import StageExecutor

    _timed(_PipelineStageBase, "forward_one_chunk", "F", mb_at=1)
    _timed(_PipelineStageBase, "backward_one_chunk", "B", mb_at=1)
    _timed(_PipelineStageBase, "backward_weight_one_chunk", "W", mb_at=1)
    _timed(StageExecutor, "forward", "F", mb_at=2)
    _timed(StageExecutor, "backward", "B", mb_at=2)
    _timed(StageExecutor, "weight", "W", mb_at=2)


def _timed(owner: type, name: str, kind: str, *, mb_at: int) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPANS.append((CURRENT[0], CURRENT[1], kind, args[mb_at], start, time.perf_counter()))

    setattr(owner, name, timed)


def step(name: str, cycle: int, one_step: Callable[[], None]) -> None:
    """Run ``one_step`` of configuration ``name``, its tasks and itself recorded as the cycle's."""
    CURRENT[:] = [name, cycle]
    start = time.perf_counter()
    one_step()
    SPANS.append((name, cycle, "step", 0, start, time.perf_counter()))


def hand_overs(ranks: list[list[tuple[str, int, str, int, float, float]]], name: str) -> dict[str, float]:
    """Medians in ms over ``name``'s micro-batches and cycles, from ranks 0 and 1's spans: rank 0's F end to rank
    1's F start (the activation), rank 1's B end to rank 0's B start (the gradient), and on rank 0 the step's start
    to its first F and its last B to the step's end (the optimizer's step is in it, the same in both libraries)."""
    spans = [{(c, k, mb): (a, b) for n, c, k, mb, a, b in rank if n == name} for rank in ranks[:2]]
    zero, one = spans
    cycles = sorted({c for c, k, _ in zero if k == "step"})
    mbs = sorted({mb for _, k, mb in zero if k == "F"})
    activation = [one[(c, "F", mb)][0] - zero[(c, "F", mb)][1] for c in cycles for mb in mbs]
    gradient = [zero[(c, "B", mb)][0] - one[(c, "B", mb)][1] for c in cycles for mb in mbs]
    first = [zero[(c, "F", mbs[0])][0] - zero[(c, "step", 0)][0] for c in cycles]
    last = [zero[(c, "step", 0)][1] - max(zero[(c, "B", mb)][1] for mb in mbs) for c in cycles]
    return {
        "activation": statistics.median(activation) * 1e3,
        "gradient": statistics.median(gradient) * 1e3,
        "start to first F": statistics.median(first) * 1e3,
        "last B to end": statistics.median(last) * 1e3,
    }


def busy(spans: list[tuple[str, int, str, int, float, float]], name: str) -> dict[str, float]:
    """One rank's medians over ``name``'s cycles, in ms per step: its time in F, B and W, and the rest of the step
    (waiting for messages, the optimizer's step, the runtime's own work). A split backward's cost shows here: its
    forward (whose linear layers record what W needs) beside the unsplit hint's, and B + W beside B."""
    mine = [s for s in spans if s[0] == name]
    cycles = sorted({c for _, c, k, *_ in mine if k == "step"})
    if not cycles:
        raise ValueError(f"no step of {name!r} recorded")
    per_cycle = {kind: [0.0] * len(cycles) for kind in ("F", "B", "W", "step")}
    index = {c: i for i, c in enumerate(cycles)}
    for _, cycle, kind, _, start, end in mine:
        if cycle in index:
            per_cycle[kind][index[cycle]] += end - start
    rest = [s - f - b - w for s, f, b, w in zip(*(per_cycle[k] for k in ("step", "F", "B", "W")), strict=True)]
    out = {kind: statistics.median(per_cycle[kind]) * 1e3 for kind in ("F", "B", "W")}
    return out | {"rest": statistics.median(rest) * 1e3}
