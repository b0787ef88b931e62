"""A run's data as batches (:mod:`hintpipe.apps.batches`): step ``k``'s micro-batches a pure function of the config
and ``k``, each data-parallel replica its own, and the held-out batch a step no run trains on."""

from __future__ import annotations

import torch

from hintpipe.apps.batches import HELD_OUT_STEP, held_out_batches, step_batch
from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.train_config import TrainConfig

CONFIG = TrainConfig.of(
    model=ModelConfig(vocab=64, max_seq_len=32), ranks=2, microbatches=3, microbatch_size=2, seq_len_dist=SeqLenDist(16)
)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_steps_batch_is_the_same_whenever_it_is_made_and_another_steps_is_not() -> None:
    inputs, targets, tokens = step_batch(CONFIG, 4)
    again = step_batch(CONFIG, 4)
    assert _same(inputs, again[0]) and _same(targets, again[1]) and tokens == again[2]
    assert [tuple(x.shape) for x in inputs] == [(2, 16)] * 3 and tokens == [32, 32, 32]
    assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in zip(inputs, targets, strict=True))  # the next token
    assert not _same(inputs, step_batch(CONFIG, 5)[0])


def test_each_replica_draws_its_own_data() -> None:
    assert not _same(step_batch(CONFIG, 4, replica=1)[0], step_batch(CONFIG, 4)[0])
    assert _same(step_batch(CONFIG, 4, replica=1)[0], step_batch(CONFIG, 4, replica=1)[0])


def test_without_eval_batches_the_held_out_batch_is_the_held_out_step() -> None:
    (held_out,) = held_out_batches(CONFIG)
    assert _same(held_out[0], step_batch(CONFIG, HELD_OUT_STEP)[0])
    assert HELD_OUT_STEP == 10**9  # a step no run reaches
