"""What a model of the command line is, without building it: its kind (a spec), sizes and sequence lengths.

Kept apart from :mod:`hintpipe.apps.models` (which needs torch) so that the command
line can describe and validate its options without importing torch. What each
kind of model is and supports is its row in :mod:`hintpipe.apps.model_spec`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hintpipe.apps.model_spec import BUILT_IN, MODEL_SPECS, SOURCED, ModelSpec
from hintpipe.dispatch.variability import mean_one_lognormal
from hintpipe.spec import Spec

#: The built-in models' names, as ``--model`` takes them.
MODELS = BUILT_IN
#: The models the pipeline gets from a plan (captured through torch.export), not from a list of layers.
PLANNED_MODELS = tuple(name for name, spec in MODEL_SPECS.items() if spec.planned)
#: How a model folder's weights start: its own (fine-tuning), or a fresh draw of its config from the seed.
INITS = ("pretrained", "random")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model of the command line: a built-in one's sizes, or where a model comes from (``source``) and how it
    starts (``init``), with the sizes read from it (a folder's ``config.json``).

    Attributes:
        name: the kind of model, a row of :data:`~hintpipe.apps.model_spec.MODEL_SPECS` (``gpt-mini``,
            ``hf-folder``, ...).
        source: ``hf-folder``: the folder (absolute); ``factory``: ``module:function``; None for a built-in.
        init: ``hf-folder``: ``pretrained`` (the folder's weights) or ``random`` (its config, weights from
            ``seed``).
        dropout: the built-in models' dropout probability (a folder's model keeps its config's).
    """

    name: str = "gpt-mini"
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    vocab: int = 128
    max_seq_len: int = 256
    seed: int = 0
    dropout: float = 0.0
    source: str | None = None
    init: str = "pretrained"

    def __post_init__(self) -> None:
        if self.name not in MODEL_SPECS:
            raise ValueError(f"unknown model {self.name!r}: choose one of {', '.join(MODEL_SPECS)}")
        if self.layers < 1 or self.hidden < 1:
            raise ValueError(f"layers and hidden must be at least 1, got {self.layers} and {self.hidden}")
        if self.heads < 1 or self.vocab < 2 or self.max_seq_len < 2:
            raise ValueError(
                f"heads must be at least 1, vocab and max_seq_len at least 2, got {self.heads}, {self.vocab} and "
                f"{self.max_seq_len}"
            )
        if self.spec.attention and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} must be a multiple of heads {self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.dropout and not self.spec.dropout:
            raise ValueError(f"{self.name} has no dropout; leave dropout out (the hf-* models take it)")
        if self.init not in INITS:
            raise ValueError(f"init {self.init!r} is unknown: choose one of {', '.join(INITS)}")
        if (self.source is None) == (self.name in SOURCED):
            need = "needs a source" if self.source is None else "takes no source"
            raise ValueError(f"model {self.name!r} {need}")

    @property
    def spec(self) -> ModelSpec:
        """What this kind of model is and supports."""
        return MODEL_SPECS[self.name]

    @property
    def label(self) -> str:
        """How output names the model: the built-in's name, or where it came from."""
        return self.name if self.source is None else self.source


@dataclasses.dataclass(frozen=True)
class SeqLenDist:
    """``fixed:T`` or ``lognormal:MEAN:SIGMA`` (rounded, clipped to 8..max)."""

    mean: int
    sigma: float = 0.0

    @classmethod
    def parse(cls, text: str) -> SeqLenDist:
        """Parse ``fixed:T`` or ``lognormal:MEAN:SIGMA`` (the colon-spec grammar of :mod:`hintpipe.spec`).

        Raises:
            SpecError: naming the spec and what is wrong with it.
        """
        spec = Spec.split(text)
        kind = "sequence length distribution"
        if spec.word == "fixed":
            spec.expect((1,), "fixed:T or lognormal:MEAN:SIGMA", kind)
            return cls(spec.integer(0, "T", minimum=1, kind=kind))
        if spec.word == "lognormal":
            spec.expect((2,), "fixed:T or lognormal:MEAN:SIGMA", kind)
            return cls(spec.integer(0, "MEAN", minimum=1, kind=kind), spec.number(1, "SIGMA", kind=kind))
        raise spec.fail("expected fixed:T or lognormal:MEAN:SIGMA", kind)

    def __str__(self) -> str:
        """The spec :meth:`parse` reads: ``fixed:64``, ``lognormal:96:0.5``."""
        return f"fixed:{self.mean}" if self.sigma == 0 else f"lognormal:{self.mean}:{self.sigma:g}"

    def sample(self, count: int, rng: np.random.Generator, limit: int) -> list[int]:
        if self.sigma == 0:
            return [min(self.mean, limit)] * count
        values = self.mean * mean_one_lognormal(rng, self.sigma, (count,))
        return [int(v) for v in np.clip(np.round(values), 8, limit)]
