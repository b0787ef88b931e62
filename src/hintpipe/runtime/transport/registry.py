"""The transports the ``transport`` option names, one row each, and the choice among them.

Adding a transport is its module (a class that builds itself from a
:class:`~hintpipe.runtime.transport.protocol.Connection` and says what it needs of the ranks), its name in
:class:`~hintpipe.modes.TransportChoice`, and its row here; the assembly builds whichever row the choice names.
"""

from __future__ import annotations

import torch

from hintpipe.modes import TransportChoice
from hintpipe.runtime.transport.links import NcclTransport
from hintpipe.runtime.transport.mailbox import GlooTransport
from hintpipe.runtime.transport.protocol import TransportSpec

__all__ = ["TRANSPORTS", "TransportChoice", "choose_transport"]

#: Each transport by its name, in the order ``auto`` prefers them.
TRANSPORTS: dict[TransportChoice, TransportSpec] = {
    TransportChoice.NCCL: TransportSpec(NcclTransport.connect, NcclTransport.refusal),
    TransportChoice.GLOO: TransportSpec(GlooTransport.connect),
}


def choose_transport(choice: str | TransportChoice, device: torch.device, *, own_gpu: bool) -> TransportChoice:
    """The transport a rank on ``device`` uses (``own_gpu``: every rank has a GPU to itself): the one named, or
    under ``auto`` the first of :data:`TRANSPORTS` the ranks can use.

    Raises:
        ValueError: a transport named that the ranks cannot use (``nccl`` on a CPU rank, or with ranks sharing a
            GPU), or a name of none.
    """
    which = TransportChoice.parse(choice)
    if which is TransportChoice.AUTO:
        return next(name for name, spec in TRANSPORTS.items() if spec.refusal(device, own_gpu) is None)
    refusal = TRANSPORTS[which].refusal(device, own_gpu)
    if refusal is not None:
        raise ValueError(f"transport {which.value} {refusal}")
    return which
