"""The run's optimizer: AdamW (the default, as torchtitan's and Hugging Face's Trainer's) or SGD, with weight
decay, AdamW's betas and SGD's momentum.

Every rank builds one over the parameters of its own stages; a tied parameter held by several ranks has the
same gradient on each (summed by the runtime), so the copies stay equal. Weight decay applies to every
parameter, as ``torch.optim.AdamW(model.parameters(), weight_decay=...)`` does on the unsplit model.

:class:`OptimizerConfig` (the run's config's section) and :func:`parse_betas` are torch-free;
:func:`build_optimizer` imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from hintpipe.apps.config_section import Section
from hintpipe.modes import OptimizerName as OptimizerName
from hintpipe.option import ChoiceField, said
from hintpipe.run_options import run_option

if TYPE_CHECKING:
    import torch


def parse_betas(text: str, label: str = "--betas") -> tuple[float, float]:
    """``"B1,B2"`` as AdamW's two betas, each in [0, 1).

    Raises:
        ValueError: naming ``label``, the value and the form it takes.
    """
    words = text.split(",")
    try:
        betas = tuple(float(word) for word in words)
    except ValueError:
        betas = ()
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{label} {text!r}: give two numbers in [0, 1) as B1,B2, e.g. 0.9,0.999")
    return betas[0], betas[1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(Section):
    """How the weights are updated (see :mod:`hintpipe.apps.optimizer`)."""

    name: ClassVar[str] = "optimizer"

    kind: ChoiceField[OptimizerName] = ChoiceField(run_option("optimizer"))
    lr: float = 1e-3
    weight_decay: float | None = None  # None: torch's default for the optimizer (AdamW 0.01, SGD 0)
    betas: str = "0.9,0.999"  # AdamW's
    momentum: float = 0.0  # SGD's
    clip_grad_norm: float | None = None  # the whole model's gradient norm clipped to this before each update

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_betas(self.betas, said("betas"))


def build_optimizer(parameters: Iterable[torch.nn.Parameter], config: OptimizerConfig) -> torch.optim.Optimizer:
    """The run's optimizer (its section, ``config``) over ``parameters`` (``weight_decay`` None: torch's default
    for it, so that a run without the flag steps as ``torch.optim.AdamW(params, lr=...)`` does)."""
    import torch

    lr, weight_decay = config.lr, config.weight_decay
    if config.kind is OptimizerName.SGD:
        decay = 0.0 if weight_decay is None else weight_decay  # torch.optim.SGD's own default
        return torch.optim.SGD(parameters, lr=lr, momentum=config.momentum, weight_decay=decay)
    decay = 0.01 if weight_decay is None else weight_decay  # torch.optim.AdamW's own default
    return torch.optim.AdamW(parameters, lr=lr, betas=parse_betas(config.betas), weight_decay=decay)
