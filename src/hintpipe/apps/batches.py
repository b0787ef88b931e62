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
    cropped_batch,
    cropped_sequences,
    data_documents,
    document_batch,
    document_sequences,
)
from hintpipe.apps.models import make_batch
from hintpipe.apps.train_config import TrainConfig
from hintpipe.data.held_out import HeldOutOrder
from hintpipe.data.prepared import open_prepared
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
    seed = config.seed + REPLICA_SEED_STRIDE * replica
    if config.data == "synthetic":
        return make_batch(config.model, config.microbatches, config.microbatch_size, config.seq_len_dist, step, seed)
    documents = data_documents(config.data, config.prepared, held_out=step == HELD_OUT_STEP)
    if config.formed:
        count = config.microbatches * config.microbatch_size
        sequences = document_sequences(documents, count, step, seed, config.model.max_seq_len - 1)
        return _formed(config, sequences, seed + step)
    return document_batch(documents, config.microbatches, config.microbatch_size, step, seed, config.model.max_seq_len)


def held_out_batches(config: TrainConfig, replica: int = 0) -> list[Batch]:
    """The batches a run's held-out loss is the mean of, at every evaluation (``eval_every``), for data-parallel
    replica ``replica``: with ``eval_batches`` K, K batches of the held-out split's documents taken in a fixed
    order without replacement (:mod:`hintpipe.data.held_out`); without, the one batch drawn from them
    (:data:`HELD_OUT_STEP`). Each batch's loss is the run's (the mean over its micro-batches of each one's mean
    token loss; formed micro-batches: the batch's summed loss over its tokens), and the held-out loss the mean
    over the batches (and over the replicas)::

        batches = hintpipe.held_out_batches(config)  # config: the run's TrainConfig (result.config)
        loss = sum(batch_loss(model, batch) for batch in batches) / len(batches)
    """
    if not config.eval_batches:
        return [step_batch(config, HELD_OUT_STEP, replica)]
    order = HeldOutOrder(tuple(open_prepared(folder).held_out for folder in config.prepared), config.seed)
    size, rows = config.microbatches * config.microbatch_size, config.microbatch_size
    batches = []
    for number in range(config.eval_batches):
        documents = order.batch(number * config.dp + replica, size)
        windows = np.random.default_rng([config.seed, HELD_OUT_STEP, number * config.dp + replica, WINDOWS])
        if config.formed:
            sequences = cropped_sequences(documents, config.model.max_seq_len - 1, windows)
            batches.append(_formed(config, sequences, config.seed + REPLICA_SEED_STRIDE * replica + HELD_OUT_STEP))
        else:
            microbatches = [documents[m * rows : (m + 1) * rows] for m in range(config.microbatches)]
            batches.append(cropped_batch(microbatches, config.model.max_seq_len, windows))
    return batches


def _formed(config: TrainConfig, sequences: list[torch.Tensor], seed: int) -> Batch:
    """The documents' ``sequences`` formed into the run's micro-batches by cost (``seed``: its ties' order)."""
    pack = config.forming is Forming.PACKED
    batch = form_batch(sequences, config.microbatches, config.sequence_cost, pack=pack, seed=seed)
    formation = batch.formation
    counts = [sum(formation.lengths[i] for i in formation.sequences(mb)) for mb in range(config.microbatches)]
    return batch.inputs, batch.targets, counts
