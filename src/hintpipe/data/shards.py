"""Token shards: a corpus's token ids in a few large ``.npy`` files, with the offsets of its documents.

Shard ``k`` is two arrays, ``tokens-k.npy`` (every document's ids one after another, in the smallest unsigned
type the vocabulary fits: uint8 for bytes, uint16 up to 65,536 ids, else uint32) and ``offsets-k.npy``
(int64, one more than its documents: document ``j`` of the shard is ``tokens[offsets[j]:offsets[j + 1]]``). A
document never straddles two shards. They are plain ``.npy`` files: ``numpy.load(path, mmap_mode="r")`` maps
one in a user's own code.

[Note: a document is read, not mapped]
A rank reads the documents it draws and nothing else: each document's ids with one ``os.pread`` at its offset
in the shard (the ``.npy`` header parsed once), into an array of its own. Mapping the shards
(``numpy.memmap``) reads as little from disk, but what a process maps of the page cache counts in its resident
memory, and the kernel maps more than the bytes touched: on Linux 6.18 with ext4's large folios, a document
of a few KB drawn from a mapped 200 MB shard mapped about 1 MB around it, and ten steps of 32 documents raised
the process's RSS by 164 MB, on the way to the whole corpus over a long run. Read, the process holds the
documents of the step it is on; the page cache still keeps what was read, shared by every process of the
machine, and gives it back under pressure.

Why shards rather than one file: a shard is written whole from a buffer of :data:`SHARD_TOKENS` ids, so
preparing needs that much memory and no more, and a shard is a file of a size every file system and copy
tool takes (a corpus of several GB is several files).

This module is torch-free.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

#: Token ids per shard (the last one holds the rest; a document longer than this is a shard of its own).
SHARD_TOKENS = 1 << 26


def token_dtype(vocab: int) -> np.dtype[Any]:
    """The smallest unsigned type every id below ``vocab`` fits."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab <= int(np.iinfo(dtype).max) + 1:
            return np.dtype(dtype)
    raise ValueError(f"a vocabulary of {vocab} ids does not fit 32 bits")


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    """One shard as the manifest lists it: its files and its counts."""

    tokens_file: str
    offsets_file: str
    documents: int
    tokens: int


class ShardWriter:
    """Writes documents' token ids into shards in ``folder``, a shard at a time."""

    def __init__(self, folder: Path, vocab: int, shard_tokens: int = SHARD_TOKENS) -> None:
        self.folder = folder
        self.dtype = token_dtype(vocab)
        self.vocab = vocab
        self.shard_tokens = shard_tokens
        self.records: list[ShardRecord] = []
        self._buffer: npt.NDArray[Any] = np.empty(shard_tokens, dtype=self.dtype)
        self._lengths: list[int] = []
        self._used = 0

    def add(self, ids: npt.NDArray[Any]) -> None:
        """Append one document's ids."""
        count = len(ids)
        if self._used + count > self.shard_tokens and self._used:
            self._flush()
        if count > self.shard_tokens:  # a document longer than a shard: a shard of its own
            self._write(np.asarray(ids, dtype=self.dtype), [count])
            return
        self._buffer[self._used : self._used + count] = ids
        self._used += count
        self._lengths.append(count)

    def close(self) -> list[ShardRecord]:
        """Write the last shard; returns every shard's record."""
        if self._used:
            self._flush()
        self._buffer = np.empty(0, dtype=self.dtype)
        return self.records

    def _flush(self) -> None:
        self._write(self._buffer[: self._used], self._lengths)
        self._used, self._lengths = 0, []

    def _write(self, tokens: npt.NDArray[Any], lengths: list[int]) -> None:
        number = len(self.records)
        record = ShardRecord(f"tokens-{number:05d}.npy", f"offsets-{number:05d}.npy", len(lengths), len(tokens))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(self.folder / record.tokens_file, tokens, allow_pickle=False)
        np.save(self.folder / record.offsets_file, offsets, allow_pickle=False)
        self.records.append(record)


class Shards:
    """A prepared folder's shards, opened on first use: document ``i`` of the whole corpus by :meth:`document`
    (see [Note: a document is read, not mapped])."""

    def __init__(self, folder: Path, records: list[ShardRecord]) -> None:
        self.folder = folder
        self.records = records
        self._starts = [0]
        for record in records:
            self._starts.append(self._starts[-1] + record.documents)
        self._files: dict[int, tuple[NpyFile, NpyFile]] = {}

    def __len__(self) -> int:
        return self._starts[-1]

    def document(self, index: int) -> npt.NDArray[Any]:
        """Document ``index``'s token ids, read from its shard (a new, read-only array)."""
        if not 0 <= index < len(self):
            raise IndexError(f"document {index} of {len(self)}")
        shard = bisect.bisect_right(self._starts, index) - 1
        tokens, offsets = self._opened(shard)
        local = index - self._starts[shard]
        start, end = offsets.read(local, local + 2)
        return tokens.read(int(start), int(end))

    def _opened(self, shard: int) -> tuple[NpyFile, NpyFile]:
        if shard not in self._files:
            record = self.records[shard]
            self._files[shard] = (NpyFile(self.folder / record.tokens_file), NpyFile(self.folder / record.offsets_file))
        return self._files[shard]


class NpyFile:
    """A one-dimensional ``.npy`` file read by ranges of elements: its header parsed once, each range read with
    one ``os.pread``. No file stays open between reads (a corpus of thousands of shards holds no descriptors,
    and a forked process inherits none)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            self._data = handle.tell()
        if len(shape) != 1 or fortran or dtype.hasobject:
            raise ValueError(f"{path}: not a one-dimensional array of numbers (shape {shape}, {dtype})")
        self.length = int(shape[0])
        self.dtype = dtype

    def read(self, start: int, end: int) -> npt.NDArray[Any]:
        """Elements ``start`` to ``end`` (excluded), as a new read-only array."""
        if not 0 <= start <= end <= self.length:
            raise IndexError(f"{self.path}: elements {start}:{end} of {self.length}")
        size = (end - start) * self.dtype.itemsize
        descriptor = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(descriptor, size, self._data + start * self.dtype.itemsize)
        finally:
            os.close(descriptor)
        if len(data) != size:
            raise OSError(f"{self.path}: read {len(data)} of {size} bytes (the file was cut short)")
        return np.frombuffer(data, dtype=self.dtype)
