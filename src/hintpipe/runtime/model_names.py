"""The model's own names for the tensors a rank's stages hold.

A stage module names its tensors its own way: a plan's stage keeps the
captured model's dotted paths (``transformer.h.3.attn.c_attn.weight``), a slice
of an ``nn.Sequential`` counts its layers from 0, and a list of stage modules
has no model above it at all. Checkpoints and :meth:`Pipeline.state_dict
<hintpipe.runtime.pipeline.Pipeline.state_dict>` speak the model's names, so
that the weights go back into the unsplit model (``load_state_dict(strict=True)``,
``save_pretrained``) and a checkpoint saved under one plan loads under another
plan of the same model: torch.distributed.checkpoint finds each tensor by its
name, whichever rank holds it now.

A tensor that several stages use (an embedding tied to the LM head) has one
name per use in the model's state dict and one copy per rank that holds it;
a checkpoint keeps it once, under its *canonical* name (the first of its names
in the model's order), and :meth:`ModelNames.expand` gives every name back.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Mapping, Sequence

import torch
from torch import nn


class Naming(enum.Enum):
    """Where the names come from."""

    MODEL = "model"  #: a plan's stages: their paths are the captured model's
    SEQUENTIAL = "sequential"  #: slices of an ``nn.Sequential``: layer ``i`` of stage ``s`` is ``offset[s] + i``
    STAGES = "stages"  #: stage modules given as they are: ``<stage>.<name>``


@dataclasses.dataclass(frozen=True)
class ModelNames:
    """How the stages' tensors are named in the model they were cut from (the same on every rank).

    Attributes:
        naming: where the names come from.
        keys: the whole model's state-dict keys in its order, where known (a plan's, a sequential's);
            empty for stage modules given as they are.
        aliases: groups of names of one tensor that several stages use (each group in model order).
        offsets: for a sequential, each stage's first layer.
    """

    naming: Naming = Naming.STAGES
    keys: tuple[str, ...] = ()
    aliases: tuple[tuple[str, ...], ...] = ()
    offsets: tuple[int, ...] = ()

    @classmethod
    def of_model(cls, keys: Sequence[str], tied: Sequence[Sequence[str]]) -> ModelNames:
        """A plan's: ``keys`` the model's state-dict keys, ``tied`` the names of each shared tensor."""
        order = {k: i for i, k in enumerate(keys)}
        groups = tuple(
            tuple(sorted((n for n in group if n in order), key=order.__getitem__))
            for group in tied
            if sum(n in order for n in group) > 1
        )
        return cls(Naming.MODEL, tuple(keys), groups)

    @classmethod
    def of_sequential(cls, model: nn.Sequential, bounds: Sequence[int]) -> ModelNames:
        """Stages of ``model``'s layers ``bounds[s]:bounds[s + 1]``, each counting its own from 0
        (``nn.Sequential(*model[a:b])``; a slice ``model[a:b]`` keeps the model's names: :meth:`of_model`)."""
        return cls(Naming.SEQUENTIAL, tuple(model.state_dict()), offsets=tuple(bounds[:-1]))

    def model_key(self, stage: int, local: str) -> str | None:
        """The model's name for ``local`` (a state-dict key of stage ``stage``'s module), or None where the
        stage holds it under a name the model does not have (a recompute group's second path to a module,
        a buffer the model does not keep)."""
        if self.naming is Naming.STAGES:
            return f"{stage}.{local}"
        if self.naming is Naming.SEQUENTIAL:
            layer, _, rest = local.partition(".")
            key = f"{self.offsets[stage] + int(layer)}.{rest}" if layer.isdigit() else local
        else:
            key = local
        return key if not self.keys or key in self._known else None

    def canonical(self, key: str) -> str:
        """The one name a checkpoint keeps a tensor under: the first of its names in the model's order."""
        return self._canonical.get(key, key)

    def expand(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` with every name of each shared tensor, in the model's order where it is known."""
        out = dict(state)
        for group in self.aliases:
            present = next((n for n in group if n in out), None)
            if present is not None:
                for name in group:
                    out.setdefault(name, out[present])
        if self.keys:
            ordered = {k: out[k] for k in self.keys if k in out}
            ordered.update((k, v) for k, v in out.items() if k not in ordered)
            return ordered
        return out

    def named_tensors(self, modules: Mapping[int, nn.Module], *, canonical: bool = True) -> dict[str, torch.Tensor]:
        """This rank's parameters and kept buffers by the model's names (the tensors themselves, parameters as
        ``nn.Parameter``; one entry per tensor, under its canonical name unless ``canonical`` is False)."""
        out: dict[str, torch.Tensor] = {}
        for stage, module in sorted(modules.items()):
            for local, tensor in module.state_dict(keep_vars=True).items():
                key = self.model_key(stage, local)
                if key is None:
                    continue
                out.setdefault(self.canonical(key) if canonical else key, tensor)
            named = {id(t) for t in out.values()}
            nameless = [n for n, p in module.named_parameters() if id(p) not in named]
            if nameless:  # a parameter missing from checkpoints would be lost without a word
                raise ValueError(
                    f"stage {stage}'s parameters {nameless[:3]} have no name in the model ({len(self.keys)} names, "
                    f"such as {list(self.keys[:2])}): build the pipeline from the model it was cut from"
                )
        return out

    @functools.cached_property
    def _known(self) -> frozenset[str]:
        return frozenset(self.keys)

    @functools.cached_property
    def _canonical(self) -> dict[str, str]:
        return {name: group[0] for group in self.aliases for name in group}


def view(tensors: Mapping[str, torch.Tensor]) -> nn.Module:
    """A module holding ``tensors`` under their dotted names (parameters as parameters, the rest as buffers):
    what torch.distributed.checkpoint's ``get_state_dict`` reads a model and its optimizer's state through,
    so that both are keyed by the model's names."""
    root = nn.Module()
    for name, tensor in tensors.items():
        *parents, leaf = name.split(".")
        module = root
        for part in parents:
            child = module._modules.get(part)
            if child is None:
                child = nn.Module()
                module.add_module(part, child)
            module = child
        if isinstance(tensor, nn.Parameter):
            module.register_parameter(leaf, tensor)
        else:
            module.register_buffer(leaf, tensor)
    return root
