"""Hugging Face ``datasets`` as sources: a dataset saved with ``save_to_disk``, or local files read by
``load_dataset``; each record's ``--data-field`` column is one document.

Both are streamed in batches of :data:`ROWS` records: a saved dataset is memory-mapped Arrow
(``load_from_disk``), and ``load_dataset(..., streaming=True)`` reads files as it goes; neither set is ever
materialised whole in a process. ``datasets`` is imported only here, and only for such a source (the ``data``
extra: ``pip install -e '.[data]'``); local files only, nothing is downloaded.

This module is torch-free (``datasets`` itself does not import torch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hintpipe.data.reading import json_kind
from hintpipe.data.refusal import FIELD_FIX, DataRefused

#: Records read at a time.
ROWS = 1000
_EXTRA = "pip install -e '.[data]'"


def saved_texts(path: str, field: str, *, on_bytes: Callable[[int], None] | None = None) -> Iterator[str]:
    """The ``field`` of every record of the dataset saved in folder ``path``, in order.

    Raises:
        DataRefused: (``data``) ``datasets`` not installed, a folder it cannot load, no column ``field``, a
            value that is not a string.
    """
    datasets = _datasets(path)
    try:
        dataset = datasets.load_from_disk(path)
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError, ... for a folder it cannot read
        raise DataRefused("data", f"{path}: not a dataset datasets.load_from_disk reads ({_first_line(exc)})") from None
    _check_column(path, field, list(dataset.column_names))
    size = sum(f.stat().st_size for f in Path(path).rglob("*.arrow"))
    rows = max(1, dataset.num_rows)
    batches = dataset.select_columns([field]).iter(batch_size=ROWS)
    yield from _texts(path, field, batches, lambda count: on_bytes(size * count // rows) if on_bytes else None)


def file_texts(
    path: str, builder: str, files: list[str], field: str, *, on_bytes: Callable[[int], None] | None = None
) -> Iterator[str]:
    """The ``field`` of every record of ``files`` as ``load_dataset(builder, data_files=files)`` reads them, in
    order, streamed; ``on_bytes`` hears of the files' bytes once they are read.

    Raises:
        DataRefused: (``data``) as :func:`saved_texts`.
    """
    datasets = _datasets(path)
    options = {"sep": "\t"} if builder == "csv" and all(_tab_separated(f) for f in files) else {}
    try:
        dataset = datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **options)
    except Exception as exc:  # a builder that cannot read the files
        raise DataRefused("data", f"{path}: load_dataset({builder!r}) cannot read it ({_first_line(exc)})") from None
    if dataset.column_names is not None:
        _check_column(path, field, list(dataset.column_names))
    yield from _texts(path, field, dataset.iter(batch_size=ROWS), None)
    if on_bytes is not None:
        on_bytes(sum(os.path.getsize(f) for f in files))


def _tab_separated(file: str) -> bool:
    """A ``.tsv`` file (compressed or not), which the ``csv`` builder reads with ``sep="\\t"``."""
    name = Path(file)
    return ".tsv" in (name.suffix, name.with_suffix("").suffix)


def _texts(
    path: str, field: str, batches: Iterable[dict[str, list[Any]]], done: Callable[[int], None] | None
) -> Iterator[str]:
    row = 0
    try:
        for batch in batches:
            if field not in batch:
                _check_column(path, field, list(batch))
            for value in batch[field]:
                if not isinstance(value, str):
                    raise DataRefused(
                        "data", f"{path}, record {row}: column {field!r} is a {json_kind(value)}, not a string"
                    )
                row += 1
                yield value
            if done is not None:
                done(len(batch[field]))
    except DataRefused:
        raise
    except Exception as exc:  # datasets' and Arrow's errors when a file turns out bad part-way
        raise DataRefused("data", f"{path}, after record {row}: {_first_line(exc)}") from None


def _check_column(path: str, field: str, columns: list[str]) -> None:
    if field not in columns:
        names = ", ".join(repr(c) for c in columns) or "none"
        raise DataRefused("data", f"{path}: no column {field!r} (its columns: {names})", fix=FIELD_FIX)


def _datasets(path: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataRefused("data", f"{path}: a Hugging Face dataset needs datasets: {_EXTRA}") from None
    return datasets


def _first_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
