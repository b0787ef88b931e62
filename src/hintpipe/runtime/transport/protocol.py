"""The transport protocol: how the step loop moves messages between ranks.

The loop only posts messages and takes the next one that arrived; how they
travel is the transport's business. Two implementations:

- ``gloo``: :class:`~hintpipe.runtime.transport.mailbox.PostOffice`, per-neighbour
  mailboxes over gloo; a GPU rank's tensors are staged through pinned host
  buffers. Works across any fabric and with one GPU shared by several ranks.
- ``nccl``: :class:`~hintpipe.runtime.transport.links.LinkPostOffice`, headers over the
  same gloo mailboxes, payloads GPU to GPU over NCCL. Needs every rank on a
  GPU of its own (NCCL refuses two ranks on one device).

``auto`` picks ``nccl`` where every rank has its own GPU, ``gloo`` otherwise
(:func:`choose_transport`). :class:`~hintpipe.runtime.faults.DelayedTransport`
wraps either to inject network latency.

[Note: producer notices]
The ``ready`` policy's ETA rule (see :class:`~hintpipe.scoreboard.Policy`)
asks when the input of the hint's next task will come; a rank can tell only
if the neighbour producing it says when that task started. So, with
``ready``, every task whose result goes to another rank sends that rank a
notice as it starts: five integers on a channel of their own (another gloo
tag), so that a notice never queues behind a payload nor waits for the
pre-posted payload receive of the data channel. Notices and data of one
neighbour are not ordered with respect to each other; none needs to be: a
notice that comes after its data finds the task already ready and changes
nothing, and one of a finished step is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from hintpipe.modes import TransportChoice
from hintpipe.runtime.transport.wire import Message, MessageKind, Value

__all__ = ["Transport", "TransportChoice", "choose_transport"]


def choose_transport(choice: str | TransportChoice, device: torch.device, *, own_gpu: bool) -> TransportChoice:
    """The transport a rank on ``device`` uses (``own_gpu``: every rank has a GPU to itself).

    Raises:
        ValueError: ``nccl`` asked for on a CPU rank, or with ranks sharing a GPU.
    """
    which = TransportChoice.parse(choice)
    if which is TransportChoice.AUTO:
        return TransportChoice.NCCL if device.type == "cuda" and own_gpu else TransportChoice.GLOO
    if which is TransportChoice.NCCL and device.type != "cuda":
        raise ValueError(f"transport nccl moves tensors between GPUs, but the ranks compute on {device.type}")
    if which is TransportChoice.NCCL and not own_gpu:
        raise ValueError("transport nccl needs a GPU per rank (NCCL refuses two ranks on one device); use gloo")
    return which


class Transport(Protocol):
    """Messages to and from this rank's neighbours, first in first out per neighbour."""

    def send(self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[Value]) -> None:
        """Post a message to ``peer`` without waiting for it to leave: tensors, numbers (which travel in its
        header) and None for an absent tensor."""

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        """Tell ``peer`` that the task producing the input of its ``(stage, mb)`` task started
        (a :attr:`~hintpipe.runtime.transport.wire.MessageKind.STARTED` notice: see [Note: producer notices])."""

    def get(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (0: do not wait); None if none came."""

    def flush(self, timeout: float) -> None:
        """Wait until every posted send completed."""

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        """Tell every neighbour this rank is done (or failed, with ``error``) and stop receiving."""
