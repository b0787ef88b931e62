"""The transport protocol: how the step loop moves messages between ranks, and the one signature every
transport is built from.

The loop only posts messages and takes the next one that arrived; how they travel is the transport's
business. Each transport the ``transport`` option names is one :class:`TransportSpec` (what builds it from a
:class:`Connection`, and what it needs of the ranks), one row of
:data:`~hintpipe.runtime.transport.registry.TRANSPORTS`:

- ``gloo``: :class:`~hintpipe.runtime.transport.mailbox.GlooTransport`, per-neighbour
  mailboxes over gloo; a GPU rank's tensors are staged through pinned host
  buffers. Works across any fabric and with one GPU shared by several ranks.
- ``nccl``: :class:`~hintpipe.runtime.transport.links.NcclTransport`, headers over the
  same gloo mailboxes, payloads GPU to GPU over NCCL. Needs every rank on a
  GPU of its own (NCCL refuses two ranks on one device).

``auto`` picks the first row whose needs every rank meets: ``nccl`` where every rank has its own GPU,
``gloo`` otherwise (:func:`~hintpipe.runtime.transport.registry.choose_transport`).
:class:`~hintpipe.runtime.faults.DelayedTransport` wraps either to inject network latency.

[Note: producer notices]
The ``ready`` policy's ETA rule (see :class:`~hintpipe.dispatch.policy.Policy`)
asks when the input of the hint's next task will come; a rank can tell only
if the neighbour producing it says when that task started. So a task whose
result goes to another rank may send that rank a notice as it starts: five
integers on a channel of their own (another gloo tag), so that a notice never
queues behind a payload nor waits for the pre-posted payload receive of the
data channel. Notices and data of one neighbour are not ordered with respect
to each other; none needs to be: a notice that comes after its data finds the
task already ready and changes nothing, and one of a finished step is dropped.

[Note: notices asked for]
A notice is a gloo message, and a gloo message costs both ranks about as much
CPU as a small task's own dispatch (``benchmarks/vs-torch``: on ``1f1b`` most
of what ``ready`` spent over the fixed order). Most are never read: the rule
asks for an ETA only when the hint's next task waits for its input while
another task is ready and admitted, which on ``1f1b`` at equal costs never
happens on two ranks. So a consumer asks for them: the first time its
scoreboard weighs a task whose producer it has not heard of (the rule then
takes the producer as due by the forecast, as it does for a notice still on
its way), it sends that producer a ``WANTED`` notice on the same channel, and
the producer notices that task's starts from then on, for the rest of the run
(:class:`~hintpipe.runtime.loop.asked_notices.AskedNotices`). A producer answers
nothing for a task it already ran: it hears the request between tasks, so the
data is on its way.
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.distributed as dist

from hintpipe.device import ReceivedBytes
from hintpipe.runtime.transport.wire import Message, MessageKind, Value

__all__ = ["Connection", "InboxTransport", "Transport", "TransportSpec"]


class Transport(Protocol):
    """Messages to and from this rank's neighbours, first in first out per neighbour."""

    def send(self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[Value]) -> None:
        """Post a message to ``peer`` without waiting for it to leave: tensors, numbers (which travel in its
        header) and None for an absent tensor."""

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        """Tell ``peer`` that the task producing the input of its ``(stage, mb)`` task started
        (a :attr:`~hintpipe.runtime.transport.wire.MessageKind.STARTED` notice: see [Note: producer notices])."""

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        """Ask ``peer`` for notices of the task producing the input of this rank's ``(stage, mb)`` task
        (a :attr:`~hintpipe.runtime.transport.wire.MessageKind.WANTED` notice: see [Note: notices asked for])."""

    def get(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (0: do not wait); None if none came."""

    def flush(self, timeout: float) -> None:
        """Wait until every posted send completed."""

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        """Tell every neighbour this rank is done (or failed, with ``error``) and stop receiving."""


class InboxTransport(Transport, Protocol):
    """A transport as a :class:`TransportSpec` builds it, before any wrapper goes round it: its inbox, where
    what arrived waits for the step loop, also takes the tensor-parallel coordination's decisions (see
    :mod:`hintpipe.runtime.loop.coordination`)."""

    inbox: queue.SimpleQueue[Message]


@dataclasses.dataclass(frozen=True)
class Connection:
    """What every transport is built from: this rank's place among its pipeline's ranks.

    Attributes:
        peers: the neighbours it exchanges messages with, as positions in the pipeline (ranks of ``group``).
        device: the rank's device: received tensors are placed there.
        group: the pipeline's own gloo group for point-to-point messages (never the collectives' group).
        pipelines: every pipeline's global ranks, by position (a transport that creates groups creates them for
            all: group creation is collective).
        stage_rank: the pipeline position of each stage.
        global_rank: this rank in the world.
        timeout: the watchdog's seconds (a transfer stuck on a dead peer fails after it).
        notices: whether producer notices travel (see [Note: producer notices]).
        received: counts the device bytes the receiving threads allocate (see [Note: what a forward left
            allocated] in :mod:`hintpipe.device`).
    """

    peers: tuple[int, ...]
    device: torch.device
    group: dist.ProcessGroup
    pipelines: tuple[tuple[int, ...], ...]
    stage_rank: tuple[int, ...]
    global_rank: int
    timeout: float
    notices: bool
    received: ReceivedBytes


def _anywhere(device: torch.device, own_gpu: bool) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class TransportSpec:
    """One transport the ``transport`` option names.

    Attributes:
        connect: builds this rank's transport (every rank calls it, in the same order: it may create groups).
        refusal: why ranks on ``device`` (``own_gpu``: every rank has a GPU to itself) cannot use it, after
            ``transport <name>`` (``"needs a GPU per rank ...; use gloo"``), or None where they can.
    """

    connect: Callable[[Connection], InboxTransport]
    refusal: Callable[[torch.device, bool], str | None] = _anywhere
