"""What admission looks ahead at: the live memory after each position of a rank's hint, were the rest to run in order.

A scoreboard admits a forward ahead of its hint position only if the rest of the hint,
run in order afterwards, stays within the budget (see [Note: admission never blocks the
hint] in :mod:`hintpipe.dispatch.scoreboard`). Running position ``pos`` ahead of the hint's next
position ``k`` moves the projection at every position in between by the task's size: a
window that spans a hundred positions at 1024 ranks, for each of the millions of tasks
that run early. Most of these are backward passes (which free memory), and few are
followed by a forward's admission before the hint has caught up with them; so an early
run is only noted, and the notes are applied when an admission reads the projection, or
once enough of them pile up. They are applied in the order they were noted, so every
position receives the same additions in the same order, float for float, as if each had
been applied at once; and only from the hint's next position on, since no position
before it is read again.

This module is torch-free.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Notes kept before those the hint has passed are dropped, and the rest applied if half as many remain (a bound
#: on their memory: 1024 ranks hold theirs at once).
PENDING_LIMIT = 256


class ProjectedLive:
    """The projected live memory after each position of one rank's hint.

    Args:
        projected: after each position, the live memory of a run of the whole hint in order.
    """

    def __init__(self, projected: npt.NDArray[np.float64]) -> None:
        self._values = np.array(projected, dtype=np.float64)
        self._pending: list[tuple[int, float]] = []

    def ran_early(self, hint_next: int, pos: int, delta: float) -> None:
        """The task at ``pos``, of size ``delta``, started while the hint's next untaken position
        was ``hint_next``: the live memory after each position in between moves by ``delta``."""
        pending = self._pending
        pending.append((pos, delta))
        if len(pending) >= PENDING_LIMIT:  # drop the notes the hint has passed; apply the rest if still many
            self._pending = pending = [note for note in pending if note[0] > hint_next]
            if len(pending) >= PENDING_LIMIT // 2:
                self._apply(hint_next)

    def peak(self, start: int, stop: int) -> float:
        """The most the projection holds after any position from ``start`` (the hint's next
        untaken position) up to, not including, ``stop``."""
        if self._pending:
            self._apply(start)
        return float(self._values[start:stop].max())

    def _apply(self, hint_next: int) -> None:
        values = self._values
        for pos, delta in self._pending:
            if pos > hint_next:
                values[hint_next:pos] += delta
        self._pending.clear()
