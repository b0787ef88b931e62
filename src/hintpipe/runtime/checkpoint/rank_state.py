"""What one rank's share of a checkpoint holds, keyed by the model's names.

A rank saves its stages' parameters and kept buffers under the model's own
names (:mod:`hintpipe.runtime.model_names`), its optimizer's state through
torch.distributed.checkpoint's ``get_state_dict`` over a module holding those
tensors under those names (flattened: ``state.<name>.exp_avg``,
``param_groups.<name>.lr``), the step, its RNG state under ``rng-rank<r>``,
and the caller's own state (an LR scheduler, a data position).

[Note: checkpoints by name]
Because every entry is named as the model names it, the copies of a tensor
(data-parallel replicas, the ranks sharing a tied embedding) share their key
and are saved once, a sharded one (FSDP2, tensor parallel) is put together by
DCP, and a run resumes under another plan of the same model: each rank asks
for the names it holds now, wherever they were saved. The RNG state belongs to
a rank: a rank the checkpoint has no RNG state for (more ranks than when it
was saved) keeps its own, and the resume says so. The caller's state is saved
once (every rank's is expected to be the same, as an LR scheduler stepped on
every rank is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from hintpipe.runtime.model_names import ModelNames, view
from hintpipe.tensor_bytes import local


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``: an LR scheduler, a sampler, the caller's own."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


def rng_key(rank: int) -> str:
    return f"rng-rank{rank}"


class RankState:
    """One rank's checkpoint entries (build afresh for each save or load: FSDP2 swaps parameter objects).

    Args:
        modules: this rank's stages.
        names: the model's names for their tensors.
        optimizer: the optimizer of their parameters, or None.
        extra: the caller's state to save with them, by key (``{"scheduler": scheduler}``).
    """

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        names: ModelNames,
        optimizer: torch.optim.Optimizer | None,
        extra: Mapping[str, Stateful] | None = None,
    ) -> None:
        self.stages = sorted(modules)
        self.tensors = names.named_tensors(modules)
        self.holder = view(self.tensors)
        self.optimizer = optimizer
        if optimizer is not None:
            held = {id(t) for t in self.tensors.values()}
            stray = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in held]
            if stray:
                shapes = ", ".join("x".join(map(str, p.shape)) or "scalar" for p in stray[:3])
                raise ValueError(
                    f"the optimizer holds {len(stray)} parameters that no stage of this rank holds ({shapes}"
                    f"{', ...' if len(stray) > 3 else ''}): give it the parameters of pipe.modules"
                )
        self.extra = dict(extra or {})

    def first_nonfinite(self) -> str | None:
        """The first parameter or optimizer state that is NaN or infinite, named; None when all are finite (a
        NaN saved is a run lost)."""
        for name, tensor in self.tensors.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(local(tensor.detach())).all()):
                return f"parameter {name}"
        if self.optimizer is not None:
            names = {id(t): name for name, t in self.tensors.items()}
            for param, slots in self.optimizer.state.items():
                for slot, value in slots.items():
                    finite = not isinstance(value, torch.Tensor) or bool(torch.isfinite(local(value)).all())
                    if not finite:
                        return f"optimizer state {slot!r} of {names.get(id(param), 'a parameter')}"
        return None

    def entries(self, step: int, rank: int) -> dict[str, Any]:
        """What DCP saves, or fills in when it loads."""
        if self.optimizer is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            # Optimizer state by parameter name rather than by position in param_groups (which differ between
            # ranks); torch.distributed.checkpoint is imported here, not at start-up (see saving's module).
            model, optim = get_state_dict(
                self.holder, self.optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
            )
        else:
            model, optim = self.holder.state_dict(), {}
        out: dict[str, Any] = {"model": model, "optim": optim, "step": torch.tensor(step)}
        out[rng_key(rank)] = torch.get_rng_state()
        out |= {f"user-{key}": value.state_dict() for key, value in self.extra.items()}
        return out

    def restore(self, loaded: Mapping[str, Any], rank: int) -> int:
        """Put what DCP loaded into ``entries`` back into the tensors, the optimizer and the caller's state;
        returns the step."""
        if self.optimizer is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(
                self.holder,
                self.optimizer,
                model_state_dict=loaded["model"],
                optim_state_dict=loaded["optim"],
                options=StateDictOptions(flatten_optimizer_state_dict=True),
            )
        else:
            self.holder.load_state_dict(loaded["model"])
        if rng_key(rank) in loaded:
            torch.set_rng_state(loaded[rng_key(rank)])
        for key, value in self.extra.items():
            value.load_state_dict(loaded[f"user-{key}"])
        return int(loaded["step"])
