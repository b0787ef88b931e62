"""A run's data: its ``--data`` entries resolved once, before any rank starts, into prepared folders; and the
documents a rank draws from them.

:func:`resolve_data` is what the launcher (``hintpipe train``, and :class:`~hintpipe.apps.train_config.TrainConfig`
in Python) calls: every entry is checked, a prepared folder against its sources and the run's tokenizer
(:func:`~hintpipe.data.prepared.check_prepared`), raw files prepared into the cache on first use
(:mod:`~hintpipe.data.cache`), so that every bad source is refused here, in one line, and the ranks only open
folders (:func:`prepared_documents`) and read the documents they draw.

The entries of one run share one tokenizer (``--tokenizer``): a mixture of token ids of two vocabularies
would be no corpus. A prepared folder's ``--data-split`` and ``--data-field`` are its manifest's; a run that
says others (not the defaults) is refused rather than silently given the manifest's.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses

from hintpipe.data.cache import cached_folder
from hintpipe.data.mixture import Mixture
from hintpipe.data.prepare import Progress
from hintpipe.data.prepared import DocumentView, Part, check_prepared, open_prepared
from hintpipe.data.refusal import DataRefused
from hintpipe.data.sources import BUILT_IN_DATA, DataEntry, Source, SourceKind, data_entries, evaluation_source
from hintpipe.data.tokenizer import BYTES, BYTES_VOCAB

#: The defaults of ``--data-field`` and ``--data-split``.
DEFAULT_FIELD = "text"
DEFAULT_SPLIT = "blank"


@dataclasses.dataclass(frozen=True)
class RunData:
    """A run's data, resolved: one prepared folder per ``--data`` entry (none for built-in data), the entries'
    weights, and the vocabulary their token ids need (None: the model's own, for ``synthetic``)."""

    folders: tuple[str, ...]
    weights: tuple[float, ...]
    vocab: int | None


def resolve_data(
    data: str | tuple[str, ...],
    *,
    field: str = DEFAULT_FIELD,
    split: str = DEFAULT_SPLIT,
    tokenizer: str = BYTES,
    cli: bool = False,
    progress: Progress | None = None,
    option: str = "data",
) -> RunData:
    """Check the run's ``data`` and prepare what is not prepared yet (``progress`` hears of it). ``option`` is the
    option that gave ``data``: ``eval_data``, the evaluation corpus, takes files and folders only.

    Raises:
        ValueError: in one line naming the option as the caller wrote it (``--data`` on the command line,
            ``data`` in Python) and what to do.
    """
    try:
        entries = data_entries(data)
        if entries[0].path in BUILT_IN_DATA:
            if option != "data":
                raise DataRefused(option, f"{entries[0].given}: built-in data trains; evaluate on files or folders")
            return _built_in(entries[0].path, field, tokenizer, cli)
        if option == "eval_data":  # a folder in splits evaluates on its evaluation split
            entries = tuple(dataclasses.replace(e, path=evaluation_source(e.path)) for e in entries)
        sources = [Source.of(entry.path) for entry in entries]
        raw = [(e, s) for e, s in zip(entries, sources, strict=True) if s.kind is not SourceKind.PREPARED]
        if field != DEFAULT_FIELD and raw and not any(s.reads_field for _, s in raw):
            _no_field(field, raw[0][0].given, cli)
        folders = []
        for entry, source in zip(entries, sources, strict=True):
            if source.kind is SourceKind.PREPARED:
                folders.append(_checked(entry, field, split, tokenizer))
            else:
                found = cached_folder(entry.path, tokenizer=tokenizer, split=split, field=field, progress=progress)
                folders.append(str(found))
        vocab = open_prepared(folders[0]).vocab
    except DataRefused as exc:
        if exc.option == "data":  # the data package names the sources ``data``
            exc.option = option
        raise exc.said(cli) from None
    return RunData(tuple(folders), tuple(entry.weight for entry in entries), vocab)


def data_vocab(
    data: str | tuple[str, ...],
    field: str = DEFAULT_FIELD,
    tokenizer: str = BYTES,
    *,
    split: str = DEFAULT_SPLIT,
    cli: bool = False,
    progress: Progress | None = None,
) -> int | None:
    """The vocabulary ``data``'s token ids need (:func:`resolve_data`'s): None for ``synthetic`` (the model's
    own), 256 for ``stdlib`` (bytes), the tokenizer's for files.

    Raises:
        ValueError: as :func:`resolve_data`.
    """
    return resolve_data(data, field=field, split=split, tokenizer=tokenizer, cli=cli, progress=progress).vocab


def prepared_documents(folders: tuple[str, ...], weights: tuple[float, ...], *, part: Part = "training") -> Mixture:
    """The documents a rank draws from the run's prepared ``folders`` (:attr:`RunData.folders`): their ``part``
    (their training documents, their held-out ones, or all), mixed by ``weights``. Opened once per process;
    nothing is read until a document is drawn."""
    return Mixture.of(document_parts(folders, part), weights)


def document_parts(folders: tuple[str, ...], part: Part) -> tuple[DocumentView, ...]:
    """Each prepared folder's ``part`` of its documents."""
    return tuple(open_prepared(folder).part(part) for folder in folders)


def _built_in(data: str, field: str, tokenizer: str, cli: bool) -> RunData:
    if field != DEFAULT_FIELD:  # an option that would change nothing
        _no_field(field, data, cli)
    if tokenizer != BYTES:
        label = "--" if cli else ""
        raise ValueError(
            f"{label}tokenizer {tokenizer} tokenizes a data file or folder; {label}data {data} has tokens of its own"
        )
    return RunData((), (), None if data == "synthetic" else BYTES_VOCAB)


def _no_field(field: str, data: str, cli: bool) -> None:
    said, named = ("--data-field", "--data") if cli else ("data_field", "data")
    raise ValueError(f"{said} {field} names a record's field; {named} {data} has no records (JSON, Parquet, CSV)")


def _checked(entry: DataEntry, field: str, split: str, tokenizer: str) -> str:
    """A prepared entry's folder, checked against the run's options, its tokenizer and its sources."""
    corpus = open_prepared(entry.path)
    manifest = corpus.manifest
    _same_as_prepared(entry.path, "data_field", field, manifest.field, DEFAULT_FIELD)
    _same_as_prepared(entry.path, "data_split", split, manifest.split, DEFAULT_SPLIT)
    check_prepared(entry.path, manifest, tokenizer=tokenizer)
    return str(corpus.folder)


def _same_as_prepared(folder: str, option: str, given: str, made: str, default: str) -> None:
    if given not in (made, default):
        flag = "--" + option.replace("_", "-")
        raise DataRefused(
            option,
            f"{given}: {folder} was prepared with {flag} {made}; leave it out (the folder's own), or prepare the "
            f"sources again with {flag} {given}",
        )
