"""What a built-in model is, without building it: names, sizes, sequence lengths.

Kept apart from :mod:`hintpipe.apps.models` (which needs torch) so that the command
line can describe and validate its options without importing torch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hintpipe.sim.variability import mean_one_lognormal
from hintpipe.spec import Spec

MODELS = ("mlp", "gpt-mini", "mm-mini", "hf-gpt2", "hf-llama")
#: The models the pipeline gets from a plan (captured through torch.export), not from a list of layers.
PLANNED_MODELS = ("hf-gpt2", "hf-llama")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes of a built-in model."""

    name: str = "gpt-mini"
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    vocab: int = 128
    max_seq_len: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in MODELS:
            raise ValueError(f"unknown model {self.name!r}: choose one of {', '.join(MODELS)}")
        if self.layers < 1 or self.hidden < 1:
            raise ValueError(f"layers and hidden must be at least 1, got {self.layers} and {self.hidden}")
        if self.name != "mlp" and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} must be a multiple of heads {self.heads}")


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

    def sample(self, count: int, rng: np.random.Generator, limit: int) -> list[int]:
        if self.sigma == 0:
            return [min(self.mean, limit)] * count
        values = self.mean * mean_one_lognormal(rng, self.sigma, (count,))
        return [int(v) for v in np.clip(np.round(values), 8, limit)]
