"""The held-out split as an evaluation reads it: every source's held-out documents as one sequence, in a fixed
order, taken without replacement.

``--eval-batches K``: each evaluation's loss is over the same ``K`` batches, the first ``K x microbatches x
microbatch_size`` documents of this order (``x dp``: each replica its own), so that two evaluations of a run,
and a user's own evaluation of its weights (:func:`hintpipe.held_out_batches`), are on the same text.

The order is a fixed permutation of the held-out documents, seeded by the run's seed (not by a step): a
prefix of it is a sample of every source and of the whole corpus, not its first files. It is an affine map
``i -> (a i + b) mod n`` with ``a`` coprime to ``n`` (a permutation), computed per document, so no list of
the held-out documents is ever held. Sources count by their held-out documents, not by their weights: an
evaluation is on the held-out text as it is.

This module is torch-free.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hintpipe.data.mixture import Documents


class HeldOutOrder:
    """``parts``' documents (each source's held-out ones) as one sequence in a fixed order seeded by ``seed``."""

    def __init__(self, parts: tuple[Documents, ...], seed: int) -> None:
        self.parts = parts
        self._starts = np.cumsum([0, *(len(part) for part in parts)])
        count = int(self._starts[-1])
        rng = np.random.default_rng([seed, 13])
        self._step = 1
        if count > 1:
            self._step = int(rng.integers(1, count))
            while math.gcd(self._step, count) != 1:
                self._step = self._step % (count - 1) + 1
        self._shift = int(rng.integers(count)) if count else 0

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, position: int) -> Any:
        """The document at ``position`` of the order."""
        if not 0 <= position < len(self):
            raise IndexError(f"held-out document {position} of {len(self)}")
        index = (self._step * position + self._shift) % len(self)
        part = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.parts[part][index - int(self._starts[part])]

    def batch(self, number: int, size: int) -> list[Any]:
        """Batch ``number``'s ``size`` documents: positions ``number x size`` to ``(number + 1) x size``."""
        return [self[number * size + i] for i in range(size)]
