"""Several sources with weights: each document a step draws comes from a source chosen in the weights'
proportion, then a document of that source, both from the step's random stream.

``--data a.jsonl:0.7 --data code/:0.3``: over many draws, 70% of the documents are ``a.jsonl``'s. The choice
is per document, not per micro-batch or per step, so every micro-batch mixes the sources (a micro-batch of
one source's long documents beside another of short ones would skew each step's cost). One source alone is
drawn exactly as before mixtures existed (one integer per document, nothing drawn for the source), so its
runs are the same as 0.6's.

Everything is drawn from the generator the caller seeds with ``(seed, step)``: every rank and every policy
draws the same documents, and step ``k``'s are the same whatever ran before (a resumed run draws what an
uninterrupted one does).

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np


class Documents(Protocol):
    """Documents by index: a tuple of them, or a prepared corpus's view
    (:class:`~hintpipe.data.prepared.DocumentView`)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Mixture:
    """Sources' documents (``parts``) and their shares (``weights``, summing to 1)."""

    parts: tuple[Documents, ...]
    weights: tuple[float, ...]

    @classmethod
    def of(cls, parts: tuple[Documents, ...], weights: tuple[float, ...]) -> Mixture:
        """``parts`` with ``weights`` in any scale (made to sum to 1)."""
        total = float(sum(weights))
        return cls(parts, tuple(w / total for w in weights))

    def draw(self, rng: np.random.Generator, count: int) -> list[Any]:
        """``count`` documents: a source for each (by the weights), then a document of it."""
        if len(self.parts) == 1:
            return draw_documents(self.parts[0], rng, count)
        which = rng.choice(len(self.parts), size=count, p=np.asarray(self.weights))
        chosen: list[Any] = [None] * count
        for k, part in enumerate(self.parts):
            slots = np.flatnonzero(which == k)
            for slot, index in zip(slots, rng.integers(len(part), size=len(slots)), strict=True):
                chosen[int(slot)] = part[int(index)]
        return chosen


def draw_documents(documents: Documents | Mixture, rng: np.random.Generator, count: int) -> list[Any]:
    """``count`` documents drawn with replacement, uniformly from one source or by a mixture's weights."""
    if isinstance(documents, Mixture):
        return documents.draw(rng, count)
    return [documents[int(i)] for i in rng.integers(len(documents), size=count)]
