"""Real variable-length text on every machine: the Python standard library's own source files.

The ``.py`` files of the standard library (found through ``sysconfig``), cut
into documents at their top-level definitions (``def``, ``class``, a
decorator at the start of a line), byte-level tokens (vocabulary 256). Whole
files are far longer than any context a CPU run affords (median 4.9 KB, so
nearly every one would be cropped to the same length); their top-level
definitions have the real, heavy-tailed lengths of code (CPython 3.11's: 96,921
documents, median 440 bytes, 90th percentile 3.2 KB). A micro-batch takes
``size`` documents drawn from ``(seed, step)`` and crops them to the shortest
one (at most ``max_len`` tokens) (:func:`stdlib_batch`); or a step draws its
documents whole, each cropped to ``max_len`` tokens only, for micro-batches
formed by cost (:func:`stdlib_sequences`, :mod:`hintpipe.forming`).
"""

from __future__ import annotations

import functools
import re
import sysconfig
from pathlib import Path

import numpy as np
import torch

VOCAB = 256
_SHORTEST = 16  # bytes: shorter documents are left out (empty __init__.py files)
_TOP_LEVEL = re.compile(rb"\n(?=(?:def |class |async def |@))")


@functools.cache
def stdlib_documents() -> tuple[bytes, ...]:
    """The standard library's top-level definitions, in the order of the sorted file paths (the same on
    every rank)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        documents += [part for part in _TOP_LEVEL.split(data) if len(part) >= _SHORTEST]
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


def stdlib_sequences(count: int, step: int, seed: int, max_len: int) -> list[torch.Tensor]:
    """``count`` documents drawn from ``(seed, step)``, each as its byte ids, cropped to ``max_len`` tokens
    (``max_len + 1`` ids: its inputs and, shifted by one, its targets)."""
    documents = stdlib_documents()
    rng = np.random.default_rng([seed, step, 11])
    chosen = [documents[int(i)] for i in rng.integers(len(documents), size=count)]
    return [torch.tensor(list(d[: max_len + 1]), dtype=torch.int64) for d in chosen]
