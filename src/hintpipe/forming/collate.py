"""A formation's micro-batches as tensors, ready for :meth:`Pipeline.step <hintpipe.runtime.pipeline.Pipeline.step>`.

Each sequence is a 1-D tensor of token ids; it contributes its tokens but
the last as inputs and its tokens but the first as targets (next-token
prediction), so a sequence of ``n + 1`` ids has length ``n`` in the
formation. Padded positions take ``pad`` as input and ``ignore_index`` as
target, so a loss that ignores that index and sums over tokens, divided by
:attr:`FormedBatch.tokens` (``Pipeline.step(loss_divisor=...)``), is the
unsplit model's mean over every token of the step, whatever the formation.
A packed row also carries each position's document (0, 1, ... within the
row) as a second input: the model keeps attention and positions within a
document (gpt-mini: ``Embedding`` and ``Block`` take ``documents``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.form import Formation, form_microbatches
from hintpipe.renamed import renamed
from hintpipe.schedule.microbatch_order import MicrobatchOrder

#: The targets a loss should ignore (``torch.nn.functional.cross_entropy``'s default ``ignore_index``).
IGNORE_INDEX = -100


@dataclasses.dataclass(frozen=True)
class FormedBatch:
    """One step's micro-batches.

    Attributes:
        inputs: per micro-batch, the token ids ``(rows, length)``, or ``(ids, documents)`` when packed.
        targets: per micro-batch, ``(rows, length)`` next tokens, ``ignore_index`` where padded.
        tokens: the targets that count (every sequence's length): divide a summed loss by it.
        formation: how the sequences were formed.
    """

    inputs: list[torch.Tensor | tuple[torch.Tensor, ...]]
    targets: list[torch.Tensor]
    tokens: int
    formation: Formation

    @property
    def ends(self) -> tuple[list[float], list[float]]:
        """Each micro-batch's work at the pipeline's first stage and at its last, for
        ``Pipeline.step(batch.inputs, batch.targets, ends=batch.ends)`` under ``microbatch_order="front-then-back"``:
        its predicted cost at both, since a language model's stages are like blocks whose work all follows the
        rows' tokens (a model whose ends differ, an encoder before a decoder, gives its own)."""
        costs = list(self.formation.costs)
        return costs, list(costs)


def collate(
    sequences: Sequence[torch.Tensor], formation: Formation, *, pad: int = 0, ignore_index: int = IGNORE_INDEX
) -> FormedBatch:
    """The tensors of ``formation`` over ``sequences`` (``sequences[i]`` of ``formation.lengths[i] + 1`` ids).

    Raises:
        ValueError: a sequence count or a sequence's length that does not match the formation.
    """
    if len(sequences) != len(formation.lengths):
        raise ValueError(f"got {len(sequences)} sequences for a formation of {len(formation.lengths)}")
    for i, (sequence, length) in enumerate(zip(sequences, formation.lengths, strict=True)):
        if sequence.dim() != 1 or sequence.numel() != length + 1:
            raise ValueError(
                f"sequence {i} has shape {tuple(sequence.shape)}; the formation expects {length + 1} token ids "
                f"(its {length} inputs and, shifted by one, its targets)"
            )
    inputs: list[torch.Tensor | tuple[torch.Tensor, ...]] = []
    targets: list[torch.Tensor] = []
    for mb, rows in enumerate(formation.microbatches):
        count, length = formation.shape(mb)
        ids = torch.full((count, length), pad, dtype=sequences[0].dtype)
        target = torch.full((count, length), ignore_index, dtype=sequences[0].dtype)
        documents = torch.zeros((count, length), dtype=torch.int64)
        for r, row in enumerate(rows):
            at = 0
            for document, i in enumerate(row):
                n = formation.lengths[i]
                ids[r, at : at + n] = sequences[i][:-1]
                target[r, at : at + n] = sequences[i][1:]
                documents[r, at : at + n] = document
                at += n
            documents[r, at:] = len(row)  # padding: a document of its own
        inputs.append((ids, documents) if formation.packed else ids)
        targets.append(target)
    return FormedBatch(inputs, targets, formation.tokens, formation)


@renamed("form_batch", order="microbatch_order")
def form_batch(
    sequences: Sequence[torch.Tensor],
    microbatches: int,
    cost: SequenceCost | None = None,
    *,
    pack: bool = False,
    microbatch_order: MicrobatchOrder | str = MicrobatchOrder.LONGEST_FIRST,
    seed: int = 0,
    pad: int = 0,
    ignore_index: int = IGNORE_INDEX,
) -> FormedBatch:
    """A step's sequences (1-D token ids each) formed into ``microbatches`` micro-batches of even predicted
    cost and collated: :func:`~hintpipe.forming.form.form_microbatches`, then :func:`collate`.

    Raises:
        ValueError: as :func:`~hintpipe.forming.form.form_microbatches` does, or for a sequence of fewer
            than 2 ids (nothing to predict).
    """
    short = [i for i, s in enumerate(sequences) if s.dim() != 1 or s.numel() < 2]
    if short:
        i = short[0]
        raise ValueError(f"sequence {i} has shape {tuple(sequences[i].shape)}: give 1-D sequences of 2 or more ids")
    lengths = [s.numel() - 1 for s in sequences]
    formation = form_microbatches(lengths, microbatches, cost, pack=pack, microbatch_order=microbatch_order, seed=seed)
    return collate(sequences, formation, pad=pad, ignore_index=ignore_index)
