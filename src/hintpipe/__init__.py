"""hintpipe: readiness-driven pipeline-parallel training for PyTorch.

The public API is importable from here, so that user code does not depend on
the package's layout::

    import hintpipe
    plan = hintpipe.plan(model, example, ranks=2, microbatches=8)
    pipe = hintpipe.Pipeline.from_plan(plan, loss_fn=loss_fn)

The scheduling core (tasks and hints in ``schedule``, the scoreboard and the rest
of the state machine in ``dispatch``, the simulator in ``sim``) imports no torch;
the runtime and the planner do, and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, Placement
from hintpipe.schedule.task import Kind, Task

if TYPE_CHECKING:
    from hintpipe.apps.batches import held_out_batches
    from hintpipe.apps.corpus import token_sequences
    from hintpipe.apps.text_files import TextCorpus, text_corpus
    from hintpipe.dispatch.cost_model import CostModel
    from hintpipe.forming.collate import FormedBatch, form_batch
    from hintpipe.forming.cost import SequenceCost
    from hintpipe.forming.form import Formation, form_microbatches
    from hintpipe.forming.profiled import profile_sequence_cost
    from hintpipe.observe.step_record import StepRecord
    from hintpipe.options import PipelineConfig
    from hintpipe.planner.capture import CaptureError, split_point
    from hintpipe.planner.plan import Plan, plan, share_plan
    from hintpipe.planner.plan_file import load_plan, save_plan
    from hintpipe.planner.stage_timing import measure_stages
    from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
    from hintpipe.runtime.checkpoint.description import hf_description
    from hintpipe.runtime.checkpoint.merged import load_merged
    from hintpipe.runtime.checkpoint.stopping import StopRequest
    from hintpipe.runtime.errors import (
        CheckpointError,
        NonFiniteLoss,
        OptionMismatch,
        PeerFailure,
        RankFailure,
        TaskError,
        WatchdogTimeout,
    )
    from hintpipe.runtime.launch import run_ranks
    from hintpipe.runtime.loop.emulated import EmulatedCosts
    from hintpipe.runtime.loop.reports import StepReport
    from hintpipe.runtime.parallel.tied import TiedParameter
    from hintpipe.runtime.pipeline import Pipeline
    from hintpipe.sampler import ReplicaSampler
    from hintpipe.sim.simulate import simulate

#: Public name -> the module defining it (imported on first use: most of them need torch).
_LAZY = {
    "Pipeline": "hintpipe.runtime.pipeline",
    "PipelineConfig": "hintpipe.options",
    "StepReport": "hintpipe.runtime.loop.reports",
    "EmulatedCosts": "hintpipe.runtime.loop.emulated",
    "TiedParameter": "hintpipe.runtime.parallel.tied",
    "Plan": "hintpipe.planner.plan",
    "plan": "hintpipe.planner.plan",
    "share_plan": "hintpipe.planner.plan",
    "split_point": "hintpipe.planner.capture",
    "CaptureError": "hintpipe.planner.capture",
    "load_plan": "hintpipe.planner.plan_file",
    "save_plan": "hintpipe.planner.plan_file",
    "measure_stages": "hintpipe.planner.stage_timing",
    "Checkpointer": "hintpipe.runtime.checkpoint.checkpointer",
    "load_merged": "hintpipe.runtime.checkpoint.merged",
    "hf_description": "hintpipe.runtime.checkpoint.description",
    "StopRequest": "hintpipe.runtime.checkpoint.stopping",
    "run_ranks": "hintpipe.runtime.launch",
    "CheckpointError": "hintpipe.runtime.errors",
    "NonFiniteLoss": "hintpipe.runtime.errors",
    "OptionMismatch": "hintpipe.runtime.errors",
    "PeerFailure": "hintpipe.runtime.errors",
    "RankFailure": "hintpipe.runtime.errors",
    "TaskError": "hintpipe.runtime.errors",
    "WatchdogTimeout": "hintpipe.runtime.errors",
    "ReplicaSampler": "hintpipe.sampler",
    "SequenceCost": "hintpipe.forming.cost",
    "Formation": "hintpipe.forming.form",
    "form_microbatches": "hintpipe.forming.form",
    "FormedBatch": "hintpipe.forming.collate",
    "form_batch": "hintpipe.forming.collate",
    "profile_sequence_cost": "hintpipe.forming.profiled",
    "TextCorpus": "hintpipe.apps.text_files",
    "text_corpus": "hintpipe.apps.text_files",
    "token_sequences": "hintpipe.apps.corpus",
    "held_out_batches": "hintpipe.apps.batches",
    "StepRecord": "hintpipe.observe.step_record",
    "simulate": "hintpipe.sim.simulate",
    "CostModel": "hintpipe.dispatch.cost_model",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hintpipe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CaptureError",
    "CheckpointError",
    "Checkpointer",
    "CostModel",
    "EmulatedCosts",
    "Formation",
    "FormedBatch",
    "Hint",
    "Kind",
    "NonFiniteLoss",
    "OptionMismatch",
    "PeerFailure",
    "Pipeline",
    "PipelineConfig",
    "Placement",
    "Plan",
    "Policy",
    "RankFailure",
    "ReplicaSampler",
    "Scoreboard",
    "SequenceCost",
    "StepRecord",
    "StepReport",
    "StopRequest",
    "Task",
    "TaskError",
    "TextCorpus",
    "TiedParameter",
    "WatchdogTimeout",
    "form_batch",
    "form_microbatches",
    "generate_hint",
    "held_out_batches",
    "hf_description",
    "load_merged",
    "load_plan",
    "measure_stages",
    "plan",
    "profile_sequence_cost",
    "run_ranks",
    "save_plan",
    "share_plan",
    "simulate",
    "split_point",
    "text_corpus",
    "token_sequences",
]
