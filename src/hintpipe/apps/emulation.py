"""Costs for emulated compute, measured on this machine (``hintpipe train --emulate``)."""

from __future__ import annotations

import statistics
import time
from typing import Protocol

import torch

from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.models import SeqLenDist, build_layers, make_batch, split_layers
from hintpipe.apps.multimodal import sized_by_input
from hintpipe.runtime.loop.executor import EmulatedCosts, as_tensors
from hintpipe.schedule.hint import Hint


class EmulatedRun(Protocol):
    """What :func:`profile_costs` reads of a run (a :class:`~hintpipe.apps.training.TrainConfig` has it)."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def resolved_hint(self) -> Hint: ...
    @property
    def microbatch_size(self) -> int: ...
    @property
    def seq_len_dist(self) -> SeqLenDist: ...
    @property
    def seed(self) -> int: ...
    @property
    def split_backward(self) -> bool: ...


def profile_costs(config: EmulatedRun, repeats: int = 5) -> EmulatedCosts:
    """Measure each stage's forward and backward on one reference micro-batch in
    this process (median of ``repeats`` after a warm-up): the costs ``--emulate`` sleeps.

    When the hint splits weight gradients off, the measured backward is shared
    equally between B and W.
    """
    torch.set_num_threads(1)
    stages = config.resolved_hint.num_stages
    modules = split_layers(build_layers(config.model), stages)
    inputs, _, _ = make_batch(
        config.model, 1, config.microbatch_size, SeqLenDist(config.seq_len_dist.mean), 0, config.seed
    )
    forward, backward = [], []
    x = as_tensors(inputs[0])  # several tensors for mm-mini (patches, text ids)
    for module in modules:
        f_times, b_times = [], []
        for _ in range(repeats + 1):
            leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in x]
            start = time.perf_counter()
            out = as_tensors(module(*leaves))
            middle = time.perf_counter()
            floating = [t for t in out if t.requires_grad]
            torch.autograd.backward(floating, [torch.ones_like(t) for t in floating])
            end = time.perf_counter()
            f_times.append(middle - start)
            b_times.append(end - middle)
        forward.append(statistics.median(f_times[1:]))
        backward.append(statistics.median(b_times[1:]))
        x = [t.detach() for t in out]
    # The emulated executor scales each stage by the size of one of the first stage's inputs: the
    # first, or where a micro-batch is several (mm-mini) the images on encoder stages and the text on decoder ones.
    references = tuple(t.numel() for t in as_tensors(inputs[0]))
    sized_by: tuple[int, ...] = ()
    if config.model.spec.inputs > 1:
        sized_by = tuple(sized_by_input(module) for module in modules)
    if config.split_backward:
        half = tuple(b / 2 for b in backward)
        return EmulatedCosts(tuple(forward), half, half, references[0], sized_by, references)
    return EmulatedCosts(tuple(forward), tuple(backward), (0.0,) * stages, references[0], sized_by, references)
