"""Putting a rank's pipeline together: placement, process groups, transport, executor, axes, step hooks.

:class:`~hintpipe.runtime.pipeline.Pipeline` checks its options and runs
steps; everything it is made of is built here, once, by :func:`assemble`, in
an order every rank follows (process groups are created collectively), into
one frozen :class:`~hintpipe.runtime.parts.Parts`:

1. the layout (which pipeline, which position) and the hint (an injection is checked against them);
2. the device and the transport every rank agrees on;
3. the stages on the device (sharded by FSDP2 over ``dp`` where asked);
4. the pipeline's process groups, the transport to the neighbours (the chosen row of
   :data:`~hintpipe.runtime.transport.registry.TRANSPORTS`, built from one
   :class:`~hintpipe.runtime.transport.protocol.Connection`; any injected delay around it) and the
   tensor-parallel coordination: the rank's :class:`~hintpipe.runtime.parts.Wiring`;
5. the other axes: the emulated tensor-parallel coupling, the data-parallel reduction, tied weights;
6. the executor (the stages, or sleeps when emulated; any injected faults around it) and the task timer;
7. the ranks compare their options (every rank must run the same pipeline) and learn each other's byte
   budgets (see :mod:`hintpipe.runtime.option_agreement`);
8. admission and the step hooks, in the order the end of a step needs them
   (see [Note: the order of the end of a step] in :mod:`hintpipe.runtime.loop.hooks`).

Everything a part needs is given to it when it is built (``Seams``: an injection, the strictness of a plan's
budget), so nothing is set on a pipeline after it is built.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hintpipe.device import ReceivedBytes, allocated_probe, gpu_identity, new_event, own_gpu, rank_device
from hintpipe.dispatch.policy import Policy
from hintpipe.modes import DataParallel, Precision
from hintpipe.options import PipelineConfig
from hintpipe.runtime.checkpoint.collective import one_line
from hintpipe.runtime.errors import WatchdogTimeout
from hintpipe.runtime.faults import cost_factors, injected_executor, injected_transport
from hintpipe.runtime.injection import CostFactors
from hintpipe.runtime.loop.admission import Admission
from hintpipe.runtime.loop.agreement import Agreement
from hintpipe.runtime.loop.coordination import Coordination, needed
from hintpipe.runtime.loop.device_memory import DeviceMemory
from hintpipe.runtime.loop.emulated import EmulatedCosts, EmulatedExecutor
from hintpipe.runtime.loop.executor import Executor, LossFn, StageExecutor
from hintpipe.runtime.loop.hooks import Hook, StepHook
from hintpipe.runtime.loop.ready_forecast import ReadyForecaster
from hintpipe.runtime.loop.reports import Reporting
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.loop.task_seeds import TaskSeeds
from hintpipe.runtime.loop.timing import DeviceTimer
from hintpipe.runtime.option_agreement import agree_on_options
from hintpipe.runtime.parallel.data_parallel import GradientAverage
from hintpipe.runtime.parallel.fsdp import FsdpOptions, ShardedReduction, check_sharding, shard_stages
from hintpipe.runtime.parallel.mesh import Layout, dp_mesh
from hintpipe.runtime.parallel.tied import TiedGradients, TiedParameter
from hintpipe.runtime.parts import Parts, Seams, Wiring
from hintpipe.runtime.private_storage import own_storage
from hintpipe.runtime.transport.protocol import Connection, InboxTransport, Transport
from hintpipe.runtime.transport.registry import TRANSPORTS, choose_transport
from hintpipe.schedule.hint import Hint

__all__ = ["Parts", "Seams", "Wiring", "assemble", "layout_of", "pipeline_budgets"]

log = logging.getLogger(__name__)


def layout_of(mesh: DeviceMesh | None) -> Layout:
    """The world as one pipeline, or as the mesh lays it out."""
    return Layout.world(dist.get_world_size()) if mesh is None else Layout.of(mesh)


def assemble(
    modules: Mapping[int, nn.Module],
    hint: Hint,
    *,
    loss_fn: LossFn,
    config: PipelineConfig,
    seams: Seams,
) -> Parts:
    """Build this rank's pipeline from its stage ``modules``, its resolved ``hint`` and its checked ``config``
    (every rank, same order).

    Raises:
        ValueError: modules for other stages than the hint places here, or options that contradict each other.
        SpecError: an injection for ranks, stages or micro-batches the pipeline does not have.
        OptionMismatch: when ranks were started with different options.
    """
    layout = layout_of(config.mesh)
    global_rank = dist.get_rank()
    rank = layout.position_of(global_rank)
    emulate = config.emulate
    microbatches = config.microbatches
    _check_modules(modules, hint, rank)
    if emulate is not None and config.activation_budget is not None:
        raise ValueError(
            "activation_budget needs real compute: emulated tasks hold no activations; use slack_microbatches"
        )
    seams.injection.check(layout.pp * layout.dp * layout.tp, hint.stages, microbatches, layout.tp)
    owned = own_storage(modules)
    if owned:
        log.info("rank %d: %d tensors arrived in shared memory; the rank trains copies of its own", global_rank, owned)
    device = rank_device(config.device, global_rank)
    own = _agreed_own_gpu(device)
    chosen = choose_transport(config.transport, device, own_gpu=own)
    sharded = _sharded(layout, config, hint, device, own)
    placed = _place(modules, device, config.mesh if sharded else None, emulated=emulate is not None, fsdp=config.fsdp)
    p2p = layout.groups(layout.pipelines)
    coll = layout.groups(layout.pipelines, config.timeout)
    assert p2p is not None and coll is not None
    policy = config.policy
    received = ReceivedBytes()  # what the receiving threads allocate on the device (see allocated_probe)
    connection = _connection(layout, hint, rank, global_rank, device, p2p, policy, config.timeout, received)
    built = (seams.transport or TRANSPORTS[chosen].connect)(connection)
    coordination: Coordination | None = None
    try:  # a pipeline that is never built must not leave its mailboxes receiving
        coordination = _coordination(layout, global_rank, policy, built, seams)
        wiring = Wiring(
            layout=layout,
            global_rank=global_rank,
            rank=rank,
            hint=hint,
            microbatches=microbatches,
            policy=policy,
            timeout=config.timeout,
            device=device,
            transport_choice=chosen,
            modules=placed,
            sharded=sharded,
            p2p=p2p,
            coll=coll,
            carrier=_carrier(built, seams),
            coordination=coordination,
        )
        return _parts_on(wiring, loss_fn, config, seams, received)
    except BaseException as exc:
        _tear_down(built, coordination, rank, exc)
        raise


def _parts_on(wiring: Wiring, loss_fn: LossFn, config: PipelineConfig, seams: Seams, received: ReceivedBytes) -> Parts:
    """The rest of the rank's pipeline on its wiring: the axes, the executor (injected faults around it), the
    ranks' agreement on their options, admission and the step hooks (steps 5-8 of the module's docstring)."""
    emulate = config.emulate
    replica_group, reductions, couple = _connect_axes(wiring, config.tied, emulated=emulate is not None)
    layout, hint = wiring.layout, wiring.hint
    member = layout.tensor_group_of(wiring.global_rank).index(wiring.global_rank)
    factors = cost_factors(seams.injection, hint.stages, wiring.microbatches, member)
    autocast = (wiring.device.type, torch.bfloat16) if config.precision is Precision.BF16 else None
    compute = _computing(wiring, loss_fn, emulate, autocast, received, factors, couple)
    executor = injected_executor(compute, seams.injection, factors, wiring.global_rank)  # faults name world ranks
    own_budget = _own_budget(config.activation_budget, layout.pp, wiring.rank)
    budgets = agree_on_options(wiring, config, own_budget)
    admission = _admission(wiring, config, budgets, strict=not seams.budget_from_plan)
    agreement = Agreement(
        hint,
        wiring.rank,
        wiring.policy,
        coll=wiring.coll,
        timeout=wiring.timeout,
        modules=wiring.modules,
        forecaster=ReadyForecaster(hint, wiring.rank),
        on_nonfinite=config.on_nonfinite,
    )
    reporting = Reporting(
        hint,
        wiring.rank,
        wiring.coll,
        timelines=config.timelines,
        every=config.report_every,
        history=config.history,
    )
    # In the order the end of a step needs them (see [Note: the order of the end of a step] in
    # hintpipe.runtime.loop.hooks): housekeeping, the gradient reductions, admission, device memory, agreement,
    # reporting.
    hooks = (
        Housekeeping(executor, wiring.carrier, wiring.timeout),
        *reductions,
        admission,
        DeviceMemory(wiring.device, compute),
        agreement,
        reporting,
    )
    return Parts(
        **{f.name: getattr(wiring, f.name) for f in dataclasses.fields(Wiring)},
        compute=compute,
        executor=executor,
        timer=_device_timer(wiring.device, emulated=emulate is not None, seams=seams),
        admission=admission,
        replica_group=replica_group,
        agreement=agreement,
        reporting=reporting,
        hooks=hooks,
    )


def _admission(wiring: Wiring, config: PipelineConfig, budgets: tuple[float, ...] | None, *, strict: bool) -> Admission:
    """This rank's admission rule, from the room options (at most one given) and ``admission``'s unit: under a
    byte budget, every pipeline rank's ``budgets`` (agreed at start-up)."""
    return Admission(
        wiring.hint,
        wiring.rank,
        config.slack_microbatches,
        budgets,
        strict=strict,
        device_budget_fraction=config.device_budget_fraction,
        unit=config.admission,
    )


