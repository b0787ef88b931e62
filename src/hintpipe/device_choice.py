"""Where a rank computes, as an enum (torch-free: the command line lists it without importing torch).

:func:`hintpipe.device.rank_device` turns it into a ``torch.device``.
"""

from __future__ import annotations

from hintpipe.choice import Choice


class DeviceChoice(Choice):
    """``auto``: the rank's GPU where CUDA is available, else the CPU; ``cpu``; ``cuda``."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def noun(cls) -> str:
        return "device"
