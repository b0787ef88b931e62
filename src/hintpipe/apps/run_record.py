"""What a run's checkpoints record of it, for its resume to compare: the learning-rate schedule it follows
(:class:`~hintpipe.apps.lr_schedule.ScheduleRecord`, refused when it would change) and what draws its batches
(:class:`BatchRecord`, said when it changed).

[Note: a resume says when its batches change]
A step's batches are a pure function of the run's data and options (:func:`hintpipe.apps.batches.step_batch`),
so a resume trains on what the uninterrupted run would have only when those are the same. Before, a resume with
another ``--seed``, another micro-batch shape or a corpus edited since went on without a word, on other batches
than its run's. Every checkpoint now records the data's identity (its documents' contents, tokenizer, split and
field, read from the prepared folders' manifests: the same corpus moved elsewhere is the same data) and the
options that draw from it, and a resume that differs in any of them says which, in one note, and goes on: a run
may be resumed on purpose with more data or another seed; it is not refused, as a changed schedule is, but it
is never silent. A checkpoint written before 0.7 records none of it and is compared on nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, ClassVar

from hintpipe.apps.lr_schedule import ScheduleRecord
from hintpipe.apps.train_config import TrainConfig
from hintpipe.data.prepared import open_prepared
from hintpipe.data.sources import data_entries


def data_identity(config: TrainConfig) -> str:
    """What ``config``'s documents are, whatever their paths: built-in data by its name; files by a digest of
    their prepared folders' manifests (each source file's SHA-256, the tokenizer's, the split, the field and the
    counts), the sources' weights, and whether the run trains on all of their documents (with ``eval_data``) or
    on all but the held-out ones."""
    if not config.prepared:
        return str(config.data.source)
    described: list[Any] = [[entry.weight for entry in data_entries(config.data.source)]]
    if config.data.eval_source is not None:  # every document trains (see [Note: an evaluation corpus of its own])
        described.append("all documents")
    for folder in config.prepared:
        manifest = open_prepared(folder).manifest
        files = [[f.sha256 or f"{f.size_bytes}:{f.mtime_ns}" for f in source.files] for source in manifest.sources]
        tokenizer = [manifest.tokenizer.name, manifest.tokenizer.sha256]
        described.append([tokenizer, manifest.split, manifest.field, files, manifest.documents, manifest.tokens])
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


#: What a resume says of data whose identity changed (:func:`data_identity`).
DATA_CHANGED = (
    "its data changed: another source, another file's contents, tokenizer, split or field, or an evaluation corpus "
    "given or left out"
)


@dataclasses.dataclass
class BatchRecord:
    """What draws a run's batches (see [Note: a resume says when its batches change]); after a resume,
    :attr:`changed` names what differs from the checkpoint's run."""

    data: str
    seed: int
    microbatches: int
    microbatch_size: int
    forming: str
    seq_len_dist: str
    dp: int
    max_seq_len: int  # the longest row (a model folder's ``--max-seq-len``: the context it trains on)
    changed: list[str] = dataclasses.field(default_factory=list, compare=False)

    @classmethod
    def of(cls, config: TrainConfig) -> BatchRecord:
        return cls(
            data_identity(config),
            config.training.seed,
            config.pipeline.microbatches,
            config.training.microbatch_size,
            str(config.data.forming.value),
            str(config.data.seq_len_dist),
            config.parallelism.dp,
            config.model.max_seq_len,
        )

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}

    def compare(self, saved: dict[str, Any]) -> None:
        """Name in :attr:`changed` each field ``saved`` (the checkpoint's record) has otherwise."""
        for name, now in self.fields().items():
            then = saved.get(name)
            if then is None or then == now:
                continue
            self.changed.append(DATA_CHANGED if name == "data" else f"{name} {then} then, {now} now")


@dataclasses.dataclass
class RunRecord:
    """A run's record in its checkpoints (a ``state`` of :class:`~hintpipe.runtime.checkpoint.checkpointer.
    Checkpointer`): its schedule, refused on resume when it would change, and its batches, said when they do."""

    schedule: ScheduleRecord
    batches: BatchRecord
    #: A checkpoint written before 0.7 holds no record: its resume compares nothing.
    absent_from_older_checkpoints: ClassVar[bool] = True

    @classmethod
    def of(cls, config: TrainConfig) -> RunRecord:
        schedule = ScheduleRecord(
            config.lr_schedule.kind, config.training.steps, config.lr_schedule.warmup_steps, config.optimizer.lr
        )
        return cls(schedule, BatchRecord.of(config))

    def state_dict(self) -> dict[str, Any]:
        return self.schedule.state_dict() | {f"batches_{k}": v for k, v in self.batches.fields().items()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Refuse a checkpoint whose schedule this run would reshape; note batches that differ from its run's.

        Raises:
            CheckpointError: as :meth:`ScheduleRecord.load_state_dict
                <hintpipe.apps.lr_schedule.ScheduleRecord.load_state_dict>`.
        """
        self.schedule.load_state_dict(saved)
        self.batches.compare({k.removeprefix("batches_"): v for k, v in saved.items() if k.startswith("batches_")})

    def note(self, step: int) -> str | None:
        """What a resume at ``step`` says of its batches, if they changed."""
        if not self.batches.changed:
            return None
        return (
            f"resumed at step {step} with other batches than its run's ({'; '.join(self.batches.changed)}): the "
            "steps from here train on other batches than the uninterrupted run would have"
        )
