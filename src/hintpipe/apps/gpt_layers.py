"""gpt-mini's layers (embedding, transformer block, head) and its synthetic text: what the built-in models
(:mod:`~hintpipe.apps.models`, :mod:`~hintpipe.apps.multimodal`) are made of."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hintpipe.apps.model_config import ModelConfig


class Embedding(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.hidden)
        self.positions = nn.Embedding(config.max_seq_len, config.hidden)

    def forward(self, ids: torch.Tensor, documents: torch.Tensor | None = None) -> Any:
        """Token and position embedding; with ``documents`` (packed rows), positions count from each
        document's start and the documents travel on with the activations: ``(x, documents)``."""
        if documents is None:
            positions = torch.arange(ids.shape[1], device=ids.device)
            embedded: torch.Tensor = self.tokens(ids) + self.positions(positions)[None]
            return embedded
        return self.tokens(ids) + self.positions(document_positions(documents)), documents


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """``(rows, length)`` document ids -> each position's index within its document (documents are runs)."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


def document_mask(documents: torch.Tensor) -> torch.Tensor:
    """``(rows, 1, length, length)``: position ``i`` attends to ``j`` when ``j <= i`` in the same document."""
    length = documents.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=documents.device).tril()
    return ((documents[:, :, None] == documents[:, None, :]) & causal)[:, None]


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.hidden)
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.norm2 = nn.LayerNorm(config.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(config.hidden, 4 * config.hidden), nn.GELU(), nn.Linear(4 * config.hidden, config.hidden)
        )

    def forward(self, x: torch.Tensor, documents: torch.Tensor | None = None) -> Any:
        """Causal self-attention and MLP; with ``documents`` (packed rows), attention stays within each
        document and the documents travel on: ``(out, documents)``."""
        b, t, h = x.shape
        normed = self.norm1(x)
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(normed).split(h, dim=2)
        else:  # unfused (tensor parallel): each rank holds a share of the heads
            q, k, v = (self.get_submodule(name)(normed) for name in "qkv")
        q, k, v = (z.view(b, t, -1, h // self.heads).transpose(1, 2) for z in (q, k, v))
        if documents is None:
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(documents))
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, -1))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out if documents is None else (out, documents)

    def unfuse_qkv(self) -> None:
        """Replace the fused ``qkv`` projection by ``q``, ``k`` and ``v`` with the same weights, so that a
        column-wise split gives each rank whole heads of all three (a split of the fused one would not)."""
        fused = self.qkv
        hidden = fused.in_features
        for index, name in enumerate("qkv"):
            part = nn.Linear(hidden, hidden)
            with torch.no_grad():
                part.weight.copy_(fused.weight[index * hidden : (index + 1) * hidden])
                part.bias.copy_(fused.bias[index * hidden : (index + 1) * hidden])
            setattr(self, name, part)
        del self.qkv


class Head(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden)
        self.out = nn.Linear(config.hidden, config.vocab)

    def forward(self, x: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        logits: torch.Tensor = self.out(self.norm(x))
        return logits


def counting_text(start: torch.Tensor, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """``length + 1`` tokens per row counting up from ``start`` (one per row), about a tenth of them shifted by
    one random amount: a language whose loss visibly falls."""
    steps = torch.arange(length + 1)[None, :]
    noise = (torch.rand(start.shape[0], length + 1, generator=generator) < 0.1).long()
    return (start + steps + noise * torch.randint(0, vocab, (1,), generator=generator)) % vocab
