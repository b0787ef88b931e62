"""The ranks of a run made apart agree on its options before its first step.

[Note: a run made apart]
Spawned ranks receive the launcher's one config, pickled. Under ``torchrun`` each process makes its own, from
its own command line or its own script, and the runtime compares the pipeline's options at start-up
([Note: the options the ranks compare] in :mod:`hintpipe.runtime.option_agreement`). The run's own options
matter as much and were compared by no one: ranks given other seeds (a script's ``seed=rank``) drew other batches,
so the first stage trained on one batch's inputs and the last on another's targets, without a word; other
``steps`` ended on a watchdog's timeout; another ``microbatch_size`` or ``data`` the same. So under ``torchrun``
every rank gathers every rank's options by key (:meth:`~hintpipe.apps.train_config.TrainConfig.keys`: the model,
the data, the optimizer, the schedule, the steps, the checkpoints) and a difference is refused by name, on every
rank, before the first step. What one rank alone acts on may differ (:data:`OWN`), and the pipeline's options are
the runtime's to compare; the plan, which rank 0 shares, is compared by its cuts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from hintpipe.apps.run_sections import PIPELINE_KEYS
from hintpipe.runtime.errors import OptionMismatch

if TYPE_CHECKING:
    from hintpipe.apps.train_config import TrainConfig

__all__ = ["OWN", "agree_on_run", "compared_keys"]

#: The run's options that rank 0 alone acts on (its log, its TensorBoard folder, its progress bar, the state it
#: returns), which other ranks may be given otherwise.
OWN = frozenset({"log_every", "tensorboard", "progress", "return_state"})


def compared_keys(config: TrainConfig) -> dict[str, Any]:
    """What a rank compares with the others (see [Note: a run made apart]): its options by key, but the
    pipeline's (the runtime compares them), :data:`OWN` and the plan (compared by its cuts)."""
    keys = {k: v for k, v in config.keys().items() if k not in PIPELINE_KEYS and k not in OWN and k != "plan"}
    keys["plan"] = None if config.plan is None else tuple(config.plan.partition.cuts)
    return keys


def agree_on_run(config: TrainConfig) -> None:
    """Refuse, on every rank of the default group, a run whose ranks were given other options.

    Raises:
        OptionMismatch: naming each option that differs, its value here and on the first rank that differs.
    """
    mine = compared_keys(config)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    here = dist.get_rank()
    for rank, theirs in enumerate(gathered):
        differing = {k: (mine[k], theirs.get(k)) for k in mine if theirs.get(k) != mine[k]}
        if differing:
            detail = ", ".join(f"{k}: {a!r} here, {b!r} on rank {rank}" for k, (a, b) in differing.items())
            raise OptionMismatch(
                f"rank {here}: ranks disagree on the run's options ({detail}); start every rank with the same options"
            )
