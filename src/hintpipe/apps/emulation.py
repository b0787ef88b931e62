"""Costs for emulated compute, measured on this machine (``hintpipe train --emulate``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hintpipe.apps.models import SeqLenDist, build_layers, loss_fn_for, make_batch, split_layers
from hintpipe.apps.multimodal import sized_by_input
from hintpipe.runtime.loop.emulated import EmulatedCosts
from hintpipe.runtime.loop.executor import as_tensors

if TYPE_CHECKING:
    from hintpipe.apps.train_config import TrainConfig


def profile_costs(config: TrainConfig, repeats: int = 5) -> EmulatedCosts:
    """Measure each stage's tasks on one reference micro-batch in this process (medians of ``repeats`` after a
    warm-up; :func:`~hintpipe.apps.split_costs.measure_stage_costs`): the costs ``--emulate`` sleeps. Under a
    hint that splits weight gradients off, B and W are the split backward's own two parts, measured (see
    [Note: what a split backward costs] in :mod:`hintpipe.apps.split_costs`); before 0.7, halves of the whole.
    """
    from hintpipe.apps.split_costs import measure_stage_costs

    torch.set_num_threads(1)
    stages = config.resolved_hint.stages
    modules = split_layers(build_layers(config.model), stages)
    size, length = config.training.microbatch_size, config.data.seq_len_dist.mean
    inputs, targets, _ = make_batch(config.model, 1, size, SeqLenDist(length), 0, config.training.seed)
    costs = measure_stage_costs(
        modules, as_tensors(inputs[0]), targets[0], loss_fn_for(config.model), repeats
    )  # several tensors for mm-mini
    # The emulated executor scales each stage by the size of one of the first stage's inputs: the
    # first, or where a micro-batch is several (mm-mini) the images on encoder stages and the text on decoder ones.
    references = tuple(t.numel() for t in as_tensors(inputs[0]))
    sized_by: tuple[int, ...] = ()
    if config.model.spec.inputs > 1:
        sized_by = tuple(sized_by_input(module) for module in modules)
    if config.split_backward:
        return EmulatedCosts(
            costs.split_forward, costs.backward_input, costs.weight, references[0], sized_by, references
        )
    return EmulatedCosts(costs.forward, costs.backward, (0.0,) * stages, references[0], sized_by, references)
