"""Documents into micro-batches; and real variable-length text on every machine: the standard library's source.

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

[Note: a long document is trained by windows]
A row holds at most the model's context (``max_len`` tokens). A document longer than that is trained by a
window of it: each time it is drawn, a window of ``max_len`` tokens at an offset drawn from a stream of its
own (the step's, apart from the stream that draws the documents, so which documents a step draws is what it
was before windows), which ``crop`` then crops to its micro-batch's shortest as it crops a document. Over a run
every part of a long document is trained; before 0.7 a row was always its document's first tokens, and what
followed them was never trained on (at gpt-mini's 256 positions, 64% of the standard library's definitions
are longer, and 88% of their bytes were never trained on). A long document is drawn as often as a short one
(documents, not tokens, are what the draws are uniform over). A document of ``max_len`` tokens or fewer is
cropped from its start, as before. Held-out batches take their windows from a stream of their own, fixed by
the run's seed and the batch: every evaluation is on the same tokens.

[Note: documents end to end]
``--forming concat`` trains every token a step draws, in one shape, for any model: the step's documents are
drawn one at a time from a stream of their own (``[seed, step, 23]``) and laid end to end until they fill its
``microbatches x size`` rows of the model's context (``max_len`` ids a row, each row's last id the next row's
first, so every id but the first is a target); the last document drawn is cut where the rows end. It is Hugging
Face's ``group_texts`` (``run_clm.py``), Megatron's and torchtitan's way: no padding, no document masks,
attention runs across documents (as it does there), and a long document is trained whole, across rows and
steps' draws, not by windows. Held-out batches are cut the same way from the documents they evaluate on
(:func:`concatenated_stream`), in their fixed order: batch ``b`` is the stream's rows after batch ``b - 1``'s.

The drawing itself is over any documents by index (:func:`document_batch`, :func:`document_sequences`):
the standard library's documents (bytes, whose items are their byte ids), a corpus of the user's files read
from its prepared shards (:mod:`hintpipe.data`, token ids as arrays) or several of them mixed by weight make
micro-batches the same way, from the same random streams. :func:`token_sequences` gives a file corpus's
documents as tensors, for :func:`hintpipe.forming.collate.form_batch` in the user's own loop.
"""

from __future__ import annotations

import functools
import itertools
import re
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from hintpipe.apps.text_files import BYTES, BYTES_VOCAB, TokenIds, text_corpus
from hintpipe.data.mixture import Documents, Mixture, draw_documents
from hintpipe.data.prepared import Part
from hintpipe.data.run_data import prepared_documents
from hintpipe.data.sources import data_entries

VOCAB = BYTES_VOCAB
_SHORTEST = 16  # bytes: shorter documents are left out (empty __init__.py files)
#: The third seed of a step's stream of window offsets (its documents' stream is ``[seed, step, 7]``, or 11).
WINDOWS = 19
#: The third seed of the stream a step draws its documents from one at a time for ``--forming concat``.
CONCATENATED = 23
_TOP_LEVEL = re.compile(rb"\n(?=(?:def |class |async def |@))")
#: A document's token ids: the standard library's bytes (each byte its id), or a file corpus's array.
Document: TypeAlias = bytes | TokenIds


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


