"""Every option of the pipeline, defined once: name, type, default, range and help.

:class:`~hintpipe.runtime.pipeline.Pipeline`'s keywords,
:meth:`TrainConfig.of <hintpipe.apps.train_config.TrainConfig.of>`'s keys (each
placed in a section of the run's config: [Note: a key per field] in
:mod:`hintpipe.apps.run_sections`) and the command line's flags are the same
options under the same names (``activation_budget`` is
``--activation-budget``); a test holds the three to this table. Values are
checked here and nowhere else, in one message style that names the option the
way the caller wrote it (``timeout`` in Python, ``--timeout`` on the command
line).

The options with a fixed set of values are :class:`~hintpipe.choice.Choice`
enums, converted from strings once, at the boundary; the command line's
choice lists are read from them.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from hintpipe.device_choice import DeviceChoice
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.policy import Policy
from hintpipe.modes import DataParallel, OnNonFinite, Precision, TransportChoice
from hintpipe.option import MAX_TIMEOUT, MIN_TIMEOUT, ChoiceField, Option
from hintpipe.renamed import renamed, retired_attribute
from hintpipe.run_options import RANKS, RUN_OPTIONS
from hintpipe.schedule.hint import Hint, HintName
from hintpipe.schedule.microbatch_order import DEFAULT_ORDER, MicrobatchOrder

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from hintpipe.runtime.loop.emulated import EmulatedCosts
    from hintpipe.runtime.parallel.fsdp import FsdpOptions
    from hintpipe.runtime.parallel.tied import TiedParameter

_TRAIN = frozenset({"train"})
_RUN = frozenset({"train", "simulate"})
_ALL = frozenset({"train", "simulate", "plan"})
_PLAN = frozenset({"plan"})


def _option(kind: str, default: Any, help: str, *, loose: bool = False, **more: Any) -> Any:
    """A field of :class:`PipelineConfig`: the option (named once the class exists) in its metadata, its
    default as the field's (none for a required option); a choice's field is its
    :class:`~hintpipe.option.ChoiceField` (see [Note: choices typed as their enums] in :mod:`hintpipe.option`),
    which holds the option (``loose``: a choice that also takes other values, kept as given: a ``torch.device``
    beside ``cpu``/``cuda``/``auto``)."""
    option = Option("", kind, default, help, **more)
    if option.choices is not None and not loose:
        return ChoiceField(option)
    if option.required:
        return dataclasses.field(metadata={"option": option})
    return dataclasses.field(default=default, metadata={"option": option})


def _named(option: Option, name: str) -> Option:
    return dataclasses.replace(option, name=name)


def field_option(owner: type, field: dataclasses.Field[Any]) -> Option:
    """The option a config field of ``owner`` is: in its metadata, or its :class:`~hintpipe.option.ChoiceField`."""
    if "option" in field.metadata:
        return _named(field.metadata["option"], field.name)
    descriptor = next(vars(c)[field.name] for c in owner.__mro__ if field.name in vars(c))
    assert isinstance(descriptor, ChoiceField), field.name
    return descriptor.option


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Every option a :class:`~hintpipe.runtime.pipeline.Pipeline` takes, checked once, here: the options table's
    pipeline rows are this class's fields (each field's metadata is its :class:`~hintpipe.option.Option`:
    kind, default, range, help, the commands that take it as a flag). Values are converted as they come in
    (``"ready"`` becomes :attr:`Policy.READY <hintpipe.dispatch.policy.Policy.READY>`); a value out of range, or
    two of the room options together, is refused naming the option.

    ``Pipeline(modules, loss_fn=..., config=PipelineConfig(microbatches=8, policy="ready"))`` or the same as
    keywords (``Pipeline(modules, loss_fn=..., microbatches=8, policy="ready")``) build the same pipeline;
    ``dataclasses.replace(config, policy="fixed")`` makes another.
    """

    microbatches: int = _option(
        "int", None, "micro-batches per step", minimum=1, required=True, metavar="M", commands=_ALL
    )
    hint: str | Hint = _option(
        "object",
        "1f1b",
        f"the schedule that ranks each rank's work: {', '.join(h.value for h in HintName)}, or a CSV file in "
        "torch.distributed.pipelining's compute-only format; train: or auto (1f1b or zb-h1, whichever's step the "
        "simulator finds shorter on the stages' costs, measured here, the split backward's included)",
        metavar="H",
        commands=_ALL,
        agreement="resolved",
    )
    policy: ChoiceField[Policy] = _option(
        "choice",
        Policy.READY,
        "fixed: the hint's order; greedy: the best-ranked ready task; ready: deviates from the hint only where "
        "the hint's next task cannot be delayed by it",
        choices=Policy,
        commands=_RUN,
    )
    chunks: int | None = _option(
        "int",
        None,
        "stages per rank (interleaved-1f1b, gpipe, bf, bfw; zbv always 2); default: the hint's own (1)",
        minimum=1,
        optional=True,
        metavar="V",
        commands=_ALL,
        agreement="resolved",
    )
    slack_microbatches: float = _option(
        "float",
        0.0,
        "room for this many more in-flight micro-batches of activations than the hint's own peak",
        minimum=0.0,
        metavar="K",
        commands=_RUN,
        agreement="own",
        before="memory_slack",
    )
    activation_budget: float | tuple[float, ...] | None = _option(
        "size",
        None,
        "activations a rank may hold, in bytes or a size such as 2GiB, each micro-batch counted by its own size "
        "(instead of slack_microbatches)",
        minimum=0.0,
        optional=True,
        metavar="SIZE",
        commands=_RUN,
        agreement="own",
    )
    device_budget_fraction: float | None = _option(
        "float",
        None,
        "every rank may hold as many micro-batches as the hint's busiest rank, times 1 + this fraction "
        "(0: as many; 0.25: a quarter more): equal devices lend the later ranks' idle memory to running ahead",
        minimum=0.0,
        optional=True,
        metavar="FRACTION",
        commands=_RUN,
        agreement="own",
        before="device_budget",
    )
    admission: ChoiceField[AdmissionUnit] = _option(
        "choice",
        AdmissionUnit.SLOTS,
        "what admission counts a micro-batch as: one slot (slots), or its known size in input elements (size), "
        "so that a sorted microbatch_order runs within what the given order holds by size (the hint runs "
        "fitted to that room; slack_microbatches and device_budget_fraction add to it); an activation_budget "
        "always counts by size",
        choices=AdmissionUnit,
        commands=_RUN,
    )
    timeout: float = _option(
        "float",
        300.0,
        "seconds a rank may wait with nothing ready (or for a collective) before every rank ends with an error "
        "naming what was awaited",
        minimum=MIN_TIMEOUT,
        maximum=MAX_TIMEOUT,
        metavar="S",
        commands=_TRAIN,
    )
    emulate: EmulatedCosts | None = _option(
        "object", None, "sleep these costs instead of computing", optional=True, agreement="given"
    )
    on_nonfinite: ChoiceField[OnNonFinite] = _option(
        "choice",
        OnNonFinite.RAISE,
        "a NaN or infinite loss stops the run (raise) or skips that step's update (skip)",
        choices=OnNonFinite,
        commands=_TRAIN,
    )
    precision: ChoiceField[Precision] = _option(
        "choice",
        Precision.FP32,
        "fp32, or bf16: forwards and the loss under torch.autocast to bfloat16 (parameters, gradients and "
        "optimizer state stay float32)",
        choices=Precision,
        commands=_TRAIN,
    )
    history: int = _option("int", 100, "how many steps' reports to keep", minimum=1, agreement="own")
    timelines: bool = _option("bool", False, "gather every rank's task timeline to rank 0 each step")
    report_every: int = _option(
        "int",
        1,
        "gather every rank's summary to rank 0 every this many steps (0: never)",
        minimum=0,
    )
    tied: Sequence[TiedParameter] = _option("object", (), "parameters shared by stages on different ranks, kept equal")
    mesh: DeviceMesh | None = _option(
        "object",
        None,
        "a DeviceMesh with dimensions named from dp, pp and tp (or torchtitan's dp_replicate and dp_shard for dp)",
        optional=True,
        agreement="given",
    )
    fsdp: FsdpOptions | None = _option(
        "object",
        None,
        "FSDP2's options for each stage (mp_policy, offload_policy, reshard_after_forward), with data_parallel='fsdp'",
        optional=True,
        agreement="given",
    )
    data_parallel: ChoiceField[DataParallel] = _option(
        "choice",
        DataParallel.REPLICATE,
        "data-parallel replicas hold whole stages and all-reduce gradients (replicate), or FSDP2 shards them",
        choices=DataParallel,
        commands=_TRAIN,
    )
    microbatch_order: ChoiceField[MicrobatchOrder] = _option(
        "choice",
        MicrobatchOrder.parse(DEFAULT_ORDER),
        "the order each step runs its micro-batches in, by their known sizes; sorted orders are faster but "
        "hold more activation memory (benchmarks/readiness-at-scale); front-then-back ranks each micro-batch's "
        "work at the first and last stages (train: the built-in models' own; Python: Pipeline.step(ends=...))",
        choices=MicrobatchOrder,
        commands=_RUN,
    )
    device: str | DeviceChoice | torch.device = _option(
        "choice",
        DeviceChoice.CPU,
        "where each rank computes: cpu, cuda (its GPU: LOCAL_RANK modulo the GPUs) or auto (cuda where available)",
        choices=DeviceChoice,
        commands=_TRAIN,
        loose=True,
    )
    transport: ChoiceField[TransportChoice] = _option(
        "choice",
        TransportChoice.AUTO,
        "how tensors travel between ranks: gloo (through host memory; ranks may share a GPU), nccl (GPU to GPU; "
        "a GPU per rank) or auto (nccl where every rank has its own GPU)",
        choices=TransportChoice,
        commands=_TRAIN,
        agreement="resolved",
    )

    def __post_init__(self) -> None:
        given = PipelineConfig.values(self)
        if not isinstance(given["device"], str):  # a torch.device, as it is
            given.pop("device")
        budget = given.pop("activation_budget")
        per_rank = isinstance(budget, (tuple, list))  # one per pipeline rank (the rank takes its own)
        # The room options are checked together: budgets per rank count as one budget given.
        given["activation_budget"] = (budget[0] if budget else None) if per_rank else budget
        checked = check_options(given)
        if per_rank:
            checked["activation_budget"] = tuple(OPTIONS["activation_budget"].check(b) for b in budget) or None
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def given(self) -> dict[str, Any]:
        """The pipeline's options that differ from their defaults (a constructor that fills in what the caller
        left, as :meth:`Pipeline.from_plan <hintpipe.runtime.pipeline.Pipeline.from_plan>` does, sees these as
        given)."""
        out = {}
        for f in dataclasses.fields(PipelineConfig):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or (value is not f.default and value != f.default):
                out[f.name] = value
        return out

    def pipeline_options(self, **changes: Any) -> PipelineConfig:
        """This config's pipeline options alone, as a :class:`PipelineConfig` (a run's config, which adds options of
        its own, gives the pipeline this), with ``changes`` to them: a subclass cannot be replaced into its base."""
        return PipelineConfig(**(PipelineConfig.values(self) | changes))

    def values(self) -> dict[str, Any]:
        """The pipeline's options, name -> value (the values themselves, not copies: a mesh or tied parameters
        stay what they are); a config that adds options of its own (the run's) keeps them out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(PipelineConfig)}


#: Every option, by name. The order is the order of ``--help``: the pipeline's run's count of ranks, the
#: pipeline's own (:class:`PipelineConfig`), then the simulator's, the run's and the planner's.
OPTIONS: Mapping[str, Option] = {
    o.name: o
    for o in (
        RANKS,
        *(field_option(PipelineConfig, f) for f in dataclasses.fields(PipelineConfig)),
        *RUN_OPTIONS,
    )
}

#: Each renamed option's name before (:attr:`Option.before <hintpipe.option.Option.before>`) -> its name now.
RENAMED_OPTIONS: Mapping[str, str] = {o.before: o.name for o in OPTIONS.values() if o.before is not None}

T = TypeVar("T")


def taking_names_before(config_class: type[T]) -> type[T]:
    """``config_class`` (:class:`PipelineConfig`, or a config with its fields) taking each renamed option's name
    before (:data:`RENAMED_OPTIONS`) until :data:`~hintpipe.renamed.REMOVED_IN`, as a keyword of its constructor
    and as an attribute read, each with a ``DeprecationWarning`` that names the new one (:mod:`hintpipe.renamed`):
    the class itself, changed. A class decorator, so that a config that adds fields (the run's) takes them too."""
    where = config_class.__name__
    config_class.__init__ = renamed(where, **RENAMED_OPTIONS)(config_class.__init__)  # type: ignore[method-assign]
    for old, new in RENAMED_OPTIONS.items():
        setattr(config_class, old, _read_as(old, new))
    return config_class


def _read_as(old: str, new: str) -> property:
    """A read-only attribute, ``old``, that reads ``new`` with a warning naming the class it is read from."""

    def read(self: object) -> Any:
        kind = type(self).__name__
        retired_attribute(f"{kind}.{old}", f"{kind}.{new}")
        return getattr(self, new)

    read.__doc__ = f"Deprecated: :attr:`{new}` (its name before 0.7)."
    return property(read)


taking_names_before(PipelineConfig)  # after the table: the names before are its options'

#: The options that say how much a rank may hold in flight; at most one of them is given.
ROOM = ("slack_microbatches", "activation_budget", "device_budget_fraction")


def check_options(values: Mapping[str, Any], *, cli: bool = False) -> dict[str, Any]:
    """``values`` (option name -> value) each checked and converted, and their combinations checked.

    Raises:
        ValueError: for the first value out of its range, or for two of :data:`ROOM` given together.
    """
    unknown = sorted(set(values) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown options {unknown}; known: {', '.join(OPTIONS)}")
    checked = {name: OPTIONS[name].check(value, cli=cli) for name, value in values.items()}
    given = [
        name
        for name in ROOM
        if checked.get(name) is not None and not (name == "slack_microbatches" and not checked[name])
    ]
    if len(given) > 1:
        labels = [OPTIONS[name].label(cli) for name in given]
        raise ValueError(f"give one of {', '.join(OPTIONS[n].label(cli) for n in ROOM)}, got {' and '.join(labels)}")
    return checked
