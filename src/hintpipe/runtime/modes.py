"""The runtime's own choices, as enums the options table refers to (:mod:`hintpipe.options`).

They belong to the runtime (the step's agreement, data parallelism, the executor's precision, the
transports), not to the table that lists them; kept here, torch-free, so that the command line can show and
check them without importing torch.
"""

from __future__ import annotations

from hintpipe.choice import Choice


class OnNonFinite(Choice):
    """What a NaN or infinite loss does: ``raise`` stops the step with
    :class:`~hintpipe.runtime.errors.NonFiniteLoss`; ``skip`` finishes it, zeroes every rank's gradients and
    lists it in :attr:`Pipeline.nonfinite_steps <hintpipe.runtime.pipeline.Pipeline.nonfinite_steps>`."""

    RAISE = "raise"
    SKIP = "skip"

    @classmethod
    def noun(cls) -> str:
        return "on_nonfinite"


class DataParallel(Choice):
    """How data-parallel replicas keep their stages equal: ``replicate`` (every replica holds the whole
    stage; gradients all-reduced) or ``fsdp`` (parameters sharded over the replicas by FSDP2)."""

    REPLICATE = "replicate"
    FSDP = "fsdp"

    @classmethod
    def noun(cls) -> str:
        return "data_parallel"


class Precision(Choice):
    """``fp32``: every task in float32; ``bf16``: forwards (and the loss) under ``torch.autocast`` to bfloat16,
    parameters, gradients and optimizer state staying float32, as autocast does for the unsplit model."""

    FP32 = "fp32"
    BF16 = "bf16"

    @classmethod
    def noun(cls) -> str:
        return "precision"


class TransportChoice(Choice):
    """``auto``: ``nccl`` where every rank has a GPU of its own, else ``gloo``; ``gloo``; ``nccl``."""

    AUTO = "auto"
    GLOO = "gloo"
    NCCL = "nccl"

    @classmethod
    def noun(cls) -> str:
        return "transport"
