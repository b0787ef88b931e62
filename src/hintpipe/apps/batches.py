"""A run's data as batches: step ``k``'s micro-batches (:func:`step_batch`), and the held-out batches its
evaluations are on (:func:`held_out_batches`, public as ``hintpipe.held_out_batches``).

Both are pure functions of the run's config (and the step): every rank and every policy makes the same
batches, a resumed run makes what an uninterrupted one does, and a user makes an evaluation's batches again
from the config alone, to recompute a run's held-out loss from its exported weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hintpipe.apps.corpus import (
    WINDOWS,
    concatenated_batch,
    concatenated_stream,
    cropped_batch,
    cropped_sequences,
    cropped_share,
    data_documents,
    document_batch,
    document_sequences,
    drawn_microbatches,
    rows_batch,
)
from hintpipe.apps.evaluation_corpus import evaluation_parts
from hintpipe.apps.models import make_batch
from hintpipe.apps.train_config import TrainConfig
from hintpipe.data.held_out import HeldOutOrder
from hintpipe.data.mixture import Documents, Mixture
from hintpipe.data.prepared import Part
from hintpipe.forming.collate import form_batch
from hintpipe.forming.form import Forming

#: The step whose data is the held-out batch of ``eval_every`` without ``eval_batches``: none the run trains
#: on; with a file corpus, drawn from its held-out documents only.
HELD_OUT_STEP = 10**9
REPLICA_SEED_STRIDE = 1_000_003  # replica r's data seed is seed + r x this: other data, the same run

#: A batch: its micro-batches' inputs, targets and tokens.
Batch = tuple[list[Any], list[torch.Tensor], list[int]]


def step_batch(config: TrainConfig, step: int, replica: int = 0) -> Batch:
    """Step ``step``'s micro-batches of data-parallel replica ``replica`` (inputs, targets, tokens each): the
    same for every policy and rank; each replica draws its own. Formed micro-batches (``config.forming``) take
    the step's ``microbatches x microbatch_size`` documents whole, formed by the run's sequence cost.

    Documents (``stdlib``, or the run's prepared folders, read by the documents drawn) come from the run's
    training documents; step :data:`HELD_OUT_STEP` (the held-out batch) from a file corpus's held-out ones
    (:mod:`hintpipe.data.prepared`). A pure function of the config and the step: a resumed run draws what an
    uninterrupted one draws."""
    seed = config.training.seed + REPLICA_SEED_STRIDE * replica
    microbatches, size = config.pipeline.microbatches, config.training.microbatch_size
    evaluated = step == HELD_OUT_STEP and config.data.eval_source is not None
    if config.data.source == "synthetic" and not evaluated:
        return make_batch(config.model, microbatches, size, config.data.seq_len_dist, step, seed)
    documents = _documents(config, step)
    if config.formed:
        sequences = document_sequences(documents, config.step_rows, step, seed, config.model.max_seq_len - 1)
        return _formed(config, sequences, seed + step)
    make = concatenated_batch if config.data.forming is Forming.CONCAT else document_batch
    return make(documents, microbatches, size, step, seed, config.model.max_seq_len)


def held_out_batches(config: TrainConfig, replica: int = 0) -> list[Batch]:
    """The batches a run's held-out loss is the mean of, at every evaluation (``eval_every``), for data-parallel
    replica ``replica``: with ``eval_batches`` K, K batches of the documents it evaluates on (its ``eval_data``'s,
    else its held-out split's; see [Note: an evaluation corpus of its own]) taken in a fixed order without
    replacement (:mod:`hintpipe.data.held_out`); without, the one batch drawn from them (:data:`HELD_OUT_STEP`).
    Each batch's loss is the run's (the mean over its micro-batches of each one's mean token loss; formed
    micro-batches: the batch's summed loss over its tokens), and the held-out loss the mean over the batches (and
    over the replicas)::

        batches = hintpipe.held_out_batches(config)  # config: the run's TrainConfig (result.config)
        loss = sum(batch_loss(model, batch) for batch in batches) / len(batches)
    """
    if not config.metrics.eval_batches:
        return [step_batch(config, HELD_OUT_STEP, replica)]
    seed, dp, count = config.training.seed, config.parallelism.dp, config.metrics.eval_batches
    order = HeldOutOrder(evaluation_parts(config.data, config.prepared, config.eval_prepared), seed)
    if config.data.forming is Forming.CONCAT:
        return _concatenated_held_out(config, order, [n * dp + replica for n in range(count)])
    size, rows = config.step_rows, config.training.microbatch_size
    batches = []
    for number in range(count):
        documents = order.batch(number * dp + replica, size)
        windows = np.random.default_rng([seed, HELD_OUT_STEP, number * dp + replica, WINDOWS])
        if config.formed:
            sequences = cropped_sequences(documents, config.model.max_seq_len - 1, windows)
            batches.append(_formed(config, sequences, seed + REPLICA_SEED_STRIDE * replica + HELD_OUT_STEP))
        else:
            microbatches = [documents[m * rows : (m + 1) * rows] for m in range(config.pipeline.microbatches)]
            batches.append(cropped_batch(microbatches, config.model.max_seq_len, windows))
    return batches


def crop_share(config: TrainConfig, steps: int = 8) -> float | None:
    """The share of its drawn documents' tokens a run that crops them trains, over its first ``steps`` steps'
    draws (:func:`~hintpipe.apps.corpus.cropped_share`); None where it does not crop documents (counting text,
    formed micro-batches). What the command line says of a run that trains far less than it draws."""
    if config.data.forming is not Forming.CROP or config.data.source == "synthetic":
        return None
    documents = _documents(config, 0)
    size = config.training.microbatch_size
    drawn = [
        chosen
        for step in range(steps)
        for chosen in drawn_microbatches(documents, config.pipeline.microbatches, size, step, config.training.seed)
    ]
    return cropped_share(drawn, config.model.max_seq_len)


def _documents(config: TrainConfig, step: int) -> Documents | Mixture:
    """The documents step ``step`` draws from (:data:`HELD_OUT_STEP`: the held-out batch's).

    [Note: an evaluation corpus of its own]
    A run evaluates on its data's held-out documents (every 20th), unless it is given a corpus of its own to
    evaluate on (``eval_data``, ``--eval-data``): a validation file beside a training file, as a user has them
    for a fine-tune. Then every evaluation draws from all of that corpus's documents (read with the run's
    tokenizer, field and split), and the run trains on all of its data's documents: none of them is held out
    for an evaluation that does not read them. A checkpoint's record of the data says which (see
    :func:`~hintpipe.apps.run_record.data_identity`), as the training documents differ.
    """
    if step != HELD_OUT_STEP:
        part: Part = "all" if config.data.eval_source is not None else "training"
        return data_documents(config.data.source, config.prepared, part=part)
    if config.data.eval_source is not None:
        return data_documents(config.data.eval_source, config.eval_prepared, part="all")
    return data_documents(config.data.source, config.prepared, part="held_out")


def _formed(config: TrainConfig, sequences: list[torch.Tensor], seed: int) -> Batch:
    """The documents' ``sequences`` formed into the run's micro-batches by cost (``seed``: its ties' order)."""
    pack, microbatches = config.data.forming is Forming.PACKED, config.pipeline.microbatches
    batch = form_batch(sequences, microbatches, config.data.sequence_cost, pack=pack, seed=seed)
    formation = batch.formation
    counts = [sum(formation.lengths[i] for i in formation.sequences(mb)) for mb in range(microbatches)]
    return batch.inputs, batch.targets, counts


def _concatenated_held_out(config: TrainConfig, order: HeldOutOrder, numbers: list[int]) -> list[Batch]:
    """Held-out batches ``numbers`` (increasing) under ``--forming concat``: batch ``b`` is the rows of the
    documents it evaluates on, end to end in their fixed order, after the rows of the batches before it (see
    [Note: documents end to end] in :mod:`hintpipe.apps.corpus`), so one walk of the documents cuts them all;
    ``check_eval_batches`` made sure they hold every batch's rows."""
    rows, length = config.step_rows, config.model.max_seq_len - 1
    stream = (order[i] for i in range(len(order)))
    cut = concatenated_stream(stream, rows * (numbers[-1] + 1), length)
    assert cut is not None, f"held-out batches up to {numbers[-1]} of a corpus too short for them"
    return [rows_batch(cut[number * rows : (number + 1) * rows], config.pipeline.microbatches) for number in numbers]
