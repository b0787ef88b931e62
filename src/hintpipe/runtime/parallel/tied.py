"""Tied parameters: one tensor of the model held by several ranks, kept equal.

A weight shared by the first and the last stage (an embedding tied to the LM
head) is one tensor in the unsplit model, whose gradient is the sum of both
uses' gradients. Split across ranks it becomes one copy per rank, each of
which sees only its own use. So, as Megatron does for embeddings, the ranks
holding a copy sum its gradient after their last backward of the step, in a
group of exactly those ranks; the copies start from one value (broadcast from
the lowest rank when the pipeline is built), and identical optimizer steps on
identical gradients keep them identical. Copies on one rank are one tensor
already (the stages of a plan share the captured module's parameters).

With other axes the copies stay one per pipeline position: a group per
pipeline. A tensor-parallel or FSDP2-sharded copy is a DTensor whose local
shard is the same slice of the tensor on every rank of such a group (same
placement, same mesh coordinate), so the sum runs on the local shards, after
the data-parallel reduction: the average over replicas of a sum over uses is
the sum over uses of the averages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.runtime.errors import WatchdogTimeout
from hintpipe.runtime.loop.hooks import Hook

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState
from hintpipe.tensor_bytes import local


@dataclasses.dataclass(frozen=True)
class TiedParameter:
    """One tensor used by several stages: every name it has, and the stages using it."""

    names: tuple[str, ...]
    stages: tuple[int, ...]


class TiedGradients(Hook):
    """The tied parameters this rank holds, with a process group per tensor; a step hook that sums their
    gradients at the end of each step.

    Build on every rank, in the same order (process groups are collective).

    Raises:
        ValueError: if a stage of this rank should hold a tied parameter and does not.
    """

    def __init__(
        self,
        tied: Sequence[TiedParameter],
        modules: Mapping[int, nn.Module],
        stage_rank: Sequence[int],
        rank: int,
        pipelines: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.rank = rank
        self._links: list[tuple[nn.Parameter, dist.ProcessGroup, tuple[int, ...]]] = []
        # Positions in a pipeline; every pipeline (one per data/tensor-parallel coordinate) gets its own group.
        every = pipelines if pipelines is not None else [range(dist.get_world_size())]
        for entry in tied:
            ranks = tuple(sorted({stage_rank[s] for s in entry.stages}))
            if len(ranks) < 2:
                continue  # every use on one rank: one tensor already
            group, _ = dist.new_subgroups_by_enumeration([[list(p)[r] for r in ranks] for p in every], backend="gloo")  # type: ignore[no-untyped-call]
            if rank not in ranks:
                continue
            param = _find(entry, modules, rank)
            with torch.no_grad():
                dist.broadcast(local(param.data), group=group, group_src=0)
            self._links.append((param, group, ranks))

    def counted_elsewhere(self) -> set[int]:
        """The ids of the tied parameters whose copy on a lower rank stands for them (a gradient norm counts
        each tensor once)."""
        return {id(param) for param, _, ranks in self._links if self.rank != ranks[0]}

    def end_step(self, state: StepState) -> None:
        """Sum each tied parameter's gradient over the ranks holding it (after the step's last backward)."""
        step = state.step
        for param, group, ranks in self._links:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            try:
                dist.all_reduce(local(param.grad), group=group)
            except RuntimeError as exc:
                raise WatchdogTimeout(
                    f"rank {self.rank}: the tied parameter's gradient sum with ranks {list(ranks)} failed in step "
                    f"{step}: {exc}"
                ) from None


def _find(entry: TiedParameter, modules: Mapping[int, nn.Module], rank: int) -> nn.Parameter:
    """This rank's copy: the parameter of one of its stages named by any of the entry's names."""
    for stage in entry.stages:
        if stage in modules:
            for name, param in modules[stage].named_parameters(remove_duplicate=False):
                if name in entry.names:
                    return param
    raise ValueError(
        f"rank {rank}: tied parameter {' = '.join(entry.names)} should be in stages {list(entry.stages)}, but no "
        f"stage of this rank ({sorted(modules)}) has a parameter of those names"
    )
