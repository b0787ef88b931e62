"""The transport protocol: how the step loop moves messages between ranks.

The loop only posts messages and takes the next one that arrived; how they
travel is the transport's business. :class:`~hintpipe.runtime.mailbox.PostOffice`
(gloo, per-neighbour mailboxes) is the implementation;
:class:`~hintpipe.runtime.faults.DelayedTransport` wraps one to inject
network latency.

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

from hintpipe.runtime.wire import Message, MessageKind


class Transport(Protocol):
    """Messages to and from this rank's neighbours, first in first out per neighbour."""

    def send(
        self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[torch.Tensor | None]
    ) -> None:
        """Post a message to ``peer`` without waiting for it to leave."""

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        """Tell ``peer`` that the task producing the input of its ``(stage, mb)`` task started
        (a :attr:`~hintpipe.runtime.wire.MessageKind.STARTED` notice: see [Note: producer notices])."""

    def get(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (0: do not wait); None if none came."""

    def flush(self, timeout: float) -> None:
        """Wait until every posted send completed."""

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        """Tell every neighbour this rank is done (or failed, with ``error``) and stop receiving."""