def document_batch(
    documents: Documents | Mixture, microbatches: int, size: int, step: int, seed: int, max_len: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """One step's micro-batches of next-token prediction from ``documents`` (each of 2 tokens or more; a mixture
    of sources drawn by their weights): (inputs, targets, tokens per micro-batch). A micro-batch's ``size``
    documents are drawn from ``(seed, step)`` and cropped to the shortest one (at most ``max_len`` tokens)."""
    chosen = drawn_microbatches(documents, microbatches, size, step, seed)
    return cropped_batch(chosen, max_len, np.random.default_rng([seed, step, WINDOWS]))


def drawn_microbatches(
    documents: Documents | Mixture, microbatches: int, size: int, step: int, seed: int
) -> list[list[Document]]:
    """The documents of each of step ``step``'s micro-batches, ``size`` each, drawn from ``(seed, step)``."""
    rng = np.random.default_rng([seed, step, 7])
    return [draw_documents(documents, rng, size) for _ in range(microbatches)]


def cropped_share(microbatches: Sequence[Sequence[Document]], max_len: int) -> float:
    """Of the tokens the rows could train of ``microbatches``' documents (each document's, up to the context's
    ``max_len`` ids), the share :func:`cropped_batch` trains, each micro-batch cropped to its shortest document."""
    trained = sum(len(chosen) * _cropped_length(chosen, max_len) for chosen in microbatches)
    whole = sum(min(len(d), max_len) - 1 for chosen in microbatches for d in chosen)
    return trained / whole


def cropped_batch(
    microbatches: list[list[Document]], max_len: int, windows: np.random.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """Micro-batches of next-token prediction from each micro-batch's documents, cropped to its shortest one (at
    most ``max_len`` tokens; a document of more by a window of ``max_len`` at an offset drawn from ``windows``,
    cropped as a document is, see [Note: a long document is trained by windows]): (inputs, targets, tokens per
    micro-batch)."""
    inputs, targets, tokens = [], [], []
    for chosen in microbatches:
        length = _cropped_length(chosen, max_len)
        rows = torch.from_numpy(np.stack([_window(d, max_len, windows)[: length + 1] for d in chosen]))
        inputs.append(rows[:, :-1].contiguous())
        targets.append(rows[:, 1:].contiguous())
        tokens.append(len(chosen) * length)
    return inputs, targets, tokens


def _cropped_length(chosen: Sequence[Document], max_len: int) -> int:
    """The targets per row of a micro-batch of ``chosen`` cropped to its shortest (at most ``max_len`` ids)."""
    return min(min(len(d) for d in chosen), max_len) - 1


def document_sequences(
    documents: Documents | Mixture, count: int, step: int, seed: int, max_len: int
) -> list[torch.Tensor]:
    """``count`` of ``documents`` drawn from ``(seed, step)``, each as its token ids, cropped to ``max_len`` tokens
    (``max_len + 1`` ids: its inputs and, shifted by one, its targets)."""
    rng = np.random.default_rng([seed, step, 11])
    return cropped_sequences(
        draw_documents(documents, rng, count), max_len, np.random.default_rng([seed, step, WINDOWS])
    )


def cropped_sequences(documents: list[Document], max_len: int, windows: np.random.Generator) -> list[torch.Tensor]:
    """Each document's token ids as a tensor, at most ``max_len`` tokens (``max_len + 1`` ids: a longer
    document's window at an offset drawn from ``windows``)."""
    return [torch.from_numpy(_window(d, max_len + 1, windows)) for d in documents]


def concatenated_batch(
    documents: Documents | Mixture, microbatches: int, size: int, step: int, seed: int, max_len: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """One step's micro-batches of ``size`` full rows each (``max_len`` ids a row), cut from documents drawn from
    ``(seed, step)`` one at a time and laid end to end (see [Note: documents end to end])."""
    rng = np.random.default_rng([seed, step, CONCATENATED])
    drawn = (draw_documents(documents, rng, 1)[0] for _ in itertools.count())  # as many as the rows take
    rows = concatenated_stream(drawn, microbatches * size, max_len - 1)
    assert rows is not None  # an endless stream fills any rows
    return rows_batch(rows, microbatches)


def concatenated_stream(documents: Iterable[Document], rows: int, length: int, skip: int = 0) -> torch.Tensor | None:
    """``rows`` rows of ``length + 1`` ids (``length`` inputs and, shifted by one, their targets), each row's last id
    the next row's first, from ``documents`` end to end after their first ``skip`` ids; None where they hold too
    few ids (see [Note: documents end to end])."""
    need = rows * length + 1
    parts: list[npt.NDArray[np.int64]] = []
    have = 0
    for document in documents:
        if skip >= len(document):
            skip -= len(document)
            continue
        ids = _ids(document, skip + need - have, skip)
        skip = 0
        parts.append(ids)
        have += len(ids)
        if have == need:
            return torch.from_numpy(np.concatenate(parts)).unfold(0, length + 1, length)
    return None


def rows_batch(rows: torch.Tensor, microbatches: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """``rows`` (of ``length + 1`` ids each) as ``microbatches`` micro-batches of as many rows each: (inputs,
    targets, tokens per micro-batch)."""
    size = len(rows) // microbatches
    chunks = [rows[m * size : (m + 1) * size] for m in range(microbatches)]
    inputs = [chunk[:, :-1].contiguous() for chunk in chunks]
    return inputs, [chunk[:, 1:].contiguous() for chunk in chunks], [x.numel() for x in inputs]


def stdlib_batch(
    microbatches: int, size: int, step: int, seed: int, max_len: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """One step's micro-batches of next-byte prediction from the standard library (:func:`document_batch`)."""
    return document_batch(stdlib_documents(), microbatches, size, step, seed, max_len)


def stdlib_sequences(count: int, step: int, seed: int, max_len: int) -> list[torch.Tensor]:
    """``count`` standard-library documents as byte ids, cropped to ``max_len`` tokens (:func:`document_sequences`)."""
    return document_sequences(stdlib_documents(), count, step, seed, max_len)


def data_documents(
    data: str | tuple[str, ...], prepared: tuple[str, ...], *, part: Part = "training"
) -> Documents | Mixture:
    """The documents a run on ``data`` draws from: the standard library's (the same whatever ``part``: its
    held-out batch is a step no run reaches), or ``part`` of the documents of the run's ``prepared`` folders
    (:attr:`hintpipe.data.run_data.RunData.folders`), mixed by the entries' weights."""
    if data == "stdlib":
        return stdlib_documents()
    weights = tuple(entry.weight for entry in data_entries(data))
    return prepared_documents(prepared, weights, part=part)


def token_sequences(
    data: str, *, field: str = "text", tokenizer: str = BYTES, max_len: int | None = None
) -> list[torch.Tensor]:
    """Every document of the file or folder ``data`` (plain text or JSONL, see :mod:`~hintpipe.apps.text_files`)
    as a 1-D tensor of its token ids (``int64``), in order, held-out ones included; each cropped to ``max_len``
    tokens (``max_len + 1`` ids) if given. What :func:`hintpipe.forming.collate.form_batch` takes::

        documents = hintpipe.token_sequences("corpus.jsonl", tokenizer="my-tokenizer", max_len=255)
        batch = hintpipe.form_batch(documents[:32], 4, cost)

    Raises:
        ValueError: as :func:`~hintpipe.apps.text_files.text_corpus`.
    """
    corpus = text_corpus(data, field=field, tokenizer=tokenizer)
    end = None if max_len is None else max_len + 1
    return [torch.from_numpy(_ids(d, end)) for d in corpus.documents]


def _window(document: Document, length: int, windows: np.random.Generator) -> npt.NDArray[np.int64]:
    """``length`` of a document's token ids as a new ``int64`` array: all of a document of no more, else a window
    at an offset drawn from ``windows`` (see [Note: a long document is trained by windows])."""
    spare = len(document) - length
    start = int(windows.integers(spare + 1)) if spare > 0 else 0
    return _ids(document, start + length, start)


def _ids(document: Document, end: int | None, start: int = 0) -> npt.NDArray[np.int64]:
    """A document's token ids from ``start`` to ``end`` (its end with None) as a new ``int64`` array."""
    ids = np.frombuffer(document, dtype=np.uint8) if isinstance(document, bytes) else document
    return ids[start:end].astype(np.int64)
