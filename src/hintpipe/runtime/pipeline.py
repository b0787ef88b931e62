"""The public runtime: :class:`Pipeline`, one per rank.

Training semantics are those of the unsplit model: the loss of micro-batch
``i`` is ``loss_fn(output_i, target_i) / D`` with ``D`` the number of
micro-batches (mean over micro-batches, the same as one mean-reduced loss over
the whole batch when micro-batches are equal) or a divisor the caller gives
(e.g. the step's token count, with a sum-reduced ``loss_fn``). Gradients are
accumulated into ``.grad`` and never rescaled, so calling :meth:`Pipeline.step`
twice without zeroing gives exactly twice one step's gradient. The optimizer
step stays the caller's.

A step: (with a byte budget) every rank learns each micro-batch's size, runs
its :class:`~hintpipe.runtime.step_loop.StepLoop`, and then agrees with the
others in one small all-reduce on the measured per-stage costs (the ``ready``
plan) and on whether any loss was non-finite; rank 0 gathers the step's report
(:mod:`hintpipe.runtime.reports`). Only the first step starts with a barrier:
later ones were synchronised by the previous step's all-reduce, and a rank
that runs ahead into the next step only fills its neighbours' inboxes.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hintpipe.choice import Choice
from hintpipe.runtime.admission import Admission, broadcast_sizes
from hintpipe.runtime.collective import one_line
from hintpipe.runtime.coordination import Coordination, needed
from hintpipe.runtime.data_parallel import GradientAverage, ReducingExecutor
from hintpipe.runtime.device import (
    allocated_probe,
    own_gpu,
    peak_memory,
    rank_device,
    reset_peak_memory,
    to_device,
)
from hintpipe.runtime.errors import NonFiniteLoss, OptionMismatch, WatchdogTimeout
from hintpipe.runtime.executor import EmulatedCosts, EmulatedExecutor, Executor, LossFn, StageExecutor
from hintpipe.runtime.fsdp import ShardedExecutor, shard_stages
from hintpipe.runtime.links import Link, LinkPostOffice
from hintpipe.runtime.mailbox import PostOffice
from hintpipe.runtime.mesh import Layout
from hintpipe.runtime.microbatch import Batch, as_inputs, split_microbatches
from hintpipe.runtime.ready_plan import ReadyPlanner
from hintpipe.runtime.reports import RankSummary, StepReport, durations_array, gather_report
from hintpipe.runtime.staging import new_event
from hintpipe.runtime.step_loop import StepLoop, StepState
from hintpipe.runtime.tied import TiedGradients, TiedParameter
from hintpipe.runtime.timing import DeviceTimer, Event
from hintpipe.runtime.transport import Transport, TransportChoice, choose_transport
from hintpipe.runtime.wire import Message
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, HintName
from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order
from hintpipe.scoreboard import BudgetError, Policy, Scoreboard
from hintpipe.sim.expected import stage_medians

if TYPE_CHECKING:
    from hintpipe.planner.plan import Plan

log = logging.getLogger(__name__)

__all__ = [
    "BudgetError",
    "DataParallel",
    "NonFiniteLoss",
    "OnNonFinite",
    "Pipeline",
    "PipelineOptions",
    "StepReport",
]


class OnNonFinite(Choice):
    """What a NaN or infinite loss does: ``raise`` stops the step with :class:`NonFiniteLoss`;
    ``skip`` finishes it, zeroes every rank's gradients and lists it in :attr:`Pipeline.nonfinite_steps`."""

    RAISE = "raise"
    SKIP = "skip"

    @classmethod
    def noun(cls) -> str:
        return "on_nonfinite"


class DataParallel(Choice):
    """How data-parallel replicas keep their stages equal: ``replicate`` (every replica holds the whole
    stage; gradients all-reduced, see :mod:`hintpipe.runtime.data_parallel`) or ``fsdp`` (parameters
    sharded over the replicas by FSDP2, see :mod:`hintpipe.runtime.fsdp`)."""

    REPLICATE = "replicate"
    FSDP = "fsdp"

    @classmethod
    def noun(cls) -> str:
        return "data_parallel"


class PipelineOptions(TypedDict, total=False):
    """The optional keyword arguments of :class:`Pipeline` (and of its ``from_*`` constructors)."""

    hint: str | Hint
    policy: str | Policy
    chunks: int | None
    memory_slack: float
    memory_budget: float | None
    device_budget: float | None
    timeout: float
    emulate: EmulatedCosts | None
    on_nonfinite: str | OnNonFinite
    history: int
    timelines: bool
    report_every: int
    tied: Sequence[TiedParameter]
    mesh: DeviceMesh | None
    data_parallel: str | DataParallel
    microbatch_order: str | MicrobatchOrder
    device: str | torch.device | None
    transport: str | TransportChoice


