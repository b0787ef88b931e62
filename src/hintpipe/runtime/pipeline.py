"""The runtime: one process per rank, driven by the scoreboard.

Each rank runs the same loop: take the messages that arrived, ask the
:class:`~hintpipe.scoreboard.Scoreboard` what to run, run it, send what it
produced. When nothing is ready it blocks on its inbox until a message comes,
the ``ready`` policy's patience runs out, or the watchdog fires.

Training semantics are those of the unsplit model: the loss of micro-batch
``i`` is ``loss_fn(output_i, target_i) / D`` with ``D`` the number of
micro-batches (mean over micro-batches, the same as one mean-reduced loss over
the whole batch when micro-batches are equal) or a divisor the caller gives
(e.g. the step's token count, with a sum-reduced ``loss_fn``). Gradients are
accumulated into ``.grad`` and never rescaled, so calling :meth:`Pipeline.step`
twice without zeroing gives exactly twice one step's gradient. The optimizer
step stays the caller's.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hintpipe.observe.trace import Record
from hintpipe.planner.plan import Plan
from hintpipe.runtime.executor import EmulatedExecutor, LossFn, StageExecutor, as_input
from hintpipe.runtime.faults import Injection
from hintpipe.runtime.mailbox import Message, MessageKind, PeerFailure, PostOffice
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, HintName
from hintpipe.schedule.task import Kind, Task
from hintpipe.scoreboard import BudgetError, Policy, RankGraph, RankPlan, Scoreboard
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import Sample, Simulator, lower_bound
from hintpipe.units import format_size

log = logging.getLogger(__name__)


class WatchdogTimeout(RuntimeError):
    """A rank waited longer than the timeout with nothing ready."""


class NonFiniteLoss(FloatingPointError):
    """The loss of a micro-batch is NaN or infinite: the step stops before the optimizer runs."""


class TaskError(RuntimeError):
    """A stage's computation failed (e.g. a shape it cannot accept), named by task and micro-batch."""


class OptionMismatch(ValueError):
    """Ranks were started with different pipeline options."""


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one step did on this rank (``records``: every rank's, after gathering)."""

    step: int
    rank: int
    policy: Policy
    step_time: float
    lower_bound: float
    records: tuple[Record, ...]
    peak_live: tuple[float, ...]
    peak_live_bytes: tuple[int, ...]
    loss: float | None
    busy: tuple[float, ...] = ()  # per rank, seconds of task time (kept when ``records`` is dropped)

    @property
    def efficiency(self) -> float:
        return self.lower_bound / self.step_time if self.step_time > 0 else 1.0

    @property
    def bubble(self) -> tuple[float, ...]:
        """Per rank, the idle share of the step."""
        return tuple(1.0 - b / self.step_time for b in self.busy)


def _split(value: Any, count: int, what: str) -> list[Any]:
    """``value`` as ``count`` micro-batches: a list of them as given, or a tensor
    (or tuple of tensors) split equally along dimension 0."""
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"{what}: got a list of {len(value)} micro-batches, the pipeline runs {count}")
        return value
    tensors = value if isinstance(value, tuple) else (value,)
    size = tensors[0].shape[0]
    if size % count:
        raise ValueError(
            f"{what}: batch of {size} does not split into {count} equal micro-batches; "
            f"use a batch size divisible by {count}, or pass a list of {count} micro-batches"
        )
    parts = [t.chunk(count, dim=0) for t in tensors]
    if isinstance(value, tuple):
        return [tuple(p[i] for p in parts) for i in range(count)]
    return list(parts[0])


