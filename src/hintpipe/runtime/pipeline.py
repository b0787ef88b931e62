"""The public runtime: :class:`Pipeline`, one per rank.

Training semantics are those of the unsplit model: the loss of micro-batch
``i`` is ``loss_fn(output_i, target_i) / D`` with ``D`` the number of
micro-batches (mean over micro-batches, the same as one mean-reduced loss over
the whole batch when micro-batches are equal) or a divisor the caller gives
(e.g. the step's token count, with a sum-reduced ``loss_fn``). Gradients are
accumulated into ``.grad`` and never rescaled, so calling :meth:`Pipeline.step`
twice without zeroing gives exactly twice one step's gradient. The optimizer
step stays the caller's.

:class:`Pipeline` is a facade: it checks its options (:mod:`hintpipe.options`),
shows its parts (built once by :mod:`hintpipe.runtime.assembly` into one frozen
:class:`~hintpipe.runtime.parts.Parts`) and hands each step to its
:class:`~hintpipe.runtime.engine.StepEngine`, which splits the batch
(:mod:`hintpipe.runtime.loop.microbatch`), calls ``begin_step`` on every step
hook, runs the :class:`~hintpipe.runtime.loop.step_loop.StepLoop`, then
``end_step`` on every hook (:mod:`hintpipe.runtime.loop.hooks`: reductions,
admission, the ranks' agreement, the report). Only the first step starts with a
barrier: later ones were synchronised by the previous step's collectives, and a
rank that runs ahead into the next step only fills its neighbours' inboxes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.dispatch.fit import BudgetError
from hintpipe.dispatch.policy import Policy
from hintpipe.modes import DataParallel, OnNonFinite, TransportChoice
from hintpipe.options import RENAMED_OPTIONS, PipelineConfig
from hintpipe.renamed import renamed, retired_attribute
from hintpipe.runtime.assembly import assemble
from hintpipe.runtime.clipping import clip_grad_norm
from hintpipe.runtime.engine import StepEngine
from hintpipe.runtime.errors import NonFiniteLoss
from hintpipe.runtime.loop.coordination import Coordination
from hintpipe.runtime.loop.executor import Executor, LossFn
from hintpipe.runtime.loop.microbatch import Batch
from hintpipe.runtime.loop.reports import StepReport
from hintpipe.runtime.loop.weight_deferral import restore_linear_weights
from hintpipe.runtime.model_names import ModelNames
from hintpipe.runtime.parallel.mesh import Layout
from hintpipe.runtime.parts import Parts, Seams
from hintpipe.runtime.planned_stages import pipeline_hint, planned_stages, sequential_stages, stages_of_this_rank
from hintpipe.runtime.rank_entry import tie_to_agent
from hintpipe.runtime.transport.protocol import Transport
from hintpipe.runtime.weights import gather_state_dict
from hintpipe.schedule.hint import Hint

if TYPE_CHECKING:
    from hintpipe.planner.plan import Plan

__all__ = ["BudgetError", "DataParallel", "NonFiniteLoss", "OnNonFinite", "Pipeline", "PipelineConfig", "StepReport"]


def configured(config: PipelineConfig | None, microbatches: int | None, keywords: dict[str, Any]) -> PipelineConfig:
    """The pipeline's config: ``config``'s pipeline options (a subclass's own, a run's, left out) with the
    constructor's ``keywords`` given beside it, or the keywords alone: the one object the assembly and the loop
    then read.

    Raises:
        TypeError: an option the pipeline does not take, or no ``microbatches``.
        ValueError: as :class:`~hintpipe.options.PipelineConfig` refuses a value.
    """
    known = {f.name for f in dataclasses.fields(PipelineConfig)}
    unknown = next((name for name in keywords if name not in known), None)
    if unknown is not None:  # as Python says it of a keyword the signature lacks
        raise TypeError(f"Pipeline.__init__() got an unexpected keyword argument {unknown!r}")
    if microbatches is not None:
        keywords = {**keywords, "microbatches": microbatches}
    if config is not None:
        if type(config) is PipelineConfig:
            return dataclasses.replace(config, **keywords) if keywords else config
        return config.pipeline_options(**keywords)
    if "microbatches" not in keywords:
        raise TypeError("a Pipeline needs microbatches= (or a config= that says them)")
    return PipelineConfig(**keywords)


#: The pipeline's parts it shows as attributes of its own, each fixed once it is built (see
#: :meth:`Pipeline.__setattr__`).
PARTS_SHOWN = (
    "hint",
    "rank",
    "global_rank",
    "layout",
    "stages",
    "modules",
    "microbatches",
    "policy",
    "device",
    "transport",
    "replica_group",
    "coordination",
    "executor",
    "carrier",
)


class Pipeline:
    """Pipeline-parallel training of one model across the ranks of a process group.

    Call on every rank after ``torch.distributed.init_process_group``. Every option is a field of
    :class:`~hintpipe.options.PipelineConfig`, described once there (the command line's ``--help`` reads the
    same text): give a config, its fields as keywords, or both (the keywords then replace the config's).

    Args:
        modules: this rank's stages, global stage id -> module (:meth:`from_modules` takes the whole list,
            :meth:`from_plan` a plan).
        loss_fn: ``loss_fn(output, target)`` of one micro-batch, a scalar.
        microbatches: micro-batches per step (or the config's).
        config: the options, checked (:class:`~hintpipe.options.PipelineConfig`).
        seams: what is built in beside the options: injected variability and faults, tests' ways in (see
            :class:`~hintpipe.runtime.parts.Seams`); no public option.
        names: the model's names for the stages' tensors (:meth:`from_plan` and :meth:`from_sequential` fill it
            in; stages given as modules are named ``<stage>.<name>``).
        options: any field of :class:`~hintpipe.options.PipelineConfig` by name (``hint``, ``policy``, the room
            a rank has for activations in flight: ``slack_microbatches``, ``activation_budget`` or
            ``device_budget_fraction`` with ``admission``, see :mod:`hintpipe.runtime.loop.admission`; ``mesh``,
            ``device``, ...); an option's name before a rename (:data:`~hintpipe.options.RENAMED_OPTIONS`) is
            still taken, with a ``DeprecationWarning``, here and by the other constructors.

    Raises:
        TypeError: an option the pipeline does not take, or no ``microbatches``.
        ValueError: for options out of range or that contradict each other or the group.
        OptionMismatch: when ranks were started with different options.
    """

    @renamed("Pipeline", **RENAMED_OPTIONS)
    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        *,
        loss_fn: LossFn,
        microbatches: int | None = None,
        config: PipelineConfig | None = None,
        seams: Seams | None = None,
        names: ModelNames | None = None,
        **options: Any,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("call torch.distributed.init_process_group before building a Pipeline")
        # A group of the caller's own under torchrun too: see [Note: ranks never outlive torchrun's agent].
        tie_to_agent()
        config = configured(config, microbatches, options)
        hint = pipeline_hint(config)
        #: The pipeline's options, checked (a frozen :class:`~hintpipe.options.PipelineConfig`), its hint resolved.
        self.config = config if config.hint is hint else dataclasses.replace(config, hint=hint)
        parts = assemble(modules, hint, loss_fn=loss_fn, config=self.config, seams=seams or Seams())
        #: What the pipeline is made of (one frozen :class:`~hintpipe.runtime.parts.Parts`).
        self.parts: Parts = parts
        #: The model's names for the stages' tensors (checkpoints and :meth:`state_dict` speak them).
        self.names = names if names is not None else ModelNames()
        self._engine = StepEngine(parts, self.config)
        # Its parts, shown as the pipeline's own (read-only: see __setattr__).
        self.hint: Hint = parts.hint
        self.rank: int = parts.rank  #: this rank's position in its pipeline (the hint's rank)
        self.global_rank: int = parts.global_rank
        self.layout: Layout = parts.layout  #: where this rank sits in data x pipeline x tensor parallelism
        self.stages: tuple[int, ...] = parts.stages  #: the stages this rank hosts
        self.modules: dict[int, nn.Module] = parts.modules  #: its stages, on its device (sharded by FSDP2)
        self.microbatches: int = parts.microbatches
        self.policy: Policy = parts.policy
        self.device: torch.device = parts.device
        self.transport: TransportChoice = parts.transport_choice  #: the option, resolved; the object: carrier
        #: The ranks holding this rank's stages in the other data-parallel replicas (None without replicas).
        self.replica_group: dist.ProcessGroup | None = parts.replica_group
        #: This rank's part in its tensor-parallel group's decisions (None where none are needed).
        self.coordination: Coordination | None = parts.coordination
        #: What runs this rank's tasks (an injection given as ``seams=Seams(injection=...)`` is built in around it).
        self.executor: Executor = parts.executor
        #: What carries its messages (:class:`~hintpipe.runtime.transport.protocol.Transport`, of the kind
        #: ``transport`` names; an injected delay or a test's watch built in around it).
        self.carrier: Transport = parts.carrier

    def __setattr__(self, name: str, value: object) -> None:
        """Set an attribute, but a part once shown: a pipeline's parts are fixed when it is built (assigning one
        here would replace it for this object's readers alone, not the step loop's or the hooks')."""
        if name in PARTS_SHOWN and name in self.__dict__:
            raise AttributeError(f"Pipeline.{name} is read-only: a pipeline's parts are fixed when it is built")
        object.__setattr__(self, name, value)

    @property
    def step_count(self) -> int:
        """Training steps run so far (a resumed run's count on from its checkpoint's)."""
        return self._engine.steps

    @step_count.setter
    def step_count(self, steps: int) -> None:
        self._engine.steps = steps

    @property
    def ranks(self) -> int:
        """The pipeline's length: its ranks (one process each)."""
        return self.parts.layout.pp

    @property
    def hint_name(self) -> str:
        return self.parts.hint.name

    @property
    def reports(self) -> list[StepReport]:
        """The last ``history`` steps' reports (every rank's on rank 0, this rank's elsewhere)."""
        return self.parts.reporting.reports

    @property
    def messages(self) -> Transport:
        """Deprecated: :attr:`carrier` (its name in 0.6), read-only as it is."""
        retired_attribute("Pipeline.messages", "Pipeline.carrier")
        return self.carrier

    @property
    def post_office(self) -> Transport:
        """Deprecated: :attr:`carrier` (its name before 0.7's release), read-only as it is."""
        retired_attribute("Pipeline.post_office", "Pipeline.carrier")
        return self.carrier

    @property
    def nonfinite_steps(self) -> list[int]:
        """Steps that had a non-finite loss (skipped, under ``on_nonfinite="skip"``)."""
        return self.parts.agreement.nonfinite_steps

    # -- building ---------------------------------------------------------------

    @classmethod
    @renamed("Pipeline.from_modules", **RENAMED_OPTIONS)
    def from_modules(
        cls,
        modules: Sequence[nn.Module],
        *,
        loss_fn: LossFn,
        microbatches: int | None = None,
        config: PipelineConfig | None = None,
        seams: Seams | None = None,
        names: ModelNames | None = None,
        **options: Any,
    ) -> Pipeline:
        """Build from the list of *all* stage modules (global order); each rank keeps its own. Takes what
        the constructor takes (``config=``, keywords)."""
        config = configured(config, microbatches, options)
        hint = pipeline_hint(config)
        mine = stages_of_this_rank(modules, hint, config.mesh)
        return cls(mine, loss_fn=loss_fn, config=dataclasses.replace(config, hint=hint), seams=seams, names=names)

    @classmethod
    @renamed("Pipeline.from_plan", **RENAMED_OPTIONS)
    def from_plan(
        cls,
        plan: Plan,
        *,
        loss_fn: LossFn,
        microbatches: int | None = None,
        config: PipelineConfig | None = None,
        seams: Seams | None = None,
        names: ModelNames | None = None,
        **options: Any,
    ) -> Pipeline:
        """Build from a :class:`~hintpipe.planner.plan.Plan`: each rank builds its planned stages.

        Unless ``slack_microbatches`` (above 0), ``activation_budget`` or ``device_budget_fraction`` is given, a plan
        made under a memory budget gives each rank a byte budget for activations: its stages' planned activations
        plus their spare memory (budget minus planned peak), so the memory the planner frees becomes
        room to run ahead, admitted by each micro-batch's own size. If the hint's own order turns out
        to hold more than the plan predicted, the rank runs the hint without running ahead. Parameters
        the plan found tied across stages are kept equal (``tied``, unless given). The stages train parameters
        of their own (copies of the plan's), so one plan object can build several pipelines. Micro-batches: the
        plan's, unless given.
        """
        if microbatches is None and "microbatches" not in options and config is None:
            microbatches = plan.microbatches
        planned = planned_stages(plan, configured(config, microbatches, options))
        seams = dataclasses.replace(seams or Seams(), budget_from_plan=planned.budget_from_plan)
        names = names if names is not None else planned.names
        return cls(planned.modules, loss_fn=loss_fn, config=planned.config, seams=seams, names=names)

    @classmethod
    @renamed("Pipeline.from_sequential", **RENAMED_OPTIONS)
    def from_sequential(
        cls,
        model: nn.Sequential,
        split: Sequence[int],
        *,
        loss_fn: LossFn,
        microbatches: int | None = None,
        config: PipelineConfig | None = None,
        seams: Seams | None = None,
        names: ModelNames | None = None,
        **options: Any,
    ) -> Pipeline:
        """Cut ``model`` before each index in ``split`` (``[2, 4]``: layers 0-1, 2-3, 4-); the stages' tensors are
        named as the model names them (unless ``names`` is given)."""
        stages = sequential_stages(model, split)
        names = names if names is not None else ModelNames.of_model(tuple(model.state_dict()), ())
        config = configured(config, microbatches, options)
        return cls.from_modules(stages, loss_fn=loss_fn, config=config, seams=seams, names=names)

    # -- one step ---------------------------------------------------------------

    def step(
        self,
        inputs: Batch | None = None,
        target: Batch | None = None,
        *,
        loss_divisor: float | None = None,
        broadcast_loss: bool = False,
        ends: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> torch.Tensor | None:
        """Run forward and backward of every micro-batch; gradients land in ``.grad``.

        Args:
            inputs: the batch (split equally along dim 0) or a list of
                micro-batches; needed on the rank of stage 0 only.
            target: the same for targets; needed on the rank of the last stage.
            loss_divisor: each micro-batch loss is divided by this (default:
                the number of micro-batches).
            broadcast_loss: return the loss on every rank, not just the last stage's.
            ends: under ``microbatch_order="front-then-back"``, each micro-batch's known
                work at the first stage and at the last, in any unit each (a vision-language
                model: its images and its tokens); read on the rank of stage 0. Without it
                each micro-batch's input elements stand for both ends (shortest-first).

        Returns:
            The step's loss (sum of the scaled micro-batch losses) on the rank
            of the last stage (every rank with ``broadcast_loss``), else None.

        Raises:
            WatchdogTimeout: a rank waited ``timeout`` seconds with nothing ready.
            PeerFailure: a neighbour failed or vanished.
            NonFiniteLoss: a loss was NaN or infinite (``on_nonfinite="raise"``).
        """
        return self._engine.step(inputs, target, loss_divisor, broadcast_loss, ends)

    def eval_step(
        self,
        inputs: Batch | None = None,
        target: Batch | None = None,
        *,
        loss_divisor: float | None = None,
        broadcast_loss: bool = False,
    ) -> torch.Tensor | None:
        """Run the forwards of every micro-batch, in the hint's order as they become ready, without gradients
        (modules in eval mode, the training precision); the arguments and the loss are :meth:`step`'s. Nothing
        is kept for a backward, no gradient changes, and the step count stays.

        Raises:
            WatchdogTimeout, PeerFailure: as :meth:`step`.
        """
        return self._engine.evaluate(inputs, target, loss_divisor, broadcast_loss)

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` of the whole model, across every rank of every axis (call on every
        rank after :meth:`step`, before the optimizer's): each parameter counted once, however it is sharded,
        replicated or tied; returns the norm before clipping, the same on every rank.

        Raises:
            ValueError: ``max_norm`` negative or ``norm_type`` not positive.
        """
        return clip_grad_norm(self.parts, max_norm, norm_type)

    # -- the model's weights ------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters and buffers by the model's own names, on the CPU, on every rank (call on
        every rank): a tied tensor under each of its names, shards put together, ready for
        ``model.load_state_dict(state, strict=True)`` on the unsplit model (or a Hugging Face model's
        ``save_pretrained``). Stages given as modules are named ``<stage>.<name>``, a sequential's layers by
        their index in it.

        Raises:
            ValueError: a name of the model that no rank holds.
        """
        return gather_state_dict(self.parts, self.names)

    # -- shutdown ------------------------------------------------------------------

    def close(self) -> None:
        """Tell the neighbours this rank is done and stop its mailboxes; the stages' layers are given their own
        ``forward`` back (a split hint's deferral is undone: see
        :func:`~hintpipe.runtime.loop.weight_deferral.restore_linear_weights`)."""
        self._engine.close()
        self._restore_layers()

    def _restore_layers(self) -> None:
        for module in self.modules.values():
            restore_linear_weights(module)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        # Leaving on an error (the caller's own, between steps) tells the neighbours at once, as a failed step
        # does: a graceful close would wait for them to close too, while they may wait for this rank.
        if error is not None:
            self._engine.abort(error)
            self._restore_layers()
        else:
            self.close()
