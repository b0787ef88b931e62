"""A model's :class:`~hintpipe.forming.cost.SequenceCost`, fitted from the planner's profile.

The planner times every node of the captured model, forward and backward,
on one example (:func:`hintpipe.planner.profile.profile`). Run at two or more
sequence lengths, the summed node times give the model's training time per
row at each length, and the fit gives its cost at any length. One capture
serves every length: the graph runs on any shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from hintpipe.forming.cost import SequenceCost
from hintpipe.planner.capture import CapturedGraph, capture
from hintpipe.planner.profile import profile
from hintpipe.tensor_bytes import tensors_in


def profile_sequence_cost(
    model: nn.Module,
    example: Callable[[int], Any],
    lengths: Sequence[int] = (32, 128),
    *,
    repeats: int = 5,
    kwargs: dict[str, Any] | None = None,
    captured: CapturedGraph | None = None,
) -> SequenceCost:
    """Fit ``model``'s cost per row of ``t`` tokens (``a t + b t^2`` seconds, forward and backward) to the
    planner's profile at each of ``lengths``.

    Args:
        model: the whole model (captured as :func:`hintpipe.plan` captures it: a deep copy, never touched).
        example: ``example(t)``: the model's positional input(s) for rows of ``t`` tokens (a tensor or a
            tuple); its first tensor's first dimension counts the rows.
        lengths: two or more sequence lengths to profile at.
        repeats: timed runs per node (after a warm-up; the median is kept).
        kwargs: keyword inputs of every call (``use_cache=False``), as :func:`hintpipe.plan` takes them.
        captured: a capture of ``model`` to reuse.

    Raises:
        ValueError: fewer than two distinct lengths.
    """
    distinct = sorted(set(int(t) for t in lengths))
    if len(distinct) < 2:
        raise ValueError(f"profile_sequence_cost needs two or more sequence lengths, got {list(lengths)}")
    first = example(distinct[0])
    positional = first if isinstance(first, tuple) else (first,)
    graph = captured if captured is not None else capture(model, example=positional, kwargs=kwargs)
    extra = tuple(v for v in (kwargs or {}).values() if isinstance(v, torch.Tensor))
    seconds = []
    for t in distinct:
        value = example(t)
        inputs = (*(value if isinstance(value, tuple) else (value,)), *extra)
        rows = int(tensors_in(list(inputs))[0].shape[0])
        nodes = profile(graph, inputs, repeats=repeats)
        seconds.append(sum(node.forward_s + node.backward_s for node in nodes) / rows)
    for param in graph.module.parameters():  # profiling ran backward into the copy's parameters
        param.grad = None
    return SequenceCost.fit(distinct, seconds)
