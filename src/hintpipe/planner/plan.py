"""Planning: ``hintpipe.plan`` captures, profiles and cuts; the result feeds the runtime.

>>> plan = hintpipe.plan(model, example_microbatch, ranks=4, microbatches=16, stage_memory="8GiB")
>>> pipe = hintpipe.Pipeline.from_plan(plan, loss_fn=loss_fn)      # on every rank

The plan is frozen and JSON-serialisable (:meth:`Plan.to_json`); it keeps the
captured graph to build each stage's module (:meth:`Plan.build_stage`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hintpipe.planner.autocast_dtypes import Float32Only
from hintpipe.planner.baselines import balanced_cuts, uniform_cuts
from hintpipe.planner.buffer_updates import keep_model_buffers
from hintpipe.planner.capture import (
    CapturedGraph,
    CaptureSpec,
    allowed_cuts,
    attribute,
    capture,
    value_uses,
)
from hintpipe.planner.fixed_shapes import FixedShapes
from hintpipe.planner.forced_cuts import forced_cuts as forced_cuts
from hintpipe.planner.memory import MemoryModel, stage_cost
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.partition import Partition, describe, max_microbatch_size, summary
from hintpipe.planner.profile import profile
from hintpipe.planner.search import PlanError, search
from hintpipe.planner.stagegen import crossing, extract
from hintpipe.planner.tables import NodeTables
from hintpipe.renamed import retired_attribute
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.resolve import resolve_hint
from hintpipe.tensor_bytes import nbytes, tensors_in
from hintpipe.units import format_size, parse_sizes


@dataclasses.dataclass(frozen=True)
class Plan:
    """Stage cuts with their recompute/offload choices, and the baselines beside them."""

    hint: str
    ranks: int
    chunks: int
    microbatches: int
    microbatch_size: int
    partition: Partition
    baselines: dict[str, Partition]
    tied: tuple[tuple[str, ...], ...]  # groups of names of one tensor used by several stages
    tied_stages: tuple[tuple[int, ...], ...]  # the stages using each group's tensor
    graph: CapturedGraph = dataclasses.field(compare=False, repr=False)
    profiles: tuple[NodeProfile, ...] = dataclasses.field(compare=False, repr=False)
    #: How the graph was captured (a plan file keeps this, not the graph's code).
    spec: CaptureSpec = dataclasses.field(default_factory=CaptureSpec, compare=False, repr=False)
    #: A Hugging Face model's class name and its whole config as ``config.json`` holds it (None for other
    #: models): what a run's checkpoints record, so that ``hintpipe export`` rebuilds the model that was
    #: planned, not one a caller's config names.
    hf_model: tuple[str, str] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def stages(self) -> int:
        """The number of stages (the partition's: ``to_json()["stages"]`` lists them)."""
        return len(self.partition.cuts) - 1

    @property
    def num_stages(self) -> int:
        """Deprecated: :attr:`stages` (its name before 0.7)."""
        retired_attribute("Plan.num_stages", "Plan.stages")
        return self.stages

    @property
    def fingerprint(self) -> str:
        """What makes two plans train the same model the same way: the pipeline, the cuts, the
        recompute and offload choices, the captured graph's code and parameter shapes.

        Two ``hintpipe.plan`` calls on one model can cut differently (node times are measured
        afresh); :meth:`~hintpipe.runtime.pipeline.Pipeline.from_plan` refuses ranks whose
        fingerprints differ. Make the plan once and :meth:`share` it, or load one plan file.
        """
        parts = [
            f"{self.hint} {self.ranks} {self.chunks} {self.microbatches} {self.partition.cuts}",
            *(f"{s.recompute} {s.offload}" for s in self.partition.stages),
            self.graph.module.code,
            *(f"{n}:{tuple(p.shape)}" for n, p in self.graph.module.named_parameters()),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def share(self, src: int = 0) -> Plan:
        """This plan as rank ``src`` holds it, on every rank (call on every rank of the process group; a rank
        that made no plan calls :func:`share_plan` with None)."""
        return share_plan(self, src)

    def first_modules(self) -> tuple[str, ...]:
        """Per stage, the module path of its first node that has one (``transformer.h.2``), else that node's
        name: where the stage starts, in the model's own words."""
        by_name = {p.name: i for i, p in enumerate(self.profiles)}
        out = []
        for stage in self.partition.stages:
            start = by_name.get(stage.first_node)
            names = self.profiles[start : start + stage.nodes] if start is not None else ()
            out.append(next((p.module for p in names if p.module), stage.first_node))
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        out = summary(self.partition)
        for stage, module in zip(out["stages"], self.first_modules(), strict=True):
            stage["first_module"] = module
        out["baselines"] = {name: summary(p) for name, p in self.baselines.items()}
        out |= {
            "hint": self.hint,
            "ranks": self.ranks,
            "chunks": self.chunks,
            "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size,
            "tied_parameters": [list(group) for group in self.tied],
        }
        return out

    def build_stage(self, index: int) -> nn.Module:
        """Stage ``index`` as a module applying the plan's recompute and offload choices.

        Its parameters are the plan's own (the captured copy of the model's), so stages that share a
        tensor share it here too; :meth:`Pipeline.from_plan <hintpipe.runtime.pipeline.Pipeline.from_plan>`
        trains copies of them.
        """
        if not 0 <= index < self.stages:
            raise IndexError(f"the plan has stages 0..{self.stages - 1}, got {index}")
        graph = self.graph
        a, b = self.partition.cuts[index], self.partition.cuts[index + 1]
        nodes = graph.nodes[a:b]
        inputs = crossing(graph, a) if index else list(graph.inputs)
        last = index == self.stages - 1
        outputs = list(graph.output.all_input_nodes) if last else crossing(graph, b)
        stage = self.partition.stages[index]
        by_name = {n.name: n for n in nodes}
        groups = {by_name[n]: "recompute" for n in stage.recompute} | {by_name[n]: "offload" for n in stage.offload}
        output_value = graph.output.args[0] if last else None
        module = extract(graph, nodes, inputs, outputs, groups=groups, output_value=output_value, boundary=True)
        if index == 0 and graph.fixed:  # [Note: dimensions the capture fixes]
            module.register_forward_pre_hook(FixedShapes(graph.fixed))
        if not graph.follows_autocast:
            module.register_forward_pre_hook(Float32Only(index))
        return module

    def activation_room(self, stages: Sequence[int]) -> float:
        """Activation bytes the budgets leave to these stages (one rank's): their planned
        in-flight activations plus their spare memory; infinite without a budget."""
        planned = [self.partition.stages[s] for s in stages]
        if any(math.isinf(s.budget_bytes) for s in planned):
            return math.inf
        return sum(max(0.0, s.spare_bytes) + s.inflight * s.activation_bytes for s in planned)

    def spare_slots(self, stage: int) -> int:
        """Micro-batches of activations that fit in the stage's budget beyond its planned peak."""
        s = self.partition.stages[stage]
        per_mb = s.activation_bytes
        if math.isinf(s.budget_bytes) or per_mb <= 0:
            return 0
        return max(0, int(s.spare_bytes // per_mb))


def share_plan(plan: Plan | None, src: int = 0) -> Plan:
    """Rank ``src``'s plan, on every rank of the default process group (call on every rank; only ``src``'s
    argument matters, the others may pass None): plan once, on one rank, and share it.

    Raises:
        ValueError: rank ``src`` had no plan.
    """
    import torch.distributed as dist

    box: list[Any] = [plan if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    shared = box[0]
    if not isinstance(shared, Plan):
        raise ValueError(f"rank {src} passed no plan to share_plan")
    return shared


def node_tables(profiles: Sequence[NodeProfile], graph: CapturedGraph | None = None) -> NodeTables:
    """Tables for ``profiles`` of ``graph``'s nodes (``graph=None``: a chain, node i feeding i + 1)."""
    if graph is None:
        return NodeTables.chain(profiles)
    uses = value_uses(graph, profiles)
    return NodeTables.build(profiles, uses, allowed_cuts(graph, uses))


def _tied(graph: CapturedGraph, cuts: Sequence[int]) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Parameters used by more than one stage, found by tensor identity: per tensor, every name it
    has (``lm_head.weight`` and ``transformer.wte.weight`` when they are one) and the stages using it."""
    root = graph.module
    names: dict[int, set[str]] = {}
    for name, param in root.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), set()).update(graph.aliases.get(name, (name,)))
    stages_of: dict[int, set[int]] = {}
    for s in range(len(cuts) - 1):
        for node in graph.nodes[cuts[s] : cuts[s + 1]]:
            for param in _parameters_used(root, node):
                stages_of.setdefault(id(param), set()).add(s)
    return sorted((tuple(sorted(names[key])), tuple(sorted(st))) for key, st in stages_of.items() if len(st) > 1)


def _parameters_used(root: nn.Module, node: Any) -> list[nn.Parameter]:
    """The parameters a graph node reads: its module's, or the ones its inputs fetch."""
    found: list[nn.Parameter] = []
    if node.op == "call_module":
        found += list(root.get_submodule(str(node.target)).parameters())
    for arg in node.all_input_nodes:
        if arg.op == "get_attr" and isinstance(value := attribute(root, str(arg.target)), nn.Parameter):
            found.append(value)
    return found


def plan(
    model: nn.Module,
    example: Any,
    *,
    ranks: int,
    microbatches: int,
    stage_memory: float | str | Sequence[float | str] = math.inf,
    hint: str | Hint = "1f1b",
    chunks: int | None = None,
    microbatch_size: int | None = None,
    optimizer_factor: float = 2.0,
    host_bandwidth: float | None = None,
    repeats: int = 5,
    cache_dir: str | Path | None = None,
    modules: Sequence[str] | None = None,
    profiles: Sequence[NodeProfile] | None = None,
    kwargs: dict[str, Any] | None = None,
    split_points: Sequence[str] | None = None,
    captured: CapturedGraph | None = None,
    autocast: bool = True,
) -> Plan:
    """Plan ``model`` into ``ranks`` pipeline ranks (x ``chunks`` stages each).

    Args:
        model: the model (a deep copy is captured; the model is not touched).
        example: one micro-batch of inputs (a tensor or a tuple of tensors);
            its first dimension is the profiled micro-batch size.
        ranks: pipeline ranks.
        microbatches: micro-batches per step (the hint's in-flight counts depend on it).
        stage_memory: the total memory of each stage's device in bytes (parameters, gradients, optimizer
            state and activations): one value or one per stage (``"2GiB"``, ``"1GiB,2GiB,..."``).
        hint: the schedule the runtime will follow.
        microbatch_size: plan for this size (default: the example's).
        optimizer_factor: optimizer state bytes per parameter byte (Adam 2, SGD 0).
        host_bandwidth: bytes/s to host memory for offloading; default 0 (no offload) for a model on the CPU,
            where the host is the device, else 10e9.
        modules: for untraceable models, the submodules to run in sequence.
        profiles: reuse profiles instead of measuring.
        kwargs: keyword inputs of the capture (``{"use_cache": False}``): torch.export captures the model with
            them (see :func:`~hintpipe.planner.capture.capture`); tensors among them become stage 0's inputs
            after the positional ones.
        split_points: cut the model right before each of these submodules (``["transformer.h.4"]``, as
            torch.distributed.pipelining's ``split_spec`` at ``BEGINNING``), one fewer than the stages:
            the cuts are kept as given (the budgets still choose recompute and offload), not searched.
        captured: what :func:`~hintpipe.planner.capture.capture` returned for this model, example, ``kwargs`` and
            ``modules`` (with ``profiles``, several pipelines plan from one capture); else captured afresh.
        autocast: whether the stages must run under ``precision="bf16"`` too (a torch.export capture is then
            made twice, see :func:`~hintpipe.planner.capture.capture`); False plans for float32 training
            alone, in about half the capture time, and its stages refuse a bfloat16 autocast.

    Raises:
        hintpipe.planner.capture.CaptureError: the model cannot be captured.
        hintpipe.planner.PlanError: no cut fits the budgets (names the stage and the bytes short), or a split
            point that names no submodule, falls where a value other than a tensor crosses, or is out of order.
    """
    graph, profiles, profiled = _measured(
        model, example, modules, profiles, kwargs or {}, repeats=repeats, cache_dir=cache_dir, captured=captured,
        autocast=autocast,
    )  # fmt: skip
    positional = example if isinstance(example, tuple) else (example,)
    spec = CaptureSpec.of(positional, kwargs, modules, autocast=graph.follows_autocast)
    hint_obj = resolve_hint(hint, ranks, microbatches, chunks)
    size = microbatch_size or profiled
    memory = _memory_model(model, hint_obj, stage_memory, optimizer_factor, host_bandwidth, scale=size / profiled)
    partition, baselines, tied = _cut(graph, profiles, memory, hint_obj.stages, profiled, split_points)
    return Plan(
        hint=hint_obj.name,
        ranks=ranks,
        chunks=hint_obj.stages // ranks,
        microbatches=microbatches,
        microbatch_size=size,
        partition=partition,
        baselines=baselines,
        tied=tuple(names for names, _ in tied),
        tied_stages=tuple(stages for _, stages in tied),
        graph=graph,
        profiles=tuple(profiles),
        spec=spec,
        hf_model=_hf_model(model),
    )


def _cut(
    graph: CapturedGraph,
    profiles: Sequence[NodeProfile],
    memory: MemoryModel,
    stages: int,
    profiled: int,
    split_points: Sequence[str] | None,
) -> tuple[Partition, dict[str, Partition], list[tuple[tuple[str, ...], tuple[int, ...]]]]:
    """The graph cut into ``stages`` under ``memory``: the partition with its recompute and offload choices, the
    memory-blind baselines beside it, and the parameters the cuts leave in several stages."""
    tables = node_tables(profiles, graph)
    cuts = _stage_cuts(graph, tables, memory, stages, split_points)
    partition = _partition(tables, memory, cuts, profiled, savings=True)
    return partition, _baselines(tables, memory, stages, profiled), _tied(graph, cuts)


def _hf_model(model: nn.Module) -> tuple[str, str] | None:
    """``(class name, config JSON)`` of a Hugging Face model (its ``config`` writes itself as JSON), else None."""
    config = getattr(model, "config", None)
    write = getattr(config, "to_json_string", None)
    return (type(model).__name__, str(write(use_diff=False))) if callable(write) else None


def _memory_model(
    model: nn.Module,
    hint: Hint,
    stage_memory: float | str | Sequence[float | str],
    optimizer_factor: float,
    host_bandwidth: float | None,
    *,
    scale: float,
) -> MemoryModel:
    """What each of the hint's stages may hold and what offloading costs there. The host bandwidth defaults
    to none for a model on the CPU (the host is the device), else 10e9 bytes/s."""
    if host_bandwidth is None:
        host_bandwidth = 0.0 if all(p.device.type == "cpu" for p in model.parameters()) else 10e9
    budgets = parse_sizes(stage_memory, hint.stages, "stage_memory")
    return MemoryModel(hint.stage_peaks, budgets, optimizer_factor, host_bandwidth, scale=scale)


def _stage_cuts(
    graph: CapturedGraph, tables: NodeTables, memory: MemoryModel, total: int, split_points: Sequence[str] | None
) -> tuple[int, ...]:
    """Where the ``total`` stages begin and end: searched for the smallest bottleneck within the budgets, or
    the caller's ``split_points`` kept as given, once they are shown to fit."""
    if split_points is None:
        return search(tables, memory, total)
    cuts = forced_cuts(graph, tables, split_points, total)
    _check_fits(tables, memory, cuts, split_points)
    return cuts


def _check_fits(tables: NodeTables, memory: MemoryModel, cuts: Sequence[int], names: Sequence[str]) -> None:
    """Given cuts must fit their budgets with every saving; else the first stage that does not, in one line."""
    for s in range(len(cuts) - 1):
        cost = stage_cost(tables, memory, s, cuts[s], cuts[s + 1])
        if not cost.feasible:
            raise PlanError(
                f"stage {s} of the split points {list(names)} cannot fit in its budget of "
                f"{format_size(memory.budgets[s])}: even with every saving it is {cost.shortfall:,.0f} bytes over"
            )


def _measured(
    model: nn.Module,
    example: Any,
    modules: Sequence[str] | None,
    profiles: Sequence[NodeProfile] | None,
    kwargs: dict[str, Any],
    *,
    repeats: int,
    cache_dir: str | Path | None,
    captured: CapturedGraph | None = None,
    autocast: bool = True,
) -> tuple[CapturedGraph, Sequence[NodeProfile], int]:
    """The captured graph, its profiles (``profiles`` if given) and the profiled micro-batch size."""
    positional = example if isinstance(example, tuple) else (example,)
    if captured is None:
        captured = capture(model, modules=modules, example=positional, kwargs=kwargs, autocast=autocast)
    graph = captured
    inputs = (*positional, *(v for v in kwargs.values() if isinstance(v, torch.Tensor)))
    for node, value in zip(graph.inputs, inputs, strict=False):
        node.meta["example_bytes"] = nbytes(value)
    profiled = int(tensors_in(list(inputs))[0].shape[0])
    if profiles is None:
        profiles = profile(graph, inputs, repeats=repeats, cache_dir=cache_dir)
    for param in graph.module.parameters():  # profiling ran backward into the copy's parameters
        param.grad = None
    keep_model_buffers(graph.module, model)  # and wrote its buffers: [Note: buffers a forward updates]
    return graph, profiles, profiled


def _baselines(tables: NodeTables, memory: MemoryModel, stages: int, profiled: int) -> dict[str, Partition]:
    """The memory-blind partitions, as cut (no savings): equal layers, balanced parameters, balanced time."""
    return {
        name: _partition(tables, memory, cuts, profiled, savings=False)
        for name, cuts in (
            ("uniform", uniform_cuts(tables, stages)),
            ("params", balanced_cuts(np.asarray(tables.params), tables.allowed, stages)),
            ("time", balanced_cuts(np.asarray(tables.compute), tables.allowed, stages)),
        )
    }


def _partition(
    tables: NodeTables, memory: MemoryModel, cuts: tuple[int, ...], profiled: int, *, savings: bool
) -> Partition:
    """``cuts`` described, with the largest micro-batch that fits: for the plan (``savings``), the largest
    for which the search finds any partition; for a baseline, the largest its own cuts hold as cut."""
    stages = len(cuts) - 1
    described = describe(tables, memory, cuts, savings=savings)

    def fits(m: MemoryModel) -> bool:
        if savings:
            try:
                search(tables, m, stages)
            except ValueError:
                return False
            return True
        return all(stage_cost(tables, m, s, cuts[s], cuts[s + 1], savings=False).feasible for s in range(stages))

    return Partition(
        cuts=cuts,
        bottleneck_ms=max(s.time_ms for s in described),
        stages=described,
        max_microbatch_size=max_microbatch_size(tables, memory, stages, profiled, fits),
    )
