"""``mm-mini``: a vision encoder and a text decoder whose costs vary independently."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hintpipe.apps.emulation import profile_costs
from hintpipe.apps.models import Chain, ModelConfig, SeqLenDist, build_layers, make_batch
from hintpipe.apps.multimodal import PATCHES_PER_IMAGE, encoder_layers, make_multimodal_batch
from hintpipe.apps.training import TrainConfig
from hintpipe.cli import main
from hintpipe.runtime.loop.emulated import EmulatedExecutor
from hintpipe.schedule.task import Kind

CONFIG = ModelConfig("mm-mini", layers=4, hidden=16, heads=2, vocab=32, max_seq_len=64)


def test_micro_batches_differ_in_image_count_and_text_length_independently() -> None:
    inputs, targets, tokens = make_batch(CONFIG, 64, 2, SeqLenDist(24, 0.5), step=0)
    images = [patches.shape[1] // PATCHES_PER_IMAGE for patches, _ in inputs]
    texts = [ids.shape[1] for _, ids in inputs]
    assert len(set(images)) > 3 and len(set(texts)) > 3
    assert [t.shape for t in targets] == [ids.shape for _, ids in inputs]
    assert tokens == [2 * n for n in texts]
    assert abs(float(np.corrcoef(images, texts)[0, 1])) < 0.35  # independent draws (64 samples)
    again, _, _ = make_batch(CONFIG, 64, 2, SeqLenDist(24, 0.5), step=0)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(inputs, again, strict=True))


def test_anti_correlated_samples_carry_short_text_with_many_images() -> None:
    inputs, _, _ = make_multimodal_batch(CONFIG, 64, 1, SeqLenDist(24, 0.5), step=0, rho=-0.8)
    images = [p.shape[1] for p, _ in inputs]
    texts = [ids.shape[1] for _, ids in inputs]
    assert float(np.corrcoef(np.log(images), np.log(texts))[0, 1]) < -0.4  # the lognormal draws' correlation
    with pytest.raises(ValueError, match=r"rho must be in \(-1, 1\), got 1.0"):
        make_multimodal_batch(CONFIG, 4, 1, SeqLenDist(24, 0.5), step=0, rho=1.0)


def test_the_layers_are_an_encoder_quarter_then_a_decoder() -> None:
    layers = build_layers(CONFIG)
    names = [type(layer).__name__ for layer in layers]
    assert encoder_layers(CONFIG) == 1
    assert names == ["PatchEmbed", "EncoderBlock", "Bridge", "Block", "Block", "Block", "TextHead"]
    [(patches, ids)], _, _ = make_batch(CONFIG, 1, 2, SeqLenDist(10), step=0)
    logits = Chain(*layers)(patches, ids)
    assert logits.shape == (2, 10, CONFIG.vocab)  # one prediction per text token, none for the image prefix


def test_front_then_back_ranks_mm_mini_by_its_images_first_and_its_text_last() -> None:
    from hintpipe.apps.step_ends import microbatch_ends
    from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order

    inputs, _, tokens = make_batch(CONFIG, 8, 2, SeqLenDist(24, 0.5), step=0)
    first, last = microbatch_ends("mm-mini", inputs)
    assert first == [2.0 * patches.shape[1] for patches, _ in inputs]  # rows x patches: the encoder's work
    assert last == [float(n) for n in tokens]  # rows x text tokens: the decoder's
    sizes = [float(sum(t.numel() for t in given)) for given in inputs]
    ordered = microbatch_order(sizes, MicrobatchOrder.FRONT_THEN_BACK, ends=(first, last))
    assert ordered != microbatch_order(sizes, MicrobatchOrder.SHORTEST_FIRST)  # not shortest-first in disguise
    lm, _, lm_tokens = make_batch(ModelConfig("gpt-mini", layers=2, hidden=16), 4, 2, SeqLenDist(16, 0.5), step=0)
    assert microbatch_ends("gpt-mini", lm) == ([float(n) for n in lm_tokens],) * 2  # one tower: both ends alike


def test_mm_mini_trains_on_two_ranks_with_the_unsplit_gradients(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--model", "mm-mini", "--ranks", "2", "--microbatches", "4", "--steps", "1", "--layers", "4"]
    argv += ["--hidden", "16", "--seq-len-dist", "lognormal:16:0.5", "--check-grads", "--json"]
    argv += ["--microbatch-order", "front-then-back"]  # each step passes its ends: the order changes no maths
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["max_grad_abs_diff"] < 1e-6  # float32 sums in another order at most


def test_emulated_mm_mini_sizes_the_encoder_by_images_and_the_decoder_by_text() -> None:
    config = TrainConfig.of(model=CONFIG, ranks=2, microbatches=2, microbatch_size=2, seq_len_dist=SeqLenDist(16))
    costs = profile_costs(config, repeats=1)
    # stage 0: PatchEmbed, EncoderBlock, Bridge (images); stage 1: three Blocks and the head (text)
    assert costs.sized_by == (0, 1)
    [(patches, ids)], _, _ = make_batch(CONFIG, 1, 2, SeqLenDist(16), step=0)
    assert costs.references == (patches.numel(), ids.numel())
    executor = EmulatedExecutor(costs, last_stage=1)
    doubled = [2.0 * patches.numel(), float(ids.numel())]
    assert executor.duration(0, Kind.F, 0, doubled) == pytest.approx(2 * costs.forward[0])
    assert executor.duration(1, Kind.F, 0, doubled) == pytest.approx(costs.forward[1])
