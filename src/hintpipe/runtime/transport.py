"""The transport protocol: how the step loop moves messages between ranks.

The loop only posts messages and takes the next one that arrived; how they
travel is the transport's business. :class:`~hintpipe.runtime.mailbox.PostOffice`
(gloo, per-neighbour mailboxes) is the implementation;
:class:`~hintpipe.runtime.faults.DelayedTransport` wraps one to inject
network latency.
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

    def get(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (0: do not wait); None if none came."""

    def flush(self, timeout: float) -> None:
        """Wait until every posted send completed."""

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        """Tell every neighbour this rank is done (or failed, with ``error``) and stop receiving."""
