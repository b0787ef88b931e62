"""A rank's tasks as arrays: to everything but the simulator, a tuple of tasks."""

from __future__ import annotations

import pytest

from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, Placement
from hintpipe.schedule.task import B, F, Kind, Task
from hintpipe.schedule.task_list import TaskList


def test_a_task_list_reads_as_the_tuple_of_its_tasks() -> None:
    tasks = (F(0, 0), F(0, 1), B(0, 0), B(0, 1))
    listed = TaskList.of(tasks)
    assert listed == tasks and listed == list(tasks) and tuple(listed) == tasks
    assert listed[2] == B(0, 0) and listed[-1] == B(0, 1)
    assert listed[1:3] == (F(0, 1), B(0, 0)) and isinstance(listed[1:3], TaskList)
    assert len(listed) == 4 and B(0, 1) in listed and listed.index(B(0, 0)) == 2
    assert hash(listed) == hash(TaskList.of(tasks)) and listed != TaskList.of(tasks[:3])
    assert repr(listed) == "TaskList(0F0 0F1 0B0 0B1)"
    assert listed.keys(2).tolist() == [0, 1, 2, 3]  # (stage * 3 + kind) * microbatches + mb


def test_the_arrays_are_read_only_and_of_one_length() -> None:
    listed = TaskList.of([F(1, 3)])
    assert (listed.stage.tolist(), listed.kind.tolist(), listed.mb.tolist()) == ([1], [int(Kind.F)], [3])
    with pytest.raises(ValueError, match="read-only"):
        listed.mb[0] = 4
    with pytest.raises(ValueError, match=r"^2 stages, 1 kinds and 1 micro-batches$"):
        TaskList([0, 1], [0], [0])


def test_a_hint_keeps_its_lists_as_arrays_and_compares_with_tuples() -> None:
    hint = generate_hint("1f1b", 2, 2)
    assert all(isinstance(tasks, TaskList) for tasks in hint.lists)
    same = Hint.from_lists("1f1b", Placement.loop(2), 2, [tuple(tasks) for tasks in hint.lists])
    assert same == hint and isinstance(same.lists[0], TaskList)
    assert [str(t) for t in hint.lists[1]] == ["1F0", "1B0", "1F1", "1B1"]
    assert isinstance(hint.lists[0][0], Task) and hint.lists[0][0].kind is Kind.F
