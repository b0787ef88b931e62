"""One rank's tasks in hint order, stored as three arrays rather than as :class:`Task` objects.

A hint of 1024 ranks and 4096 micro-batches has 8.4 million tasks. As
``Task`` named tuples they take about a gigabyte and seconds to build; as
arrays (stage, kind and micro-batch of each position) they take 76 MB, and
the rank graphs and the simulator read them without touching a ``Task`` at
all. To everything else a :class:`TaskList` is a read-only sequence of
``Task``: indexing, iteration, slicing, ``len`` and equality with a tuple of
tasks behave as a tuple's would.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np
import numpy.typing as npt

from hintpipe.schedule.task import Kind, Task

#: ``Kind`` by value, for building tasks from the arrays without an enum lookup.
_KINDS = (Kind.F, Kind.B, Kind.W)

IntArray = npt.NDArray[np.int64]


class TaskList(Sequence[Task]):
    """One rank's tasks in order: ``stage[i]``, ``kind[i]`` (a :class:`Kind` value) and ``mb[i]`` of position ``i``.

    The arrays are read-only; build one with :meth:`of` (from tasks) or from arrays of equal length.
    """

    __slots__ = ("kind", "mb", "stage")

    def __init__(self, stage: npt.ArrayLike, kind: npt.ArrayLike, mb: npt.ArrayLike) -> None:
        arrays = [np.array(a, dtype=np.int64).reshape(-1) for a in (stage, kind, mb)]
        if not len(arrays[0]) == len(arrays[1]) == len(arrays[2]):
            raise ValueError(f"{len(arrays[0])} stages, {len(arrays[1])} kinds and {len(arrays[2])} micro-batches")
        for array in arrays:
            array.setflags(write=False)
        self.stage: IntArray = arrays[0]
        self.kind: IntArray = arrays[1]
        self.mb: IntArray = arrays[2]

    @classmethod
    def of(cls, tasks: Iterable[Task]) -> TaskList:
        """The tasks as a list (a :class:`TaskList` is returned as it is)."""
        if isinstance(tasks, TaskList):
            return tasks
        rows = [(t.stage, int(t.kind), t.mb) for t in tasks]
        table = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return cls(table[:, 0], table[:, 1], table[:, 2])

    def __len__(self) -> int:
        return len(self.stage)

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> TaskList: ...

    def __getitem__(self, index: int | slice) -> Task | TaskList:
        if isinstance(index, slice):
            return TaskList(self.stage[index], self.kind[index], self.mb[index])
        return Task(int(self.stage[index]), _KINDS[self.kind[index]], int(self.mb[index]))

    def __iter__(self) -> Iterator[Task]:
        kinds = _KINDS
        for s, k, m in zip(self.stage.tolist(), self.kind.tolist(), self.mb.tolist(), strict=True):
            yield Task(s, kinds[k], m)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TaskList):
            return bool(
                np.array_equal(self.stage, other.stage)
                and np.array_equal(self.kind, other.kind)
                and np.array_equal(self.mb, other.mb)
            )
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.stage.tobytes(), self.kind.tobytes(), self.mb.tobytes()))

    def __repr__(self) -> str:
        shown = " ".join(str(t) for t in self[:8])
        more = f" ... ({len(self)} tasks)" if len(self) > 8 else ""
        return f"TaskList({shown}{more})"

    def keys(self, microbatches: int) -> IntArray:
        """One integer per position, ``(stage * 3 + kind) * microbatches + mb``: a task's identity as a
        number, for looking positions up with arrays (see :func:`positions_of`)."""
        return (self.stage * 3 + self.kind) * microbatches + self.mb


def positions_of(tasks: TaskList, microbatches: int) -> tuple[IntArray, IntArray]:
    """``(sorted keys, their positions)``: look up the position of task key ``k`` with
    ``positions[np.searchsorted(keys, k)]`` (after checking that ``keys`` holds ``k``)."""
    keys = tasks.keys(microbatches)
    order = np.argsort(keys, kind="stable")
    return keys[order], order


def as_task_lists(lists: Sequence[Sequence[Task]]) -> tuple[TaskList, ...]:
    """Every rank's tasks as a :class:`TaskList`."""
    return tuple(TaskList.of(tasks) for tasks in lists)
