"""Putting a rank's pipeline together: placement, process groups, transport, executor, axes, step hooks.

:class:`~hintpipe.runtime.pipeline.Pipeline` checks its options and runs
steps; everything it is made of is built here, once, by :func:`assemble`, in
an order every rank follows (process groups are created collectively):

1. the layout (which pipeline, which position) and the hint;
2. the device and the transport every rank agrees on;
3. the stages on the device (sharded by FSDP2 over ``dp`` where asked);
4. the pipeline's process groups and the transport to the neighbours;
5. the executor (the stages, or sleeps when emulated) and the task timer;
6. the axes: tensor-parallel coordination, the data-parallel reduction, tied weights;
7. the step hooks, in the order the end of a step needs them
   (see [Note: the order of the end of a step] in :mod:`hintpipe.runtime.loop.hooks`);
8. the ranks compare their options (every rank must run the same pipeline).
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
from hintpipe.runtime.checkpoint.collective import one_line
from hintpipe.runtime.errors import OptionMismatch, WatchdogTimeout
from hintpipe.runtime.loop.admission import Admission
from hintpipe.runtime.loop.agreement import Agreement
from hintpipe.runtime.loop.coordination import Coordination, needed
from hintpipe.runtime.loop.device_memory import DeviceMemory
from hintpipe.runtime.loop.executor import EmulatedCosts, EmulatedExecutor, Executor, LossFn, StageExecutor
from hintpipe.runtime.loop.hooks import Hook, StepHook
from hintpipe.runtime.loop.ready_plan import ReadyPlanner
from hintpipe.runtime.loop.reports import Reporting
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.loop.timing import DeviceTimer, Event
from hintpipe.runtime.modes import DataParallel, Precision, TransportChoice
from hintpipe.runtime.parallel.data_parallel import GradientAverage
from hintpipe.runtime.parallel.fsdp import FsdpOptions, ShardedReduction, check_sharding, shard_stages
from hintpipe.runtime.parallel.mesh import Layout, dp_mesh
from hintpipe.runtime.parallel.tied import TiedGradients, TiedParameter
from hintpipe.runtime.private_storage import own_storage
from hintpipe.runtime.transport.links import LinkPostOffice, make_links
from hintpipe.runtime.transport.mailbox import PostOffice
from hintpipe.runtime.transport.protocol import Transport, choose_transport
from hintpipe.schedule.hint import Hint
from hintpipe.scoreboard import Policy

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Seams:
    """Where tests reach into the assembly (no option of the public API reaches these).

    Attributes:
        coordinate_tp: tensor-parallel members share one decision per task (see
            :mod:`hintpipe.runtime.loop.coordination`); tests turn it off to show what goes wrong without.
        link_backend: ``"gloo"`` runs the NCCL transport's code path with its payload links on gloo, on CPU
            ranks (see :mod:`hintpipe.runtime.transport.links`).
        timing_events: timing events for a CPU rank, to run the GPU's task timing (see
            :mod:`hintpipe.runtime.loop.timing`) where there is no GPU.
    """

    coordinate_tp: bool = True
    link_backend: str | None = None
    timing_events: Callable[[], Event] | None = None


@dataclasses.dataclass
class Parts:
    """What one rank's pipeline is made of (see the module's docstring for the order they are built in)."""

    layout: Layout
    global_rank: int
    rank: int  # the rank's position in its pipeline (the hint's rank)
    hint: Hint
    microbatches: int
    policy: Policy
    timeout: float
    device: torch.device
    transport_choice: TransportChoice
    modules: dict[int, nn.Module]
    sharded: bool
    p2p: dist.ProcessGroup
    coll: dist.ProcessGroup
    post_office: Transport  # the chosen transport's object: what carries this rank's messages
    compute: Executor  # the stages, or the sleeps, before any wrapper (injected faults) goes round it
    executor: Executor  # what the step loop calls (wrappers included)
    timer: DeviceTimer | None
    admission: Admission
    coordination: Coordination | None = None
    replica_group: dist.ProcessGroup | None = None
    agreement: Agreement | None = None
    reporting: Reporting | None = None
    hooks: list[StepHook] = dataclasses.field(default_factory=list)

    @property
    def stages(self) -> tuple[int, ...]:
        return self.hint.placement.stages_of(self.rank)

    @property
    def emulated(self) -> bool:
        return isinstance(self.compute, EmulatedExecutor)


def layout_of(mesh: DeviceMesh | None) -> Layout:
    """The world as one pipeline, or as the mesh lays it out."""
    return Layout.world(dist.get_world_size()) if mesh is None else Layout.of(mesh)


def assemble(
    modules: Mapping[int, nn.Module],
    hint: Hint,
    *,
    loss_fn: LossFn,
    microbatches: int,
    options: Mapping[str, Any],
    seams: Seams,
) -> Parts:
    """Build this rank's pipeline from its stage ``modules`` and checked ``options`` (every rank, same order).

    Raises:
        ValueError: modules for other stages than the hint places here, or options that contradict each other.
        OptionMismatch: when ranks were started with different options.
    """
    layout = layout_of(options["mesh"])
    global_rank = dist.get_rank()
    rank = layout.position_of(global_rank)
    emulate: EmulatedCosts | None = options["emulate"]
    _check_modules(modules, hint, rank)
    if emulate is not None and options["activation_budget"] is not None:
        raise ValueError("activation_budget needs real compute: emulated tasks hold no activations; use memory_slack")
    owned = own_storage(modules)
    if owned:
        log.info("rank %d: %d tensors arrived in shared memory; the rank trains copies of its own", global_rank, owned)
    device = rank_device(options["device"], global_rank)
    own = _agreed_own_gpu(device)
    chosen = choose_transport(options["transport"], device, own_gpu=own)
    sharded = _sharded(layout, options, hint, device, own)
    fsdp: FsdpOptions | None = options["fsdp"]
    placed = _place(modules, device, options["mesh"] if sharded else None, emulated=emulate is not None, fsdp=fsdp)
    p2p = layout.groups(layout.pipelines)
    coll = layout.groups(layout.pipelines, options["timeout"])
    assert p2p is not None and coll is not None
    policy: Policy = options["policy"]
    received = ReceivedBytes()  # what the receiving threads allocate on the device (see allocated_probe)
    post_office = _connect(
        layout, hint, rank, global_rank, device, chosen, p2p, policy, options["timeout"], seams, received
    )
    autocast = (device.type, torch.bfloat16) if options["precision"] is Precision.BF16 else None
    compute = _computing(placed, hint, loss_fn, emulate, device, autocast, received)
    parts = Parts(
        layout=layout,
        global_rank=global_rank,
        rank=rank,
        hint=hint,
        microbatches=microbatches,
        policy=policy,
        timeout=options["timeout"],
        device=device,
        transport_choice=chosen,
        modules=placed,
        sharded=sharded,
        p2p=p2p,
        coll=coll,
        post_office=post_office,
        compute=compute,
        executor=compute,
        timer=_device_timer(device, emulated=emulate is not None, seams=seams),
        admission=_admission(hint, rank, layout, options),
    )
    try:
        axes = _connect_axes(parts, options["tied"], seams)
        parts.agreement = Agreement(parts, ReadyPlanner(hint, rank), options["on_nonfinite"])
        parts.reporting = Reporting(
            hint, rank, coll, timelines=options["timelines"], every=options["report_every"], history=options["history"]
        )
        parts.hooks = _hooks(parts, axes)
        _agree_on_options(parts, options)
    except BaseException as exc:  # a pipeline that is never built must not leave its mailboxes receiving
        _tear_down(parts, exc)
        raise
    return parts


def _admission(hint: Hint, rank: int, layout: Layout, options: Mapping[str, Any]) -> Admission:
    """This rank's admission rule, from the room options (at most one given) and ``admission``'s unit."""
    return Admission(
        hint,
        rank,
        options["memory_slack"],
        pipeline_budgets(options["activation_budget"], layout.pp),
        device_budget=options["device_budget"],
        unit=options["admission"],
    )


def pipeline_budgets(budget: float | tuple[float, ...] | None, ranks: int) -> float | tuple[float, ...] | None:
    """The activation budget given: one for every rank, or one per pipeline rank (every rank fits the hint to
    all of them: see [Note: byte admission] in :mod:`hintpipe.runtime.loop.admission`).

    Raises:
        ValueError: budgets for another number of ranks than the pipeline's.
    """
    if isinstance(budget, tuple) and len(budget) != ranks:
        raise ValueError(f"activation_budget gives {len(budget)} budgets, one per rank; the pipeline has {ranks} ranks")
    return budget


def _sharded(layout: Layout, options: Mapping[str, Any], hint: Hint, device: torch.device, own: bool) -> bool:
    """Whether the stages are sharded with FSDP2 (data parallelism over real compute), checked first.

    Raises:
        ValueError: FSDP2 on ranks that share a GPU, or ``reshard_after_forward`` under a split backward.
    """
    sharded = layout.dp > 1 and options["data_parallel"] is DataParallel.FSDP and options["emulate"] is None
    fsdp: FsdpOptions | None = options["fsdp"]
    if sharded:
        check_sharding(device, own)
        if fsdp and fsdp.get("reshard_after_forward") and hint.split_backward:
            raise ValueError(
                f"fsdp reshard_after_forward=True with hint {hint.name!r}: its split backward (W) computes weight "
                "gradients after FSDP2 has resharded the stage; keep the default (False) or use a hint without W"
            )
    return bool(sharded)


def _tear_down(parts: Parts, exc: BaseException) -> None:
    """Stop what a half-built pipeline started: its coordination and its transport's threads."""
    if parts.coordination is not None:
        parts.coordination.close(timeout=5.0)
    parts.post_office.close(timeout=5.0, error=f"rank {parts.rank}: {exc}")


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