def _own_budget(budget: float | tuple[float, ...] | None, ranks: int, rank: int) -> float | None:
    """This rank's activation budget, from the one given for every rank or one per pipeline rank."""
    budget = pipeline_budgets(budget, ranks)
    if budget is None:
        return None
    return float(budget[rank] if isinstance(budget, tuple) else budget)


def pipeline_budgets(budget: float | tuple[float, ...] | None, ranks: int) -> float | tuple[float, ...] | None:
    """The activation budget given: one for every rank, or one per pipeline rank (every rank fits the hint to
    all of them: see [Note: byte admission] in :mod:`hintpipe.runtime.loop.admission`).

    Raises:
        ValueError: budgets for another number of ranks than the pipeline's.
    """
    if isinstance(budget, tuple) and len(budget) != ranks:
        raise ValueError(f"activation_budget gives {len(budget)} budgets, one per rank; the pipeline has {ranks} ranks")
    return budget


def _sharded(layout: Layout, config: PipelineConfig, hint: Hint, device: torch.device, own: bool) -> bool:
    """Whether the stages are sharded with FSDP2 (data parallelism over real compute), checked first.

    Raises:
        ValueError: FSDP2 on ranks that share a GPU, or ``reshard_after_forward`` under a split backward.
    """
    sharded = layout.dp > 1 and config.data_parallel is DataParallel.FSDP and config.emulate is None
    fsdp = config.fsdp
    if sharded:
        check_sharding(device, own)
        if fsdp and fsdp.get("reshard_after_forward") and hint.split_backward:
            raise ValueError(
                f"fsdp reshard_after_forward=True with hint {hint.name!r}: its split backward (W) computes weight "
                "gradients after FSDP2 has resharded the stage; keep the default (False) or use a hint without W"
            )
    return bool(sharded)


