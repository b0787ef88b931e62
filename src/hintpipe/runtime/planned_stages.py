"""Which stage modules a rank builds its pipeline from: its share of a list of all stages, or its stages of a
plan (with the config the plan implies), checked against every other rank's."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn

from hintpipe.modes import Precision
from hintpipe.options import PipelineConfig
from hintpipe.runtime.assembly import layout_of
from hintpipe.runtime.errors import OptionMismatch
from hintpipe.runtime.model_names import ModelNames
from hintpipe.runtime.parallel.tied import TiedParameter
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.resolve import resolve_hint

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hintpipe.planner.plan import Plan


def pipeline_hint(config: PipelineConfig) -> Hint:
    """The hint the pipeline's config names (``hint``, ``microbatches``, ``chunks``), resolved for its ranks (the
    ``mesh``'s pipeline length, or the world): the one resolution of the constructor's and of
    :meth:`~hintpipe.runtime.pipeline.Pipeline.from_modules`'s, which needs the stage count before the
    constructor runs (a hint resolved already is taken as it is).

    Raises:
        ValueError, HintError: as :func:`~hintpipe.schedule.resolve.resolve_hint`.
    """
    return resolve_hint(config.hint, layout_of(config.mesh).pp, config.microbatches, config.chunks)


def stages_of_this_rank(modules: Sequence[nn.Module], hint: Hint, mesh: DeviceMesh | None) -> dict[int, nn.Module]:
    """This rank's stages out of *all* stage ``modules`` (global order), by ``hint`` (this rank's position in
    ``mesh``, or in the world).

    Raises:
        ValueError: a module count other than the hint's stage count.
    """
    if len(modules) != hint.stages:
        raise ValueError(
            f"got {len(modules)} stage modules; hint {hint.name!r} on {hint.ranks} ranks needs "
            f"{hint.stages} ({hint.stages // hint.ranks} per rank)"
        )
    return {s: modules[s] for s in hint.placement.stages_of(layout_of(mesh).position_of(dist.get_rank()))}


def sequential_stages(model: nn.Sequential, split: Sequence[int]) -> list[nn.Module]:
    """``model`` cut before each index in ``split``; its slices keep the model's layer names.

    Raises:
        ValueError: split points that do not increase strictly within the model.
    """
    bounds = [0, *split, len(model)]
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"split points {list(split)} must increase strictly within 1..{len(model) - 1}")
    return [model[a:b] for a, b in itertools.pairwise(bounds)]


@dataclasses.dataclass(frozen=True)
class PlannedStages:
    """This rank's stages of a plan and what the plan implies for its pipeline.

    Attributes:
        modules: its stages, with parameters of their own.
        config: the pipeline's config with the plan's hint, its tied parameters (unless given) and, where no room
            option was given, this rank's activation budget from the plan's memory budget.
        budget_from_plan: whether that budget is the plan's (no room option given).
        names: the model's names for the stages' tensors.
    """

    modules: dict[int, nn.Module]
    config: PipelineConfig
    budget_from_plan: bool
    names: ModelNames


def planned_stages(plan: Plan, config: PipelineConfig) -> PlannedStages:
    """This rank's stages of ``plan``, built with parameters of their own, and the config the plan implies.

    Raises:
        ValueError: a plan for another number of ranks, or captured for float32 alone under ``precision="bf16"``.
        OptionMismatch: ranks holding different plans.
    """
    layout = layout_of(config.mesh)
    if layout.pp != plan.ranks:
        raise ValueError(f"the plan is for {plan.ranks} ranks, the pipeline has {layout.pp}")
    hint = resolve_hint(plan.hint, plan.ranks, plan.microbatches, plan.chunks)
    mine = hint.placement.stages_of(layout.position_of(dist.get_rank()))
    room_given = (
        bool(config.slack_microbatches)
        or config.activation_budget is not None
        or config.device_budget_fraction is not None
    )
    budget = config.activation_budget
    if not room_given and config.emulate is None and math.isfinite(room := plan.activation_room(mine)):
        budget = room
    tied = config.tied or [TiedParameter(n, s) for n, s in zip(plan.tied, plan.tied_stages, strict=True)]
    _same_plan(plan)  # (before the refusals that depend on the plan: every rank then refuses alike)
    if config.precision is Precision.BF16 and not plan.graph.follows_autocast:
        raise ValueError(
            "the plan was captured for float32 alone (plan(..., autocast=False)), and precision bf16 runs its "
            "stages under a bfloat16 autocast: plan with autocast=True"
        )
    # The stages get parameters of their own, copied together (a tensor two of them share stays one): the plan
    # keeps its own, so one plan object can build several pipelines.
    modules = copy.deepcopy({s: plan.build_stage(s) for s in mine})
    names = ModelNames.of_model(plan.graph.state_keys, plan.tied)
    implied = dataclasses.replace(config, hint=hint, activation_budget=budget, tied=tied)
    return PlannedStages(modules, implied, not room_given, names)


def _same_plan(plan: Plan) -> None:
    """Refuse to start when ranks hold different plans (each rank planning for itself)."""
    mine = plan.fingerprint
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    others = [rank for rank, theirs in enumerate(gathered) if theirs != mine]
    if others:
        raise OptionMismatch(
            f"rank {dist.get_rank()}: ranks {others} hold another plan than this rank's (fingerprint {mine}); "
            "make the plan once and share it: plan.share(), or one plan file loaded on every rank"
        )