def _connect(
    layout: Layout,
    hint: Hint,
    rank: int,
    global_rank: int,
    device: torch.device,
    chosen: TransportChoice,
    p2p: dist.ProcessGroup,
    policy: Policy,
    timeout: float,
    seams: Seams,
    received: ReceivedBytes,
) -> Transport:
    """The transport to the neighbours, on the pipeline's own point-to-point group.

    Point-to-point traffic gets its own gloo group so that it never interleaves
    with the collectives of the default one; the runtime's collectives get a group
    whose timeout is the watchdog's, so a stuck rank cannot hold the others there.
    """
    stage_rank = hint.placement.stage_rank
    stages = hint.placement.stages_of(rank)
    peers = sorted({stage_rank[s + d] for s in stages for d in (-1, 1) if 0 <= s + d < hint.num_stages})
    notices = policy is Policy.READY
    backend = "nccl" if chosen is TransportChoice.NCCL else seams.link_backend
    if backend is None:
        return PostOffice(peers, device, group=p2p, notices=notices, received=received)
    outgoing, incoming = make_links(layout.pipelines, stage_rank, global_rank, backend, timeout)
    return LinkPostOffice(peers, device, p2p, outgoing=outgoing, incoming=incoming, notices=notices, received=received)


def _computing(
    modules: Mapping[int, nn.Module],
    hint: Hint,
    loss_fn: LossFn,
    emulate: EmulatedCosts | None,
    device: torch.device,
    autocast: tuple[str, torch.dtype] | None,
    received: ReceivedBytes,
) -> Executor:
    """The executor of this rank's tasks: its stages (checked against the allocator on a GPU, less what the
    receiving threads allocate), or sleeps."""
    last = hint.num_stages - 1
    if emulate is not None:
        return EmulatedExecutor(emulate, last)
    probe = allocated_probe(device, received)
    return StageExecutor(modules, last, loss_fn, hint.split_backward, allocated=probe, autocast=autocast)


