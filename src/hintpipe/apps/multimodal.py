"""``mm-mini``: a small vision-language model whose encoder and decoder costs vary independently.

Multimodal training is where readiness pays most: a micro-batch's cost in the
vision encoder follows its image count, its cost in the language decoder its
text length, and the two are unrelated, so a fixed order stalls on whichever
stage the current micro-batch makes slow. ``mm-mini`` has that structure at
a size a CPU trains:

- a patch embedding and transformer blocks over the image patches (the
  encoder, about the first quarter of the layers), carrying the text ids
  through untouched;
- a bridge that pools the image tokens into one prefix token and embeds the
  text after it;
- gpt-mini's causal transformer blocks over prefix + text (the decoder), and
  its head, at the text positions.

Every micro-batch has its own image count and text length (``images`` and
``seq_len`` distributions, optionally correlated), so its tensors have their
own shapes: the runtime sends them as they are.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hintpipe.apps.gpt_layers import Block, Head, counting_text
from hintpipe.apps.model_config import ModelConfig, SeqLenDist

#: Values per image patch, and patches per image.
PATCH = 12
PATCHES_PER_IMAGE = 4


class PatchEmbed(nn.Module):
    """Image patches to hidden vectors; the text ids pass through."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(PATCH, config.hidden)

    def forward(self, patches: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.proj(patches), ids


class EncoderBlock(nn.Module):
    """A bidirectional transformer block over the image tokens; the text ids pass through."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            config.hidden, config.heads, 4 * config.hidden, dropout=0.0, batch_first=True, norm_first=True
        )

    def forward(self, image: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(image), ids


class Bridge(nn.Module):
    """The image tokens pooled into one prefix token, then the embedded text."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.project = nn.Linear(config.hidden, config.hidden)
        self.tokens = nn.Embedding(config.vocab, config.hidden)
        self.positions = nn.Embedding(config.max_seq_len + 1, config.hidden)

    def forward(self, image: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        prefix = self.project(image.mean(dim=1, keepdim=True))
        x = torch.cat([prefix, self.tokens(ids)], dim=1)
        positions: torch.Tensor = self.positions(torch.arange(x.shape[1], device=x.device))
        return x + positions


class TextHead(Head):
    """Next-token logits at the text positions (the prefix predicts nothing)."""

    def forward(self, x: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x[:, 1:])


def sized_by_input(stage: nn.Module) -> int:
    """Which input of the model sets a stage's cost, for emulation: the images (0) where the stage
    holds more image layers than text layers, else the text (1)."""
    layers = list(stage.children()) or [stage]
    image = sum(isinstance(layer, (PatchEmbed, EncoderBlock)) for layer in layers)
    text = sum(isinstance(layer, (Block, Head)) for layer in layers)
    return 0 if image > text else 1


def encoder_layers(config: ModelConfig) -> int:
    """Encoder blocks: a quarter of the blocks (at least one); the rest decode."""
    return max(1, config.layers // 4)


def build_multimodal_layers(config: ModelConfig) -> list[nn.Module]:
    """The model as a list of layers (same weights on every rank for the same seed)."""
    torch.manual_seed(config.seed)
    encoder = encoder_layers(config)
    decoder = max(1, config.layers - encoder)
    return [
        PatchEmbed(config),
        *(EncoderBlock(config) for _ in range(encoder)),
        Bridge(config),
        *(Block(config) for _ in range(decoder)),
        TextHead(config),
    ]


def make_multimodal_batch(
    config: ModelConfig,
    microbatches: int,
    microbatch_size: int,
    seq_len: SeqLenDist,
    step: int,
    data_seed: int = 0,
    images: tuple[float, float] = (2.0, 1.0),
    rho: float = 0.0,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor], list[int]]:
    """One step's micro-batches: ((patches, ids) inputs, next-token targets, text tokens per micro-batch).

    Each micro-batch draws its image count (lognormal around ``images[0]`` with sigma ``images[1]``, at
    least one) and its text length (``seq_len``); ``rho`` correlates the two draws (negative: image-heavy
    samples carry short text). The text is a noisy counting language that starts from a token the images
    determine, so the decoder needs the encoder to predict the first tokens. Deterministic in
    ``(data_seed, step)``.
    """
    if not -1.0 < rho < 1.0:
        raise ValueError(f"rho must be in (-1, 1), got {rho}")
    rng = np.random.default_rng([data_seed, step, 7])
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    normal = rng.standard_normal((2, microbatches))
    normal[1] = rho * normal[0] + np.sqrt(1.0 - rho * rho) * normal[1]
    mean_images, image_sigma = images
    counts = mean_images * np.exp(image_sigma * normal[0] - 0.5 * image_sigma**2)
    text_sigma = seq_len.sigma
    lengths = seq_len.mean * np.exp(text_sigma * normal[1] - 0.5 * text_sigma**2)
    inputs, targets, tokens = [], [], []
    for count, length in zip(counts, lengths, strict=True):
        n_images = max(1, round(float(count)))
        text = int(np.clip(round(length), 8, config.max_seq_len - 1)) if text_sigma else seq_len.mean
        patches = torch.randn(microbatch_size, n_images * PATCHES_PER_IMAGE, PATCH, generator=generator)
        start = (patches[:, :, 0].sum(dim=1) > 0).long()[:, None] * (config.vocab // 2)
        sequence = counting_text(start, text, config.vocab, generator)
        inputs.append((patches, sequence[:, :-1].contiguous()))
        targets.append(sequence[:, 1:].contiguous())
        tokens.append(microbatch_size * text)
    return inputs, targets, tokens
