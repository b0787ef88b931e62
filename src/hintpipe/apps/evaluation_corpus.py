"""What a run evaluates on: its evaluation corpus (``eval_data``) or its data's held-out documents, and the rules
that hold them to the run (see [Note: an evaluation corpus of its own] in :mod:`hintpipe.apps.batches`)."""

from __future__ import annotations

from typing import Any

from hintpipe.data.prepared import DocumentView, open_prepared
from hintpipe.data.run_data import document_parts
from hintpipe.data.sources import data_entries
from hintpipe.option import said


def evaluation_parts(config: Any) -> tuple[DocumentView, ...]:
    """The documents a run's evaluations draw from, per prepared folder (``config``: the run's config, or the
    command line's arguments with its folders resolved): all of its ``eval_data``'s, else its data's held-out
    ones (see [Note: an evaluation corpus of its own] in :mod:`hintpipe.apps.batches`)."""
    if getattr(config, "eval_data", None) is not None:
        return document_parts(config.eval_prepared, "all")
    return document_parts(config.prepared, "held_out")


def check_eval_batches(
    config: Any, parts: tuple[DocumentView, ...], *, cli: bool = False, concatenated: int | None = None
) -> None:
    """Refuse ``eval_batches`` that the documents the run evaluates on (``parts``: :func:`evaluation_parts`)
    cannot fill without replacement (``config``: the run's config, or the command line's arguments, with the
    same names): documents, or under ``--forming concat`` rows of ``concatenated`` tokens (see [Note: documents
    end to end] in :mod:`hintpipe.apps.corpus`).

    Raises:
        ValueError: naming the option as the caller wrote it, the documents needed and held, and the fix.
    """
    count = getattr(config, "eval_batches", 0)
    if not count:
        return
    said = "--eval-batches" if cli else "eval_batches"
    data = "--data" if cli else "data"
    if not parts:
        raise ValueError(
            f"{said} {count} evaluates on a file corpus's held-out documents; {data} {config.data} has none: leave "
            f"{said} out (each evaluation draws one batch)"
        )
    if concatenated is not None:
        _check_eval_tokens(config, parts, count, concatenated, cli)
        return
    held = sum(len(part) for part in parts)
    per_batch = config.microbatches * config.microbatch_size * config.dp
    if count * per_batch > held:
        most = held // per_batch
        fix = f"use {said} {most} or fewer" if most else "use fewer or smaller micro-batches"
        evaluated = getattr(config, "eval_data", None)
        given = f"{'--eval-data' if cli else 'eval_data'} {evaluated}"
        holder = "the run's held-out split" if evaluated is None else given
        raise ValueError(
            f"{said} {count} takes {count * per_batch:,} held-out documents ({count} x {config.microbatches} "
            f"micro-batches x {config.microbatch_size} x {config.dp} replicas, without replacement); {holder} "
            f"has {held:,}: {fix}"
        )


def _check_eval_tokens(config: Any, parts: tuple[DocumentView, ...], count: int, length: int, cli: bool) -> None:
    """:func:`check_eval_batches` under ``--forming concat``: the documents hold every batch's rows end to end
    (counted until they do, not over the whole corpus)."""
    rows = config.microbatches * config.microbatch_size
    need = count * config.dp * rows * length + 1
    held = 0
    for part in parts:
        for index in range(len(part)):
            held += len(part[index])
            if held >= need:
                return
    said, most = "--eval-batches" if cli else "eval_batches", (held - 1) // (config.dp * rows * length)
    fix = f"use {said} {most} or fewer" if most else "use fewer or smaller micro-batches"
    evaluated = getattr(config, "eval_data", None)
    holder = "the run's held-out split" if evaluated is None else f"{'--eval-data' if cli else 'eval_data'} {evaluated}"
    raise ValueError(
        f"{said} {count} takes {need:,} held-out tokens under {'--forming' if cli else 'forming'} concat ({count} x "
        f"{config.microbatches} micro-batches x {config.microbatch_size} rows of {length} x {config.dp} replicas, "
        f"and one, without replacement); {holder} has {held:,}: {fix}"
    )


def check_apart(eval_data: str | tuple[str, ...], evaluated: tuple[str, ...], trained: tuple[str, ...]) -> None:
    """Refuse an evaluation corpus that is also among the training data (a source file of the same contents, by
    its SHA-256 in the prepared folders' manifests, whatever its path): every one of its documents would train,
    then be evaluated on."""

    def contents(folder: str) -> set[str]:
        sources = open_prepared(folder).manifest.sources
        return {f.sha256 for source in sources for f in source.files if f.sha256}

    training = set().union(*(contents(folder) for folder in trained))
    for entry, folder in zip(data_entries(eval_data), evaluated, strict=True):
        if contents(folder) & training:
            data, kept = said("data"), said("eval_data")
            raise ValueError(
                f"{kept} {entry.path} is also in {data}: its documents would train and be evaluated on; evaluate "
                f"on a corpus of its own, or leave {kept} out (then every 20th document of {data} is held out)"
            )