def _device_timer(device: torch.device, *, emulated: bool, seams: Seams) -> DeviceTimer | None:
    """Task times from CUDA events on a GPU rank (see :mod:`hintpipe.runtime.loop.timing`); None: the wall clock."""
    if seams.timing_events is not None:
        return DeviceTimer(seams.timing_events)
    if device.type == "cuda" and not emulated:
        return DeviceTimer(lambda: new_event(timing=True))
    return None


def _connect_axes(parts: Parts, tied: Sequence[TiedParameter], seams: Seams) -> list[StepHook]:
    """The tensor-parallel group's coordination, the data-parallel reduction and the tied weights' groups,
    created on every rank in the same order (they are collective); returns the reductions' step hooks."""
    layout = parts.layout
    if needed(parts.policy, layout.tp) and seams.coordinate_tp:
        group = layout.groups(layout.tensors)
        assert group is not None
        leader = layout.tensor_group_of(parts.global_rank)[0]
        assert isinstance(parts.post_office, PostOffice)
        parts.coordination = Coordination(group, parts.post_office.inbox, leader)
    if parts.emulated and layout.tp > 1:
        assert isinstance(parts.compute, EmulatedExecutor)
        parts.compute.couple = _tensor_parallel_coupling(parts)
    #: The ranks holding the same stages in the other data-parallel replicas (None without replicas).
    parts.replica_group = layout.groups(layout.replicas, parts.timeout) if layout.dp > 1 else None
    tied_hook = TiedGradients(tied, parts.modules, parts.hint.placement.stage_rank, parts.rank, layout.pipelines)
    reduction: StepHook | None = None
    if parts.sharded:
        reduction = ShardedReduction(parts.modules, parts.rank)
    elif parts.replica_group is not None and not parts.emulated:
        reduction = GradientAverage(parts.modules, parts.replica_group, layout.dp, parts.rank, parts.timeout)
    return [h for h in (reduction, tied_hook) if h is not None]


