"""Forming a step's micro-batches from its sequences, by predicted cost.

Why: a pipeline's step is paced by its costliest micro-batches (a long one
holds up every stage behind it), and padding is work thrown away. Packing
documents into rows of one fixed length fixes both, at the price of cutting
documents at the row ends and, without document masks, of attending across
them. Sequence lengths are known when a batch is loaded, so the micro-batches
can instead be *formed*: whole sequences, grouped so that every micro-batch's
predicted cost (:class:`~hintpipe.forming.cost.SequenceCost`) is about the
same, in shapes that vary from micro-batch to micro-batch (which hintpipe's
runtime takes as they come). Two forms:

- **Rows of one sequence each** (any causal model): the sequences sorted by
  length and cut into ``microbatches`` consecutive runs whose largest padded
  cost (rows x the cost of the run's longest) is smallest, as DynaPipe forms
  them: similar lengths together, so little padding, and costs evened out.
  Padding goes at the end of a row, where causal attention keeps it from
  every real position; its targets are ignored.
- **Packed** (``pack=True``): each micro-batch one row of whole sequences,
  kept apart by document masks, which the model must take (gpt-mini's
  ``documents`` input, :mod:`hintpipe.apps.models`): no padding at all. The
  sequences are dealt longest first to the micro-batch whose row is shortest
  so far, so the rows come out nearly equal.

The micro-batches are then put in the order the hint should run them by
their predicted costs (:func:`~hintpipe.schedule.microbatch_order.microbatch_order`;
the readiness study's lever: longest first breaks the convoys a long
micro-batch forms). Sequences of equal length are told apart by a
permutation drawn from ``seed``: forming is deterministic for a seed.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence

import numpy as np

from hintpipe.choice import Choice
from hintpipe.forming.cost import SequenceCost
from hintpipe.renamed import renamed
from hintpipe.schedule.microbatch_order import MicrobatchOrder
from hintpipe.schedule.microbatch_order import microbatch_order as ordering


class Forming(Choice):
    """How ``hintpipe train --data stdlib`` makes a step's micro-batches from documents.

    - ``crop``: each micro-batch draws its documents and crops them to its shortest (one shape per
      micro-batch, documents cut).
    - ``padded``: the step's documents whole, formed by cost into rows of one document each
      (:func:`form_microbatches`), padded to each micro-batch's longest.
    - ``packed``: the same, several documents per row with document masks (gpt-mini).
    - ``concat``: the step's drawn documents end to end, cut into full rows of the model's context (any model;
      attention crosses documents), as Hugging Face's ``group_texts`` makes them (see [Note: documents end to
      end] in :mod:`hintpipe.apps.corpus`).
    """

    CROP = "crop"
    PADDED = "padded"
    PACKED = "packed"
    CONCAT = "concat"

    @classmethod
    def noun(cls) -> str:
        return "forming"

    @property
    def by_cost(self) -> bool:
        """Whether the micro-batches are formed by the model's predicted cost (``padded``, ``packed``): of uneven
        sizes, so a step's loss is the sum over its tokens divided by their count."""
        return self in (Forming.PADDED, Forming.PACKED)


#: Rows of one micro-batch, each row the indices of the sequences it holds, in order.
Rows = tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class Formation:
    """A step's sequences formed into micro-batches.

    Attributes:
        lengths: every sequence's length in tokens, as given.
        microbatches: per micro-batch, in the order to run them, its rows; a row lists the indices (into
            ``lengths``) of the sequences it holds (one each, unless packed).
        costs: each micro-batch's predicted cost (seconds of the fitted model; padding included).
        packed: whether rows hold several sequences apart by document masks.
    """

    lengths: tuple[int, ...]
    microbatches: tuple[Rows, ...]
    costs: tuple[float, ...]
    packed: bool = False

    def sequences(self, mb: int) -> tuple[int, ...]:
        """The sequences of micro-batch ``mb``, row by row."""
        return tuple(i for row in self.microbatches[mb] for i in row)

    def shape(self, mb: int) -> tuple[int, int]:
        """Micro-batch ``mb``'s rows and their length (the longest row's tokens)."""
        rows = self.microbatches[mb]
        return len(rows), max(sum(self.lengths[i] for i in row) for row in rows)

    @property
    def tokens(self) -> int:
        """The sequences' own tokens."""
        return sum(self.lengths)

    @property
    def padding(self) -> float:
        """Padded tokens over the sequences' own (0: none)."""
        padded = sum(rows * length for rows, length in map(self.shape, range(len(self.microbatches))))
        return padded / self.tokens - 1.0