def _tear_down(transport: Transport, coordination: Coordination | None, rank: int, exc: BaseException) -> None:
    """Stop what a half-built pipeline started: its coordination and its transport's threads."""
    if coordination is not None:
        coordination.close(timeout=5.0)
    transport.close(timeout=5.0, error=f"rank {rank}: {exc}")


def _check_modules(modules: Mapping[int, nn.Module], hint: Hint, rank: int) -> None:
    stages = hint.placement.stages_of(rank)
    if sorted(modules) != list(stages):
        raise ValueError(
            f"rank {rank} hosts stages {list(stages)} under hint {hint.name!r}, got modules for stages "
            f"{sorted(modules)}"
        )


def _agreed_own_gpu(device: torch.device) -> bool:
    """Whether every rank has a GPU to itself, from every rank's GPU (see [Note: who shares a GPU] in
    :mod:`hintpipe.device`): one answer for all, since the transport's links are created by all."""
    if device.type != "cuda":
        return False
    identities: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(identities, gpu_identity(device))  # on the host where the default group has gloo
    return own_gpu(identities)


def _place(
    modules: Mapping[int, nn.Module],
    device: torch.device,
    mesh: DeviceMesh | None,
    *,
    emulated: bool,
    fsdp: FsdpOptions | None = None,
) -> dict[int, nn.Module]:
    """This rank's stages on its device and, given a mesh, sharded by FSDP2 (with ``fsdp``'s options) over its
    data-parallel dimensions (``dp``, or torchtitan's ``dp_replicate`` x ``dp_shard``: HSDP); emulated stages
    never run: they stay where they are. A stage is moved whatever device it was built on (a plan made on a GPU
    trains on CPU ranks)."""
    if not emulated:
        for module in modules.values():
            module.to(device)
    placed = dict(modules)
    if mesh is not None:
        shard_stages(placed, dp_mesh(mesh), fsdp)
    return placed


def _connection(
    layout: Layout,
    hint: Hint,
    rank: int,
    global_rank: int,
    device: torch.device,
    p2p: dist.ProcessGroup,
    policy: Policy,
    timeout: float,
    received: ReceivedBytes,
) -> Connection:
    """What the transport to the neighbours is built from, on the pipeline's own point-to-point group.

    Point-to-point traffic gets its own gloo group so that it never interleaves
    with the collectives of the default one; the runtime's collectives get a group
    whose timeout is the watchdog's, so a stuck rank cannot hold the others there.
    """
    stage_rank = hint.placement.stage_rank
    stages = hint.placement.stages_of(rank)
    peers = sorted({stage_rank[s + d] for s in stages for d in (-1, 1) if 0 <= s + d < hint.stages})
    return Connection(
        peers=tuple(peers),
        device=device,
        group=p2p,
        pipelines=tuple(tuple(ranks) for ranks in layout.pipelines),
        stage_rank=tuple(stage_rank),
        global_rank=global_rank,
        timeout=timeout,
        notices=policy is Policy.READY,
        received=received,
    )


