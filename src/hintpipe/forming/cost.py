"""What a sequence costs to train on: ``a * tokens + b * tokens**2`` seconds.

Why a formula and not a table of measured lengths: a step's sequences have
lengths no profile saw, and a transformer's work has two parts, one linear in
the tokens (projections, MLP, norms, the embedding and the head) and one
quadratic (attention scores). Two coefficients, fitted by least squares to
the model's time at two or more lengths, predict any length; the
micro-batches are then formed so that their predicted costs are even
(:mod:`hintpipe.forming.form`).

The fit comes from measured times: :func:`hintpipe.forming.profiled.profile_sequence_cost`
takes them from the planner's per-node profile of the model at several
lengths; :meth:`SequenceCost.fit` takes any.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class SequenceCost:
    """The predicted time of a training pass (forward and backward) over ``t`` tokens: ``a t + b t^2``.

    Attributes:
        a: seconds per token (at least 0).
        b: seconds per token squared (at least 0): attention over the whole row.
    """

    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"SequenceCost.{name} must be a finite number of at least 0, got {value!r}")
        if self.a == 0 and self.b == 0:
            raise ValueError("SequenceCost needs a or b above 0: a cost of zero for every length balances nothing")

    def __call__(self, tokens: float) -> float:
        """The predicted time of one row of ``tokens`` tokens."""
        return self.a * tokens + self.b * tokens * tokens

    def rows(self, count: int, length: int) -> float:
        """The predicted time of ``count`` rows padded to ``length`` tokens (padding costs as tokens do)."""
        return count * self(length)

    @classmethod
    def fit(cls, lengths: Sequence[float], seconds: Sequence[float]) -> SequenceCost:
        """Least squares of ``seconds`` against ``a t + b t^2`` over ``lengths`` (``t``), with ``a, b >= 0``.

        Where the unconstrained fit makes a coefficient negative (a quadratic term lost in the noise), the
        best fit with that coefficient at 0 is kept.

        Raises:
            ValueError: fewer than two distinct lengths, lists of different lengths, or a length or time
                that is not a positive finite number.
        """
        if len(lengths) != len(seconds):
            raise ValueError(f"got {len(lengths)} lengths and {len(seconds)} times: give one time per length")
        t = np.asarray(lengths, dtype=np.float64)
        y = np.asarray(seconds, dtype=np.float64)
        for name, values in (("lengths", t), ("times", y)):
            bad = values[~(np.isfinite(values) & (values > 0))]
            if bad.size:
                raise ValueError(f"{name} must be positive finite numbers, got {float(bad[0])!r}")
        if len(set(t.tolist())) < 2:
            raise ValueError(f"fitting a t + b t^2 needs times at two or more lengths, got {sorted(set(t.tolist()))}")
        design = np.stack([t, t * t], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if a >= 0 and b >= 0:
            return cls(float(a), float(b))
        linear = float(t @ y / (t @ t))  # b = 0
        quadratic = float((t * t) @ y / ((t * t) @ (t * t)))  # a = 0
        misfit = [float(np.sum((y - linear * t) ** 2)), float(np.sum((y - quadratic * t * t) ** 2))]
        return cls(linear, 0.0) if misfit[0] <= misfit[1] else cls(0.0, quadratic)

    def to_json(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b}
