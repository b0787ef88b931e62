"""Cost model: expected time and activation size of every task.

Costs are per kind and per stage, optionally scaled per micro-batch (a
micro-batch twice as long costs twice as much on every stage). Defaults follow
the usual convention: F = 1, B = 1, W = 1 when weight gradients are split off,
and the full backward B = B + W = 2 when they are not.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hintpipe.renamed import retired_attribute
from hintpipe.schedule.task import Kind


class CostModelError(ValueError):
    """A cost model that does not fit the pipeline or is malformed."""


def _per_stage(name: str, value: float | Sequence[float], stages: int) -> tuple[float, ...]:
    if isinstance(value, (int, float)):
        values = (float(value),) * stages
    else:
        values = tuple(float(v) for v in value)
        if len(values) != stages:
            raise CostModelError(f"{name} has {len(values)} entries, the pipeline has {stages} stages")
    if any(not np.isfinite(v) or v < 0 for v in values):
        raise CostModelError(f"{name} must be finite and non-negative, got {list(values)}")
    return values


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Expected cost of each task.

    Attributes:
        forward, backward, weight: per-stage cost of F, B (input gradient) and
            W (weight gradient). When a hint does not split W off, its B costs
            ``backward + weight``.
        activation: per-stage bytes an F keeps for its backward, or ``None``
            to count activations in micro-batch slots.
        microbatch_scale: per-micro-batch factor on every cost and activation
            size (e.g. relative sequence length), or ``None`` for all 1.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    activation: tuple[float, ...] | None = None
    microbatch_scale: tuple[float, ...] | None = None

    @classmethod
    def uniform(
        cls,
        stages: int,
        *,
        forward: float | Sequence[float] = 1.0,
        backward: float | Sequence[float] = 1.0,
        weight: float | Sequence[float] = 1.0,
        activation: float | Sequence[float] | None = None,
        microbatch_scale: Sequence[float] | None = None,
    ) -> CostModel:
        """A cost model from scalars (same for every stage) or per-stage lists."""
        act = None if activation is None else _per_stage("activation", activation, stages)
        scale = None
        if microbatch_scale is not None:
            scale = tuple(float(v) for v in microbatch_scale)
            if any(not np.isfinite(v) or v <= 0 for v in scale):
                raise CostModelError(f"microbatch_scale must be positive, got {list(scale)}")
        return cls(
            _per_stage("forward", forward, stages),
            _per_stage("backward", backward, stages),
            _per_stage("weight", weight, stages),
            act,
            scale,
        )

    @classmethod
    def from_json(cls, path: str | Path, stages: int) -> CostModel:
        """Load ``{"forward": .., "backward": .., "weight": .., "activation": ..,
        "microbatch_scale": [..]}``; each cost a number or a per-stage list."""
        try:
            data: Any = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CostModelError(f"cannot read cost model {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise CostModelError(f"cost model {path} must be a JSON object")
        known = {"forward", "backward", "weight", "activation", "microbatch_scale"}
        unknown = set(data) - known
        if unknown:
            raise CostModelError(f"cost model {path} has unknown keys {sorted(unknown)}; known: {sorted(known)}")
        return cls.uniform(stages, **data)

    @property
    def stages(self) -> int:
        """The number of stages the costs are for."""
        return len(self.forward)

    @property
    def num_stages(self) -> int:
        """Deprecated: :attr:`stages` (its name before 0.7)."""
        retired_attribute("CostModel.num_stages", "CostModel.stages")
        return self.stages

    def check_fits(self, stages: int, microbatches: int) -> None:
        if self.stages != stages:
            raise CostModelError(f"cost model has {self.stages} stages, the pipeline has {stages}")
        if self.microbatch_scale is not None and len(self.microbatch_scale) != microbatches:
            raise CostModelError(
                f"microbatch_scale has {len(self.microbatch_scale)} entries, the step has {microbatches} micro-batches"
            )

    def expected(self, microbatches: int, split_backward: bool) -> npt.NDArray[np.float64]:
        """Array ``[stage, mb, kind]`` of expected costs (kind = :class:`Kind` value)."""
        base = np.empty((self.stages, 3))
        base[:, Kind.F] = self.forward
        base[:, Kind.B] = self.backward
        base[:, Kind.W] = self.weight
        if not split_backward:
            base[:, Kind.B] += base[:, Kind.W]
            base[:, Kind.W] = 0.0
        scale = self._scale(microbatches)
        return base[:, None, :] * scale[None, :, None]

    def activation_sizes(self, microbatches: int) -> npt.NDArray[np.float64] | None:
        """Array ``[stage, mb]`` of activation bytes, or ``None`` for slots."""
        if self.activation is None:
            return None
        return np.asarray(self.activation)[:, None] * self._scale(microbatches)[None, :]

    def _scale(self, microbatches: int) -> npt.NDArray[np.float64]:
        if self.microbatch_scale is None:
            return np.ones(microbatches)
        return np.asarray(self.microbatch_scale, dtype=float)
