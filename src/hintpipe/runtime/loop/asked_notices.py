"""Which producer notices travel: the ones a neighbour asked for, kept for the whole run (see [Note: notices
asked for] in :mod:`hintpipe.runtime.transport.protocol`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hintpipe.runtime.transport.protocol import Transport
from hintpipe.runtime.transport.wire import MessageKind
from hintpipe.schedule.task import Kind, Task


class AskedNotices:
    """One rank's record of the notices asked for, by either side, across the steps of a run.

    Tasks are kept as tasks, not as positions: a step's positions may differ from the last's (a fitted hint, the
    micro-batches in another order), and a request made in one step stands for every later one.
    """

    def __init__(self) -> None:
        #: Tasks on other ranks whose input this rank produces, and whose rank asked to hear when it starts.
        self.theirs: set[Task] = set()
        #: Tasks of this rank whose producer it has asked (asked once per run).
        self.mine: set[Task] = set()

    def asked_by_peer(self, stage: int, of: MessageKind, mb: int) -> None:
        """A neighbour asked for notices of the input of its task ``(stage, of, mb)``: an activation feeds an F,
        a gradient a B."""
        self.theirs.add(Task(stage, Kind.F if of is MessageKind.ACTIVATION else Kind.B, mb))

    def ask(
        self,
        unheard: Iterable[int],
        tasks: Sequence[Task],
        source: Sequence[tuple[int, Task] | None],
        transport: Transport,
        step: int,
    ) -> None:
        """Ask the producers of the tasks at positions ``unheard`` (whose ETA the scoreboard weighed without
        having heard of their producer) for notices, each once per run; ``source[pos]``: the ``(rank, task)``
        feeding ``pos`` from another rank, or None."""
        for pos in unheard:
            task = tasks[pos]
            fed = source[pos]
            if fed is None or task in self.mine:
                continue
            self.mine.add(task)
            data = MessageKind.ACTIVATION if task.kind is Kind.F else MessageKind.GRADIENT
            transport.ask(fed[0], step, task.stage, task.mb, data)
