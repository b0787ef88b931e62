"""What the built stages of a plan cost, measured: the check of the planner's predicted stage times.

A plan predicts each stage's forward + backward time from its nodes' profiles
(:attr:`StagePlan.time_ms <hintpipe.planner.partition.StagePlan.time_ms>`). This runs the stages themselves,
as a pipeline runs them (stage ``i`` on stage ``i - 1``'s outputs, a gradient of ones into each output), on
the clock the profile used ([Note: a GPU's node times] in :mod:`~hintpipe.planner.graph_timing`): what the
prediction is to be compared with.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from hintpipe.planner.graph_timing import backward_of_ones, leaf, marks_for

if TYPE_CHECKING:
    from hintpipe.planner.plan import Plan


def measure_stages(plan: Plan, inputs: Sequence[Any], *, repeats: int = 5, device: str | None = None) -> list[float]:
    """Each stage's forward + backward seconds on one micro-batch, the fastest of ``repeats`` runs after one
    warm-up (as the profile keeps each node's fastest run).

    Args:
        plan: the plan (its stages are built from a copy: the plan's parameters get no gradient).
        inputs: stage 0's inputs (the model's positional inputs, then its tensor keyword inputs).
        repeats: timed runs per stage.
        device: where to run the stages (default: where the plan's parameters are); ``inputs`` are moved there.
    """
    own = copy.deepcopy(plan)
    where = torch.device(device) if device is not None else _device_of(own)
    marks = marks_for(where)
    values: tuple[Any, ...] = tuple(_moved(v, where) for v in inputs)
    seconds = []
    for index in range(own.stages):
        stage = own.build_stage(index).to(where)
        best = float("inf")
        for attempt in range(repeats + 1):
            leaves = tuple(leaf(v) for v in values)
            start = marks.mark()
            out = stage(*leaves)
            backward_of_ones(out)
            spent = marks.seconds(start, marks.mark())
            if attempt:
                best = min(best, spent)
        stage.zero_grad(set_to_none=True)
        seconds.append(best)
        values = tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in _flat(out))
    return seconds


def _device_of(plan: Plan) -> torch.device:
    first = next(iter(plan.graph.module.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def _moved(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _flat(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
