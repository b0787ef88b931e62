"""Which stage modules a rank builds its pipeline from: its share of a list of all stages, or its stages of a
plan (with the options the plan implies), checked against every other rank's."""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn

from hintpipe.options import OPTIONS
from hintpipe.runtime.assembly import layout_of
from hintpipe.runtime.errors import OptionMismatch
from hintpipe.runtime.model_names import ModelNames
from hintpipe.runtime.parallel.tied import TiedParameter
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.resolve import resolve_hint

if TYPE_CHECKING:
    from hintpipe.planner.plan import Plan


def pipeline_hint(options: Mapping[str, Any]) -> Hint:
    """The hint the pipeline's options name (``hint``, ``microbatches``, ``chunks``; the default where one is not
    given), resolved for its ranks (the ``mesh``'s pipeline length, or the world): the one resolution of the
    constructor's and of :func:`stages_of_this_rank`'s, which needs the stage count before the constructor runs.

    Raises:
        ValueError, HintError: as :func:`~hintpipe.schedule.resolve.resolve_hint`.
    """
    hint = options.get("hint", OPTIONS["hint"].default)
    return resolve_hint(hint, layout_of(options.get("mesh")).pp, options["microbatches"], options.get("chunks"))


def stages_of_this_rank(modules: Sequence[nn.Module], options: dict[str, Any]) -> dict[int, nn.Module]:
    """This rank's stages out of *all* stage ``modules`` (global order), by the hint of ``options`` (which give
    ``microbatches``); sets ``options["hint"]`` to the resolved hint, which the constructor then takes as it is.

    Raises:
        ValueError: a module count other than the hint's stage count.
    """
    layout = layout_of(options.get("mesh"))
    hint = pipeline_hint(options)
    if len(modules) != hint.num_stages:
        raise ValueError(
            f"got {len(modules)} stage modules; hint {hint.name!r} on {hint.ranks} ranks needs "
            f"{hint.num_stages} ({hint.num_stages // hint.ranks} per rank)"
        )
    options["hint"] = hint
    return {s: modules[s] for s in hint.placement.stages_of(layout.position_of(dist.get_rank()))}


def sequential_stages(model: nn.Sequential, split: Sequence[int], options: dict[str, Any]) -> list[nn.Module]:
    """``model`` cut before each index in ``split``; its slices keep the model's layer names, which
    ``options["names"]`` gets (unless given).

    Raises:
        ValueError: split points that do not increase strictly within the model.
    """
    bounds = [0, *split, len(model)]
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"split points {list(split)} must increase strictly within 1..{len(model) - 1}")
    options.setdefault("names", ModelNames.of_model(tuple(model.state_dict()), ()))
    return [model[a:b] for a, b in itertools.pairwise(bounds)]


def planned_stages(plan: Plan, options: dict[str, Any]) -> tuple[dict[int, nn.Module], bool]:
    """This rank's stages of ``plan``, built with parameters of their own, and whether its activation budget
    comes from the plan's memory budget (no budget option given); fills in the options the plan implies
    (hint, tied parameters, the model's names, the activation budget).

    Raises:
        ValueError: a plan for another number of ranks.
        OptionMismatch: ranks holding different plans.
    """
    layout = layout_of(options.get("mesh"))
    if layout.pp != plan.ranks:
        raise ValueError(f"the plan is for {plan.ranks} ranks, the pipeline has {layout.pp}")
    hint = resolve_hint(plan.hint, plan.ranks, plan.microbatches, plan.chunks)
    mine = hint.placement.stages_of(layout.position_of(dist.get_rank()))
    from_budget = not {"memory_slack", "activation_budget", "device_budget"} & set(options)
    if from_budget and options.get("emulate") is None and math.isfinite(room := plan.activation_room(mine)):
        options["activation_budget"] = room
    options["hint"] = hint
    options.setdefault("tied", [TiedParameter(n, s) for n, s in zip(plan.tied, plan.tied_stages, strict=True)])
    _same_plan(plan)
    options.setdefault("names", ModelNames.of_model(plan.graph.state_keys, plan.tied))
    # The stages get parameters of their own, copied together (a tensor two of them share stays one): the plan
    # keeps its own, so one plan object can build several pipelines.
    return copy.deepcopy({s: plan.build_stage(s) for s in mine}), from_budget


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
