"""The choices of the pipeline and of a run, as enums the options table refers to (:mod:`hintpipe.options`).

The runtime's (the step's agreement, data parallelism, the executor's precision, the transports) and the
run's (its optimizer and learning-rate schedule): torch-free and below every part, so that the options
table, which every part reads (the runtime takes its :class:`~hintpipe.options.PipelineConfig`), refers to
them without reaching up into the runtime or the applications that use them; and so that the command line
can show and check them without importing torch.
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


class LrSchedule(Choice):
    """``constant``; ``warmup-cosine``: linear from ``1 / (warm-up + 1)`` to 1 over the warm-up steps, then a
    half cosine down to 0 at the last step; ``warmup-linear``: the same warm-up, then a straight line to 0."""

    CONSTANT = "constant"
    WARMUP_COSINE = "warmup-cosine"
    WARMUP_LINEAR = "warmup-linear"

    @classmethod
    def noun(cls) -> str:
        return "lr_schedule"


class OptimizerName(Choice):
    """``adamw`` (``torch.optim.AdamW``) or ``sgd`` (``torch.optim.SGD``)."""

    ADAMW = "adamw"
    SGD = "sgd"

    @classmethod
    def noun(cls) -> str:
        return "optimizer"


class WeightsDtype(Choice):
    """The dtype ``hintpipe export`` writes a model's floating-point tensors in: ``fp32`` (as trained), ``bf16`` or
    ``fp16``."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    @classmethod
    def noun(cls) -> str:
        return "dtype"
