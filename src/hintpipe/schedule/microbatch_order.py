"""Micro-batch order: which of the step's micro-batches runs in which slot.

Forwards pass every stage first-in-first-out, so the longest micro-batch in
flight sets the pace of those behind it (a convoy). When the sizes of the
step's micro-batches are known before it starts (sequence lengths, image
counts: known when the batch is loaded), running them in a chosen order
breaks the convoys; the maths is unchanged, because the step's gradient is a
sum over micro-batches. The simulator orders its sampled work with
:func:`microbatch_order`, and the runtime can order a step's micro-batches
with the same function.

This module is torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hintpipe.choice import Choice


class MicrobatchOrder(Choice):
    """How to order a step's micro-batches by their known sizes.

    - ``given``: as they come.
    - ``longest-first``: largest first; the long ones start while the pipeline
      is filling and no short one queues behind them.
    - ``shortest-first``: smallest first.
    - ``balanced``: largest, smallest, second largest, second smallest, ...:
      neighbours in flight even each other out.
    - ``front-then-back``: where a micro-batch's work differs between the
      pipeline's ends (a vision-language model: its images size the encoder's
      stages, its text the decoder's), first those whose first-stage work
      ranks at least as high among the step's as their last-stage work does,
      lightest first, then the others, heaviest last stage first (see
      [Note: front then back]). With one size per micro-batch both ends are
      that size, and it orders as shortest-first.
    """

    GIVEN = "given"
    LONGEST_FIRST = "longest-first"
    SHORTEST_FIRST = "shortest-first"
    BALANCED = "balanced"
    FRONT_THEN_BACK = "front-then-back"

    @classmethod
    def noun(cls) -> str:
        return "micro-batch order"


def microbatch_order(
    sizes: Sequence[float],
    order: MicrobatchOrder | str = MicrobatchOrder.GIVEN,
    *,
    ends: tuple[Sequence[float], Sequence[float]] | None = None,
) -> list[int]:
    """The permutation that runs the step's micro-batches in ``order``.

    Args:
        sizes: each micro-batch's known size or expected cost (any unit, one per
            micro-batch, in the given order).
        order: the rule.
        ends: for ``front-then-back``, each micro-batch's known work at the first
            stage and at the last (any unit for each: only ranks within an end are
            compared; default: ``sizes`` for both).

    Returns:
        ``perm``: slot ``i`` of the step runs given micro-batch ``perm[i]``. Equal
        sizes keep their given order, so the result is deterministic.

    Raises:
        ValueError: for an unknown order or a size that is not a finite number.
    """
    rule = MicrobatchOrder.parse(order)
    values = [float(v) for v in sizes]
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"micro-batch sizes must be finite numbers, got {bad[0]!r}")
    given = list(range(len(values)))
    if rule is MicrobatchOrder.GIVEN:
        return given
    if rule is MicrobatchOrder.SHORTEST_FIRST:
        return sorted(given, key=lambda i: (values[i], i))
    if rule is MicrobatchOrder.FRONT_THEN_BACK:
        return _front_then_back(values, ends)
    longest = sorted(given, key=lambda i: (-values[i], i))
    if rule is MicrobatchOrder.LONGEST_FIRST:
        return longest
    balanced = []
    low, high = 0, len(longest) - 1
    while low <= high:
        balanced.append(longest[low])
        if low != high:
            balanced.append(longest[high])
        low, high = low + 1, high - 1
    return balanced


def _front_then_back(sizes: list[float], ends: tuple[Sequence[float], Sequence[float]] | None) -> list[int]:
    """[Note: front then back]
    A micro-batch whose work differs between the pipeline's first and last stages is a job on two
    machines in a row, and orders for such jobs are an old subject (Johnson's rule orders a two-machine
    flow shop: the jobs lighter on the first machine first, by that machine's time rising, then the
    rest by the second machine's time falling). A pipeline's step differs from a flow shop: every
    forward comes back as a backward through the same stages, and a rank admits forwards only within
    its memory, so what helps is the mirror image: the micro-batches heavier at the front first, the
    lightest of them first, and those heavier at the back last, the lightest of them last. "Heavier at
    the front" compares ranks, not values: a micro-batch whose first-stage work ranks at least as high
    among the step's micro-batches as its last-stage work does (so the two ends may be counted in any
    units, images and tokens). Measured in the simulator at 128 ranks x 512 micro-batches under
    ``mm:1.0:0.5`` (encoder work drawn with sigma 1.0, decoder work with 0.5), ``ready``, admission by
    size within fixed 1F1B's busiest rank's bytes, 3 trials: 2.83x fixed 1F1B on ``zb-h1`` and 2.79x
    on ``bfw``, against 2.45x and 2.41x longest-first; comparing the two ends' values instead of their
    ranks gave 2.76x and 2.75x, and Johnson's own order was slower than either sort
    (``benchmarks/readiness-at-scale``, "Front then back"). Ties go to the front group and then to the
    given order, so the permutation is deterministic."""
    front, back = (sizes, sizes) if ends is None else ([float(v) for v in ends[0]], [float(v) for v in ends[1]])
    if len(front) != len(sizes) or len(back) != len(sizes):
        raise ValueError(
            f"ends must give the first and the last stage's work of each of the {len(sizes)} micro-batches, "
            f"got {len(front)} and {len(back)}"
        )
    bad = [v for v in (*front, *back) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"micro-batch sizes must be finite numbers, got {bad[0]!r}")
    front_rank, back_rank = _ranks(front), _ranks(back)
    heavier_front = [i for i in range(len(sizes)) if front_rank[i] >= back_rank[i]]
    heavier_back = [i for i in range(len(sizes)) if front_rank[i] < back_rank[i]]
    return sorted(heavier_front, key=lambda i: (front[i], i)) + sorted(heavier_back, key=lambda i: (-back[i], i))


def _ranks(values: list[float]) -> list[int]:
    """Each value's place among ``values`` (0: the smallest; equal values by their index)."""
    ranks = [0] * len(values)
    for place, i in enumerate(sorted(range(len(values)), key=lambda i: (values[i], i))):
        ranks[i] = place
    return ranks


#: What ``hintpipe train`` and ``simulate`` use unless told otherwise. Sorted orders are faster, but a
#: sorted step keeps its largest micro-batches in flight together: at 128 ranks the busiest rank held
#: 1.62x fixed 1F1B's activation bytes under shortest-first, 1.17x under balanced
#: (benchmarks/readiness-at-scale), so the order that never costs memory is the default. Admission by
#: size (``simulate --admission size``, :mod:`hintpipe.dispatch.fit`) holds any order to the given one's.
DEFAULT_ORDER = MicrobatchOrder.GIVEN.value
