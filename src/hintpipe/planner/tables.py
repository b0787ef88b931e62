"""Per-node tables for the search: time, kept bytes and parameters of each node, and what crosses each cut.

Built from plain data, so that the search and its tests need no torch: the
node profiles, the values the nodes pass on (:class:`ValueUse`) and the
positions where a cut may fall. :func:`hintpipe.planner.capture.value_uses`
and :func:`~hintpipe.planner.capture.allowed_cuts` read the last two off a
captured graph; :meth:`NodeTables.chain` makes them up for a chain.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from hintpipe.planner.node_profile import NodeProfile

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class ValueUse(NamedTuple):
    """One value passed between nodes: it is alive across cuts ``producer + 1 .. last_user``."""

    producer: int  # node index; -1 for a model input
    last_user: int  # node index; the node count for the model's output
    size: float  # bytes per micro-batch of the profiled size
    is_tensor: bool


@dataclasses.dataclass(frozen=True)
class NodeTables:
    """Per-node costs as arrays, plus what crosses each possible cut.

    ``saved[i]`` is what node ``i`` adds to a micro-batch's activations: its
    own temporaries, plus its output if anything saves that output (the
    producer or a consumer), so a tensor saved twice counts once.
    ``crossing[c]`` lists the values alive across cut ``c`` (between node
    ``c - 1`` and ``c``) as ``(producer index or -1, bytes, saved)``.
    """

    names: tuple[str, ...]
    compute: Array  # forward + backward seconds
    forward: Array
    saved: Array
    params: Array
    crossing: tuple[tuple[tuple[int, float, bool], ...], ...]  # per cut c = 0..N
    allowed: tuple[int, ...]  # cut positions 1..N-1 where a cut may fall
    # Savings are chosen per *segment*, the nodes between two neighbouring
    # allowed cuts: recomputing one (one checkpointed run) frees its nodes'
    # temporaries and every value produced in it whose savers are all in it;
    # its inputs stay saved (checkpoint keeps them), and so does a value that
    # a node outside saves. Conservative: merged runs free at least as much.
    segment_bounds: tuple[int, ...] = ()
    segment_free: Array = dataclasses.field(default_factory=lambda: np.zeros(0))
    segment_forward: Array = dataclasses.field(default_factory=lambda: np.zeros(0))
    segment_compute: Array = dataclasses.field(default_factory=lambda: np.zeros(0))

    @property
    def size(self) -> int:
        return len(self.names)

    @functools.cached_property
    def compute_prefix(self) -> list[float]:
        """``compute_prefix[i]``: the compute time of nodes ``0..i-1``."""
        return [0.0, *np.cumsum(self.compute).tolist()]

    def crossing_bytes(self, cut: int) -> float:
        return sum(size for _, size, _ in self.crossing[cut])

    @classmethod
    def chain(cls, profiles: Sequence[NodeProfile]) -> NodeTables:
        """Tables for a chain: node ``i`` feeds node ``i + 1`` alone, and a cut may fall anywhere."""
        n = len(profiles)
        uses = [ValueUse(i, min(i + 1, n), float(p.output_bytes), True) for i, p in enumerate(profiles)]
        return cls.build(profiles, uses, range(1, n))

    @classmethod
    def build(cls, profiles: Sequence[NodeProfile], uses: Sequence[ValueUse], allowed: Sequence[int]) -> NodeTables:
        """Tables for ``profiles`` (one per node, in order), the values ``uses`` and the cut positions ``allowed``.

        Raises:
            ValueError: ``allowed`` is not increasing within ``1 .. len(profiles) - 1``.
        """
        n = len(profiles)
        cuts = tuple(int(c) for c in allowed)
        if any(not 0 < c < n for c in cuts) or any(x >= y for x, y in itertools.pairwise(cuts)):
            raise ValueError(f"allowed cuts must increase within 1..{n - 1} for {n} nodes, got {cuts[:10]}...")
        owner = _storage_owners(profiles)
        savers_of = _savers(profiles, owner)
        compute = np.array([p.forward_s + p.backward_s for p in profiles])
        forward = np.array([p.forward_s for p in profiles])
        internal = np.array([float(p.internal_bytes) for p in profiles])
        saved = internal.copy()
        bounds = sorted({0, *cuts, n})
        segment_of = np.searchsorted(bounds, np.arange(n), side="right") - 1
        segment_free = np.add.reduceat(internal, bounds[:-1]) if n else np.zeros(0)
        crossing: list[list[tuple[int, float, bool]]] = [[] for _ in range(n + 1)]
        for producer, last, size, _ in uses:
            savers = savers_of.get(producer, set())
            # A view whose storage is saved is held with it (crossing a cut, it is not extra memory).
            is_saved = bool(savers_of.get(owner[producer])) if producer >= 0 else bool(savers)
            if savers:
                kept = max(size, float(profiles[producer].storage_bytes))
                saved[producer] += kept
                if len({int(segment_of[i]) for i in savers} | {int(segment_of[producer])}) == 1:
                    segment_free[segment_of[producer]] += kept
            for c in range(producer + 1, last + 1):
                crossing[c].append((producer, size, is_saved))
        return cls(
            tuple(p.name for p in profiles),
            compute,
            forward,
            saved,
            np.array([float(p.param_bytes) for p in profiles]),
            tuple(tuple(c) for c in crossing),
            cuts,
            tuple(bounds),
            segment_free,
            np.add.reduceat(forward, bounds[:-1]) if n else np.zeros(0),
            np.add.reduceat(compute, bounds[:-1]) if n else np.zeros(0),
        )

    def boundary(self, a: int, b: int) -> float:
        """Boundary bytes held with one micro-batch of nodes ``a:b``.

        The received inputs plus the outputs, minus what is already counted:
        outputs the range itself saved, and values passing straight through
        (received and sent on).
        """
        boundary = self.crossing_bytes(a) + self.crossing_bytes(b)
        for producer, size, is_saved in self.crossing[b]:
            if producer < a or (is_saved and producer < b):
                boundary -= size
        return boundary

    def per_microbatch(self, a: int, b: int) -> tuple[float, float]:
        """(kept activations of nodes a:b, boundary bytes held with them) for one micro-batch."""
        return float(self.saved[a:b].sum()), self.boundary(a, b)

    # -- the boundary split into its two ends, for the search --------------------------------------------

    @functools.cached_property
    def received(self) -> Array:
        """``received[c]``: the bytes crossing cut ``c``, all received by a stage that starts there."""
        return np.array([self.crossing_bytes(c) for c in range(self.size + 1)])

    @functools.cached_property
    def _sent_values(self) -> tuple[IntArray, IntArray, Array]:
        # The values a stage sends on and holds (produced by a node, not saved): producer, last cut, bytes.
        last: dict[int, tuple[int, float]] = {}
        for c, values in enumerate(self.crossing):
            for producer, size, is_saved in values:
                if producer >= 0 and not is_saved:
                    last[producer] = (c, size)
        producers = sorted(last)
        return (
            np.array(producers, dtype=np.int64),
            np.array([last[p][0] for p in producers], dtype=np.int64),
            np.array([last[p][1] for p in producers], dtype=np.float64),
        )

    def sent(self, a: int, cuts: Sequence[int] | IntArray) -> Array:
        """For each cut ``b`` in ``cuts`` (increasing, all after ``a``): ``boundary(a, b) - received[a]``.

        That is the bytes of values produced in ``a:b`` that cross ``b`` and
        nothing saves; it does not depend on anything else about ``a``.
        """
        ends = np.asarray(cuts, dtype=np.int64)
        if not len(ends):
            return np.zeros(0)
        producers, last, size = self._sent_values
        first, stop = np.searchsorted(producers, [a, ends[-1]])  # produced in a:cuts[-1]
        length = int(ends[-1]) + 1
        diff = np.bincount(producers[first:stop] + 1, size[first:stop], length)
        crossed = np.minimum(last[first:stop] + 1, length)  # past the last cut asked about: never subtracted
        diff -= np.bincount(crossed, size[first:stop], length + 1)[:length]
        return np.asarray(np.cumsum(diff)[ends], dtype=np.float64)

    @functools.cached_property
    def uniform_boundaries(self) -> bool:
        """Whether every range's boundary bytes are the same wherever its ends fall (at allowed cuts).

        True when every allowed cut receives the same bytes and sends the same
        bytes, and no value a stage sends on crosses two of the cuts (allowed
        ones and the end), so that what a stage sends does not depend on where
        it starts. Then a range's memory grows with the range, on both ends.
        """
        cuts = np.array(self.allowed, dtype=np.int64)
        if len(cuts) == 0:
            return True
        received = self.received[cuts]
        sent = self.sent(0, cuts)
        if np.ptp(received) > 0 or np.ptp(sent) > 0:
            return False
        producers, last, _ = self._sent_values
        ends = np.append(cuts, self.size)
        spans = np.searchsorted(ends, last, side="right") - np.searchsorted(ends, producers + 1, side="left")
        return bool(np.all(spans <= 1))


def _storage_owners(profiles: Sequence[NodeProfile]) -> list[int]:
    """``owner[i]``: the node whose output storage node ``i``'s output lives in (``i`` if its own)."""
    names = {p.name: i for i, p in enumerate(profiles)}
    owners = []
    for i in range(len(profiles)):
        j = i
        while profiles[j].alias_of in names and names[profiles[j].alias_of] < j:
            j = names[profiles[j].alias_of]
        owners.append(j)
    return owners


def _savers(profiles: Sequence[NodeProfile], owner: Sequence[int]) -> dict[int, set[int]]:
    """``savers[i]``: the nodes that keep node ``i``'s output storage for their backward.

    A view's saver keeps the storage of the node it is a view of (see
    :attr:`NodeProfile.alias_of`).
    """
    names = {p.name: i for i, p in enumerate(profiles)}
    savers: dict[int, set[int]] = {}
    for i, p in enumerate(profiles):
        if p.saves_output:
            savers.setdefault(owner[i], set()).add(i)
    for consumer, p in enumerate(profiles):
        for name in p.saved_inputs:
            if name in names:
                savers.setdefault(owner[names[name]], set()).add(consumer)
    return savers
