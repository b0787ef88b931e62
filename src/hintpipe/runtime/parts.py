"""What one rank's pipeline is made of, fixed once built: :class:`Parts` (one frozen dataclass, read by plain
attribute access; its first fields, the rank's :class:`Wiring`, are built first), and the :class:`Seams` it is
built with beside its options.

:func:`hintpipe.runtime.assembly.assemble` builds them; the facade
(:class:`~hintpipe.runtime.pipeline.Pipeline`) and the step engine
(:class:`~hintpipe.runtime.engine.StepEngine`) read them. Nothing replaces a part of a built pipeline: what
wraps the executor or the transport (injected faults, a test's spy) is given as a seam and built in, so that
the step hooks, the coordination and the step loop all hold the same objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.dispatch.policy import Policy
from hintpipe.modes import TransportChoice
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.loop.admission import Admission
from hintpipe.runtime.loop.agreement import Agreement
from hintpipe.runtime.loop.coordination import Coordination
from hintpipe.runtime.loop.emulated import EmulatedExecutor
from hintpipe.runtime.loop.executor import Executor
from hintpipe.runtime.loop.hooks import StepHook
from hintpipe.runtime.loop.reports import Reporting
from hintpipe.runtime.loop.timing import DeviceTimer, Event
from hintpipe.runtime.parallel.mesh import Layout
from hintpipe.runtime.transport.protocol import Connection, InboxTransport, Transport
from hintpipe.schedule.hint import Hint


@dataclasses.dataclass(frozen=True)
class Seams:
    """What reaches into the assembly beside the options (no option of the public API reaches these): the
    constructors' own context, injected variability and faults, and tests' ways in.

    Attributes:
        coordinate_tp: tensor-parallel members share one decision per task (see
            :mod:`hintpipe.runtime.loop.coordination`); tests turn it off to show what goes wrong without.
        transport: builds the transport in place of the chosen one's row of
            :data:`~hintpipe.runtime.transport.registry.TRANSPORTS` (tests run the NCCL transport's code on CPU
            ranks: ``functools.partial(NcclTransport.connect, backend="gloo")``).
        timing_events: timing events for a CPU rank, to run the GPU's task timing (see
            :mod:`hintpipe.runtime.loop.timing`) where there is no GPU.
        injection: variability and faults to inject (``hintpipe train --variability/--faults``, tests), built
            into the executor and the transport (see :mod:`hintpipe.runtime.faults`).
        budget_from_plan: the activation budget is a plan's room to run ahead
            (:meth:`~hintpipe.runtime.pipeline.Pipeline.from_plan`), not a limit the user gave: a first step over
            it runs the hint's order with a warning instead of raising (``Admission(strict=False)``).
        watch_transport: wraps the transport, outermost (tests spy on what it delivers).
    """

    coordinate_tp: bool = True
    transport: Callable[[Connection], InboxTransport] | None = None
    timing_events: Callable[[], Event] | None = None
    injection: Injection = dataclasses.field(default_factory=Injection)
    budget_from_plan: bool = False
    watch_transport: Callable[[Transport], Transport] | None = None


@dataclasses.dataclass(frozen=True)
class Wiring:
    """What connects one rank, built first: its place, its stages on its device, its groups and its transport
    (steps 1-4 of :mod:`hintpipe.runtime.assembly`: the tensor-parallel coordination too).

    A phase of its own because what comes next needs it whole and is not yet there: the ranks compare their
    options and gather each other's byte budgets over its groups
    (:func:`~hintpipe.runtime.option_agreement.agree_on_options`), and admission, the executor and the step
    hooks are built from what they agreed. :class:`Parts` extends it, so the built pipeline is one flat object.
    """

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
    #: What carries this rank's messages (the ``transport`` option names its kind): the chosen transport's object,
    #: any injected delay (or a test's watch) around it.
    carrier: Transport
    coordination: Coordination | None  # this rank's part in its tensor-parallel group's decisions

    @property
    def stages(self) -> tuple[int, ...]:
        return self.hint.placement.stages_of(self.rank)


@dataclasses.dataclass(frozen=True)
class Parts(Wiring):
    """What one rank's pipeline is made of: its :class:`Wiring`, then what runs on it (steps 5-8 of
    :mod:`hintpipe.runtime.assembly`), fixed once built: nothing replaces a part of a built pipeline."""

    compute: Executor  # the stages, or the sleeps, before any wrapper (injected faults) goes round it
    executor: Executor  # what the step loop calls (wrappers included)
    timer: DeviceTimer | None
    admission: Admission
    replica_group: dist.ProcessGroup | None  # the ranks holding the same stages in the other replicas
    agreement: Agreement
    reporting: Reporting
    hooks: tuple[StepHook, ...]  # in the order the end of a step needs them

    @property
    def emulated(self) -> bool:
        return isinstance(self.compute, EmulatedExecutor)