def _carrier(transport: InboxTransport, seams: Seams) -> Transport:
    """What carries the rank's messages: the chosen transport's object, delayed where the injection says, watched
    where a test watches it."""
    carried = injected_transport(transport, seams.injection)
    return carried if seams.watch_transport is None else seams.watch_transport(carried)


def _computing(
    wiring: Wiring,
    loss_fn: LossFn,
    emulate: EmulatedCosts | None,
    autocast: tuple[str, torch.dtype] | None,
    received: ReceivedBytes,
    factors: CostFactors | None,
    couple: Callable[[], None] | None,
) -> Executor:
    """The executor of this rank's tasks: its stages (checked against the allocator on a GPU, less what the
    receiving threads allocate), or sleeps (scaled by the injected ``factors``, ended by the tensor-parallel
    group's ``couple``)."""
    last = wiring.hint.stages - 1
    if emulate is not None:
        return EmulatedExecutor(emulate, last, factors, couple=couple)
    probe = allocated_probe(wiring.device, received)
    split = wiring.hint.split_backward
    seeds = TaskSeeds(wiring.device, replica=wiring.layout.replica_of(wiring.global_rank))
    return StageExecutor(wiring.modules, last, loss_fn, split, allocated=probe, autocast=autocast, seeds=seeds)


def _device_timer(device: torch.device, *, emulated: bool, seams: Seams) -> DeviceTimer | None:
    """Task times from CUDA events on a GPU rank (see :mod:`hintpipe.runtime.loop.timing`); None: the wall clock."""
    if seams.timing_events is not None:
        return DeviceTimer(seams.timing_events)
    if device.type == "cuda" and not emulated:
        return DeviceTimer(lambda: new_event(timing=True))
    return None


def _coordination(
    layout: Layout, global_rank: int, policy: Policy, transport: InboxTransport, seams: Seams
) -> Coordination | None:
    """The tensor-parallel group's coordination, where its members need one decision per task (a collective:
    every rank creates its group, in the same order)."""
    if not (needed(policy, layout.tp) and seams.coordinate_tp):
        return None
    group = layout.groups(layout.tensors)
    assert group is not None
    return Coordination(group, transport.inbox, layout.tensor_group_of(global_rank)[0])


def _connect_axes(
    wiring: Wiring, tied: Sequence[TiedParameter], *, emulated: bool
) -> tuple[dist.ProcessGroup | None, list[StepHook], Callable[[], None] | None]:
    """The emulated tensor-parallel coupling, the data-parallel reduction and the tied weights' groups, created
    on every rank in the same order (they are collective); returns the group of the replicas (None without),
    the reductions' step hooks and the coupling (None but for emulated tensor-parallel stages)."""
    layout = wiring.layout
    couple = _tensor_parallel_coupling(wiring) if emulated and layout.tp > 1 else None
    replica_group = layout.groups(layout.replicas, wiring.timeout) if layout.dp > 1 else None
    tied_hook = TiedGradients(tied, wiring.modules, wiring.hint.placement.stage_rank, wiring.rank, layout.pipelines)
    reduction: StepHook | None = None
    if wiring.sharded:
        reduction = ShardedReduction(wiring.modules, wiring.rank)
    elif replica_group is not None and not emulated:
        reduction = GradientAverage(wiring.modules, replica_group, layout.dp, wiring.rank, wiring.timeout)
    return replica_group, [h for h in (reduction, tied_hook) if h is not None], couple


def _tensor_parallel_coupling(wiring: Wiring) -> Callable[[], None]:
    """What ends an emulated task of a tensor-parallel stage: an all-reduce with the group's members
    (see :class:`EmulatedExecutor`), on a group of its own so that it never pairs with a decision."""
    layout, global_rank = wiring.layout, wiring.global_rank
    group = layout.groups(layout.tensors, wiring.timeout)
    assert group is not None
    members = list(layout.tensor_group_of(global_rank))
    token = torch.zeros(1)

    def couple() -> None:
        try:
            dist.all_reduce(token, group=group)
        except RuntimeError as exc:
            raise WatchdogTimeout(
                f"rank {global_rank}: the emulated task's all-reduce with tensor-parallel ranks {members} "
                f"failed: {one_line(exc)}"
            ) from None

    return couple


class Housekeeping(Hook):
    """The executor chain learns the step (injected faults count by it); the step's sends are flushed within
    ``timeout`` seconds."""

    def __init__(self, executor: Executor, carrier: Transport, timeout: float) -> None:
        self.executor = executor
        self.carrier = carrier
        self.timeout = timeout

    def begin_step(self, state: StepState) -> None:
        self.executor.begin_step(state.step)

    def end_step(self, state: StepState) -> None:
        self.carrier.flush(self.timeout)
