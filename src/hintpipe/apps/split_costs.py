"""What each stage's tasks cost on this machine, the backward both whole and split: measured by the runtime's own
executor, so that a choice between a split hint and an unsplit one weighs what the runtime will run.

[Note: what a split backward costs]
A zero-bubble hint (``zb-h1``, ``bfw``, ``zbv``) splits each stage's backward into B, the gradient of its
input, and W, the gradient of its weights, and fills bubbles with W. The split is not always free: with
torch.distributed.pipelining's ``stage_backward_input``/``stage_backward_weight`` (which the runtime called
before 0.7) the two passes cost 1.7-1.9x one backward on small stages, and ``zb-h1`` ran 12-17% slower than
1F1B on a 2-rank CPU pipeline, where the simulator at F = B = W = 1 counted the split as free. The runtime's
own split (see [Note: weight gradients put off] in :mod:`hintpipe.runtime.loop.weight_deferral`) costs about
one backward where a stage's weights are mostly linear layers' and more elsewhere (a stage's other weights'
gradients are B's, and W may be small), and the split adds tasks and messages. So the costs are
measured, both ways, on one reference micro-batch through every stage, with the executor the runtime uses
(:class:`~hintpipe.runtime.loop.executor.StageExecutor`, each stage as not the last, its output gradients
ones), and :func:`hintpipe.sim.hint_choice.choose_hint` simulates each candidate hint on them.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.models import SeqLenDist, build_layers, loss_fn_for, make_batch, split_layers
from hintpipe.planner.buffer_updates import buffers_kept
from hintpipe.runtime.loop.executor import LossFn, StageExecutor, as_tensors, as_values
from hintpipe.runtime.transport.wire import Value
from hintpipe.sim.hint_choice import choose_hint, predicted_steps


@dataclasses.dataclass(frozen=True)
class StageCosts:
    """Seconds per stage: forward, whole backward, the split backward's two parts, and the forward of a split
    hint (its linear layers record what their put-off weight gradients need: see [Note: a deferred layer's
    forward] in :mod:`hintpipe.runtime.loop.weight_deferral`)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    backward_input: tuple[float, ...]
    weight: tuple[float, ...]
    split_forward: tuple[float, ...]


def measure_stage_costs(
    modules: Sequence[nn.Module], first: Sequence[Value], target: Any, loss_fn: LossFn, repeats: int = 5
) -> StageCosts:
    """Each stage's costs on the micro-batch ``first`` (the first stage's inputs; ``target`` the last stage's,
    its loss ``loss_fn``), each stage fed the one before's outputs: medians of ``repeats`` runs after a
    warm-up, the whole and the split backward in turn (see [Note: what a split backward costs]). The modules'
    gradients and buffers (a batch norm's statistics) are left as they were."""
    with buffers_kept(nn.ModuleList(modules)):
        return _measured_costs(modules, first, target, loss_fn, repeats)


def _measured_costs(
    modules: Sequence[nn.Module], first: Sequence[Value], target: Any, loss_fn: LossFn, repeats: int
) -> StageCosts:
    saved = [[None if p.grad is None else p.grad.clone() for p in m.parameters()] for m in modules]
    inputs: list[Value] = list(first)
    columns: tuple[list[float], ...] = ([], [], [], [], [])
    for stage, module in enumerate(modules):
        last = 0 if stage == len(modules) - 1 else -1  # the last stage computes the loss, as in the runtime
        whole = StageExecutor({0: module}, last_stage=last, loss_fn=loss_fn, split_backward=False)
        split = StageExecutor({0: module}, last_stage=last, loss_fn=loss_fn, split_backward=True)
        times: list[tuple[float, float, float, float, float]] = []
        outputs: list[Value] = []
        for mb in range(repeats + 1):
            forward, outputs, backward = _timed(whole, inputs, target, mb)
            split_forward, _, backward_input = _timed(split, inputs, target, mb)
            began = time.perf_counter()
            split.weight(0, mb)
            times.append((forward, backward, backward_input, time.perf_counter() - began, split_forward))
        for column, measured in zip(columns, zip(*times, strict=True), strict=True):
            column.append(statistics.median(measured[1:]))  # the first run warms up
        inputs = [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in outputs]  # as received
    for module, grads in zip(modules, saved, strict=True):
        for parameter, grad in zip(module.parameters(), grads, strict=True):
            parameter.grad = grad
    return StageCosts(*(tuple(column) for column in columns))


def _timed(executor: StageExecutor, inputs: Sequence[Value], target: Any, mb: int) -> tuple[float, list[Value], float]:
    """One forward and one backward of ``executor``'s stage: their seconds, and the forward's outputs (none at
    the last stage: its loss is backward's start)."""
    leaves = [
        v.detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v for v in inputs
    ]
    began = time.perf_counter()
    outputs, loss = executor.forward(0, mb, leaves, target, 1.0)
    middle = time.perf_counter()
    grads = [torch.ones_like(o) if isinstance(o, torch.Tensor) and o.requires_grad else None for o in outputs]
    executor.backward(0, mb, None if loss is not None else grads)
    return middle - began, as_values(outputs), time.perf_counter() - middle


@dataclasses.dataclass(frozen=True)
class AutoRun:
    """What ``hint="auto"`` reads of a run, from a :class:`~hintpipe.apps.train_config.TrainConfig` or from
    the command line's flags before there is one: what it measures, and whether it resumes a run whose
    checkpoints record the hint already."""

    model: ModelConfig
    ranks: int
    microbatches: int
    microbatch_size: int
    seq_len_dist: SeqLenDist
    seed: int
    checkpoint_dir: str | None = None
    resume: bool = False


def auto_hint(config: AutoRun, *, chunks: int | None = None) -> tuple[str, dict[str, float]]:
    """``hint="auto"`` for ``config``'s built-in model: its stages' costs measured on one reference micro-batch
    (:func:`measure_stage_costs`), each candidate's step simulated on them
    (:func:`~hintpipe.sim.hint_choice.predicted_steps`); the chosen hint's name and every prediction.

    Raises:
        ValueError: a planned model (its stages are the plan's), or ``chunks`` (the candidates have one stage
            per rank).
    """
    if config.model.spec.planned:
        raise ValueError(
            f"hint auto measures a list of layers cut one stage per rank; {config.model.label} is planned: "
            "give --hint 1f1b or zb-h1"
        )
    if chunks not in (None, 1):
        raise ValueError(f"hint auto chooses among hints of one stage per rank, got chunks {chunks}")
    ranks = config.ranks
    modules = split_layers(build_layers(config.model), ranks)
    inputs, targets, _ = make_batch(
        config.model, 1, config.microbatch_size, SeqLenDist(config.seq_len_dist.mean), 0, config.seed
    )
    costs = measure_stage_costs(modules, as_tensors(inputs[0]), targets[0], loss_fn_for(config.model))
    predicted = predicted_steps(
        ranks,
        config.microbatches,
        costs.forward,
        costs.backward,
        costs.backward_input,
        costs.weight,
        split_forward=costs.split_forward,
    )
    return choose_hint(predicted), predicted