class Pipeline:
    """Pipeline-parallel training of one model across the ranks of a process group.

    Call on every rank after ``torch.distributed.init_process_group``.

    Args:
        modules: this rank's stages, global stage id -> module (see
            :meth:`from_modules` to pass the whole list).
        loss_fn: ``loss_fn(output, target)`` of one micro-batch, a scalar.
        microbatches: micro-batches per step.
        hint: a generator name or a :class:`~hintpipe.schedule.hint.Hint`.
        policy: ``fixed``, ``greedy`` or ``ready``.
        chunks: stages per rank (interleaved schedules); default the hint's own.
        memory_slack: room for this many more in-flight micro-batches than
            the hint's own peak (activation slots), spent by running ahead.
        memory_budget: activation bytes this rank may hold, instead of
            ``memory_slack`` (see [Note: byte admission] in
            :mod:`hintpipe.runtime.admission`).
        device_budget: instead of either, every rank may hold as many
            micro-batches as the hint's busiest rank holds, times ``1 +
            device_budget`` (0: just as many): equal devices lend the later
            ranks' idle memory to running ahead, and no device holds more
            than the fixed-order pipeline's busiest one (plus the headroom).
        timeout: seconds a rank may wait with nothing ready before the
            watchdog ends the step with an error on every rank.
        emulate: sleep these costs instead of computing (for more ranks than
            cores); the modules are then not run.
        on_nonfinite: see :class:`OnNonFinite`.
        history: how many steps' reports to keep.
        timelines: gather every rank's task timeline to rank 0 each step
            (traces, pictures, predictions); otherwise only summaries travel.
        report_every: gather every rank's summary to rank 0 every this many
            steps (0: never); the other steps' reports cover their own rank.
        tied: parameters shared by stages on different ranks, kept equal
            (see :mod:`hintpipe.runtime.tied`); :meth:`from_plan` fills it in.
        mesh: a DeviceMesh with dimensions named from ``dp``, ``pp`` (the
            pipeline) and ``tp`` (see :mod:`hintpipe.runtime.mesh`); each rank
            is then a stage rank of the pipeline at its ``(dp, tp)``
            coordinate, and ranks at the same position in different ``dp``
            replicas average their stages' gradients each step (see
            :mod:`hintpipe.runtime.data_parallel`). Default: the whole world is
            one pipeline.
        data_parallel: see :class:`DataParallel` (with a mesh that has ``dp``).
        microbatch_order: the order a step runs its micro-batches in, by their sizes (input elements, known to
            stage 0): see :class:`MicrobatchOrder` and [Note: micro-batch order].
        device: where this rank computes: ``cpu`` (default), ``cuda`` (the rank's GPU), ``auto`` (its GPU
            where CUDA is available) or a ``torch.device`` (see :mod:`hintpipe.runtime.device`). The stage
            modules are moved there, and so are the inputs, targets and received tensors.
        transport: how messages travel between ranks: ``gloo`` (host memory; a GPU's tensors staged
            through pinned buffers), ``nccl`` (headers over gloo, payloads GPU to GPU) or ``auto``
            (``nccl`` where every rank has a GPU of its own): see :mod:`hintpipe.runtime.transport`.

    Raises:
        ValueError: for options that contradict each other or the group.
        OptionMismatch: when ranks were started with different options.
    """

    #: Tensor-parallel members share one decision per task (see :mod:`hintpipe.runtime.coordination`). Tests
    #: alone turn this off, to show what goes wrong without it; no option reaches it.
    _coordinate_tp = True
    #: Tests alone set this to ``"gloo"``: the NCCL transport's code path, with its payload links on gloo, on
    #: CPU ranks (see :mod:`hintpipe.runtime.links`).
    _link_backend: str | None = None
    #: Tests alone set this: timing events for a CPU rank, to run the GPU's task timing (see
    #: :mod:`hintpipe.runtime.timing`) where there is no GPU.
    _timing_events: Callable[[], Event] | None = None

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        *,
        loss_fn: LossFn,
        microbatches: int,
        hint: str | Hint = "1f1b",
        policy: str | Policy = Policy.READY,
        chunks: int | None = None,
        memory_slack: float = 0.0,
        memory_budget: float | None = None,
        device_budget: float | None = None,
        timeout: float = 300.0,
        emulate: EmulatedCosts | None = None,
        on_nonfinite: str | OnNonFinite = OnNonFinite.RAISE,
        history: int = 100,
        timelines: bool = False,
        report_every: int = 1,
        tied: Sequence[TiedParameter] = (),
        mesh: DeviceMesh | None = None,
        data_parallel: str | DataParallel = DataParallel.REPLICATE,
        microbatch_order: str | MicrobatchOrder = MicrobatchOrder.GIVEN,
        device: str | torch.device | None = None,
        transport: str | TransportChoice = TransportChoice.AUTO,
    ) -> None:
        _check_arguments(microbatches, history, report_every, timeout)
        _check_memory_arguments(memory_budget, device_budget, emulated=emulate is not None)
        self.layout = _layout(mesh)
        self.global_rank = dist.get_rank()
        #: This rank's position in its pipeline (the hint's rank), and the pipeline's length.
        self.rank = self.layout.position_of(self.global_rank)
        self.world = self.layout.stages_ranks
        self.policy = Policy.parse(policy)
        self.on_nonfinite = OnNonFinite.parse(on_nonfinite)
        self.hint = _resolve_hint(hint, self.world, microbatches, chunks)
        self.microbatches = microbatches
        self.stages = self.hint.placement.stages_of(self.rank)
        self._check_modules(modules)
        self.data_parallel = DataParallel.parse(data_parallel)
        self.microbatch_order = MicrobatchOrder.parse(microbatch_order)
        self.device = rank_device(device, self.global_rank)
        self.transport_choice = choose_transport(transport, self.device, own_gpu=self._agreed_own_gpu())
        self.modules = self._place(modules, mesh, emulated=emulate is not None)
        self.timeout = timeout
        self.timelines = timelines
        self.report_every = report_every
        self.history = history
        self.admission = Admission(self.hint, self.rank, memory_slack, memory_budget, device_budget=device_budget)
        #: What computes the tasks, before any wrapper (reductions, injected faults) goes round it.
        self._compute = self._computing(loss_fn, emulate)
        self.executor: Executor = self._compute
        self.transport: Transport = self._connect()
        self.timer = self._device_timer(emulated=emulate is not None)
        self._connect_axes(emulated=emulate is not None)
        self.tied = TiedGradients(tied, self.modules, self.hint.placement.stage_rank, self.rank, self.layout.pipelines)
        self.planner = ReadyPlanner(self.hint, self.rank)
        self._stash: list[Message] = []
        self.step_count = 0
        #: The last ``history`` steps' reports (bounded: a run of days must not grow).
        self.reports: list[StepReport] = []
        self.nonfinite_steps: list[int] = []
        self._closed = False
        self._started = False
        self._check_options(
            emulated=emulate is not None,
            byte_admission=memory_budget is not None,
            dp=self.layout.dp,
            tp=self.layout.tp,
            data_parallel=self.data_parallel.value,
            microbatch_order=self.microbatch_order.value,
            transport=self.transport_choice.value,
        )

    def _check_modules(self, modules: Mapping[int, nn.Module]) -> None:
        if sorted(modules) != list(self.stages):
            raise ValueError(
                f"rank {self.rank} hosts stages {list(self.stages)} under hint {self.hint.name!r}, got modules for "
                f"stages {sorted(modules)}"
            )

    def _computing(self, loss_fn: LossFn, emulate: EmulatedCosts | None) -> Executor:
        """The executor of this rank's tasks: its stages (checked against the allocator on a GPU), or sleeps."""
        last = self.hint.num_stages - 1
        if emulate is not None:
            return EmulatedExecutor(emulate, last)
        allocated = allocated_probe(self.device)
        return StageExecutor(self.modules, last, loss_fn, self.hint.split_backward, allocated=allocated)

    def _device_timer(self, *, emulated: bool) -> DeviceTimer | None:
        """Task times from CUDA events on a GPU rank (see :mod:`hintpipe.runtime.timing`); None: the wall clock."""
        if self._timing_events is not None:
            return DeviceTimer(self._timing_events)
        if self.device.type == "cuda" and not emulated:
            return DeviceTimer(lambda: new_event(timing=True))
        return None

    def _place(
        self, modules: Mapping[int, nn.Module], mesh: DeviceMesh | None, *, emulated: bool
    ) -> dict[int, nn.Module]:
        """This rank's stages on its device and, with FSDP2 over a ``dp`` axis, sharded (emulated stages never run:
        they stay where they are)."""
        if self.device.type != "cpu" and not emulated:
            for module in modules.values():
                module.to(self.device)
        placed = dict(modules)
        self.sharded = self.layout.dp > 1 and self.data_parallel is DataParallel.FSDP and not emulated
        if self.sharded:
            assert mesh is not None
            shard_stages(placed, mesh["dp"])
        return placed

    def _connect(self) -> Transport:
        """The process groups and the transport to the neighbours.

        Point-to-point traffic gets its own gloo group so that it never interleaves
        with the collectives of the default one; the runtime's collectives get a group
        whose timeout is the watchdog's, so a stuck rank cannot hold the others there.
        """
        p2p = self.layout.groups(self.layout.pipelines)
        coll = self.layout.groups(self.layout.pipelines, self.timeout)
        assert p2p is not None and coll is not None
        self._p2p, self._coll = p2p, coll
        stage_rank = self.hint.placement.stage_rank
        peers = {stage_rank[s + d] for s in self.stages for d in (-1, 1) if 0 <= s + d < self.hint.num_stages}
        notices = self.policy is Policy.READY
        backend = "nccl" if self.transport_choice is TransportChoice.NCCL else self._link_backend
        if backend is None:
            self._post_office = PostOffice(sorted(peers), self.device, group=self._p2p, notices=notices)
        else:
            outgoing, incoming = self._links(backend)
            self._post_office = LinkPostOffice(
                sorted(peers), self.device, self._p2p, outgoing=outgoing, incoming=incoming, notices=notices
            )
        return self._post_office

    def _links(self, backend: str) -> tuple[dict[int, Link], dict[int, Link]]:
        """A process group per directed pair of neighbouring ranks, in every pipeline (group creation is
        collective: every rank creates every link, in the same order); returns this rank's, by the peer's
        position (see [Note: NCCL links are deadlock-free] in :mod:`hintpipe.runtime.links`)."""
        stage_rank = self.hint.placement.stage_rank
        last = self.hint.num_stages - 1
        pairs = sorted(
            {(stage_rank[s], stage_rank[s + d]) for s in range(last + 1) for d in (-1, 1) if 0 <= s + d <= last}
            - {(a, a) for a in range(self.world)}
        )
        outgoing: dict[int, Link] = {}
        incoming: dict[int, Link] = {}
        # A transfer stuck on a dead peer fails after the watchdog's timeout (NCCL's own watchdog then ends the
        # rank) rather than NCCL's default of ten minutes.
        span = datetime.timedelta(seconds=self.timeout)
        for ranks in self.layout.pipelines:
            for a, b in pairs:
                group = dist.new_group([ranks[a], ranks[b]], backend=backend, timeout=span)
                if ranks[a] == self.global_rank:
                    outgoing[b] = Link(group, ranks[b])
                elif ranks[b] == self.global_rank:
                    incoming[a] = Link(group, ranks[a])
        return outgoing, incoming

    def _agreed_own_gpu(self) -> bool:
        """Whether every rank has a GPU to itself, agreed by all (the transport's links are created by all)."""
        if self.device.type != "cuda":
            return False
        flag = torch.tensor([int(own_gpu())], device=self.device)  # on the GPU: a default group may be NCCL alone
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def _connect_axes(self, *, emulated: bool) -> None:
        """The tensor-parallel group's coordination and the data-parallel reduction, when the mesh has them.

        Groups are created on every rank in the same order (they are collective).
        """
        self.coordination: Coordination | None = None
        if needed(self.policy, self.layout.tp) and self._coordinate_tp:
            group = self.layout.groups(self.layout.tensors)
            assert group is not None
            leader = self.layout.tensor_group_of(self.global_rank)[0]
            self.coordination = Coordination(group, self._post_office.inbox, leader)
        if emulated and self.layout.tp > 1:
            assert isinstance(self.executor, EmulatedExecutor)
            self.executor.couple = self._tensor_parallel_coupling()
        #: The ranks holding the same stages in the other data-parallel replicas (None without replicas).
        self.replica_group = self.layout.groups(self.layout.replicas, self.timeout) if self.layout.dp > 1 else None
        self.average: GradientAverage | None = None
        self._fsdp_executor: ShardedExecutor | None = None
        if self.sharded:
            split = self.hint.split_backward
            self._fsdp_executor = ShardedExecutor(self.executor, self.modules, self.microbatches, split)
            self.executor = self._fsdp_executor
        elif self.replica_group is not None and not emulated:
            split = self.hint.split_backward
            self.average = GradientAverage(
                self.modules, self.replica_group, self.layout.dp, self.microbatches, split, self.rank
            )
            self.executor = ReducingExecutor(self.executor, self.average)

    def _tensor_parallel_coupling(self) -> Callable[[], None]:
        """What ends an emulated task of a tensor-parallel stage: an all-reduce with the group's members
        (see :class:`EmulatedExecutor`), on a group of its own so that it never pairs with a decision."""
        group = self.layout.groups(self.layout.tensors, self.timeout)
        assert group is not None
        members = list(self.layout.tensor_group_of(self.global_rank))
        token = torch.zeros(1)

        def couple() -> None:
            try:
                dist.all_reduce(token, group=group)
            except RuntimeError as exc:
                raise WatchdogTimeout(
                    f"rank {self.global_rank}: the emulated task's all-reduce with tensor-parallel ranks {members} "
                    f"failed: {one_line(exc)}"
                ) from None

        return couple

    # -- building ---------------------------------------------------------------

    @classmethod
    def from_modules(
        cls, modules: Sequence[nn.Module], *, loss_fn: LossFn, microbatches: int, **options: Unpack[PipelineOptions]
    ) -> Pipeline:
        """Build from the list of *all* stage modules (global order); each rank keeps its own."""
        layout = _layout(options.get("mesh"))
        position = layout.position_of(dist.get_rank())
        hint = _resolve_hint(options.get("hint", "1f1b"), layout.stages_ranks, microbatches, options.get("chunks"))
        if len(modules) != hint.num_stages:
            raise ValueError(
                f"got {len(modules)} stage modules; hint {hint.name!r} on {hint.num_ranks} ranks needs "
                f"{hint.num_stages} ({hint.num_stages // hint.num_ranks} per rank)"
            )
        mine = {s: modules[s] for s in hint.placement.stages_of(position)}
        options["hint"] = hint
        return cls(mine, loss_fn=loss_fn, microbatches=microbatches, **options)

    @classmethod
    def from_plan(
        cls, plan: Plan, *, loss_fn: LossFn, microbatches: int | None = None, **options: Unpack[PipelineOptions]
    ) -> Pipeline:
        """Build from a :class:`~hintpipe.planner.plan.Plan`: each rank builds its planned stages.

        Unless ``memory_slack`` or ``memory_budget`` is given, a plan made under
        a memory budget gives each rank a byte budget for activations: its
        stages' planned activations plus their spare memory (budget minus
        planned peak), so the memory the planner frees becomes room to run
        ahead, admitted by each micro-batch's own size. If the hint's own
        order turns out to hold more than the plan predicted, the rank runs the
        hint without running ahead. Parameters the plan found tied across
        stages are kept equal (``tied``).
        """
        layout = _layout(options.get("mesh"))
        rank, world = layout.position_of(dist.get_rank()), layout.stages_ranks
        if world != plan.ranks:
            raise ValueError(f"the plan is for {plan.ranks} ranks, the pipeline has {world}")
        microbatches = microbatches if microbatches is not None else plan.microbatches
        hint = generate_hint(HintName.parse(plan.hint), plan.ranks, plan.microbatches, plan.chunks)
        mine = hint.placement.stages_of(rank)
        from_budget = not {"memory_slack", "memory_budget", "device_budget"} & set(options)
        if from_budget and options.get("emulate") is None and math.isfinite(room := plan.activation_room(mine)):
            options["memory_budget"] = room
        options["hint"] = hint
        options.setdefault("tied", [TiedParameter(n, s) for n, s in zip(plan.tied, plan.tied_stages, strict=True)])
        cls._same_plan(plan)
        pipe = cls({s: plan.build_stage(s) for s in mine}, loss_fn=loss_fn, microbatches=microbatches, **options)
        pipe.admission.strict = not from_budget
        return pipe

    @staticmethod
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

    @classmethod
    def from_sequential(
        cls,
        model: nn.Sequential,
        split: Sequence[int],
        *,
        loss_fn: LossFn,
        microbatches: int,
        **options: Unpack[PipelineOptions],
    ) -> Pipeline:
        """Cut ``model`` before each index in ``split`` (``[2, 4]``: layers 0-1, 2-3, 4-)."""
        bounds = [0, *split, len(model)]
        if any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"split points {list(split)} must increase strictly within 1..{len(model) - 1}")
        stages = [model[a:b] for a, b in itertools.pairwise(bounds)]
        return cls.from_modules(stages, loss_fn=loss_fn, microbatches=microbatches, **options)

    # -- one step ---------------------------------------------------------------

    def step(
        self,
        inputs: Batch | None = None,
        target: Batch | None = None,
        *,
        loss_divisor: float | None = None,
        broadcast_loss: bool = False,
    ) -> torch.Tensor | None:
        """Run forward and backward of every micro-batch; gradients land in ``.grad``.

        Args:
            inputs: the batch (split equally along dim 0) or a list of
                micro-batches; needed on the rank of stage 0 only.
            target: the same for targets; needed on the rank of the last stage.
            loss_divisor: each micro-batch loss is divided by this (default:
                the number of micro-batches).
            broadcast_loss: return the loss on every rank, not just the last stage's.

        Returns:
            The step's loss (sum of the scaled micro-batch losses) on the rank
            of the last stage (every rank with ``broadcast_loss``), else None.

        Raises:
            WatchdogTimeout: a rank waited ``timeout`` seconds with nothing ready.
            PeerFailure: a neighbour failed or vanished.
            NonFiniteLoss: a loss was NaN or infinite (``on_nonfinite="raise"``).
        """
        if self._closed:
            raise RuntimeError("this Pipeline is closed")
        try:
            return self._step(inputs, target, loss_divisor, broadcast_loss)
        except Exception as exc:
            self._abort(exc)
            raise

    def _step(
        self, inputs: Batch | None, target: Batch | None, loss_divisor: float | None, broadcast_loss: bool
    ) -> torch.Tensor | None:
        state = self._prepare(inputs, target, loss_divisor)
        step = state.step
        policy = self.policy if self.planner.plan is not None or self.policy is not Policy.READY else Policy.FIXED
        plan_costs = self.planner.costs if policy is Policy.READY else None
        if not self._started:  # the first step starts together; later ones meet at the end of the step before
            self._barrier(step)
            self._started = True
        order = self._order(state)
        graph, budget = self.admission.for_step(state.elements)
        ready = policy is Policy.READY
        board = Scoreboard(
            graph,
            policy,
            budget=budget,
            plan=self.planner.plan if ready else None,
            notices=ready,
            sizes=_relative_sizes(state.elements) if ready else None,
        )
        self.executor.begin_step(step)
        reset_peak_memory(self.device)
        loop = StepLoop(
            rank=self.rank,
            board=board,
            executor=self.executor,
            transport=self.transport,
            admission=self.admission,
            timeout=self.timeout,
            stash=self._stash,
            check_loss=lambda loss, slot: self._check_loss(loss, step, order[slot]),
            coordination=self.coordination,
            notices=ready,
            timer=self.timer,
        )
        if self.average is not None:
            self.average.begin_step()
        if self._fsdp_executor is not None:
            self._fsdp_executor.start_step()
        loop_time = loop.run(state)
        self.transport.flush(self.timeout)
        if self.average is not None:
            self.average.wait(step, self.timeout)
        if self._fsdp_executor is not None:
            self._fsdp_executor.check(self.rank, step)
        self.tied.reduce(step)
        if self.admission.by_bytes:
            self.admission.check(step, state.peak_bytes, budget, first=graph is self.admission.graph)
        loss = torch.stack(state.losses).sum() if state.losses else None
        self._finish(state, policy, loop_time, loss, plan_costs)
        self.step_count += 1
        if broadcast_loss:
            buffer = loss.detach().clone() if loss is not None else torch.zeros(())
            dist.broadcast(buffer, group=self._coll, group_src=self.hint.placement.stage_rank[-1])
            return buffer
        return loss

    def _order(self, state: StepState) -> list[int]:
        """The step's micro-batch sizes where needed (byte admission, an order by size), and its order.

        [Note: micro-batch order]
        The rank of stage 0 knows every micro-batch's size (input elements)
        and sends the sizes to the pipeline's ranks; each rank derives the same
        permutation from them (:func:`microbatch_order`, deterministic) and the
        step runs slot ``i`` on given micro-batch ``order[i]``: stage 0 takes
        its inputs, the last stage its targets, in that order. Every other rank
        only sees slots. The step's gradient is a sum over micro-batches, so
        the order changes no maths; errors name given micro-batches.
        Returns ``order`` (the identity when the order is ``given``).
        """
        given = list(range(self.microbatches))
        ordered = self.microbatch_order is not MicrobatchOrder.GIVEN
        if not (self.admission.by_bytes or ordered):
            return given
        first = {mb: state.activations[(0, mb)] for mb in given} if 0 in self.stages else {}
        sizes = broadcast_sizes(
            first,
            self.microbatches,
            self.hint.placement.stage_rank[0],
            self._coll,
            rank=self.rank,
            step=state.step,
            timeout=self.timeout,
        )
        order = microbatch_order(sizes, self.microbatch_order)  # the identity for given
        if 0 in self.stages:
            state.activations.update({(0, slot): first[mb] for slot, mb in enumerate(order)})
        if state.targets:
            state.targets = [state.targets[mb] for mb in order]
        if self.admission.by_bytes:
            state.elements = [sizes[mb] for mb in order]
        return order

    def _prepare(self, inputs: Batch | None, target: Batch | None, loss_divisor: float | None) -> StepState:
        """The step's first-stage inputs and last-stage targets, split into micro-batches."""
        m = self.microbatches
        state = StepState(self.step_count, {}, loss_scale=1.0 / (loss_divisor if loss_divisor is not None else m))
        if 0 in self.stages:
            if inputs is None and isinstance(self.executor, EmulatedExecutor):
                inputs = [torch.empty(self.executor.costs.reference_size, dtype=torch.uint8)] * m
            if inputs is None:
                raise ValueError(f"rank {self.rank} hosts stage 0 and needs the inputs")
            for mb, batch in enumerate(split_microbatches(inputs, m, "inputs")):
                state.activations[(0, mb)] = to_device(as_inputs(batch), self.device)
        if self.hint.num_stages - 1 in self.stages and not isinstance(self.executor, EmulatedExecutor):
            if target is None:
                raise ValueError(f"rank {self.rank} hosts the last stage and needs the target")
            state.targets = to_device(split_microbatches(target, m, "target"), self.device)
        return state

    def _finish(
        self,
        state: StepState,
        policy: Policy,
        loop_time: float,
        loss: torch.Tensor | None,
        plan_costs: tuple[tuple[float, ...], ...] | None,
    ) -> None:
        """Agree on costs and non-finite losses when needed; gather the report to rank 0 when due.

        [Note: collectives per step]
        A step's only collectives are the ones something needs: the sizes for byte
        admission, the all-reduce of measured costs when the ``ready`` plan looks at
        them (after steps 0, 1, 3, 7, ..., then every 16) or of non-finite losses
        (``on_nonfinite="skip"``), the sum of tied gradients, the report's gather
        (``report_every``), the loss broadcast (``broadcast_loss``). Otherwise
        ranks are coupled only by their messages, and a hang is still caught by
        the watchdog.
        """
        split = self.hint.split_backward
        summary = RankSummary.of(self.rank, state.started, loop_time, state.records, split, state.peak_bytes)
        reduction = self.average or self._fsdp_executor
        if reduction is not None and reduction.overlap:
            overlap = min(reduction.overlap.values())
            summary = dataclasses.replace(summary, dp_overlap=overlap, dp_exposed=reduction.exposed)
        if self.device.type == "cuda":
            summary = dataclasses.replace(
                summary, device_peak=peak_memory(self.device), allocated_over_counted=self._allocated_over_counted()
            )
        ready = self.policy is Policy.READY
        if self.on_nonfinite is OnNonFinite.SKIP or (ready and self.planner.due(state.step)):
            medians, poisoned = self._agree(summary, state.step)
            if poisoned:
                self._drop_gradients(state.step)
            if ready:
                self.planner.update(state.step, medians)
        gather = self.report_every > 0 and state.step % self.report_every == 0
        report = gather_report(
            summary,
            hint=self.hint,
            step=state.step,
            policy=policy,
            loss=None if loss is None else float(loss),
            timelines=self.timelines,
            plan_costs=plan_costs,
            group=self._coll if gather else None,
        )
        self.reports.append(report)
        del self.reports[: max(0, len(self.reports) - self.history)]

    def _allocated_over_counted(self) -> float:
        """What this step's forwards left allocated on the device over the bytes the runtime counted for them
        (see :attr:`StepReport.allocated_over_counted`); NaN where nothing was measured."""
        if not isinstance(self._compute, StageExecutor) or not self._compute.memory_check:
            return math.nan
        counted = sum(c for c, _ in self._compute.memory_check)
        return sum(a for _, a in self._compute.memory_check) / counted if counted else math.nan

    def _agree(self, summary: RankSummary, step: int) -> tuple[np.ndarray[Any, np.dtype[np.float64]], bool]:
        """One all-reduce: every stage's median costs (each rank fills its own) and any non-finite loss.

        It is also where the ranks meet between steps: a rank that never gets here is waited for
        at most the watchdog's timeout.
        """
        own = stage_medians(durations_array(self.hint, [summary]))  # zero for the other ranks' stages
        flagged = step in self.nonfinite_steps
        values = torch.from_numpy(np.concatenate([own.reshape(-1), [1.0 if flagged else 0.0]]))
        try:
            dist.all_reduce(values, group=self._coll)
        except RuntimeError as exc:
            raise WatchdogTimeout(
                f"rank {self.rank}: waited {self.timeout:g} s for the other ranks to finish step {step}: {exc}"
            ) from None
        result = values.numpy()
        return result[:-1].reshape(self.hint.num_stages, 3), bool(result[-1] > 0)

    def _drop_gradients(self, step: int) -> None:
        """on_nonfinite="skip": the whole step's gradients are poisoned; drop them everywhere."""
        if step not in self.nonfinite_steps:
            self.nonfinite_steps.append(step)
        for module in self.modules.values():
            for param in module.parameters():
                param.grad = None
        log.warning("rank %d: step %d had a non-finite loss; its gradients were zeroed", self.rank, step)

    def _check_loss(self, loss: torch.Tensor, step: int, mb: int) -> None:
        if bool(torch.isfinite(loss)):
            return
        self.nonfinite_steps.append(step)
        if self.on_nonfinite is OnNonFinite.RAISE:
            raise NonFiniteLoss(
                f"rank {self.rank}: the loss of micro-batch {mb} in step {step} is {float(loss)}; the step "
                "stops before the optimizer runs (on_nonfinite='skip' finishes it and zeroes the gradients)"
            )

    def _check_options(self, **extra: Any) -> None:
        """Every rank must run the same pipeline: compare once, at start-up.

        Memory slack and budgets are left out: they may differ per rank
        (heterogeneous devices, a plan's spare memory per stage).
        """
        options = {
            "hint": self.hint.name,
            "stages": self.hint.num_stages,
            "microbatches": self.microbatches,
            "policy": self.policy.value,
            "split_backward": self.hint.split_backward,
            "timeout": self.timeout,
            "on_nonfinite": self.on_nonfinite.value,
            **extra,
        }
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, options, group=self._coll)
        for rank, theirs in enumerate(gathered):
            differing = {k: (options[k], theirs.get(k)) for k in options if theirs.get(k) != options[k]}
            if differing:
                detail = ", ".join(
                    f"{k}: {mine!r} here, {other!r} on rank {rank}" for k, (mine, other) in differing.items()
                )
                raise OptionMismatch(
                    f"rank {self.rank}: ranks disagree on pipeline options ({detail}); start every "
                    "rank with the same options"
                )

    def _barrier(self, step: int) -> None:
        """Start the step together (one clock for the timeline), but never wait
        on a missing rank longer than the watchdog timeout."""
        try:
            dist.monitored_barrier(group=self._coll, timeout=datetime.timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            raise WatchdogTimeout(
                f"rank {self.rank}: waited {self.timeout:g} s for the other ranks to start step {step}: {exc}"
            ) from None

    # -- shutdown ------------------------------------------------------------------

    def _abort(self, exc: BaseException) -> None:
        if not self._closed:
            self._closed = True
            text = str(exc) if str(exc).startswith(f"rank {self.rank}:") else f"rank {self.rank}: {exc}"
            self.transport.close(timeout=5.0, error=text)
            if self.coordination is not None and not self.coordination.is_leader:
                self.coordination.close(timeout=5.0)

    def close(self) -> None:
        """Tell the neighbours this rank is done and stop its mailboxes."""
        if not self._closed:
            self._closed = True
            if self.coordination is not None:
                self.coordination.close(self.timeout)
            self.transport.close(timeout=self.timeout)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _layout(mesh: DeviceMesh | None) -> Layout:
    return Layout.world(dist.get_world_size()) if mesh is None else Layout.of(mesh)


def _resolve_hint(hint: str | Hint, ranks: int, microbatches: int, chunks: int | None) -> Hint:
    """A generated hint by name, or the given one checked against the group and the step."""
    if isinstance(hint, str):
        if chunks is not None and chunks < 1:
            raise ValueError(f"chunks must be at least 1, got {chunks}")
        return generate_hint(HintName.parse(hint), ranks, microbatches, chunks)
    if hint.num_ranks != ranks or hint.num_microbatches != microbatches:
        raise ValueError(
            f"hint {hint.name!r} is for {hint.num_ranks} ranks and {hint.num_microbatches} micro-batches, "
            f"the group has {ranks} ranks and the pipeline runs {microbatches}"
        )
    return hint


def _check_arguments(microbatches: int, history: int, report_every: int, timeout: float) -> None:
    """Refuse the constructor's arguments that no group could run with, before anything collective."""
    if not dist.is_initialized():
        raise RuntimeError("call torch.distributed.init_process_group before building a Pipeline")
    _check_positive(microbatches=microbatches, history=history)
    if report_every < 0:
        raise ValueError(f"report_every must be >= 0, got {report_every}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")


def _check_memory_arguments(memory_budget: float | None, device_budget: float | None, *, emulated: bool) -> None:
    if emulated and memory_budget is not None:
        raise ValueError("memory_budget needs real compute: emulated tasks hold no activations; use memory_slack")
    if device_budget is not None and not (device_budget >= 0 and math.isfinite(device_budget)):
        raise ValueError(f"device_budget must be a finite fraction >= 0 (0.25: 25% more), got {device_budget!r}")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def _relative_sizes(elements: Sequence[int] | None) -> list[float] | None:
    """Each micro-batch's input elements over the median's (the plan's costs are medians), for the
    ETA rule; ``None`` where the step's sizes are not known (nothing needed them)."""
    if elements is None:
        return None
    typical = float(np.median(elements)) or 1.0
    return [e / typical for e in elements]