def _tensor_parallel_coupling(parts: Parts) -> Callable[[], None]:
    """What ends an emulated task of a tensor-parallel stage: an all-reduce with the group's members
    (see :class:`EmulatedExecutor`), on a group of its own so that it never pairs with a decision."""
    layout = parts.layout
    group = layout.groups(layout.tensors, parts.timeout)
    assert group is not None
    members = list(layout.tensor_group_of(parts.global_rank))
    token = torch.zeros(1)

    def couple() -> None:
        try:
            dist.all_reduce(token, group=group)
        except RuntimeError as exc:
            raise WatchdogTimeout(
                f"rank {parts.global_rank}: the emulated task's all-reduce with tensor-parallel ranks {members} "
                f"failed: {one_line(exc)}"
            ) from None

    return couple


class Housekeeping(Hook):
    """The executor chain learns the step (injected faults count by it); the step's sends are flushed."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def begin_step(self, state: StepState) -> None:
        self.parts.executor.begin_step(state.step)

    def end_step(self, state: StepState) -> None:
        self.parts.post_office.flush(self.parts.timeout)


def _hooks(parts: Parts, reductions: Sequence[StepHook]) -> list[StepHook]:
    """The step hooks in the order the end of a step needs them (see [Note: the order of the end of a
    step] in :mod:`hintpipe.runtime.loop.hooks`): housekeeping, the gradient reductions, admission,
    device memory, agreement, reporting."""
    assert parts.agreement is not None and parts.reporting is not None
    return [
        Housekeeping(parts),
        *reductions,
        parts.admission,
        DeviceMemory(parts.device, parts.compute),
        parts.agreement,
        parts.reporting,
    ]


def _agree_on_options(parts: Parts, options: Mapping[str, Any]) -> None:
    """Every rank must run the same pipeline: compare once, at start-up.

    Byte budgets are left out: they may differ per rank (heterogeneous devices, a plan's spare memory per
    stage); every rank learns every rank's own, since each fits the same hint to all of them. So is memory
    slack, except under admission by size without a byte budget, where every rank computes every rank's room.
    """
    admission = parts.admission
    mine = {
        "hint": parts.hint.name,
        "stages": parts.hint.num_stages,
        "microbatches": parts.microbatches,
        "policy": parts.policy.value,
        "split_backward": parts.hint.split_backward,
        "timeout": parts.timeout,
        "on_nonfinite": options["on_nonfinite"].value,
        "emulated": parts.emulated,
        "byte_admission": parts.admission.by_bytes,
        "dp": parts.layout.dp,
        "tp": parts.layout.tp,
        "data_parallel": options["data_parallel"].value,
        "microbatch_order": options["microbatch_order"].value,
        "transport": parts.transport_choice.value,
        "admission": admission.unit.value,
    }
    if admission.by_size and not admission.by_bytes:
        mine |= {"memory_slack": admission.memory_slack, "device_budget": admission.device_budget}
    gathered: list[Any] = [None] * parts.layout.pp
    dist.all_gather_object(gathered, (mine, admission.activation_budget), group=parts.coll)
    for rank, (theirs, _) in enumerate(gathered):
        differing = {k: (mine[k], theirs.get(k)) for k in mine if theirs.get(k) != mine[k]}
        if differing:
            detail = ", ".join(f"{k}: {a!r} here, {b!r} on rank {rank}" for k, (a, b) in differing.items())
            raise OptionMismatch(
                f"rank {parts.rank}: ranks disagree on pipeline options ({detail}); start every rank with the same "
                "options"
            )
    if admission.by_bytes:
        admission.budgets = tuple(float(budget) for _, budget in gathered)
