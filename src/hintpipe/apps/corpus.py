"""Real variable-length text on every machine: the Python standard library's own source files.

One document per ``.py`` file of the standard library (found through
``sysconfig``), byte-level tokens (vocabulary 256). A micro-batch takes
``size`` documents drawn from ``(seed, step)`` and crops them to the shortest
one (at most ``max_len`` tokens), so micro-batch lengths follow the real,
heavy-tailed distribution of file lengths, as a pipeline sees them.
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import numpy as np
import torch

VOCAB = 256
_SHORTEST = 16  # bytes: files shorter than this are left out (empty __init__.py files)


@functools.cache
def stdlib_documents() -> tuple[bytes, ...]:
    """The standard library's source files, sorted by path (the same on every rank)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if len(data) >= _SHORTEST:
            documents.append(data)
    if not documents:
        raise FileNotFoundError(f"no Python source files under {root}")
    return tuple(documents)


def stdlib_batch(
    microbatches: int, size: int, step: int, seed: int, max_len: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """One step's micro-batches of next-byte prediction: (inputs, targets, tokens per micro-batch)."""
    documents = stdlib_documents()
    rng = np.random.default_rng([seed, step, 7])
    inputs, targets, tokens = [], [], []
    for _ in range(microbatches):
        chosen = [documents[int(i)] for i in rng.integers(len(documents), size=size)]
        length = min(min(len(d) for d in chosen) - 1, max_len - 1)
        rows = torch.tensor([list(d[: length + 1]) for d in chosen], dtype=torch.int64)
        inputs.append(rows[:, :-1].contiguous())
        targets.append(rows[:, 1:].contiguous())
        tokens.append(size * length)
    return inputs, targets, tokens
