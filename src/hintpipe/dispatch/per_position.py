"""Per-position values that hot paths index, at 8 bytes a task.

The simulator holds every rank's scoreboard at once, and a 1024 x 4096 pipeline has 8.4
million tasks: a list made by ``ndarray.tolist()`` costs 32 bytes a task for floats (a
pointer and a float object each) and 44 for positions above 256 (Python shares only the
small ints), and a scoreboard keeps a dozen such lists. So floats are read through a
memoryview of their numpy array (no copy, and about as quick to index as a list), and
positions and ranks are lists of shared int objects, one object per value, still lists
because a memoryview of integers builds a new int on every read.

This module is torch-free.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: ``_SHARED[v + 1]``: the one int object for ``v``, from -1 up (grown on demand).
_SHARED: npt.NDArray[np.object_] = np.array(list(range(-1, 4095)), dtype=object)


def float_view(values: npt.ArrayLike) -> memoryview[float]:
    """``values`` as a flat memoryview of doubles (writable; a copy only if they are not already
    a contiguous float64 array): indexing it gives the same floats as the array's ``tolist()``."""
    array = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    return array.data.cast("B").cast("d")


def shared_ints(values: npt.NDArray[np.integer]) -> list[int]:
    """``values.tolist()`` (integers, none below -1), every equal value one shared int object."""
    global _SHARED
    flat = np.asarray(values, dtype=np.int64).reshape(-1)
    if not len(flat):
        return []
    top = int(flat.max())
    if top + 1 >= len(_SHARED):
        grown = max(top + 2, 2 * len(_SHARED))
        _SHARED = np.concatenate([_SHARED, np.array(list(range(len(_SHARED) - 1, grown - 1)), dtype=object)])
    table = _SHARED
    out: list[int] = table[flat + 1].tolist()
    return out
