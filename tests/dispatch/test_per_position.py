"""Per-position values at 8 bytes a task (:mod:`hintpipe.dispatch.per_position`): floats read through a view of
their array, positions as shared int objects, both reading exactly what ``tolist()`` would."""

from __future__ import annotations

import numpy as np

from hintpipe.dispatch.per_position import float_view, shared_ints


def test_a_float_view_reads_the_arrays_floats_and_writes_through_to_it() -> None:
    array = np.array([[0.1, 2.5], [1e-300, -3.0]])
    view = float_view(array)
    assert list(view) == array.reshape(-1).tolist() and len(view) == 4
    view[1] = 7.0
    assert array[0, 1] == 7.0  # a contiguous float64 array is not copied
    assert list(float_view([1, 2])) == [1.0, 2.0]  # anything else is, once, into doubles


def test_equal_positions_are_one_shared_int_even_past_the_table() -> None:
    big = 5000  # past the table of 4096: it grows
    values = np.array([[big, -1], [3, big]], dtype=np.int32)
    ints = shared_ints(values)
    assert ints == [big, -1, 3, big] and all(type(v) is int for v in ints)
    assert ints[0] is ints[3] and ints[0] is shared_ints(np.array([big]))[0]
    assert shared_ints(np.array([], dtype=np.int64)) == []
