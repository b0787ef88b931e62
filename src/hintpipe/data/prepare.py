"""Tokenize once: sources read as streams, tokenized in batches, written as shards with a manifest.

``hintpipe data prepare SOURCE... --tokenizer bytes|DIR --out DIR`` (:func:`prepare`) and a run's first use of
raw files (:mod:`~hintpipe.data.cache`) both come here. The steps:

1. Every source is found and its files listed (a missing path, a folder without files, a bad tokenizer are
   refused here, before anything is written).
2. A temporary folder beside ``out`` receives the shards (:class:`~hintpipe.data.shards.ShardWriter`) as the
   documents stream through the tokenizer, :data:`BATCH_CHARS` characters at a time; each file is digested
   (SHA-256) as it is read.
3. The manifest is written last, and the folder renamed to ``out``: a folder with a manifest is whole, and a
   preparation stopped part-way leaves no folder that looks prepared.

Documents of fewer than 2 tokens are left out (a document gives at least one input and its target), counted in
the manifest. Memory: one shard's buffer and one batch of documents, whatever the corpus's size.

This module is torch-free.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from hintpipe.data.manifest import FileRecord, Manifest, SourceRecord, is_prepared, write_manifest
from hintpipe.data.reading import Digest
from hintpipe.data.refusal import DataRefused
from hintpipe.data.shards import SHARD_TOKENS, ShardWriter, token_dtype
from hintpipe.data.sources import Source, SourceKind
from hintpipe.data.split import DocumentSplit
from hintpipe.data.tokenizer import BYTES, Encode, load_tokenizer, tokenizer_identity

#: Tokens a document needs: an input and its target.
SHORTEST = 2
#: Characters of documents tokenized at a time (and at most :data:`BATCH_DOCUMENTS` documents).
BATCH_CHARS = 4 << 20
BATCH_DOCUMENTS = 1024
#: Told ``(bytes read so far, bytes to read)`` as preparing goes.
Progress = Callable[[int, int], None]


def prepare(
    sources: Sequence[str],
    out: str | os.PathLike[str],
    *,
    tokenizer: str = BYTES,
    split: str = "blank",
    field: str = "text",
    replace: bool = False,
    progress: Progress | None = None,
    shard_tokens: int = SHARD_TOKENS,
) -> Manifest:
    """Tokenize ``sources`` (paths, as ``--data`` takes them) once into the prepared folder ``out``.

    Args:
        tokenizer: ``bytes`` or a tokenizer folder (:mod:`~hintpipe.data.tokenizer`).
        split: how plain text becomes documents (:class:`~hintpipe.data.split.DocumentSplit`).
        field: a JSONL line's field, or a dataset's column, that holds its document.
        replace: replace ``out`` if it is a prepared folder already (else it is refused).
        progress: told ``(bytes read, bytes in all)`` as it goes.

    Returns:
        The manifest written.

    Raises:
        DataRefused: in one line naming the option (``data``, ``tokenizer``, ``data_split``, ``data_field``,
            ``out``): a source that is missing, empty, not UTF-8, a JSONL line without the field, a dataset
            without the column; a tokenizer that is not one; an ``out`` that exists.
    """
    if not sources:
        raise DataRefused("data", "(none given): name at least one file or folder to prepare")
    document_split = DocumentSplit.parse(split)
    target = Path(out)
    found = [_source(given) for given in sources]
    _check_field(found, field)
    listed = [source.files(document_split) for source in found]
    _check_out(target, found, replace)
    encode, vocab = load_tokenizer(tokenizer)
    identity = tokenizer_identity(tokenizer)
    stamps = {file: file.stat() for files in listed for file in files}
    total = sum(stat.st_size for stat in stamps.values())
    done = 0

    def read(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    temporary = target.parent / f".{target.name}.preparing-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    try:
        writer = ShardWriter(temporary, vocab, shard_tokens)
        records: list[SourceRecord] = []
        short = 0
        for given, source, files in zip(sources, found, listed, strict=True):
            record, left_out = _tokenized(given, source, files, stamps, writer, encode, document_split, field, read)
            records.append(record)
            short += left_out
        shards = tuple(writer.close())
        manifest = Manifest(
            tokenizer=identity,
            tokenizer_given=tokenizer,
            vocab=vocab,
            dtype=token_dtype(vocab).name,
            split=split,
            field=field,
            sources=tuple(records),
            documents=sum(r.documents for r in records),
            tokens=sum(r.tokens for r in records),
            short_left_out=short,
            shards=shards,
        )
        write_manifest(temporary, manifest)
        _move_into_place(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return manifest


def _tokenized(
    given: str,
    source: Source,
    files: Sequence[Path],
    stamps: dict[Path, os.stat_result],
    writer: ShardWriter,
    encode: Encode,
    document_split: DocumentSplit,
    field: str,
    read: Callable[[int], None],
) -> tuple[SourceRecord, int]:
    """One source's documents tokenized into ``writer``; returns its record and the documents left out as too
    short.

    Raises:
        DataRefused: the source has no document of :data:`SHORTEST` tokens or more.
    """
    digests: dict[Path, Digest] = {file: hashlib.sha256() for file in files}
    documents = tokens = short = 0
    for batch in _batches(source.texts(document_split, field, on_bytes=read, digests=digests)):
        for ids in encode(batch):
            if len(ids) < SHORTEST:
                short += 1
                continue
            writer.add(ids)
            documents += 1
            tokens += len(ids)
    if not documents:
        raise DataRefused("data", f"{source.path}: no document of {SHORTEST} tokens or more (an empty corpus)")
    file_records = tuple(
        _file_record(file, stamps[file], None if source.read_by_datasets(file) else digests[file]) for file in files
    )
    return SourceRecord(given, source.absolute, source.kind.value, file_records, documents, tokens), short


def _source(given: str) -> Source:
    source = Source.of(given)
    if source.kind is SourceKind.PREPARED:
        raise DataRefused("data", f"{given}: prepared already; train from it (--data {given})")
    return source


def _check_field(sources: list[Source], field: str) -> None:
    if field != "text" and not any(source.reads_field for source in sources):
        raise DataRefused(
            "data_field",
            f"{field} names the field of a JSONL line's document (or a dataset's column); no source here has one",
        )


def _check_out(target: Path, sources: list[Source], replace: bool) -> None:
    """Refuse an ``out`` that holds something (a prepared folder only with ``replace``), or one inside a source
    (it would become part of the source it was made from)."""
    resolved = target.resolve()
    for source in sources:
        root = source.root.resolve()
        if source.kind is SourceKind.FOLDER and resolved.is_relative_to(root):
            raise DataRefused("out", f"{target} is inside the source {source.path}; prepare into another folder")
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    if not is_prepared(target):
        raise DataRefused("out", f"{target} exists and is not a prepared folder; give a new folder")
    if not replace:
        raise DataRefused("out", f"{target} is prepared already; give --replace to prepare it again, or a new folder")


def _move_into_place(temporary: Path, target: Path) -> None:
    """Rename the finished folder to ``target`` (an empty folder there is removed; a prepared one is replaced,
    moved aside first so that ``target`` is never missing a manifest it had)."""
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.rename(temporary, target)
        return
    old = target.parent / f".{target.name}.replaced-{os.getpid()}"
    os.rename(target, old)
    os.rename(temporary, target)
    shutil.rmtree(old, ignore_errors=True)


def _file_record(file: Path, stat: os.stat_result, digest: Digest | None) -> FileRecord:
    """A file's record: its size and time before it was read, and the digest of what was read (a file read by
    ``datasets`` is digested here, read again)."""
    if digest is None:
        digest = hashlib.sha256()
        with open(file, "rb") as handle:
            while block := handle.read(8 << 20):
                digest.update(block)
    return FileRecord(str(file.resolve()), stat.st_size, stat.st_mtime_ns, digest.hexdigest())


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_CHARS or len(batch) >= BATCH_DOCUMENTS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