@renamed("form_microbatches", order="microbatch_order")
def form_microbatches(
    lengths: Sequence[int],
    microbatches: int,
    cost: SequenceCost | None = None,
    *,
    pack: bool = False,
    microbatch_order: MicrobatchOrder | str = MicrobatchOrder.LONGEST_FIRST,
    seed: int = 0,
) -> Formation:
    """Form ``microbatches`` micro-batches of even predicted cost from sequences of ``lengths`` tokens.

    Args:
        lengths: each sequence's tokens (the positions the loss sees), known when the batch is loaded.
        microbatches: how many micro-batches the pipeline runs per step.
        cost: the model's cost per row (:func:`~hintpipe.forming.profiled.profile_sequence_cost`, or
            :meth:`SequenceCost.fit` on times of your own); default: proportional to tokens.
        pack: several sequences per row with document masks (the model must take them), else one per row.
        microbatch_order: the order to run the micro-batches in, by predicted cost (see
            :class:`~hintpipe.schedule.microbatch_order.MicrobatchOrder`).
        seed: breaks ties between sequences of equal length.

    Returns:
        The :class:`Formation`: every sequence in exactly one micro-batch, every micro-batch non-empty.

    Raises:
        ValueError: a length that is not a positive integer, fewer sequences than micro-batches, or an
            unknown order.
    """
    rule = MicrobatchOrder.parse(microbatch_order)
    if microbatches < 1:
        raise ValueError(f"microbatches must be at least 1, got {microbatches}")
    bad = [n for n in lengths if int(n) != n or n < 1]
    if bad:
        raise ValueError(f"sequence lengths must be positive integers, got {bad[0]!r}")
    values = [int(n) for n in lengths]
    if len(values) < microbatches:
        raise ValueError(
            f"{len(values)} sequences cannot fill {microbatches} micro-batches: give at least {microbatches} "
            "sequences a step, or run fewer micro-batches"
        )
    model = cost if cost is not None else SequenceCost(1.0)
    formed: list[Rows]
    # Longest first; equal lengths in an order drawn from the seed.
    tiebreak = np.random.default_rng(seed).permutation(len(values))
    ranked = sorted(range(len(values)), key=lambda i: (-values[i], int(tiebreak[i])))
    if pack:
        formed = [(row,) for row in _deal(ranked, values, microbatches)]
        costs = [model(sum(values[i] for i in rows[0])) for rows in formed]
    else:
        groups = _cut(ranked, values, microbatches, model)
        formed = [tuple((i,) for i in group) for group in groups]
        costs = [model.rows(len(group), values[group[0]]) for group in groups]
    perm = ordering(costs, rule)
    return Formation(
        lengths=tuple(values),
        microbatches=tuple(formed[p] for p in perm),
        costs=tuple(costs[p] for p in perm),
        packed=pack,
    )


def _cut(ranked: list[int], lengths: list[int], m: int, cost: SequenceCost) -> list[list[int]]:
    """``ranked`` (longest first) cut into ``m`` consecutive non-empty runs whose largest padded cost is
    smallest: the least limit at which the greedy cut (each run as long as the limit allows, which needs the
    fewest runs) needs at most ``m``; then the costliest runs split until there are ``m``."""
    unit = [cost(lengths[i]) for i in ranked]  # one row of the run's longest, for a run starting here

    def greedy(limit: float) -> list[tuple[int, int]] | None:
        runs, start = [], 0
        while start < len(ranked):
            count = math.floor(limit / unit[start] * (1 + 1e-12))
            if count < 1:
                return None
            end = min(len(ranked), start + count)
            runs.append((start, end))
            start = end
            if len(runs) > m:
                return None
        return runs

    low, high = max(unit), len(ranked) * unit[0]
    best = greedy(high)
    for _ in range(64):
        middle = (low + high) / 2
        if middle <= low or middle >= high:
            break
        runs = greedy(middle)
        if runs is None:
            low = middle
        else:
            high, best = middle, runs
    assert best is not None
    runs = list(best)
    while len(runs) < m:  # fewer runs than micro-batches: split the costliest run where its halves cost least
        splittable = [r for r in runs if r[1] - r[0] > 1]
        start, end = max(splittable, key=lambda r: ((r[1] - r[0]) * unit[r[0]], -r[0]))
        cut = min(range(start + 1, end), key=lambda h: max((h - start) * unit[start], (end - h) * unit[h]))
        at = runs.index((start, end))
        runs[at : at + 1] = [(start, cut), (cut, end)]
    return [ranked[start:end] for start, end in runs]


def _deal(ranked: list[int], lengths: list[int], m: int) -> list[tuple[int, ...]]:
    """``ranked`` (longest first) dealt into ``m`` rows, each sequence to the row shortest so far (the lowest
    index among equals): rows of nearly equal tokens, each non-empty."""
    rows: list[list[int]] = [[] for _ in range(m)]
    heap = [(0, row) for row in range(m)]
    for i in ranked:
        tokens, row = heapq.heappop(heap)
        rows[row].append(i)
        heapq.heappush(heap, (tokens + lengths[i], row))
    return [tuple(row) for row in rows]
