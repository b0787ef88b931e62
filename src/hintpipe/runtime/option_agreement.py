"""The ranks' one comparison of their options, at start-up: every rank must run the same pipeline.

Part of the assembly (:mod:`hintpipe.runtime.assembly`, step 8): it runs once every group exists, before the
rank's admission rule is made, which takes the byte budgets it gathers.
"""

from __future__ import annotations

import enum
from typing import Any

import torch.distributed as dist

from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.options import OPTIONS, PipelineConfig
from hintpipe.runtime.errors import OptionMismatch
from hintpipe.runtime.parts import Wiring


def agree_on_options(wiring: Wiring, config: PipelineConfig, own_budget: float | None) -> tuple[float, ...] | None:
    """Every rank must run the same pipeline: compare once, at start-up; returns every pipeline rank's byte
    budget under byte admission (``own_budget`` is this rank's), else None.

    [Note: the options the ranks compare] What is compared is derived from the options themselves
    (:attr:`~hintpipe.option.Option.agreement`), so that a new option is compared without a list to keep in
    step: an ``equal`` option by its value, a ``given`` one by whether it is given, a ``resolved`` one as what
    it resolves to (the hint's name and stages, the transport chosen). Byte budgets are each rank's own: they
    may differ per rank (heterogeneous devices, a plan's spare memory per stage); every rank learns every
    rank's own, since each fits the same hint to all of them. So is the slack in micro-batches, except under
    admission by size without a byte budget, where every rank computes every rank's room.
    """
    by_bytes = own_budget is not None
    mine = compared_options(wiring, config, by_bytes)
    if config.admission is AdmissionUnit.SIZE and not by_bytes:
        mine |= {
            "slack_microbatches": config.slack_microbatches,
            "device_budget_fraction": config.device_budget_fraction,
        }
    gathered: list[Any] = [None] * wiring.layout.pp
    dist.all_gather_object(gathered, (mine, own_budget), group=wiring.coll)
    for rank, (theirs, _) in enumerate(gathered):
        differing = {k: (mine[k], theirs.get(k)) for k in mine if theirs.get(k) != mine[k]}
        if differing:
            detail = ", ".join(f"{k}: {a!r} here, {b!r} on rank {rank}" for k, (a, b) in differing.items())
            raise OptionMismatch(
                f"rank {wiring.rank}: ranks disagree on pipeline options ({detail}); start every rank with the same "
                "options"
            )
    return tuple(float(budget) for _, budget in gathered) if by_bytes else None


def compared_options(wiring: Wiring, config: PipelineConfig, by_bytes: bool) -> dict[str, Any]:
    """What this rank compares with the others (see [Note: the options the ranks compare]): plain values."""
    hint = wiring.hint
    mine: dict[str, Any] = {
        "hint": hint.name,
        "stages": hint.stages,
        "split_backward": hint.split_backward,
        "transport": wiring.transport_choice.value,
        "byte_admission": by_bytes,
        "dp": wiring.layout.dp,
        "tp": wiring.layout.tp,
    }
    for name, option in OPTIONS.items():
        if not option.pipeline:
            continue
        if option.agreement == "equal":
            mine[name] = _plain(getattr(config, name))
        elif option.agreement == "given":
            mine[name] = getattr(config, name) is not None
    return mine


def _plain(value: Any) -> Any:
    """An option's value as ranks compare it: an enum by its string (the same on every rank)."""
    return value.value if isinstance(value, enum.Enum) else value
