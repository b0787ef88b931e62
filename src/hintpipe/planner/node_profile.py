"""What one node costs, as plain data: the profiler's output and the planner's input.

Kept apart from :mod:`~hintpipe.planner.profile` (which runs nodes under torch)
so that the search and its tables can be built and tested without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class NodeProfile:
    """What one node costs, per micro-batch of the profiled size."""

    name: str
    forward_s: float
    backward_s: float
    saved_bytes: int
    param_bytes: int
    output_bytes: int
    tensor_output: bool
    # How ``saved_bytes`` splits, so that a tensor saved by two nodes (a
    # tanh's output saved again as the next linear's input) counts once.
    internal_bytes: int = 0
    saves_output: bool = False
    saved_inputs: tuple[str, ...] = ()
    # Where the output's memory lives: ``alias_of`` names the earlier node
    # whose output storage this output is a view of ("" if its own), and
    # ``storage_bytes`` is the size of that storage. Saving a view keeps the
    # whole storage alive (q, k and v split from one projection), and two
    # saved views of one storage keep it once.
    storage_bytes: int = 0
    alias_of: str = ""
    #: The innermost module whose code made the node (``transformer.h.0.attn``; "" for the model's own code):
    #: how a plan names a stage's first node to a user.
    module: str = ""

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> NodeProfile:
        """A profile as ``dataclasses.asdict`` wrote it to JSON (its tuple read back as a list: made a tuple again,
        so that it equals the profile it was written from)."""
        return cls(**{**row, "saved_inputs": tuple(row.get("saved_inputs", ()))})