class Pipeline:
    """Pipeline-parallel training of one model across the ranks of a process group.

    Call on every rank after ``torch.distributed.init_process_group``.

    Args:
        modules: this rank's stages, global stage id -> module (see
            :meth:`from_modules` to pass the whole list).
        loss_fn: ``loss_fn(output, target)`` of one micro-batch, a scalar.
        microbatches: micro-batches per step.
        hint: a generator name or a :class:`~hintpipe.hint.Hint`.
        policy: ``fixed``, ``greedy`` or ``ready``.
        chunks: stages per rank (interleaved schedules); ``zbv`` implies 2.
        memory_slack: room for this many more in-flight micro-batches than
            the hint's own peak (activation slots), spent by running ahead.
        memory_budget: activation bytes this rank may hold, instead of
            ``memory_slack`` (see [Note: byte admission]).
        timeout: seconds a rank may wait with nothing ready before the
            watchdog ends the step with an error on every rank.
        injection: variability to inject (experiments).
        emulate: ``costs(stage, kind, mb)`` in seconds; sleep instead of
            computing (for more ranks than cores).
        history: how many steps' reports (timelines) to keep.
        on_nonfinite: a NaN or infinite loss ``"raise"``s :class:`NonFiniteLoss`
            on the last stage's rank (its neighbours then fail naming it), or
            with ``"skip"`` the step finishes, every rank zeroes its gradients
            and the step is listed in :attr:`nonfinite_steps` (with ``broadcast_loss``
            every rank sees the non-finite loss and can skip its optimizer step).

    [Note: byte admission]
    With a ``memory_budget`` each micro-batch is admitted by its own size, so
    that micro-batches of different shapes (variable sequence lengths) cannot
    push a rank over its budget by running ahead. At the start of a step the
    rank of stage 0 broadcasts each micro-batch's size in input elements
    (tokens, rows); every rank estimates the activation bytes of ``F(s, mb)``
    as that size times the most bytes per element stage ``s`` has kept so far
    (measured, as :attr:`StepReport.peak_live_bytes` is), and the scoreboard
    admits in those bytes. The first step runs the hint in order and measures;
    if it alone holds more than the budget, :class:`BudgetError`. A later step
    whose micro-batches are so large that the hint's own order needs more than
    the budget runs that order (no running ahead); a step whose measured peak
    still exceeds the budget (activations that grow faster than the input, as
    attention scores do) logs a warning and raises the estimates by the excess.
    """

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
        timeout: float = 300.0,
        injection: Injection | None = None,
        emulate: Any = None,
        on_nonfinite: str = "raise",
        history: int = 100,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("call torch.distributed.init_process_group before building a Pipeline")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.policy = Policy.parse(policy) if isinstance(policy, str) else policy
        if isinstance(hint, str):
            name = HintName.parse(hint)
            chunks = chunks if chunks is not None else (2 if name is HintName.ZBV else 1)
            hint = generate_hint(name, self.world, microbatches, chunks)
        elif hint.num_ranks != self.world or hint.num_microbatches != microbatches:
            raise ValueError(
                f"hint {hint.name!r} is for {hint.num_ranks} ranks and {hint.num_microbatches} micro-batches, "
                f"the group has {self.world} ranks and the pipeline runs {microbatches}"
            )
        self.hint = hint
        self.microbatches = microbatches
        mine = hint.placement.stages_of(self.rank)
        if sorted(modules) != list(mine):
            raise ValueError(
                f"rank {self.rank} hosts stages {list(mine)} under hint {hint.name!r}, got modules for "
                f"stages {sorted(modules)}"
            )
        self.stages = mine
        self.last_stage = hint.num_stages - 1
        self.timeout = timeout
        self.injection = injection or Injection()
        if memory_budget is not None and memory_slack:
            raise ValueError("give memory_slack or memory_budget, not both")
        self.memory_slack = memory_slack
        self.memory_budget = memory_budget
        #: Per stage of this rank, the most activation bytes per input element seen (byte admission).
        self.bytes_per_element: dict[int, float] = {}
        self._strict_budget = True  # a plan's budget is room to run ahead, not a limit on the hint itself
        self.executor: StageExecutor | EmulatedExecutor
        if emulate is not None and memory_budget is not None:
            raise ValueError("memory_budget needs real compute: emulated tasks hold no activations; use memory_slack")
        if emulate is not None:
            self.executor = EmulatedExecutor(emulate, self.last_stage)
        else:
            self.executor = StageExecutor(modules, self.last_stage, loss_fn, hint.split_backward)
        self.modules = dict(modules)
        stage_rank = hint.placement.stage_rank
        peers = {stage_rank[s + d] for s in mine for d in (-1, 1) if 0 <= s + d < hint.num_stages}
        # Point-to-point traffic gets its own gloo group so that it never
        # interleaves with the collectives (barrier, gathers) of the default one.
        self._p2p = dist.new_group(backend="gloo")
        # Collectives of the runtime (step barrier, timeline gather, loss
        # broadcast) get a group whose timeout is the watchdog's, so a stuck
        # rank cannot hold the others in a collective either.
        self._coll = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        self.device = torch.device("cpu")
        self.post = PostOffice(sorted(peers), self.device, group=self._p2p, delay_s=self.injection.comm_ms / 1000)
        self.graph = RankGraph(hint, self.rank)
        self._plan: RankPlan | None = None
        self._stash: list[Message] = []
        self._stopped: set[int] = set()
        self.step_count = 0
        #: The last ``history`` steps' reports (bounded: a run of days must not grow).
        self.reports: list[StepReport] = []
        self.history = history
        self._closed = False
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
        self.on_nonfinite = on_nonfinite
        self.nonfinite_steps: list[int] = []
        self._check_options(
            {
                "hint": hint.name,
                "stages": hint.num_stages,
                "microbatches": microbatches,
                "policy": self.policy.value,
                "split_backward": hint.split_backward,
                "timeout": timeout,
                "on_nonfinite": on_nonfinite,
                "emulated": emulate is not None,
                "byte_admission": memory_budget is not None,
                "injection": dataclasses.asdict(self.injection),
            }
        )

    @classmethod
    def from_modules(cls, modules: Sequence[nn.Module], **kwargs: Any) -> Pipeline:
        """Build from the list of *all* stage modules (global order); each rank keeps its own."""
        rank, world = dist.get_rank(), dist.get_world_size()
        microbatches = kwargs["microbatches"]
        hint = kwargs.get("hint", "1f1b")
        if isinstance(hint, str):
            name = HintName.parse(hint)
            chunks = kwargs.get("chunks") or (2 if name is HintName.ZBV else 1)
            hint = generate_hint(name, world, microbatches, chunks)
            kwargs["hint"] = hint
        if len(modules) != hint.num_stages:
            raise ValueError(
                f"got {len(modules)} stage modules; hint {hint.name!r} on {world} ranks needs "
                f"{hint.num_stages} ({hint.num_stages // world} per rank)"
            )
        return cls({s: modules[s] for s in hint.placement.stages_of(rank)}, **kwargs)

    @classmethod
    def from_plan(cls, plan: Plan, **kwargs: Any) -> Pipeline:
        """Build from a :class:`~hintpipe.planning.Plan`: each rank builds its planned stages.

        Unless ``memory_slack`` or ``memory_budget`` is given, a plan made under
        a memory budget gives each rank a byte budget for activations: its
        stages' planned activations plus their spare memory (budget minus
        planned peak), so the memory the planner frees becomes room to run
        ahead, admitted by each micro-batch's own size (see [Note: byte
        admission]). If the hint's own order turns out to hold more than the
        plan predicted, the rank runs the hint without running ahead.
        """
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != plan.ranks:
            raise ValueError(f"the plan is for {plan.ranks} ranks, the group has {world}")
        hint = generate_hint(HintName.parse(plan.hint), plan.ranks, plan.microbatches, plan.chunks)
        mine = hint.placement.stages_of(rank)
        from_budget = "memory_slack" not in kwargs and "memory_budget" not in kwargs
        if from_budget:
            room = plan.activation_room(mine)
            if math.isfinite(room) and not kwargs.get("emulate"):
                kwargs["memory_budget"] = room
        kwargs.setdefault("microbatches", plan.microbatches)
        pipe = cls({s: plan.build_stage(s) for s in mine}, hint=hint, **kwargs)
        pipe._strict_budget = not from_budget
        return pipe

    @classmethod
    def from_sequential(cls, model: nn.Sequential, split: Sequence[int], **kwargs: Any) -> Pipeline:
        """Cut ``model`` before each index in ``split`` (``[2, 4]``: layers 0-1, 2-3, 4-)."""
        bounds = [0, *split, len(model)]
        if any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"split points {list(split)} must increase strictly within 1..{len(model) - 1}")
        return cls.from_modules([model[a:b] for a, b in itertools.pairwise(bounds)], **kwargs)

    # -- one step ---------------------------------------------------------------

    def step(
        self,
        inputs: Any = None,
        target: Any = None,
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
        """
        if self._closed:
            raise RuntimeError("this Pipeline is closed")
        try:
            return self._step(inputs, target, loss_divisor, broadcast_loss)
        except Exception as exc:
            self._abort(exc)
            raise

    def _abort(self, exc: BaseException) -> None:
        if not self._closed:
            self._closed = True
            text = str(exc) if str(exc).startswith(f"rank {self.rank}:") else f"rank {self.rank}: {exc}"
            self.post.close(timeout=5.0, error=text)

    def _step(self, inputs: Any, target: Any, loss_divisor: float | None, broadcast_loss: bool) -> torch.Tensor | None:
        step, m = self.step_count, self.microbatches
        act_in: dict[tuple[int, int], list[torch.Tensor]] = {}
        grad_in: dict[tuple[int, int], list[torch.Tensor | None]] = {}
        targets: list[Any] = [None] * m
        emulated = isinstance(self.executor, EmulatedExecutor)
        if 0 in self.stages:
            if emulated:
                batches = [torch.zeros(1)] * m
            elif inputs is None:
                raise ValueError(f"rank {self.rank} hosts stage 0 and needs the inputs")
            else:
                batches = _split(inputs, m, "inputs")
            for mb, batch in enumerate(batches):
                act_in[(0, mb)] = list(batch) if isinstance(batch, tuple) else [batch]
        if self.last_stage in self.stages and not emulated:
            if target is None:
                raise ValueError(f"rank {self.rank} hosts the last stage and needs the target")
            targets = _split(target, m, "target")
        scale = 1.0 / (loss_divisor if loss_divisor is not None else m)
        policy = self.policy
        if policy is Policy.READY and self._plan is None:
            policy = Policy.FIXED  # no measured plan yet: the first step runs the hint in order
        self._barrier(step)  # before any collective of the step: a missing rank is named here
        elements = self._elements(act_in) if self.memory_budget is not None else None
        graph, budget = self._admission(elements)
        board = Scoreboard(graph, policy, budget=budget, plan=self._plan)
        stage_rank = self.hint.placement.stage_rank
        losses: list[torch.Tensor] = []
        records: list[Record] = []
        peak_bytes = self.executor.live_bytes

        def accept(msg: Message) -> None:
            if msg.kind is MessageKind.STOP:
                self._stopped.add(msg.peer)
                return
            if msg.kind is MessageKind.ABORT:
                raise PeerFailure(f"rank {self.rank}: rank {msg.peer} failed in step {step}; it said: {msg.error}")
            if msg.step > step:
                self._stash.append(msg)
                return
            if msg.step < step:
                raise RuntimeError(f"rank {self.rank}: message for old step {msg.step} in step {step}")
            if msg.kind is MessageKind.ACTIVATION:
                act_in[(msg.stage, msg.mb)] = [as_input(t) for t in msg.tensors if t is not None]
                board.deliver(Task(msg.stage, Kind.F, msg.mb))
            else:
                grad_in[(msg.stage, msg.mb)] = msg.tensors
                board.deliver(Task(msg.stage, Kind.B, msg.mb))

        t0 = time.perf_counter()
        stash, self._stash = self._stash, []
        for msg in stash:
            accept(msg)
        last_progress = t0
        while not board.done:
            while (arrived := self.post.get(0)) is not None:
                accept(arrived)
            now = time.perf_counter()
            pos = board.take(now - t0)
            if pos < 0:
                deadline = last_progress + self.timeout
                wait = deadline - now
                if math.isfinite(board.wake_at):
                    wait = min(wait, board.wake_at - (now - t0))
                arrived = self.post.get(max(wait, 1e-4))
                if arrived is not None:
                    accept(arrived)
                    last_progress = time.perf_counter()
                elif time.perf_counter() >= deadline:
                    raise WatchdogTimeout(
                        f"rank {self.rank}: waited {self.timeout:g} s with nothing ready in step {step}; "
                        + board.pending_report()
                    )
                continue
            task = board.tasks[pos]
            s, kind, mb = task
            if records:
                self._inject_fault(step)
            start = time.perf_counter()
            try:
                if kind is Kind.F:
                    before = self.executor.live_bytes
                    mb_scale = math.nan if (step in self.injection.nan_steps and mb == 0) else scale
                    outputs, loss = self.executor.forward(s, mb, act_in.pop((s, mb)), targets[mb], mb_scale)
                    if loss is not None:
                        self._check_loss(loss, step, mb)
                        losses.append(loss)
                    peak_bytes = max(peak_bytes, self.executor.live_bytes)
                    if elements is not None:
                        kept = (self.executor.live_bytes - before) / max(1, elements[mb])
                        self.bytes_per_element[s] = max(self.bytes_per_element.get(s, 0.0), kept)
                elif kind is Kind.B:
                    grads = None if s == self.last_stage else grad_in.pop((s, mb))
                    dinputs = self.executor.backward(s, mb, grads)
                else:
                    self.executor.weight(s, mb)
            except (NonFiniteLoss, KeyboardInterrupt):
                raise
            except Exception as exc:
                raise TaskError(
                    f"rank {self.rank}: task {task} (stage {s}, micro-batch {mb}) failed in step {step}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            compute_end = time.perf_counter()
            if self.injection.active:
                extra = self.injection.extra_seconds(self.rank, step, s, kind.name, mb, compute_end - start)
                if extra > 0:
                    time.sleep(extra)
            end = time.perf_counter()
            board.finish(pos, end - t0)
            records.append((self.rank, task, start - t0, end - t0))
            last_progress = end
            if kind is Kind.F and s < self.last_stage:
                if stage_rank[s + 1] == self.rank:
                    act_in[(s + 1, mb)] = [as_input(t) for t in outputs]
                else:
                    self.post.send(stage_rank[s + 1], MessageKind.ACTIVATION, step, s + 1, mb, outputs)
            elif kind is Kind.B and s > 0:
                if stage_rank[s - 1] == self.rank:
                    grad_in[(s - 1, mb)] = dinputs
                else:
                    self.post.send(stage_rank[s - 1], MessageKind.GRADIENT, step, s - 1, mb, dinputs)
        end_of_step = time.perf_counter() - t0
        self.post.flush(self.timeout)
        if self.memory_budget is not None:
            self._check_budget(step, peak_bytes, budget, first=graph is self.graph)
        loss_value = torch.stack(losses).sum() if losses else None
        self._finish_step(step, policy, end_of_step, records, self._in_flight_peak(records), peak_bytes, loss_value)
        self.step_count += 1
        if broadcast_loss:
            owner = stage_rank[self.last_stage]
            buffer = loss_value.detach().clone() if loss_value is not None else torch.zeros(())
            dist.broadcast(buffer, src=owner, group=self._coll)
            return buffer
        return loss_value

    def _elements(self, act_in: Mapping[tuple[int, int], list[torch.Tensor]]) -> list[int]:
        """Each micro-batch's size in input elements, from the rank of stage 0 to every rank."""
        sizes = torch.zeros(self.microbatches, dtype=torch.int64)
        if 0 in self.stages:
            for mb in range(self.microbatches):
                sizes[mb] = sum(t.numel() for t in act_in[(0, mb)])
        source = self.hint.placement.stage_rank[0]
        try:
            dist.broadcast(sizes, src=source, group=self._coll)
        except RuntimeError as exc:
            raise WatchdogTimeout(
                f"rank {self.rank}: waited {self.timeout:g} s for the micro-batch sizes from rank {source} in step "
                f"{self.step_count}: {exc}"
            ) from None
        return [int(v) for v in sizes.tolist()]

    def _admission(self, elements: list[int] | None) -> tuple[RankGraph, float]:
        """The step's dependency graph and budget: slots, or bytes per micro-batch (byte admission)."""
        if elements is None:
            return self.graph, self.graph.peak + self.memory_slack * self.graph.unit
        assert self.memory_budget is not None
        if any(s not in self.bytes_per_element for s in self.stages):
            return self.graph, self.graph.peak  # the first step: the hint in order, measuring
        sizes = [
            self.bytes_per_element[t.stage] * elements[t.mb] if t.kind is Kind.F else 0.0 for t in self.graph.tasks
        ]
        graph = RankGraph(self.hint, self.rank, sizes)
        return graph, max(self.memory_budget, graph.peak)

    def _check_budget(self, step: int, peak_bytes: int, budget: float, first: bool) -> None:
        """After a step under byte admission: the hint itself must fit; estimates that fell short grow."""
        assert self.memory_budget is not None
        if peak_bytes <= self.memory_budget:
            return
        if first:
            if self._strict_budget:
                raise BudgetError(
                    f"rank {self.rank}: memory budget {format_size(self.memory_budget)} is below what the hint "
                    f"itself held, {format_size(peak_bytes)}; raise the budget, or use smaller or fewer micro-batches"
                )
        elif peak_bytes > budget:
            log.warning(
                "rank %d: step %d held %s of activations, over its budget of %s: activations grew faster than the "
                "micro-batches' input elements; the estimates are raised by that factor",
                self.rank,
                step,
                format_size(peak_bytes),
                format_size(budget),
            )
            factor = peak_bytes / budget
            self.bytes_per_element = {s: v * factor for s, v in self.bytes_per_element.items()}

    def _in_flight_peak(self, records: Sequence[Record]) -> float:
        """The most micro-batches this rank held at once: from an ``F``'s start to the end of the backward
        task that releases it (``W`` when split off, else ``B``)."""
        release = Kind.W if self.hint.split_backward else Kind.B
        events = sorted(
            [(start, 1) for _, task, start, _ in records if task.kind is Kind.F]
            + [(end, -1) for _, task, _, end in records if task.kind is release]
        )
        live = peak = 0
        for _, delta in events:
            live += delta
            peak = max(peak, live)
        return float(peak)

    def _inject_fault(self, step: int) -> None:
        """Injected faults, for tests: this rank dies or stops in the middle of ``step``."""
        if (self.rank, step) in self.injection.crash:
            log.error("rank %d: injected crash in step %d", self.rank, step)
            os._exit(3)
        if (self.rank, step) in self.injection.hang:
            log.error("rank %d: injected hang in step %d", self.rank, step)
            while True:
                time.sleep(3600)

    def _check_loss(self, loss: torch.Tensor, step: int, mb: int) -> None:
        if not bool(torch.isfinite(loss)):
            self.nonfinite_steps.append(step)
            if self.on_nonfinite == "raise":
                raise NonFiniteLoss(
                    f"rank {self.rank}: the loss of micro-batch {mb} in step {step} is {float(loss)}; the step "
                    "stops before the optimizer runs (on_nonfinite='skip' finishes it and zeroes the gradients)"
                )

    def _check_options(self, options: dict[str, Any]) -> None:
        """Every rank must run the same pipeline: compare once, at start-up.

        Memory slack and budgets are left out: they may differ per rank
        (heterogeneous devices, a plan's spare memory per stage).
        """
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

    def _finish_step(
        self,
        step: int,
        policy: Policy,
        step_time: float,
        records: list[Record],
        peak: float,
        peak_bytes: int,
        loss: torch.Tensor | None,
    ) -> None:
        """Share every rank's timeline; build the next step's plan from it."""
        gathered: list[Any] = [None] * self.world
        flagged = step in self.nonfinite_steps
        dist.all_gather_object(gathered, (records, peak, peak_bytes, step_time, flagged), group=self._coll)
        if any(part[4] for part in gathered):
            # on_nonfinite="skip": the whole step's gradients are poisoned; drop them everywhere.
            if not flagged:
                self.nonfinite_steps.append(step)
            for module in self.modules.values():
                for param in module.parameters():
                    param.grad = None
            log.warning("rank %d: step %d had a non-finite loss; its gradients were zeroed", self.rank, step)
        all_records = [r for part in gathered for r in part[0]]
        durations = np.zeros((self.hint.num_stages, self.microbatches, 3))
        for _, task, start, end in all_records:
            durations[task.stage, task.mb, task.kind] = end - start
        sample = Sample(durations, np.zeros_like(durations), 0.0)
        if self.policy is Policy.READY:
            self._plan = self._plan_from(durations)
        self.reports.append(
            StepReport(
                step=step,
                rank=self.rank,
                policy=policy,
                step_time=max(part[3] for part in gathered),
                lower_bound=lower_bound(self.hint, sample),
                records=tuple(sorted(all_records, key=lambda r: (r[2], r[0]))),
                peak_live=tuple(part[1] for part in gathered),
                peak_live_bytes=tuple(part[2] for part in gathered),
                loss=None if loss is None else float(loss),
                busy=tuple(sum(end - start for _, _, start, end in part[0]) for part in gathered),
            )
        )
        if len(self.reports) > self.history:
            del self.reports[: len(self.reports) - self.history]

    def _plan_from(self, durations: np.ndarray[Any, Any]) -> RankPlan:
        """The fixed-order timeline of the hint with each stage's median measured costs."""
        expected = np.zeros_like(durations)
        for s in range(durations.shape[0]):
            for k in range(3):
                expected[s, :, k] = statistics.median(durations[s, :, k].tolist())
        sim = Simulator(self.hint, CostModel.uniform(self.hint.num_stages))
        plan = sim.run(Policy.FIXED, Sample(expected, np.zeros_like(expected), 0.0))
        r = self.rank
        expected_costs = [float(expected[t.stage, t.mb, t.kind]) for t in self.hint.ranks[r]]
        return RankPlan.from_timeline(plan.starts[r], plan.ends[r], expected_costs)

    # -- shutdown ------------------------------------------------------------------

    def close(self) -> None:
        """Tell the neighbours this rank is done and stop its mailboxes."""
        if not self._closed:
            self._closed = True
            self.post.close(timeout=self.timeout)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
